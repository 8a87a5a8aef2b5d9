"""A stream-stream inner join against Spark's own engine, in one process.

``python -m benchmarks.stream_join [--batches 20] [--rows 20000]``

Two ``rate-micro-batch`` streams of ``rows`` rows a batch each (the same values and
timestamps on both sides, one second of event time per batch), each with a 5-second
watermark, joined on ``["value", "timestamp"]``: every row meets its twin, and state is
evicted once the watermark passes a key's timestamp, so it stays bounded. The same query
runs on Spark's engine and on microbatch, alternating, one run each after a warm-up run
of each. It prints the median ``triggerExecution`` of batches 1.. per engine, their ratio
(microbatch / Spark), and the join's state rows per tenth of the run (bounded: once the
watermark evicts, the state stops growing; last tenth / peak about 1), and writes
``benchmarks/results/stream_join.json``.

Not yet the issue's time-range join (``a.ts BETWEEN b.ts AND b.ts + interval``):
microbatch joins on column names only so far.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from benchmarks.progress import by_tenth, first_batches

HERE = os.path.dirname(os.path.abspath(__file__))


def join_query(session, rows: int):
    from pyspark.sql import functions as F

    def side(payload: str):
        return (session.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
                .option("numPartitions", 2).option("advanceMillisPerBatch", 1000).load()
                .withColumnRenamed("timestamp", "ts").withWatermark("ts", "5 seconds")
                .withColumn(payload, F.col("value") * 2))
    return side("left_payload").join(side("right_payload"), ["value", "ts"])


def run(session, rows: int, batches: int) -> list[dict]:
    query = (join_query(session, rows).writeStream.format("noop")
             .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-join-"))
             .trigger(processingTime="0 seconds").start())
    progress = first_batches(query, batches)
    return [{"batchId": p.batchId, "triggerMs": p.durationMs.get("triggerExecution", 0),
             "inputRows": p.numInputRows, "stateRows": p.stateOperators[0].numRowsTotal,
             "removed": p.stateOperators[0].numRowsRemoved} for p in progress]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args(argv)

    from microbatch import StreamingSession, embedded_spark
    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": "4"})
    ss = StreamingSession(spark)
    engines = {"spark": spark, "microbatch": ss}
    for session in engines.values():   # warm-up: JVM code paths and Python workers
        run(session, args.rows, 3)
    results = {name: run(session, args.rows, args.batches) for name, session in engines.items()}
    medians = {name: statistics.median(b["triggerMs"] for b in batches[1:]) for name, batches in results.items()}
    print(f"stream-stream inner join, {args.rows} rows a batch on each side, {args.batches} batches")
    for name, batches in results.items():
        tenths = by_tenth(batches, "stateRows")
        print(f"  {name:10} median triggerExecution {medians[name]:6.0f} ms; state rows per tenth "
              f"{[round(t) for t in tenths]} (last tenth / peak {tenths[-1] / max(max(tenths), 1):.2f})")
    print(f"  microbatch / Spark: {medians['microbatch'] / medians['spark']:.2f}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "stream_join.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "args": vars(args), "medians_ms": medians,
                   "batches": results}, f, indent=1)


if __name__ == "__main__":
    main()
