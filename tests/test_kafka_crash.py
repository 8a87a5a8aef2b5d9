"""Exactly once with Kafka across SIGKILL: Kafka -> files, and files -> Kafka.

Real processes (a child query in its own process group, its JVM and Python workers)
are killed with SIGKILL; the broker is a real Kafka-protocol broker (Tansu).
"""
from __future__ import annotations

import collections
import os
import random
import time

import pytest

import kafka_child
from file_inputs import write_json_files
from child_process import Child, batch_ids
from helpers import wait_for

#: a separate bounded step (make test-faults): real processes killed with SIGKILL
pytestmark = pytest.mark.faults

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kafka_child.py")


def produce_numbered(broker, topic, start, count, partitions):
    broker.produce(topic, [(b"r%d" % i, b"%d" % i, i % partitions) for i in range(start, start + count)])
    return start + count


def test_kafka_to_parquet_is_exactly_once_across_sigkills(ss, spark, broker, tmp_path):
    """A crash at each step of the protocol (the child kills itself the second time it
    gets there, ``microbatch.crash_points``), then a kill at a random moment."""
    topic, out, ckpt = "crash-source", tmp_path / "out", tmp_path / "ckpt"
    broker.create_topic(topic, 4)
    produced = produce_numbered(broker, topic, 0, 400, 4)
    rng = random.Random(20261124)
    offsets, commits = ckpt / "offsets", ckpt / "commits"
    kills = []
    for step in ["offsets-written", "source-get-batch", "sink-manifest-written", "commit-written", "random"]:
        env = {} if step == "random" else {"MICROBATCH_CRASH_AT": f"{step}:2"}
        child = Child(topic, out, ckpt, tmp_path / "child.log", script=CHILD,
                      args=("source", broker.bootstrap), env=env)
        if step == "random":
            child.wait_for("PROGRESS", timeout=180)
            time.sleep(rng.uniform(0.0, 0.5))   # (deliberate: the kill lands at a random moment)
        else:
            child.proc.wait(240)
            assert child.proc.returncode == -9, (step, child.proc.returncode)
        child.kill()
        kills.append((step, max(batch_ids(offsets), default=-1), max(batch_ids(commits), default=-1)))
        produced = produce_numbered(broker, topic, produced, 40, 4)
    assert sum(1 for _, o, c in kills if o > c) >= 3, kills

    query = kafka_child.source_writer(ss, topic, str(out), str(ckpt), broker.bootstrap) \
        .trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    counts = collections.Counter(r["value"] for r in rows)
    assert set(counts) == {"r%d" % i for i in range(produced)}, kills
    assert max(counts.values()) == 1, [v for v, n in counts.items() if n > 1][:5]
    assert len({(r["partition"], r["offset"]) for r in rows}) == produced


def _crash_in_the_middle_of_a_sink_write(broker, tmp_path, mode, topic):
    src, ckpt = tmp_path / f"in-{mode}", tmp_path / f"ckpt-{mode}"
    broker.create_topic(topic, 3)
    expected = write_json_files(src, 0, 6, rows_per_file=20)
    child = Child(src, topic, ckpt, tmp_path / "child.log", script=CHILD, args=(mode, broker.bootstrap),
                  env={"MICROBATCH_CRASH_AT": "kafka-sink-record:7"})
    child.proc.wait(240)                       # it kills itself after a task's 7th record
    assert child.proc.returncode == -9, child.proc.returncode
    child.kill()
    written_before_restart = len(broker.read_all(topic))
    assert not batch_ids(ckpt / "commits"), "the crash was meant to land inside batch 0"
    assert 0 < written_before_restart < 40, written_before_restart
    child = Child(src, topic, ckpt, tmp_path / "child.log", script=CHILD, args=(mode, broker.bootstrap))
    wait_for(lambda: max(batch_ids(ckpt / "commits"), default=-1) >= 2, 240, "all three batches", every=0.002)
    child.kill()
    return expected, [m.value().decode() for m in broker.read_all(topic)], written_before_restart


def test_exactly_once_kafka_sink_writes_each_row_once_across_a_kill_mid_write(broker, tmp_path):
    rows, got, before = _crash_in_the_middle_of_a_sink_write(broker, tmp_path, "sink", "eo-out")
    expected = sorted(f"{r['name']}-{r['id']}" for r in rows)
    counts = collections.Counter(got)
    assert sorted(counts) == expected
    assert max(counts.values()) == 1, (before, [v for v, n in counts.items() if n > 1][:5])


def test_without_the_option_the_kafka_sink_is_at_least_once_as_sparks(broker, tmp_path):
    rows, got, before = _crash_in_the_middle_of_a_sink_write(broker, tmp_path, "sink-at-least-once",
                                                             "alo-out")
    counts = collections.Counter(got)
    assert sorted(counts) == sorted(f"{r['name']}-{r['id']}" for r in rows)
    assert sum(counts.values()) == len(rows) + before      # the re-run wrote batch 0 again
