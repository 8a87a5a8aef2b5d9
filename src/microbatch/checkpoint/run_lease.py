"""One run at a time: the run lease of a checkpoint, ``<checkpoint>/leases/<n>``.

A run that starts takes lease n+1 over the newest lease n with a create-if-absent write
(an exclusive create on local disk, a conditional PUT on object storage), so of two runs
that start at once exactly one wins. It refuses to start while lease n belongs to a live
run:

- a run on this host is live while its process (pid and process start time) exists, so a
  run killed on this host never blocks a restart;
- a run on another host is live while its heartbeat (rewritten every quarter of
  ``spark.sql.streaming.microbatch.runLeaseTimeout``, default 60 s) is younger than the
  timeout, so a run that died elsewhere blocks a restart for at most the timeout.

Fencing: before a run writes an ``offsets`` or ``commits`` entry it checks that no newer
lease exists (one file's existence). A run whose lease was taken over (its heartbeat
stopped for longer than the timeout, e.g. a host that froze) fails there with a clear
error, before it writes. A clean stop marks the lease released.

Each lease is a small JSON document: run and query id, host, pid, process start time,
start and heartbeat times, and once the run ended its end time and, for a run that
failed, the error's message (what the dashboard of a checkpoint shows of its runs).
Spark's own engine ignores the directory.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.errors import ConcurrentUpdateError

log = logging.getLogger(__name__)

TIMEOUT_CONF = "spark.sql.streaming.microbatch.runLeaseTimeout"
DEFAULT_TIMEOUT_MS = 60_000
_KEEP = 5   # older leases are deleted


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), or None if it
    does not exist; "" where /proc is missing but the process exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
            return ""
        except ProcessLookupError:
            return None
        except PermissionError:
            return ""


#: The runs whose lease this process holds now. A run of this process that ended without
#: marking its lease released (the write failed: a full disk, a store down) is not live,
#: though its process is: the lease record alone cannot tell, this set can.
_HELD_HERE: set[str] = set()


class RunLease:
    def __init__(self, fs: CheckpointFileSystem, checkpoint_root: str, query_id: str, run_id: str,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.fs = fs
        self.path = f"{checkpoint_root}/leases"
        self.checkpoint_root = checkpoint_root
        self.query_id = query_id
        self.run_id = run_id
        self.timeout_ms = timeout_ms
        self.number: int | None = None
        self._record: dict[str, Any] = {}
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # -- reading ----------------------------------------------------------------------
    def _numbers(self) -> list[int]:
        return sorted(int(n) for n in self.fs.list(self.path) if n.isdigit())

    def runs(self) -> list[dict[str, Any]]:
        """The records of the runs whose leases are kept, oldest first, each with
        ``live``: why the run is live, or None."""
        found = []
        numbers = self._numbers()
        for number in numbers:
            record = self._read(number)
            if record is not None:
                superseded = number != numbers[-1]
                found.append({**record, "lease": number,
                              "live": None if superseded else self._live(record)})
        return found

    def _read(self, number: int) -> dict[str, Any] | None:
        try:
            return json.loads(self.fs.read_text(f"{self.path}/{number}"))
        except (FileNotFoundError, ValueError):
            return None   # gone, or torn by a crash mid-write: no live run keeps it that way

    def _live(self, record: dict[str, Any]) -> str | None:
        """Why the run of ``record`` is live, or None when it is not."""
        if record.get("released"):
            return None
        if record.get("host") == socket.gethostname():
            started = process_start(int(record.get("pid", -1)))
            if started is not None and started == record.get("processStart"):
                if int(record["pid"]) == os.getpid() and record.get("runId") not in _HELD_HERE:
                    return None      # ended in this process; its release could not be written
                return f"its process {record['pid']} on this host is running"
            return None
        age_ms = int(time.time() * 1000) - int(record.get("heartbeatMs", 0))
        if age_ms < self.timeout_ms:
            return (f"its heartbeat from host {record.get('host')} is {age_ms / 1000:.0f} s old "
                    f"(a run is taken for dead after {self.timeout_ms / 1000:.0f} s, "
                    f"{TIMEOUT_CONF})")
        return None

    def _refusal(self, record: dict[str, Any], why: str) -> ConcurrentUpdateError:
        return ConcurrentUpdateError(
            f"Another run of this query is active on checkpoint '{self.checkpoint_root}': run "
            f"{record.get('runId')} (process {record.get('pid')} on host {record.get('host')}, "
            f"started {record.get('startedAt')}); {why}. Stop that run first: one checkpoint "
            "takes one run at a time, or the two would write the same batches.")

    # -- the lease --------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease or raise ``ConcurrentUpdateError`` naming the live run."""
        self.fs.mkdirs(self.path)
        numbers = self._numbers()
        newest = numbers[-1] if numbers else 0
        if numbers:
            record = self._read(newest)
            why = self._live(record) if record else None
            if why:
                raise self._refusal(record, why)
        now_ms = int(time.time() * 1000)
        pid = os.getpid()
        self._record = {"runId": self.run_id, "queryId": self.query_id, "host": socket.gethostname(),
                        "pid": pid, "processStart": process_start(pid),
                        "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000)),
                        "heartbeatMs": now_ms}
        if not self.fs.create(f"{self.path}/{newest + 1}", json.dumps(self._record)):
            record = self._read(newest + 1) or {}
            raise self._refusal(record, "it started at the same moment and took the lease first")
        self.number = newest + 1
        _HELD_HERE.add(self.run_id)
        for old in numbers[:-_KEEP]:
            self.fs.delete(f"{self.path}/{old}")
        self._heartbeat = threading.Thread(target=self._beat, daemon=True,
                                           name=f"run lease heartbeat of {self.run_id}")
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.timeout_ms / 4000):
            self._record["heartbeatMs"] = int(time.time() * 1000)
            try:
                if not self.fs.exists(f"{self.path}/{self.number + 1}"):
                    self.fs.write(f"{self.path}/{self.number}", json.dumps(self._record))
            except Exception:  # a missed heartbeat is retried; fencing guards writes
                log.warning("Cannot renew the run lease %s/%s", self.path, self.number, exc_info=True)

    def check(self) -> None:
        """Fencing: raise if a newer run took the lease over."""
        if self.number is None or not self.fs.exists(f"{self.path}/{self.number + 1}"):
            return
        record = self._read(self.number + 1) or {}
        raise ConcurrentUpdateError(
            f"Another run of this query is active on checkpoint '{self.checkpoint_root}': run "
            f"{record.get('runId')} (process {record.get('pid')} on host {record.get('host')}) "
            f"took this run's lease over (this run's heartbeat was older than "
            f"{self.timeout_ms / 1000:.0f} s). This run stops before writing anything more.")

    def release(self, failure: str | None = None) -> None:
        """Mark the lease released; ``failure``: the message of the error that ended the run
        (the checkpoint's dashboard shows it)."""
        self._stop.set()
        _HELD_HERE.discard(self.run_id)
        if self._heartbeat is not None:
            self._heartbeat.join(5)
        if self.number is None:
            return
        try:
            if not self.fs.exists(f"{self.path}/{self.number + 1}"):
                record = {**self._record, "released": True,
                          "endedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                if failure is not None:
                    record["failure"] = failure
                self.fs.write(f"{self.path}/{self.number}", json.dumps(record))
        except Exception:  # the next run finds the process gone instead
            log.warning("Cannot release the run lease %s/%s", self.path, self.number, exc_info=True)
        self.number = None
