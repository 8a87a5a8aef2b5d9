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


def print_engines(title: str, results: dict, medians: dict, bounded: bool = False) -> None:
    """``title``, then per engine its median ``triggerExecution`` and its state rows per
    tenth of the run (``bounded``: with the last tenth over the peak, about 1 once the
    watermark evicts), then microbatch's median over Spark's."""
    print(title)
    for name, batches in results.items():
        tenths = by_tenth(batches, "stateRows")
        bound = f" (last tenth / peak {tenths[-1] / max(max(tenths), 1):.2f})" if bounded else ""
        print(f"  {name:10} median triggerExecution {medians[name]:6.0f} ms; state rows per tenth "
              f"{[round(t) for t in tenths]}{bound}")
    print(f"  microbatch / Spark: {medians['microbatch'] / medians['spark']:.2f}")


def batch_times(progress) -> dict:
    """A batch's id, ``triggerExecution`` and engine overhead (everything outside
    ``addBatch``, the sink's Spark job), in ms."""
    trigger = progress.durationMs.get("triggerExecution", 0)
    return {"batchId": progress.batchId, "triggerMs": trigger,
            "overheadMs": trigger - progress.durationMs.get("addBatch", 0)}


def both_engines(run, warm_up: tuple, measured: tuple, partitions: int = 4, conf: dict | None = None):
    """``run(session, *args)`` on Spark's engine and on microbatch in one embedded Spark:
    a warm-up run of each with ``warm_up`` (JVM code paths, Python workers), then one
    measured run of each with ``measured``. Returns the batches per engine and the median
    ``triggerMs`` of batches 1.. per engine; ``conf`` adds to the embedded Spark's."""
    from microbatch import StreamingSession, embedded_spark
    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": str(partitions), **(conf or {})})
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))   # a session made before keeps its own
    engines = {"spark": spark, "microbatch": StreamingSession(spark)}
    for session in engines.values():
        run(session, *warm_up)
    results = {name: run(session, *measured) for name, session in engines.items()}
    medians = {name: statistics.median(b["triggerMs"] for b in batches[1:]) for name, batches in results.items()}
    return results, medians


def engines_cell(results: dict, medians: dict) -> dict:
    """A cell of the full run from ``both_engines``: the medians, their ratio, and
    microbatch's median engine overhead (batches 1..)."""
    return {"microbatch_ms": medians["microbatch"], "anchor_ms": medians["spark"],
            "ratio": medians["microbatch"] / medians["spark"],
            "overhead_ms": statistics.median(b["overheadMs"] for b in results["microbatch"][1:]),
            "anchor_overhead_ms": statistics.median(b["overheadMs"] for b in results["spark"][1:])}


def write_results(name: str, args, medians: dict, results: dict) -> None:
    """``benchmarks/results/<name>.json``: the date, the arguments, the medians and every batch."""
    import json
    import os
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(here, exist_ok=True)
    with open(os.path.join(here, f"{name}.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "args": vars(args), "medians_ms": medians,
                   "batches": results}, f, indent=1)
