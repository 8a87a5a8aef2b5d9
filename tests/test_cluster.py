"""A multi-process Spark: ``local-cluster[2,1,1024]`` (two executor JVMs, each with its
own Python workers) in a child process, a windowed aggregation and a deduplication over
several batches, an executor JVM killed with SIGKILL at a step of a batch (make
test-faults). State partitions' tasks move between executors; the output must equal,
batch by batch, the same queries on Spark's own engine in local mode. (An executor killed
at a random moment of a batch was a test of its own in ``make test`` until issue 58: the
kill right after a state partition's new version is written covers its paths, the
re-run task and the moved partitions, at the step where they can go wrong.)"""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import pytest
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


def run_child(tmp_path, src: str, *args: str, env: dict | None = None) -> tuple[str, str, str]:
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, **(env or {})}
    child = subprocess.run([sys.executable, os.path.join(HERE, "cluster_child.py"), src, out, ckpt, *args],
                           env=env, capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-3000:]
    return out, ckpt, child.stdout


def assert_equals_sparks_engine(spark, tmp_path, src: str, out: str, names: tuple[str, ...]) -> None:
    """The same queries on Spark's own engine in local mode, batch by batch."""
    reference = str(tmp_path / "spark")
    frames = queries(spark, src)
    for name in names:
        query = (frames[name].writeStream.format("parquet").outputMode("append")
                 .option("checkpointLocation", f"{reference}/ckpt/{name}").trigger(availableNow=True)
                 .start(f"{reference}/out/{name}"))
        query.awaitTermination(300)
        assert query.exception() is None
    for name in names:
        ours, theirs = batches(spark, f"{out}/{name}"), batches(spark, f"{reference}/out/{name}")
        assert ours == theirs, name
        assert sum(map(len, ours)) > 0


@pytest.mark.faults
# (RocksDB's provider: the same kill, its commit's other files; make test-extended)
@pytest.mark.parametrize("provider", ["map", pytest.param("rocksdb", marks=pytest.mark.extended)])
def test_an_executor_killed_while_its_state_partitions_commit(spark, tmp_path, provider):
    """In each query, the 6th state partition to commit (batch 1, 4 partitions a batch)
    has its executor SIGKILLed right after its new version's file is written: the task
    (which also writes the file sink's data files) never ends. Spark retries it on the
    other executor, which commits the same version again over the dead one's file."""
    src, kills = str(tmp_path / "in"), tmp_path / "kills"
    write_json_files(src, 0, 6, rows_per_file=4)
    kills.mkdir()
    out, ckpt, stdout = run_child(tmp_path, src, "--kill", "at-step", "--provider", provider, env={
        "MICROBATCH_KILL_EXECUTOR_AT": "state-delta-written:6", "MICROBATCH_KILL_EXECUTOR_DIR": str(kills)})
    assert "DONE counts" in stdout and "DONE distinct" in stdout
    for name in ("counts", "distinct"):
        struck = json.loads((kills / f"{name}-killed-6.json").read_text())
        assert struck["step"] == "state-delta-written" and struck["attemptNumber"] == 0, struck
        assert os.path.exists(f"/proc/{struck['executorPid']}") is False, struck
    assert_equals_sparks_engine(spark, tmp_path, src, out, ("counts", "distinct"))


@pytest.mark.faults
def test_executors_killed_while_the_file_sinks_tasks_write(spark, tmp_path):
    """Every executor is SIGKILLed as soon as a task attempt's data file appears in the
    file sink's staging directory: the attempt's file is never committed (Spark's commit
    protocol), the retried task writes it again, and the output holds every row once."""
    src = str(tmp_path / "in")
    write_json_files(src, 0, 4, rows_per_file=40_000)
    out, _, stdout = run_child(tmp_path, src, "--kill", "sink-write", "--queries", "projected")
    assert re.search(r"KILLED executors \[\d+.* while .*_temporary.* was written", stdout), stdout
    assert "DONE projected" in stdout
    assert_equals_sparks_engine(spark, tmp_path, src, out, ("projected",))
