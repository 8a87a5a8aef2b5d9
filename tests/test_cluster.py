"""A multi-process Spark: ``local-cluster[2,1,1024]`` (two executor JVMs, each with its
own Python workers) in a child process, a windowed aggregation and a deduplication over
several batches, one executor JVM killed with SIGKILL while a batch runs. State
partitions' tasks move between executors; the output must equal, batch by batch, the
same queries on Spark's own engine in local mode."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from cluster_child import queries
from file_inputs import write_json_files

HERE = os.path.dirname(os.path.abspath(__file__))


def batches(spark, out: str) -> list[list[tuple]]:
    """The rows of each batch of a file sink's output, read through its log."""
    log_dir = os.path.join(out, "_spark_metadata")
    found = []
    for name in sorted((n for n in os.listdir(log_dir) if n.isdigit()), key=int):
        with open(os.path.join(log_dir, name)) as f:
            paths = [json.loads(line)["path"] for line in f.read().split("\n")[1:] if line.strip()]
        rows = spark.read.parquet(*paths).collect() if paths else []
        found.append(sorted(tuple(str(v) for v in row) for row in rows))
    return found


def test_stateful_queries_on_a_cluster_survive_a_killed_executor(spark, tmp_path):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 6, rows_per_file=4)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    child = subprocess.run([sys.executable, os.path.join(HERE, "cluster_child.py"), src, out, ckpt],
                           env=env, capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, child.stderr[-3000:]
    assert "KILLED executor" in child.stdout, child.stdout
    assert "DONE counts" in child.stdout and "DONE distinct" in child.stdout

    reference = str(tmp_path / "spark")
    for name, frame in queries(spark, src).items():
        query = (frame.writeStream.format("parquet").outputMode("append")
                 .option("checkpointLocation", f"{reference}/ckpt/{name}").trigger(availableNow=True)
                 .start(f"{reference}/out/{name}"))
        query.awaitTermination(300)
        assert query.exception() is None
    for name in ("counts", "distinct"):
        ours, theirs = batches(spark, f"{out}/{name}"), batches(spark, f"{reference}/out/{name}")
        assert ours == theirs, name
        assert sum(map(len, ours)) > 0
