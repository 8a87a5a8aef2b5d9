"""A stream-stream inner join against Spark's own engine, in one process.

``python -m benchmarks.stream_join [--batches 20] [--rows 20000] [--on range|keys] [--driver-memory 4g]``

Two ``rate-micro-batch`` streams of ``rows`` rows a batch each (the same values and
timestamps on both sides, one second of event time per batch), each with a 5-second
watermark, joined by value within a 2-second time range (``--on range``, the default) or
on ``["value", "timestamp"]`` (``--on keys``): every row meets its twin, and state is
evicted as the watermark moves, so it stays bounded. The same query
runs on Spark's engine and on microbatch, alternating, one run each after a warm-up run
of each. It prints the median ``triggerExecution`` of batches 1.. per engine, their ratio
(microbatch / Spark), and the join's state rows per tenth of the run (bounded: once the
watermark evicts, the state stops growing; last tenth / peak about 1), and writes
``benchmarks/results/stream_join_<on>.json``.
"""
from __future__ import annotations

import argparse
import tempfile

from benchmarks.progress import (batch_times, both_engines, engines_cell, first_batches, print_engines,
                                 write_results)


def join_query(session, rows: int, on: str):
    """``on="range"``: ``lvalue = rvalue AND lts BETWEEN rts AND rts + INTERVAL 2 SECONDS``
    (state evicted by each side's state value watermark); ``on="keys"``: the USING join
    on ``["value", "ts"]`` (state evicted by the watermarked key)."""
    from pyspark.sql import functions as F

    def side(prefix: str):
        frame = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
                 .option("numPartitions", 2).option("advanceMillisPerBatch", 1000).load()
                 .withColumn(f"{prefix}payload", F.col("value") * 2))
        if on == "keys":
            return frame.withColumnRenamed("timestamp", "ts").withWatermark("ts", "5 seconds")
        return (frame.withColumnRenamed("value", f"{prefix}value").withColumnRenamed("timestamp", f"{prefix}ts")
                .withWatermark(f"{prefix}ts", "5 seconds"))
    if on == "keys":
        return side("l").join(side("r"), ["value", "ts"])
    return side("l").join(side("r"), F.expr("lvalue = rvalue AND lts BETWEEN rts AND rts + INTERVAL 2 SECONDS"))


def run(session, rows: int, batches: int, on: str) -> list[dict]:
    query = (join_query(session, rows, on).writeStream.format("noop")
             .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-join-"))
             .trigger(processingTime="0 seconds").start())
    progress = first_batches(query, batches)
    return [{**batch_times(p), "inputRows": p.numInputRows, "stateRows": p.stateOperators[0].numRowsTotal,
             "removed": p.stateOperators[0].numRowsRemoved} for p in progress]


def measure(rows: int = 20_000, batches: int = 20, on: str = "range",
            driver_memory: str | None = None) -> tuple[dict, dict, dict]:
    """Both engines' batches, their medians, and the cell of the full run
    (``python -m benchmarks``)."""
    conf = {"spark.driver.memory": driver_memory} if driver_memory else None
    results, medians = both_engines(run, (rows, 3, on), (rows, batches, on), conf=conf)
    return results, medians, engines_cell(results, medians)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--on", choices=("range", "keys"), default="range")
    parser.add_argument("--driver-memory", default=None,
                        help="the embedded Spark's heap (Spark's engine keeps 100,000 rows a batch in 4g, not 1g)")
    args = parser.parse_args(argv)

    results, medians, _ = measure(args.rows, args.batches, args.on, args.driver_memory)
    print_engines(f"stream-stream inner join on {args.on}, {args.rows} rows a batch on each side, "
                  f"{args.batches} batches", results, medians, bounded=True)
    write_results(f"stream_join_{args.on}", args, medians, results)


if __name__ == "__main__":
    main()
