"""The Kafka source's read limit ``maxOffsetsPerTrigger``: a batch's end offsets cut to
a number of offsets, prorated over the partitions' lags (Spark's rateLimit)."""
from __future__ import annotations

import math


def rate_limit(limit: int, start: dict, latest: dict, earliest_of_new) -> dict:
    """Spark's KafkaMicroBatchStream.rateLimit: ``limit`` offsets prorated over the
    partitions' lags; a partition with a lag always gets at least one."""
    new = [tp for tp in latest if tp not in start]
    from_new = earliest_of_new(new) if new else {}
    sizes = {}
    for tp, end in latest.items():
        begin = start.get(tp, from_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, from_new.get(tp))
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + share)
    return out
