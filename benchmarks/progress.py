"""Shared by the benchmarks: the progress of a query's first batches."""
from __future__ import annotations

import statistics
import time


def first_batches(query, batches: int) -> list:
    """The progress of the query's first ``batches`` batches; stops the query then. A
    failed query raises its error."""
    progress, seen = [], -1
    try:
        while len(progress) < batches:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            for p in query.recentProgress:
                if p.batchId > seen:
                    progress.append(p)
                    seen = p.batchId
            time.sleep(0.05)
    finally:
        query.stop()
    return progress[:batches]


def by_tenth(batches: list[dict], key: str) -> list[float]:
    """The median of ``key`` over each tenth of the batches."""
    tenth = max(1, len(batches) // 10)
    return [statistics.median(b[key] for b in batches[i:i + tenth]) for i in range(0, len(batches), tenth)]
