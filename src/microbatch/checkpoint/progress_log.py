"""The progress log: ``<checkpoint>/progress/<batchId>``, what each batch did.

Spark keeps a query's progress in memory (and, with event logging on, in the event log
its History Server reads). microbatch also keeps it beside the batch logs, so the
checkpoint tells how its batches ran to any process that reads it: the dashboard of a
checkpoint (``microbatch ui CKPT``, read-only, from another process or host), ``microbatch
checkpoint explain N`` and ``diff``, and ``rollback`` (which finds the file sink's output
from the sink's description). Each entry is one JSON document::

    {"progress": <the batch's StreamingQueryProgress JSON, Spark's fields>,
     "plan": "<the run's plan, as query.explain() prints it>"}

Entries are written after ``commits/N`` on a background thread, off the batch's path: a
crash may lose the newest entry, never a batch. They are purged with the offsets and
commits (``minBatchesToRetain``). ``spark.sql.streaming.microbatch.progressLog.enabled``
(default true) turns the log off; Spark's engine ignores the directory.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from typing import Any

from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.errors import CheckpointError

log = logging.getLogger(__name__)

ENABLED_CONF = "spark.sql.streaming.microbatch.progressLog.enabled"
DIRECTORY = "progress"


class ProgressLog:
    """Reads the progress log of a checkpoint."""

    def __init__(self, fs: CheckpointFileSystem, checkpoint_root: str):
        self.fs = fs
        self.path = f"{checkpoint_root}/{DIRECTORY}"

    def batch_file(self, batch_id: int) -> str:
        return f"{self.path}/{batch_id}"

    def batch_ids(self) -> list[int]:
        return sorted(int(n) for n in self.fs.list(self.path) if n.isdigit())

    def get(self, batch_id: int) -> dict[str, Any] | None:
        """The entry of ``batch_id`` (``progress`` and ``plan``), or None if there is none."""
        path = self.batch_file(batch_id)
        try:
            text = self.fs.read_text(path)
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(text)
            if not isinstance(entry, dict) or not isinstance(entry.get("progress"), dict):
                raise ValueError("no 'progress' object")
            return entry
        except ValueError as e:
            raise CheckpointError(
                f"The progress log entry '{path}' is damaged ({e}). It only describes how batch "
                f"{batch_id} ran, no batch depends on it: delete it.") from None

    def entries(self, after: int = -1) -> list[tuple[int, dict[str, Any]]]:
        """Every readable entry with a batch id above ``after``, oldest first (a damaged one
        is skipped with a warning: the log is informational)."""
        found = []
        for batch_id in self.batch_ids():
            if batch_id <= after:
                continue
            try:
                entry = self.get(batch_id)
            except CheckpointError as e:
                log.warning("%s", e)
                continue
            if entry is not None:
                found.append((batch_id, entry))
        return found


class ProgressLogWriter(ProgressLog):
    """Writes a run's entries on a thread of its own; ``close()`` writes what is queued."""

    def __init__(self, fs: CheckpointFileSystem, checkpoint_root: str):
        super().__init__(fs, checkpoint_root)
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._made_directory = False

    def add(self, batch_id: int, progress_json: str, plan: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_queued, daemon=True,
                                            name=f"progress log writer of {self.path}")
            self._thread.start()
        self._queue.put(("add", batch_id, progress_json, plan))

    def purge(self, threshold_batch_id: int) -> None:
        if self._thread is not None:
            self._queue.put(("purge", threshold_batch_id, None, None))

    def _write_queued(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._apply(*item)
            except Exception:  # the log is informational: a batch never fails on it
                log.warning("Cannot write the progress log %s", self.path, exc_info=True)
            finally:
                self._queue.task_done()

    def _apply(self, what: str, batch_id: int, progress_json: str | None, plan: str | None) -> None:
        if what == "purge":
            for old in self.batch_ids():
                if old < batch_id:
                    self.fs.delete(self.batch_file(old))
            return
        if not self._made_directory:
            self.fs.mkdirs(self.path)
            self._made_directory = True
        self.fs.write(self.batch_file(batch_id),
                      '{"progress":' + progress_json + ',"plan":' + json.dumps(plan) + "}")

    def close(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None
