"""What the dashboard and the metrics know of a query: its batches, status and failure.

Two places know it:

- ``ProcessQueries``: the queries this process runs, from their listener events (a
  ``StreamingQueryListener`` on the session's ``ss.streams``, as Spark UI's streaming tab
  is fed by Spark's listener bus). It keeps, like Spark UI,
  ``spark.sql.streaming.ui.retainedQueries`` queries (100) and
  ``spark.sql.streaming.ui.retainedProgressUpdates`` progress updates of each (100).
- ``CheckpointQueries``: queries known only by their checkpoints, read-only: the runs from
  the run leases (``leases/``: live, stopped, failed with its message, or killed) and the
  batches from the progress log (``progress/``), read again as they grow, so the page of
  a checkpoint whose query runs elsewhere is live too.

Both give ``QueryHistory`` objects: a summary for the list of queries, the progress of
each batch (Spark's progress JSON, as dicts), the plan and the failure.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
from typing import Any, Iterable

from pyspark.sql.streaming import StreamingQueryListener

from microbatch.checkpoint.fs import CheckpointFileSystem

from microbatch.checkpoint.stores import storage_for
from microbatch.checkpoint.progress_log import ProgressLog
from microbatch.checkpoint.run_lease import RunLease
from microbatch.checkpoint.stream_metadata import StreamMetadata

log = logging.getLogger(__name__)

RUNNING, FINISHED, FAILED, KILLED = "RUNNING", "FINISHED", "FAILED", "KILLED"
RETAINED_QUERIES_CONF = "spark.sql.streaming.ui.retainedQueries"
RETAINED_PROGRESS_CONF = "spark.sql.streaming.ui.retainedProgressUpdates"


class QueryHistory:
    """One query (a run of it in this process, or a checkpoint's query)."""

    def __init__(self, key: str, origin: str, retained: int):
        self.key = key
        self.origin = origin              # "process" or "checkpoint"
        self.id: str | None = None
        self.run_id: str | None = None
        self.name: str | None = None
        self.checkpoint: str | None = None
        self.status = RUNNING
        self.started_at: str | None = None
        self.exception: str | None = None
        self.plan: str | None = None
        #: a processing-time trigger's interval (None: another trigger, or a checkpoint's query)
        self.trigger_interval_ms: int | None = None
        self.runs: list[dict[str, Any]] = []
        self._progress: collections.deque[dict[str, Any]] = collections.deque(maxlen=retained)
        self.lock = threading.Lock()

    def add_progress(self, progress: dict[str, Any]) -> None:
        with self.lock:
            if self._progress and progress["batchId"] <= self._progress[-1]["batchId"] \
                    and progress.get("runId") == self._progress[-1].get("runId"):
                return
            self._progress.append(progress)

    def progress(self, after_batch: int = -1, after_timestamp: str = "") -> list[dict[str, Any]]:
        """The kept progress updates newer than (``after_timestamp``, ``after_batch``):
        a restarted query's batch ids go on from its checkpoint, so the pair orders them."""
        with self.lock:
            return [p for p in self._progress
                    if (p["timestamp"], p["batchId"]) > (after_timestamp, after_batch)]

    @property
    def last_progress(self) -> dict[str, Any] | None:
        with self.lock:
            return self._progress[-1] if self._progress else None

    def summary(self) -> dict[str, Any]:
        last = self.last_progress or {}
        return {"key": self.key, "origin": self.origin, "name": self.name, "id": self.id,
                "runId": self.run_id, "status": self.status, "checkpoint": self.checkpoint,
                "startedAt": self.started_at, "batchId": last.get("batchId"),
                "inputRowsPerSecond": last.get("inputRowsPerSecond"),
                "processedRowsPerSecond": last.get("processedRowsPerSecond"),
                "watermark": (last.get("eventTime") or {}).get("watermark"),
                "stateRows": sum(op.get("numRowsTotal", 0) for op in last.get("stateOperators", [])),
                "exception": self.exception}

    def refresh(self) -> None:
        """Bring the history up to date (a checkpoint's is read again; a process's is fed)."""


class ProcessQueries(StreamingQueryListener):
    """The queries of this process, fed by their listener events."""

    def __init__(self, manager: Any, retained_queries: int = 100, retained_progress: int = 100):
        self._manager = manager
        self._retained_queries = retained_queries
        self._retained_progress = retained_progress
        self._histories: "collections.OrderedDict[str, QueryHistory]" = collections.OrderedDict()
        self._executions: dict[str, Any] = {}
        self._lock = threading.Lock()
        for query in manager.active:   # queries started before the dashboard
            history = self._start(query.runId, query.id, query.name, query._execution)
            for progress in query.recentProgress:
                history.add_progress(json.loads(progress.json))

    def _start(self, run_id: str, query_id: str, name: str | None, execution: Any) -> QueryHistory:
        history = QueryHistory(str(run_id), "process", self._retained_progress)
        history.id, history.run_id, history.name = str(query_id), str(run_id), name
        if execution is not None:
            history.checkpoint = execution.checkpoint_root
            history.trigger_interval_ms = execution.trigger.interval_ms or None
        with self._lock:
            self._histories[history.key] = history
            self._executions[history.key] = execution
            self._forget_finished()
        return history

    def _forget_finished(self) -> None:
        while len(self._histories) > self._retained_queries:
            finished = [k for k, h in self._histories.items() if h.status != RUNNING]
            if not finished:
                return
            self._histories.pop(finished[0])
            self._executions.pop(finished[0], None)

    def histories(self) -> list[QueryHistory]:
        """The queries' histories, a query that has ended marked so even before its
        ``onQueryTerminated`` reaches this listener: the listener bus is asynchronous, while
        the manager forgets a query before ``stop()`` returns (as Spark removes a query's
        metrics source in the query thread before ``stop()`` returns)."""
        active = {str(query.runId) for query in self._manager.active}
        with self._lock:
            histories = list(self._histories.values())
            for history in histories:
                execution = self._executions.get(history.key)
                if (history.status == RUNNING and execution is not None
                        and history.key not in active and not execution.is_active):
                    history.status = FAILED if execution.failed else FINISHED
            return histories

    def plan(self, history: QueryHistory) -> str | None:
        execution = self._executions.get(history.key)
        if execution is not None:
            try:
                history.plan = execution.explain_string()
            except Exception:  # a plan that cannot be printed is left out
                log.debug("Cannot print the plan of %s", history.key, exc_info=True)
        return history.plan

    # -- the listener ---------------------------------------------------------------
    def onQueryStarted(self, event) -> None:
        query = self._manager.get(str(event.id))
        history = self._start(event.runId, event.id, event.name,
                              query._execution if query is not None else None)
        history.started_at = event.timestamp

    def onQueryProgress(self, event) -> None:
        with self._lock:
            history = self._histories.get(str(event.progress.runId))
        if history is not None:
            history.add_progress(json.loads(event.progress.json))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        with self._lock:
            history = self._histories.get(str(event.runId))
        if history is not None:
            self.plan(history)
            history.exception = event.exception
            history.status = FAILED if event.exception else FINISHED
            with self._lock:
                self._executions.pop(history.key, None)


class CheckpointHistory(QueryHistory):
    """A query known by its checkpoint: runs from the leases, batches from the progress log."""

    def __init__(self, fs: CheckpointFileSystem, root: str, retained: int):
        super().__init__(hashlib.sha1(root.encode()).hexdigest()[:12], "checkpoint", retained)
        self.fs = fs
        self.checkpoint = root
        self._log = ProgressLog(fs, root)
        self._last_read = -1

    def refresh(self) -> None:
        if self.id is None and self.fs.exists(f"{self.checkpoint}/metadata"):
            self.id = StreamMetadata.read_or_create(self.fs, self.checkpoint).id
        runs = RunLease(self.fs, self.checkpoint, self.id or "", "").runs()
        for batch_id, entry in self._log.entries(self._last_read):
            self.add_progress(entry["progress"])
            self.plan = entry.get("plan") or self.plan
            self._last_read = batch_id
        last = self.last_progress or {}
        self.name = last.get("name", self.name)
        self.runs = runs
        if not runs:
            self.status = FINISHED if last else RUNNING
            return
        run = runs[-1]
        self.run_id, self.started_at = run.get("runId"), run.get("startedAt")
        self.exception = run.get("failure")
        if run["live"]:
            self.status = RUNNING
        elif run.get("released"):
            self.status = FAILED if run.get("failure") else FINISHED
        else:
            self.status = KILLED


class CheckpointQueries:
    """Queries given by their checkpoint locations (local or S3), read-only."""

    def __init__(self, locations: Iterable[str], settings: dict[str, str] | None = None,
                 retained_progress: int = 100):
        self._histories: list[CheckpointHistory] = []
        for location in locations:
            fs = storage_for(location, settings or {})
            self._histories.append(CheckpointHistory(fs, fs.resolve(location), retained_progress))

    def histories(self) -> list[QueryHistory]:
        for history in self._histories:
            try:
                history.refresh()
            except Exception as e:  # noqa: BLE001 - one unreadable checkpoint does not hide the others
                history.status, history.exception = FAILED, f"Cannot read the checkpoint: {e}"
        return list(self._histories)

    def plan(self, history: QueryHistory) -> str | None:
        return history.plan
