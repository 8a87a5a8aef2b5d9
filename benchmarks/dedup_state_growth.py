"""Deduplication over a growing state: is the per-batch time flat as the state grows?

``python -m benchmarks.dedup_state_growth [--keys 10000000] [--batches 100]``

A ``rate-micro-batch`` stream of ``keys / batches`` new distinct values per batch,
``dropDuplicates(["value"])`` without watermark (so no key is ever evicted) into the
``noop`` sink, on microbatch and then on Spark's own Structured Streaming, one
process, one local[2] SparkSession. Per batch it records ``triggerExecution`` and
``addBatch`` (ms) and the state's ``numRowsTotal``; it prints the median batch time
per tenth of the run and the ratio last tenth / second tenth (1.0 = flat), and
writes everything to ``benchmarks/results/dedup_state_growth.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(session, engine: str, keys: int, batches: int, checkpoint: str) -> list[dict]:
    rows_per_batch = keys // batches
    frame = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
             .option("numPartitions", 2).load().dropDuplicates(["value"]))
    query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start())
    progress: list[dict] = []
    seen = -1
    try:
        while len(progress) < batches:
            if query.exception() is not None:
                raise RuntimeError(f"{engine}: {query.exception()}")
            last = query.lastProgress
            if last and last["batchId"] != seen:
                # recentProgress keeps the last 100: collect as we go
                for p in query.recentProgress:
                    if p["batchId"] > seen:
                        progress.append(p)
                        seen = p["batchId"]
            time.sleep(0.05)
    finally:
        query.stop()
    out = []
    for p in progress[:batches]:
        op = p["stateOperators"][0]
        out.append({"batchId": p["batchId"], "triggerMs": p["durationMs"].get("triggerExecution", 0),
                    "addBatchMs": p["durationMs"].get("addBatch", 0), "stateRows": op["numRowsTotal"],
                    "memoryUsedBytes": op["memoryUsedBytes"], "commitTimeMs": op["commitTimeMs"]})
    return out


def summarize(engine: str, batches: list[dict]) -> dict:
    n = len(batches)
    tenth = max(1, n // 10)
    deciles = [statistics.median(b["triggerMs"] for b in batches[i:i + tenth]) for i in range(0, n, tenth)]
    flat = deciles[-1] / deciles[1] if len(deciles) > 1 and deciles[1] else float("nan")
    print(f"\n{engine}: median triggerExecution ms per tenth of the run (state rows at its end)")
    for i, median in enumerate(deciles):
        end = batches[min(n, (i + 1) * tenth) - 1]
        print(f"  batches {i * tenth:4d}-{min(n, (i + 1) * tenth) - 1:4d}: {median:8.0f} ms   "
              f"state rows {end['stateRows']:>11,}")
    print(f"  last tenth / second tenth: {flat:.2f}   max batch: {max(b['triggerMs'] for b in batches)} ms")
    return {"deciles_ms": deciles, "flatness": flat, "max_ms": max(b["triggerMs"] for b in batches)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8, help="spark.sql.shuffle.partitions")
    parser.add_argument("--no-spark", action="store_true", help="skip Spark's own engine")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from microbatch import StreamingSession, embedded_spark
    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": str(args.partitions),
                                 "spark.driver.memory": "4g"})
    ss = StreamingSession(spark)
    results = {"keys": args.keys, "batches": args.batches, "partitions": args.partitions,
               "machine": f"{os.cpu_count()} cores, local[2]"}
    with tempfile.TemporaryDirectory() as tmp:
        ours = run(ss, "microbatch", args.keys, args.batches, f"{tmp}/microbatch")
        results["microbatch"] = {"batches": ours, **summarize("microbatch", ours)}
        if not args.no_spark:
            theirs = run(spark, "spark", args.keys, args.batches, f"{tmp}/spark")
            results["spark"] = {"batches": theirs, **summarize("Spark Structured Streaming", theirs)}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "dedup_state_growth.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
