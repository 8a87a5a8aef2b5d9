"""Exactly once for an http source across SIGKILLs while clients keep sending.

Real processes: a child query (receiver_child.py: http -> parquet) in its own process
group, its JVM and Python workers, killed with SIGKILL at chosen steps (a block durable
and its senders not yet answered; the sink's manifest written) and at random moments.
Client threads (``microbatch.testing.ingest_clients``) send numbered records in requests
with an ``Idempotency-Key`` and retry each request until it is answered 200. Afterwards
every record sent is in the sink exactly once. The chaos runner's ``receiver`` kind does
the same at random moments only, in the source's default ``ackMode`` (``block``).
"""
from __future__ import annotations

import collections
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from child_process import Child
from helpers import wait_for
from microbatch.testing.ingest_clients import start_senders, stop_senders
from test_receivers import free_port

pytestmark = pytest.mark.faults

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "receiver_child.py")


def test_every_acknowledged_record_is_in_the_sink_once_across_sigkills(spark, tmp_path):
    ack_mode = "interval"   # group commit: a block holds several clients' requests
    port, out, ckpt = free_port(), tmp_path / "out", tmp_path / "ckpt"
    url = f"http://127.0.0.1:{port}/"
    rng = random.Random(f"receivers-{ack_mode}")
    deadline = time.monotonic() + 420
    senders = start_senders(url, 3, rng, deadline)
    steps = ["receiver-block-written:15", "random", "sink-manifest-written:3"]
    for step in steps:
        env = {} if step == "random" else {"MICROBATCH_CRASH_AT": step}
        child = Child(port, out, ckpt, tmp_path / "child.log", script=CHILD, args=(ack_mode,), env=env)
        if step == "random":
            child.wait_for("PROGRESS", timeout=180)
            time.sleep(rng.uniform(0.2, 2.0))   # (deliberate: the kill lands at a random moment)
        else:
            child.proc.wait(240)
            assert child.proc.returncode == -9, (step, child.proc.returncode)
        child.kill()
        assert all(s.error is None and s.is_alive() for s in senders), [s.error for s in senders]

    child = Child(port, out, ckpt, tmp_path / "child.log", script=CHILD, args=(ack_mode,))
    try:
        child.wait_for("PROGRESS", timeout=180)
        time.sleep(1.0)     # (deliberate: the senders go on a while against the last run)
        acked = collections.Counter(stop_senders(senders))

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


@pytest.mark.extended   # kills as the tests above, from the chaos runner (make test-extended)
def test_a_short_chaos_seed_of_the_receiver_kind_is_exactly_once(tmp_path):
    """The chaos runner's ``receiver`` kind, as users run it: two kills at random moments
    while its clients send; its own check says every acknowledged record is in the sink once."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, "-m", "microbatch.testing.chaos", "--kills", "2", "--kinds", "receiver",
                           "--seed", "20261127", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert len(re.findall(r"^  receiver: kill \d/2 ", out, re.M)) == 2, out
    summary = re.search(r"^receiver: 2 kills, 2 restarts, rows in (\d+), rows out (\d+), "
                        r"missing 0, written twice 0: EXACTLY ONCE$", out, re.M)
    assert summary and int(summary.group(1)) > 0 and summary.group(1) == summary.group(2), out


class CountingLineServer:
    """Streams lines ``L0, L1, ...`` (one numbering across connections) to whoever
    connects, about 300 a second, until the connection breaks or ``stop``."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sent = 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    while not self.stop.is_set():
                        conn.sendall("".join(f"L{self.sent + i}\n" for i in range(10)).encode())
                        self.sent += 10
                        time.sleep(0.03)
                except OSError:
                    continue

    def close(self):
        self.stop.set()
        self.sock.close()


def logged_lines(ckpt) -> list[str]:
    """Every line in the socket source's write-ahead log, read back from its blocks."""
    import pyarrow as pa
    directory = ckpt / "sources" / "0" / "blocks"
    lines = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".arrow"):
            with pa.OSFile(str(directory / name)) as f:
                lines += pa.ipc.open_file(f).read_all().column("value").to_pylist()
    return lines


def test_socket_lines_in_the_log_are_in_the_sink_once_across_sigkills(spark, tmp_path):
    """The socket protocol has no acknowledgements: lines read but not yet logged when the
    query dies are lost. Every line that reached the log is in the sink once, and the
    log holds no line twice."""
    server = CountingLineServer()
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    rng = random.Random("receivers-socket")
    try:
        for step in ["receiver-block-written:20", "random"]:
            env = {} if step == "random" else {"MICROBATCH_CRASH_AT": step}
            child = Child(server.port, out, ckpt, tmp_path / "child.log", script=CHILD,
                          args=("interval", "socket"), env=env)
            if step == "random":
                child.wait_for("PROGRESS", timeout=180)
                time.sleep(rng.uniform(0.2, 2.0))   # (deliberate: the kill lands at a random moment)
            else:
                child.proc.wait(240)
                assert child.proc.returncode == -9, (step, child.proc.returncode)
            child.kill()
        child = Child(server.port, out, ckpt, tmp_path / "child.log", script=CHILD, args=("interval", "socket"))
        try:
            child.wait_for("PROGRESS", timeout=180)
            time.sleep(1.0)    # (deliberate: lines flow a while to the last run)
            server.close()     # the peer closes: the receiver logs what it read and stops reading
            time.sleep(1.0)    # (a grace for that to happen)
            logged = logged_lines(ckpt)

            def sink_has_all() -> bool:
                try:
                    return spark.read.parquet(str(out)).count() >= len(logged)
                except Exception:   # noqa: BLE001 - no committed batch yet
                    return False
            wait_for(sink_has_all, 180, "every logged line in the sink", every=0.5)
        finally:
            child.kill()
    finally:
        server.close()
    in_log = collections.Counter(logged)
    in_sink = collections.Counter(r.value for r in spark.read.parquet(str(out)).collect())
    assert [line for line, n in in_log.items() if n != 1] == []
    assert in_sink == in_log
    print(f"socket: {server.sent} lines sent, {len(in_log)} logged and in the sink once")
    assert 0 < len(in_log) <= server.sent
