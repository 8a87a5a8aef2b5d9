"""Moving a 10M-key deduplication between the engines, against reprocessing its input.

``python -m benchmarks.state_conversion [--keys 10000000] [--files 10] [--partitions 200]``

The query: ``dropDuplicates(["id"])`` (no watermark: every key stays in the state) over
``files`` parquet files of ``keys / files`` distinct ids, one file a batch, into the
``noop`` sink. Each step is a fresh process (its own JVM), timed from start to exit, its
peak memory the largest sum of resident memory over its process tree (driver, JVM, Python
workers), sampled every 100 ms:

1. reprocessing on Spark's engine: the whole input into a new checkpoint (Spark's
   HDFS-backed provider) — the alternative to moving a checkpoint to Spark's engine;
2. reprocessing on microbatch: the same into a new checkpoint — the alternative to moving
   one to microbatch;
3. Spark -> microbatch: microbatch resumes a copy of (1)'s checkpoint on one more file of
   one new id: the state is adopted at the start (``runtime/spark_state.py``), then a batch;
   its control: microbatch resuming its own checkpoint (2) on that file;
4. microbatch -> Spark: ``microbatch checkpoint convert CKPT --to spark`` on a copy of (2)'s
   checkpoint, then Spark's engine resuming it on that file; its control: Spark's engine
   resuming its own checkpoint (1) on that file.

The cost of a move is its step minus its control (the same start and batch without the
move). Results go to ``benchmarks/results/state_conversion.json``; the table is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

RUN = r"""
import sys, time
from pyspark.sql import SparkSession
engine, source, checkpoint, partitions = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", partitions)
         .config("spark.driver.memory", "6g").config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
session = spark
if engine == "microbatch":
    from microbatch import StreamingSession
    session = StreamingSession(spark)
frame = (session.readStream.schema("id BIGINT, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
         .parquet(source).dropDuplicates(["id"]))
query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
query.awaitTermination()
assert query.exception() is None, query.exception()
last = query.lastProgress
print("STATE_ROWS", last["stateOperators"][0]["numRowsTotal"] if last else -1, flush=True)
"""

CONVERT = [sys.executable, "-m", "microbatch.cli.main", "checkpoint", "convert"]


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


def measured(command: list[str], env: dict) -> dict:
    """Run ``command``; its wall seconds, peak tree memory (MB) and output."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss(process.pid))
        time.sleep(0.1)
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n{out[-3000:]}\n{err[-3000:]}")
    state_rows = [int(line.split()[1]) for line in out.splitlines() if line.startswith("STATE_ROWS")]
    return {"seconds": round(seconds, 2), "peak_mb": round(peak / 2**20), "state_rows": state_rows[-1]
            if state_rows else None, "output": out.strip().splitlines()[-1:] if out.strip() else []}


def write_input(directory: str, keys: int, files: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(directory)
    per_file = keys // files
    base = time.time() - 10_000
    for i in range(files):
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        ts = pa.array((ids % 86_400_000_000) + 1_790_000_000_000_000, type=pa.timestamp("us", tz="UTC"))
        path = os.path.join(directory, f"part-{i:04d}.parquet")
        pq.write_table(pa.table({"id": ids, "ts": ts}), path)
        os.utime(path, (base + i, base + i))


def one_more_file(directory: str, new_id: int, index: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = os.path.join(directory, f"part-{index:04d}.parquet")
    pq.write_table(pa.table({"id": pa.array([new_id], pa.int64()),
                             "ts": pa.array([1_790_000_000_000_000], pa.timestamp("us", tz="UTC"))}), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH")]))}
    work = tempfile.mkdtemp(prefix="state-conversion-")
    source = os.path.join(work, "input")
    ckpt = {name: os.path.join(work, name) for name in ("spark", "microbatch", "adopted", "converted")}
    results: dict = {"keys": args.keys, "files": args.files, "partitions": args.partitions}
    try:
        write_input(source, args.keys, args.files)

        def run(engine: str, checkpoint: str) -> dict:
            return measured([sys.executable, "-c", RUN, engine, source, checkpoint, str(args.partitions)], env)

        results["reprocess on spark"] = run("spark", ckpt["spark"])
        results["reprocess on microbatch"] = run("microbatch", ckpt["microbatch"])
        shutil.copytree(ckpt["spark"], ckpt["adopted"])
        shutil.copytree(ckpt["microbatch"], ckpt["converted"])
        one_more_file(source, args.keys, args.files)
        results["spark -> microbatch: adopt and one batch"] = run("microbatch", ckpt["adopted"])
        results["control: microbatch resumes its own, one batch"] = run("microbatch", ckpt["microbatch"])
        results["microbatch -> spark: convert"] = measured(CONVERT + [ckpt["converted"], "--to", "spark"], env)
        results["microbatch -> spark: spark resumes, one batch"] = run("spark", ckpt["converted"])
        results["control: spark resumes its own, one batch"] = run("spark", ckpt["spark"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")
    adopt = results["spark -> microbatch: adopt and one batch"]["seconds"] - \
        results["control: microbatch resumes its own, one batch"]["seconds"]
    convert = results["microbatch -> spark: convert"]["seconds"] + \
        results["microbatch -> spark: spark resumes, one batch"]["seconds"] - \
        results["control: spark resumes its own, one batch"]["seconds"]
    results["move to microbatch (s, minus control)"] = round(adopt, 2)
    results["move to spark (s, convert + resume minus control)"] = round(convert, 2)
    results["move to microbatch / reprocess on microbatch"] = round(adopt / results["reprocess on microbatch"]["seconds"], 3)
    results["move to spark / reprocess on spark"] = round(convert / results["reprocess on spark"]["seconds"], 3)
    print(f"{args.keys:,} keys, {args.files} files, {args.partitions} partitions")
    print(f"{'step':52s} {'seconds':>8s} {'peak MB':>8s} {'state rows':>11s}")
    for name, value in results.items():
        if isinstance(value, dict):
            print(f"{name:52s} {value['seconds']:8.1f} {value['peak_mb']:8d} {value['state_rows'] or '':>11}")
    for name in [k for k, v in results.items() if not isinstance(v, dict) and k not in ("keys", "files", "partitions")]:
        print(f"{name:52s} {results[name]}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "state_conversion.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
