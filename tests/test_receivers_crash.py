"""Exactly once for an http source across SIGKILLs while clients keep sending.

Real processes: a child query (receiver_child.py: http -> parquet) in its own process
group, its JVM and Python workers, killed with SIGKILL at chosen steps (a block durable
and its senders not yet answered; the sink's manifest written) and at random moments.
Client threads send numbered records in requests with an ``Idempotency-Key`` and retry
each request until it is answered 200. Afterwards every record sent is in the sink
exactly once.
"""
from __future__ import annotations

import collections
import json
import os
import random
import threading
import time

import pytest
import requests

from child_process import Child
from helpers import wait_for
from test_receivers import free_port

pytestmark = pytest.mark.faults

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "receiver_child.py")


class Sender(threading.Thread):
    """Sends ids client*1_000_000 + 0, 1, ... in requests of 1-5 records until told to
    stop, each request retried (same key, same records) until it is acknowledged."""

    def __init__(self, client: int, url: str, seed: int, deadline: float):
        super().__init__(daemon=True)
        self.client, self.url, self.deadline = client, url, deadline
        self.rng = random.Random(seed)
        self.acked: list[int] = []
        self.stop = threading.Event()
        self.error: str | None = None
        self.retries = 0
        self.duplicates = 0

    def run(self) -> None:
        next_id, seq = self.client * 1_000_000, 0
        while not self.stop.is_set():
            ids = list(range(next_id, next_id + self.rng.randint(1, 5)))
            body = "".join(json.dumps({"id": i, "client": self.client}) + "\n" for i in ids)
            headers = {"Content-Type": "application/x-ndjson", "Idempotency-Key": f"c{self.client}-{seq}"}
            while True:
                if time.monotonic() > self.deadline:
                    self.error = "the deadline passed with a request unacknowledged"
                    return
                try:
                    answer = requests.post(self.url, data=body, headers=headers, timeout=10)
                except requests.RequestException:
                    self.retries += 1
                    time.sleep(0.1)
                    continue
                if answer.status_code == 200:
                    self.duplicates += bool(answer.json().get("duplicate"))
                    break
                if answer.status_code in (429, 503):
                    self.retries += 1
                    time.sleep(min(1.0, float(answer.headers.get("Retry-After", "1"))))
                    continue
                self.error = f"answer {answer.status_code}: {answer.text[:200]}"
                return
            self.acked.extend(ids)
            next_id += len(ids)
            seq += 1
            time.sleep(self.rng.uniform(0.0, 0.03))


@pytest.mark.parametrize("ack_mode", ["interval", "block"])
def test_every_acknowledged_record_is_in_the_sink_once_across_sigkills(spark, tmp_path, ack_mode):
    port, out, ckpt = free_port(), tmp_path / "out", tmp_path / "ckpt"
    url = f"http://127.0.0.1:{port}/"
    rng = random.Random(f"receivers-{ack_mode}")
    deadline = time.monotonic() + 420
    senders = [Sender(c, url, rng.random(), deadline) for c in range(3)]
    for s in senders:
        s.start()
    steps = ["receiver-block-written:15", "random", "sink-manifest-written:3", "random"]
    for step in steps:
        env = {} if step == "random" else {"MICROBATCH_CRASH_AT": step}
        child = Child(port, out, ckpt, tmp_path / "child.log", script=CHILD, args=(ack_mode,), env=env)
        if step == "random":
            child.wait_for("PROGRESS", timeout=180)
            time.sleep(rng.uniform(0.2, 2.0))
        else:
            child.proc.wait(240)
            assert child.proc.returncode == -9, (step, child.proc.returncode)
        child.kill()
        assert all(s.error is None and s.is_alive() for s in senders), [s.error for s in senders]

    child = Child(port, out, ckpt, tmp_path / "child.log", script=CHILD, args=(ack_mode,))
    try:
        child.wait_for("PROGRESS", timeout=180)
        time.sleep(1.0)
        for s in senders:
            s.stop.set()
        for s in senders:
            s.join(60)
        assert all(s.error is None and not s.is_alive() for s in senders), [s.error for s in senders]
        acked = collections.Counter(i for s in senders for i in s.acked)

        def sink_has_all() -> bool:
            try:
                rows = spark.read.parquet(str(out)).select("id").collect()
            except Exception:   # noqa: BLE001 - no committed batch yet
                return False
            return len(rows) >= sum(acked.values())
        wait_for(sink_has_all, 180, "every acknowledged record in the sink", every=0.5)
    finally:
        child.kill()
    counts = collections.Counter(r.id for r in spark.read.parquet(str(out)).select("id").collect())
    assert set(counts) == set(acked), (len(counts), len(acked))
    assert [i for i, n in counts.items() if n != 1] == []
    print(f"{ack_mode}: {sum(acked.values())} records acknowledged, {sum(s.retries for s in senders)} "
          f"retries, {sum(s.duplicates for s in senders)} retries answered as already logged")
    assert sum(s.retries for s in senders) > 0    # the kills were felt by the clients
    # the first kill came after a block was durable and before its senders heard: their
    # retries found their keys in the log
    assert sum(s.duplicates for s in senders) > 0
