"""State growing batch after batch: is the per-batch time flat as the state grows?

``python -m benchmarks.dedup_state_growth [--keys 10000000] [--batches 100]
[--query dedup|window] [--provider map|rocksdb] [--python-memory 512m]``

A ``rate-micro-batch`` stream of ``keys / batches`` new distinct values per batch into
the ``noop`` sink, on microbatch and then on Spark's own Structured Streaming, one
process, one local[2] SparkSession:

- ``dedup``: ``dropDuplicates(["value"])`` without watermark, so no key is ever evicted;
- ``window``: a count per ``value`` and 1-minute window, update mode, no watermark, so
  every (value, window) is a state key that stays.

``--provider rocksdb`` runs both engines on their RocksDB state stores (the same conf
value, Spark's class name), ``map`` microbatch's default against Spark's default.
``--python-memory`` caps each Python worker (``spark.executor.pyspark.memory``).
Per batch it records ``triggerExecution`` and ``addBatch`` (ms) and the state's
``numRowsTotal``, and samples the resident memory of the Python workers; it prints
the median batch time per tenth of the run and the ratio last tenth / second tenth
(1.0 = flat), and writes everything to ``benchmarks/results/<query>_state_growth[_rocksdb].json``.
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


SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def python_workers_rss() -> dict[int, int]:
    """Resident bytes of each PySpark Python worker process (its daemon and the forks)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"pyspark.daemon" not in f.read():
                    continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        found[int(pid)] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return found


def run(session, engine: str, keys: int, batches: int, checkpoint: str, query_kind: str = "dedup") -> list[dict]:
    rows_per_batch = keys // batches
    frame = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
             .option("numPartitions", 2).load())
    if query_kind == "dedup":
        frame, mode = frame.dropDuplicates(["value"]), "append"
    else:
        from pyspark.sql import functions as F
        frame, mode = frame.groupBy(F.window("timestamp", "1 minute"), "value").count(), "update"
    query = (frame.writeStream.format("noop").outputMode(mode).option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start())
    peak_rss = 0
    progress: list[dict] = []
    seen = -1
    try:
        while len(progress) < batches:
            if query.exception() is not None:
                raise RuntimeError(f"{engine}: {query.exception()}")
            peak_rss = max(peak_rss, max(python_workers_rss().values(), default=0))
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
                    "memoryUsedBytes": op["memoryUsedBytes"], "commitTimeMs": op["commitTimeMs"],
                    "customMetrics": op.get("customMetrics", {})})
    if out:
        out[-1]["peakPythonWorkerRss"] = peak_rss
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
    peak = batches[-1].get("peakPythonWorkerRss", 0) if engine == "microbatch" else 0
    workers = f"   largest Python worker: {peak / 2**20:.0f} MiB" if peak else ""
    print(f"  last tenth / second tenth: {flat:.2f}   max batch: {max(b['triggerMs'] for b in batches)} ms"
          + workers)
    return {"deciles_ms": deciles, "flatness": flat, "max_ms": max(b["triggerMs"] for b in batches),
            "peak_python_worker_rss": peak}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8, help="spark.sql.shuffle.partitions")
    parser.add_argument("--no-spark", action="store_true", help="skip Spark's own engine")
    parser.add_argument("--query", choices=("dedup", "window"), default="dedup")
    parser.add_argument("--provider", choices=("map", "rocksdb"), default="map",
                        help="rocksdb: both engines on their RocksDB state stores")
    parser.add_argument("--python-memory", default=None, help="spark.executor.pyspark.memory, e.g. 512m")
    parser.add_argument("--master", default="local[2]",
                        help="e.g. local-cluster[2,1,2048]: state partitions move between two executors")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from microbatch import StreamingSession, embedded_spark
    conf = {"spark.sql.shuffle.partitions": str(args.partitions), "spark.driver.memory": "4g"}
    if args.provider == "rocksdb":
        conf["spark.sql.streaming.stateStore.providerClass"] = SPARK_ROCKSDB
    if args.python_memory:
        conf["spark.executor.pyspark.memory"] = args.python_memory
        # the cap is on address space (RLIMIT_AS): glibc's per-thread malloc arenas reserve
        # 64 MB each, and RocksDB's threads would spend the cap on reservations
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    spark = embedded_spark(args.master, conf=conf)
    ss = StreamingSession(spark)
    results = {"keys": args.keys, "batches": args.batches, "partitions": args.partitions,
               "query": args.query, "provider": args.provider, "python_memory": args.python_memory,
               "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {args.master}"}
    with tempfile.TemporaryDirectory() as tmp:
        ours = run(ss, "microbatch", args.keys, args.batches, f"{tmp}/microbatch", args.query)
        results["microbatch"] = {"batches": ours, **summarize("microbatch", ours)}
        if not args.no_spark:
            theirs = run(spark, "spark", args.keys, args.batches, f"{tmp}/spark", args.query)
            results["spark"] = {"batches": theirs, **summarize("Spark Structured Streaming", theirs)}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    suffix = ("_rocksdb" if args.provider == "rocksdb" else "") + \
        ("_cluster" if args.master.startswith("local-cluster") else "")
    path = os.path.join(HERE, "results", f"{args.query}_state_growth{suffix}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
