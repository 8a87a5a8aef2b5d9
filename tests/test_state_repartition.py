"""Offline state repartitioning (``microbatch checkpoint state repartition``,
``ss._streamingCheckpointManager.repartition``): the same answers as a run never
repartitioned, and Spark's repartition batch, errors and restart check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from helpers import ci_share, confs
from microbatch.cli.main import main as verify_main
from test_transform_with_state_differential import OUTPUT as TRACKER_OUTPUT, ROCKSDB, Tracker

SHUFFLE = "spark.sql.shuffle.partitions"
BASE = time.time() - 50_000


def write_stage(directory, stage: int, files: int = 2) -> None:
    """Files of one stage: ids repeat across files and stages (dedup, counts, joins match
    across batches), event time moves on by stage (windows close, timers fire)."""
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        number = stage * files + f
        rows = [{"id": (number * 7 + j) % 23, "ts": f"2026-01-01 00:{stage * 10 + f * 2 + j % 3:02d}:00",
                 "v": number * 100 + j} for j in range(12)]
        path = os.path.join(directory, f"f{number:03d}.json")
        with open(path, "w") as out:
            out.write("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (BASE + number, BASE + number))


def events(session, directory, schema="id INT, ts TIMESTAMP, v INT"):
    return session.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(directory))


QUERIES = {
    # a deduplication, then a windowed count over its output (two operators, append)
    "dedup then window count": ("append", lambda ss, d: (
        events(ss, d / "a").withWatermark("ts", "5 minutes").dropDuplicates(["id", "ts"])
        .groupBy(F.window("ts", "10 minutes"), "id").agg(F.count("*").alias("n"), F.sum("v").alias("s")))),
    # a stream-stream join: four stores per partition
    "stream-stream join": ("append", lambda ss, d: (
        events(ss, d / "a").withWatermark("ts", "5 minutes")
        .join(events(ss, d / "b", "id INT, ts TIMESTAMP, w INT").withWatermark("ts", "5 minutes"), ["id", "ts"]))),
    # transformWithState: a store per state variable (value, list, map) and the timers
    "transformWithStateInPandas": ("append", lambda ss, d: (
        events(ss, d / "a").withWatermark("ts", "5 minutes").groupBy("id")
        .transformWithStateInPandas(Tracker(), TRACKER_OUTPUT, "append", "EventTime"))),
}


def run(ss, directory, ckpt, case):
    mode, build = QUERIES[case]
    batches = []
    query = (build(ss, directory).writeStream.outputMode(mode)
             .foreachBatch(lambda df, i: batches.append(sorted(map(repr, df.collect()))))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return batches, query


def state_layout(ckpt, version):
    """Partitions of each operator holding a snapshot of ``version``."""
    found = {}
    for op in sorted(os.listdir(ckpt / "state")):
        for partition in sorted(os.listdir(ckpt / "state" / op)):
            if partition.isdigit():
                for _directory, _, names in os.walk(ckpt / "state" / op / partition):
                    if f"{version}.snapshot.arrow" in names:
                        found.setdefault(int(op), set()).add(int(partition))
    return found


@pytest.mark.parametrize("case", ci_share(list(QUERIES), every=3))   # one in CI's run (helpers.ci_share)
def test_repartition_4_to_8_to_3_gives_the_answers_of_a_run_never_repartitioned(ss, tmp_path, case):
    data = tmp_path / "in"
    for side in ("a", "b"):
        write_stage(data / side, 0)
    with confs(ss, {SHUFFLE: "4"}):
        reference = []
        ours = []
        for stage in range(3):
            if stage:
                for side in ("a", "b"):
                    write_stage(data / side, stage)
            batches, _ = run(ss, data, tmp_path / "reference", case)
            reference += batches
            if stage == 1:   # 4 -> 8 through the Python API
                ss._streamingCheckpointManager.repartition(str(tmp_path / "ckpt"), 8)
                last = max(int(n) for n in os.listdir(tmp_path / "ckpt/commits"))
                layout = state_layout(tmp_path / "ckpt", last + 1)
                assert layout and all(parts == set(range(8)) for parts in layout.values()), layout
            if stage == 2 and case != "dedup then window count":
                ss._streamingCheckpointManager.repartition(str(tmp_path / "ckpt"), 3)
            elif stage == 2:   # 8 -> 3 through the command, in a process of its own
                done = subprocess.run([sys.executable, "-m", "microbatch.cli.main", "checkpoint", "state",
                                       "repartition", str(tmp_path / "ckpt"), "--partitions", "3"],
                                      capture_output=True, text=True, timeout=300,
                                      env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
                assert done.returncode == 0, done.stdout + done.stderr[-3000:]
                assert "the state is in 3 partitions from batch" in done.stdout
            batches, query = run(ss, data, tmp_path / "ckpt", case)
            ours += batches
            assert verify_main(["checkpoint", "verify", str(tmp_path / "ckpt")]) == 0
            partitions = {1: 8, 2: 3}.get(stage, 4)
            for progress in query.recentProgress:
                for op in progress.stateOperators:
                    assert op.numShufflePartitions == partitions, (stage, op)
    assert [b for b in ours if b] == [b for b in reference if b]
    assert sum(map(len, ours)) > 10


def _condition(error: BaseException) -> str:
    if isinstance(error, Py4JJavaError):
        return error.java_exception.getCondition()
    assert isinstance(error, PySparkException), type(error)
    return error.getCondition()


def _message(error: BaseException, ckpt) -> str:
    origin = error.java_exception if isinstance(error, Py4JJavaError) else error._origin
    text = origin.getMessage()
    return text.replace(str(ckpt), "<ckpt>").replace("file://", "").split("\n\nJVM stacktrace")[0]


def test_the_repartition_batch_its_errors_and_the_restart_check_are_sparks(ss, spark, tmp_path):
    """Spark's own engine (with its RocksDB store, which Spark's repartition needs) and
    microbatch run the same count; both checkpoints are repartitioned, damaged and
    restarted the same ways."""
    write_stage(tmp_path / "in", 0)
    spark_session = spark.newSession()
    spark_session.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    engines = {"spark": (spark_session, spark_session._streamingCheckpointManager),
               "microbatch": (ss, ss._streamingCheckpointManager)}

    def start(engine):
        session = engines[engine][0]
        frame = session.readStream.schema("id INT, ts TIMESTAMP, v INT").json(str(tmp_path / "in"))
        return (frame.groupBy("id").count().writeStream.format("noop").outputMode("complete")
                .option("checkpointLocation", str(tmp_path / engine)).trigger(availableNow=True).start())

    def attempt(call):
        try:
            call()
        except (Py4JJavaError, PySparkException) as e:
            return e
        raise AssertionError("no error")

    for engine, (_session, manager) in engines.items():
        start(engine).awaitTermination(180)
        ckpt = tmp_path / engine
        manager.repartition(str(ckpt), 5)
        offsets = [open(ckpt / f"offsets/{b}").read().split("\n") for b in (0, 1)]
        repartitioned = json.loads(offsets[1][1])
        assert repartitioned["conf"][SHUFFLE] == "5", engine
        assert offsets[1][2:] == offsets[0][2:] and offsets[1][0] == offsets[0][0]
        assert repartitioned["batchTimestampMs"] == json.loads(offsets[0][1])["batchTimestampMs"]
        assert open(ckpt / "commits/1").read() == open(ckpt / "commits/0").read()

    errors = {}
    for engine, (_session, manager) in engines.items():
        ckpt = tmp_path / engine
        errors[engine] = [
            attempt(lambda manager=manager, ckpt=ckpt: manager.repartition(str(ckpt), 0)),
            attempt(lambda manager=manager, ckpt=ckpt: manager.repartition(str(ckpt), 5)),   # already 5
        ]
        os.rename(ckpt / "commits/1", ckpt / "uncommitted")             # the repartition did not finish
        for crc in (ckpt / "commits/.1.crc",):
            if crc.exists():
                crc.unlink()
        query = start(engine)
        errors[engine].append(attempt(lambda query=query: query.awaitTermination(180)))
        errors[engine].append(attempt(lambda manager=manager, ckpt=ckpt: manager.repartition(str(ckpt), 6)))   # another N
        manager.repartition(str(ckpt), 5)                                # the same N finishes it
        assert (ckpt / "commits/1").exists()
        start(engine).awaitTermination(180)
        assert sorted(int(n) for n in os.listdir(ckpt / "commits") if n.isdigit()) == [0, 1, 2] or \
            sorted(int(n) for n in os.listdir(ckpt / "commits") if n.isdigit()) == [0, 1]
    conditions = {engine: [_condition(e) for e in found] for engine, found in errors.items()}
    assert conditions["microbatch"][:2] == conditions["spark"][:2] == [
        "STATE_REPARTITION_INVALID_PARAMETER.IS_NOT_GREATER_THAN_ZERO",
        "STATE_REPARTITION_INVALID_CHECKPOINT.SHUFFLE_PARTITIONS_ALREADY_MATCH"]
    assert conditions["microbatch"][3] == conditions["spark"][3] == \
        "STATE_REPARTITION_INVALID_CHECKPOINT.LAST_BATCH_ABANDONED_REPARTITION"
    assert "STREAMING_UNFINISHED_REPARTITION_DETECTED" in str(errors["spark"][2])
    assert "STREAMING_UNFINISHED_REPARTITION_DETECTED" in str(errors["microbatch"][2])
    for spark_error, our_error in zip(errors["spark"][1:2] + errors["spark"][3:],
                                      errors["microbatch"][1:2] + errors["microbatch"][3:]):
        assert _message(our_error, tmp_path / "microbatch") == _message(spark_error, tmp_path / "spark")


def test_a_failed_last_batch_is_refused_unless_asked_to_skip_it(ss, tmp_path):
    write_stage(tmp_path / "in", 0)
    frame = ss.readStream.schema("id INT, ts TIMESTAMP, v INT").json(str(tmp_path / "in"))
    query = (frame.groupBy("id").count().writeStream.format("noop").outputMode("complete")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    os.remove(tmp_path / "ckpt/commits/0")
    manager = ss._streamingCheckpointManager
    with pytest.raises(PySparkException) as refused:
        manager.repartition(str(tmp_path / "ckpt"), 3)
    assert refused.value.getCondition() == "STATE_REPARTITION_INVALID_CHECKPOINT.NO_COMMITTED_BATCH"
    write_stage(tmp_path / "in", 1)
    query = (frame.groupBy("id").count().writeStream.format("noop").outputMode("complete")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(120)   # re-runs batch 0, then batch 1
    os.remove(tmp_path / "ckpt/commits/1")
    with pytest.raises(PySparkException) as refused:
        manager.repartition(str(tmp_path / "ckpt"), 3)
    assert refused.value.getCondition() == "STATE_REPARTITION_INVALID_CHECKPOINT.LAST_BATCH_FAILED"
    assert "The last batch ID 1 didn't finish successfully" in str(refused.value)
    manager.repartition(str(tmp_path / "ckpt"), 3, enforce_exactly_once_sink=False)
    assert sorted(os.listdir(tmp_path / "ckpt/commits")) == ["0", "1", "2"]
    assert json.loads(open(tmp_path / "ckpt/offsets/2").read().split("\n")[1])["conf"][SHUFFLE] == "3"
