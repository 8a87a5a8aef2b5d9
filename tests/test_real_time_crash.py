"""Real-time mode across SIGKILL: a Kafka-to-Kafka query killed in the middle of a batch
(records of the batch already in the output topic, its offsets not logged) and started
again loses nothing; with the Kafka sink's exactly-once option it repeats nothing either.
A real broker (Tansu), the child query in a process group of its own."""
from __future__ import annotations

import collections
import json
import os

import pytest

from child_process import Child, batch_ids
from helpers import wait_for

#: a separate bounded step (make test-faults): real processes killed with SIGKILL
pytestmark = pytest.mark.faults

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kafka_child.py")


def _produce(broker, topic: str, start: int, count: int) -> int:
    broker.produce(topic, [(b"%d" % i, b"k%d" % i, i % 2) for i in range(start, start + count)])
    return start + count


def _committed_rows(ckpt) -> int:
    """The input records the last committed batch's end offsets cover."""
    commits = batch_ids(ckpt / "commits")
    if not commits:
        return 0
    offsets = json.loads((ckpt / "offsets" / str(max(commits))).read_text().splitlines()[-1])
    return sum(sum(partitions.values()) for partitions in offsets.values())


@pytest.mark.parametrize("exactly_once", [
    pytest.param(False, id="at-least-once", marks=pytest.mark.extended),   # (CI's minutes: make test-extended)
    pytest.param(True, id="exactly-once")])
def test_a_real_time_query_killed_mid_batch_resumes_without_loss(broker, tmp_path, exactly_once):
    mode = "real-time-exactly-once" if exactly_once else "real-time"
    src, out, ckpt = f"rt-crash-in-{exactly_once}", f"rt-crash-out-{exactly_once}", tmp_path / "ckpt"
    broker.create_topic(src, 2)
    broker.create_topic(out, 2)
    produced = _produce(broker, src, 0, 200)
    child = Child(src, out, ckpt, tmp_path / "child.log", script=CHILD, args=(mode, broker.bootstrap))
    try:
        child.wait_for("PROGRESS", timeout=180)
        produced = _produce(broker, src, produced, 150)
        # (the kill lands once records beyond the last commit's offsets are in the output)
        wait_for(lambda: len({m.value() for m in broker.read_all(out)}) >= _committed_rows(ckpt) + 100, 60,
                 "records of an uncommitted batch in the output")
    finally:
        child.kill()
    written_at_kill = {m.value() for m in broker.read_all(out)}
    committed = _committed_rows(ckpt)
    assert len(written_at_kill) > committed, (len(written_at_kill), committed)

    produced = _produce(broker, src, produced, 50)
    again = Child(src, out, ckpt, tmp_path / "child.log", script=CHILD, args=(mode, broker.bootstrap))
    try:
        wait_for(lambda: len({m.value() for m in broker.read_all(out)}) >= produced, 120, "every record in the output")
        again.wait_for("PROGRESS", timeout=60)     # (a batch after the catch-up: a repeat would be in it)
    finally:
        again.kill()
    values = collections.Counter(m.value() for m in broker.read_all(out))
    assert set(values) == {b"%d" % i for i in range(produced)}
    if exactly_once:
        assert max(values.values()) == 1, [v for v, n in values.items() if n > 1][:10]
    else:       # (Spark's guarantee: the crashed batch's records are written again)
        assert sum(n - 1 for n in values.values()) > 0
