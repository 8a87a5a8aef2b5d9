"""Kill a running query with SIGKILL, again and again; vanilla Spark must still see every row once.

A child process runs json -> parquet with a processing-time trigger. The test
kills its whole process group (the Python driver and Spark's JVM) at random
moments and at chosen steps of the batch protocol (after ``offsets/N`` is
written; after the sink logged batch N but before ``commits/N``), adds input
between runs, then finishes the job in this process and reads the output with
plain ``spark.read.parquet``.
"""
from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

import crash_child
from file_inputs import write_json_files

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_child.py")
ROWS_PER_FILE = 20


def batch_ids(directory) -> set[int]:
    try:
        return {int(n.split(".")[0]) for n in os.listdir(directory) if n.split(".")[0].isdigit()}
    except FileNotFoundError:
        return set()


class Child:
    """A query in a process of its own group; ``script`` and ``env`` for other children."""

    def __init__(self, src, out, ckpt, log_path, script=CHILD, env=None, args=()):
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP="127.0.0.1", **(env or {}))
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen([sys.executable, script, str(src), str(out), str(ckpt),
                                      *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.lines.get(timeout=0.2).startswith(prefix):
                    return
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise AssertionError(f"the child exited ({self.proc.returncode}); see {self.log.name}")
        raise AssertionError(f"no {prefix!r} from the child in {timeout} s; see {self.log.name}")

    def kill(self) -> None:
        """SIGKILL the driver and its JVM, and wait until both are gone."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                self.log.close()
                return
            time.sleep(0.05)
        raise AssertionError("processes of the killed child survived SIGKILL")


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_at_random_moments_then_run_to_the_end(ss, spark, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    rng = random.Random(20261122)
    rows = write_json_files(src, 0, 40, rows_per_file=ROWS_PER_FILE)
    next_file = 40
    offsets, commits, sink_log = ckpt / "offsets", ckpt / "commits", out / "_spark_metadata"

    def uncommitted_batch() -> bool:
        return max(batch_ids(offsets), default=-1) > max(batch_ids(commits), default=-1)

    def sink_logged_but_uncommitted() -> bool:
        return bool(batch_ids(sink_log) - batch_ids(commits))

    kills = []
    for plan in ["random", "after offsets/N", "random", "after _spark_metadata/N", "random"]:
        child = Child(src, out, ckpt, tmp_path / "child.log")
        child.wait_for("STARTED", timeout=180)
        if plan == "random":
            child.wait_for("PROGRESS", timeout=120)
            time.sleep(rng.uniform(0.0, 2.5))
        elif plan == "after offsets/N":
            wait_until(uncommitted_batch, 120, "a batch in flight")
        else:
            wait_until(sink_logged_but_uncommitted, 120, "a batch logged by the sink, not committed")
        child.kill()
        kills.append((plan, sorted(batch_ids(offsets))[-1:], sorted(batch_ids(commits))[-1:],
                      uncommitted_batch()))
        rows += write_json_files(src, next_file, 3, rows_per_file=ROWS_PER_FILE)
        next_file += 3

    assert sum(1 for *_, in_flight in kills if in_flight) >= 2, kills
    assert max(batch_ids(commits)) >= 5, f"the children made too little progress: {kills}"

    query = crash_child.writer(ss, str(src), str(out), str(ckpt)).trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert query.exception() is None

    got = sorted((r.id, r.name, r.label) for r in spark.read.parquet(str(out)).collect())
    expected = sorted((r["id"], r["name"], f"{r['name']}-{r['id']}") for r in rows if r["id"] % 3 != 0)
    assert got == expected, f"kills: {kills}"
    assert len(got) == len(set(got)), "a row was written twice"
