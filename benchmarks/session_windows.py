"""A session-window count with many keys against Spark's own engine, in one process.

``python -m benchmarks.session_windows [--batches 20] [--keys 100000] [--gap 5s|500ms] [--driver-memory 4g]``

One ``rate-micro-batch`` stream of ``keys`` rows a batch (every key once a batch, one second
of event time per batch), with a 2-second watermark, counted per key and session window of
``--gap`` in append mode (Spark refuses update mode for session windows): with a gap of 5 seconds (the default) each key's one session grows
by every batch's row, merged with the session held (state: a session per key); with a gap
of 500 milliseconds each batch starts a new session per key and the watermark closes the
older ones (state: the sessions the watermark has not passed). The same query runs on
Spark's engine and on microbatch, alternating, one run each after a warm-up run of each.
It prints the median ``triggerExecution`` of batches 1.. per engine, their ratio
(microbatch / Spark), and the aggregation's state rows per tenth of the run, and writes
``benchmarks/results/session_windows_<gap>.json``.
"""
from __future__ import annotations

import argparse
import tempfile

from benchmarks.progress import (batch_times, both_engines, engines_cell, first_batches, print_engines,
                                 write_results)


def session_query(session, keys: int, gap: str):
    from pyspark.sql import functions as F
    return (session.readStream.format("rate-micro-batch").option("rowsPerBatch", keys)
            .option("numPartitions", 2).option("advanceMillisPerBatch", 1000).load()
            .withColumn("key", F.col("value") % keys)
            .withWatermark("timestamp", "2 seconds")
            .groupBy(F.session_window("timestamp", gap), "key").count())


def run(session, keys: int, batches: int, gap: str) -> list[dict]:
    query = (session_query(session, keys, gap).writeStream.format("noop").outputMode("append")
             .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-session-"))
             .trigger(processingTime="0 seconds").start())
    progress = first_batches(query, batches)
    return [{**batch_times(p), "inputRows": p.numInputRows, "stateRows": p.stateOperators[0].numRowsTotal,
             "updated": p.stateOperators[0].numRowsUpdated, "removed": p.stateOperators[0].numRowsRemoved}
            for p in progress]


def measure(keys: int = 100_000, batches: int = 20, gap: str = "5 seconds",
            driver_memory: str | None = None) -> tuple[dict, dict, dict]:
    """Both engines' batches, their medians, and the cell of the full run."""
    conf = {"spark.driver.memory": driver_memory} if driver_memory else None
    results, medians = both_engines(run, (keys, 3, gap), (keys, batches, gap), conf=conf)
    return results, medians, engines_cell(results, medians)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--gap", default="5 seconds", help="the session gap: '5 seconds' (sessions grow), "
                                                            "'500 milliseconds' (a session a batch, closed by the watermark)")
    parser.add_argument("--driver-memory", default=None)
    args = parser.parse_args(argv)

    results, medians, _ = measure(args.keys, args.batches, args.gap, args.driver_memory)
    print_engines(f"session-window count, {args.keys} keys a batch, gap {args.gap}, {args.batches} batches",
                  results, medians)
    write_results(f"session_windows_{args.gap.replace(' ', '')}", args, medians, results)


if __name__ == "__main__":
    main()
