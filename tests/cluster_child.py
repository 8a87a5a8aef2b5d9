"""Run streaming queries on a multi-process Spark (``local-cluster[2,1,1024]``: two
executor JVMs, each with its own Python workers) and lose an executor while they run.
Used by tests/test_cluster.py.

Usage: python cluster_child.py SRC OUT CHECKPOINT [--kill during-batch|at-step|sink-write]
                              [--provider map|rocksdb] [--queries counts,distinct]

- ``during-batch`` (the default): kill one executor JVM with SIGKILL as soon as a batch
  runs.
- ``at-step``: the test sets ``MICROBATCH_KILL_EXECUTOR_AT``/``_DIR``
  (``microbatch.crash_points``): the executor running a task that reaches that step is
  killed there, e.g. ``state-delta-written`` (a state partition committed its new version,
  the task, which also writes the file sink's data files, not done).
- ``sink-write``: kill every executor JVM as soon as a task attempt's data file appears
  in the file sink's staging directory, i.e. while the sink's tasks write.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from microbatch import StreamingSession
from microbatch.crash_points import KILL_EXECUTOR_AT, KILL_EXECUTOR_DIR

PROVIDERS = {"map": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
             "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}
STAGING_DIR = "_microbatch_staging"


def queries(session, src: str):
    events = (session.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
              .withColumn("ts", F.timestamp_seconds("id")).withWatermark("ts", "50 seconds"))
    counts = events.groupBy(F.window("ts", "100 seconds"), "name").count()
    distinct = events.dropDuplicates(["name", "ts"])
    projected = events.where(F.col("id") % 7 != 3).select("id", F.upper("name").alias("name"), "ts")
    return {"counts": counts, "distinct": distinct, "projected": projected}


def executor_pids() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def kill_during_batch(query, killed: threading.Event) -> None:
    # as soon as a batch runs, kill one executor JVM (its Python workers go with it)
    while query.isActive and not killed.is_set():
        progress = query.lastProgress
        if progress is not None and progress.batchId >= 0 and query.status["isTriggerActive"]:
            pids = executor_pids()
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                print(f"KILLED executor {pids[0]}", flush=True)
                killed.set()
                return
        killed.wait(0.02)


def kill_while_sink_writes(query, out: str, killed: threading.Event) -> None:
    # a task attempt's file under the staging directory's _temporary: Spark's commit
    # protocol has not committed that task yet, its executor is writing it
    staging = os.path.join(out, STAGING_DIR)
    while query.isActive and not killed.is_set():
        for directory, _dirs, names in os.walk(staging):
            if "/_temporary/" in directory + "/" and "/attempt_" in directory and \
                    any(n.startswith("part-") for n in names):
                pids = executor_pids()
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                print(f"KILLED executors {pids} while {directory} was written", flush=True)
                killed.set()
                return
        killed.wait(0.005)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("checkpoint")
    parser.add_argument("--kill", default="during-batch", choices=("during-batch", "at-step", "sink-write"))
    parser.add_argument("--provider", default="map", choices=tuple(PROVIDERS))
    parser.add_argument("--queries", default="counts,distinct")
    args = parser.parse_args()
    builder = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("microbatch-cluster")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.task.maxFailures", "8")
               .config("spark.sql.streaming.stateStore.providerClass", PROVIDERS[args.provider])
               # as docs/deploying.md recommends: Python workers over Unix domain sockets
               .config("spark.python.unix.domain.socket.enabled", "true"))
    for name in (KILL_EXECUTOR_AT, KILL_EXECUTOR_DIR):
        if name in os.environ:
            builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ss = StreamingSession(spark)
    killed = threading.Event()
    frames = queries(ss, args.src)
    for name in args.queries.split(","):
        query = (frames[name].writeStream.format("parquet").outputMode("append")
                 .option("checkpointLocation", f"{args.checkpoint}/{name}").trigger(availableNow=True)
                 .start(f"{args.out}/{name}"))
        if args.kill == "during-batch":
            threading.Thread(target=kill_during_batch, args=(query, killed), daemon=True).start()
        elif args.kill == "sink-write":
            threading.Thread(target=kill_while_sink_writes, args=(query, f"{args.out}/{name}", killed),
                             daemon=True).start()
        query.awaitTermination()
        print(f"DONE {name} batches={len(query.recentProgress)}", flush=True)
        if os.environ.get(KILL_EXECUTOR_DIR):
            # the next query's arrivals count from 1 again; its kills are recorded apart
            directory = os.environ[KILL_EXECUTOR_DIR]
            for entry in os.listdir(directory):
                if entry.startswith("arrival-"):
                    os.remove(os.path.join(directory, entry))
                elif entry.startswith("killed-"):
                    os.replace(os.path.join(directory, entry), os.path.join(directory, f"{name}-{entry}"))
    spark.stop()


if __name__ == "__main__":
    main()
