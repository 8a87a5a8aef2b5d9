"""Run a windowed aggregation and a deduplication on a multi-process Spark
(``local-cluster[2,1,1024]``: two executor JVMs, each with its own Python workers), and
kill one executor JVM with SIGKILL while a batch runs. Used by tests/test_cluster.py.

Usage: python cluster_child.py SRC OUT CHECKPOINT
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from microbatch import StreamingSession


def queries(session, src: str):
    events = (session.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
              .withColumn("ts", F.timestamp_seconds("id")).withWatermark("ts", "50 seconds"))
    counts = events.groupBy(F.window("ts", "100 seconds"), "name").count()
    distinct = events.dropDuplicates(["name", "ts"])
    return {"counts": counts, "distinct": distinct}


def executor_pids() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def main() -> None:
    src, out, checkpoint = sys.argv[1:4]
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("microbatch-cluster")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.task.maxFailures", "8")
             # as docs/deploying.md recommends: Python workers over Unix domain sockets
             .config("spark.python.unix.domain.socket.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ss = StreamingSession(spark)
    killed = threading.Event()
    for name, frame in queries(ss, src).items():
        query = (frame.writeStream.format("parquet").outputMode("append")
                 .option("checkpointLocation", f"{checkpoint}/{name}").trigger(availableNow=True)
                 .start(f"{out}/{name}"))

        def kill_during_batch(query=query):
            # as soon as batch 1 runs, kill one executor JVM (its Python workers go with it)
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
        threading.Thread(target=kill_during_batch, daemon=True).start()
        query.awaitTermination()
        print(f"DONE {name} batches={len(query.recentProgress)}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
