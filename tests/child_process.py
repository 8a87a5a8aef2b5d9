"""Child processes for the SIGKILL tests: a query in a process group of its own.

``Child`` starts a script (``kafka_child.py``) in a new session; the test reads the lines
it prints (``STARTED``, ``PROGRESS <batchId>`` from ``PrintProgress``) and kills the
whole group (the Python driver, Spark's JVM and the Python workers) with SIGKILL. The
file-source pipelines' kills live in ``microbatch.testing.chaos`` (the crash-at-every-step
test and the chaos runner).
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from helpers import wait_for
from microbatch import StreamingQueryListener


def batch_ids(directory) -> set[int]:
    try:
        return {int(n.split(".")[0]) for n in os.listdir(directory) if n.split(".")[0].isdigit()}
    except FileNotFoundError:
        return set()


class Child:
    """``script SRC OUT CKPT *args`` in a process group of its own."""

    def __init__(self, src, out, ckpt, log_path, script, env=None, args=()):
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
                    raise AssertionError(f"the child exited ({self.proc.returncode}); see {self.log.name}") from None
        raise AssertionError(f"no {prefix!r} from the child in {timeout} s; see {self.log.name}")

    def kill(self) -> None:
        """SIGKILL the driver and its JVM, and wait until both are gone."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

        def gone() -> bool:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            return False
        wait_for(gone, 30, "the killed child's processes to end (they survived SIGKILL)")
        self.log.close()


class PrintProgress(StreamingQueryListener):
    """Prints ``PROGRESS <batchId>`` after every batch, for the test to pick its moments."""

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        print(f"PROGRESS {event.progress['batchId']}", flush=True)

    def onQueryTerminated(self, event) -> None:
        pass
