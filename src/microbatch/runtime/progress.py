"""ProgressReporter: time the phases of a trigger and build the query's progress.

Each progress is first written as Spark's StreamingQueryProgress JSON (same fields, same
order, the same fields left out: ``eventTime`` without a watermark, ``observedMetrics``
without ``observe``, empty ``metrics`` maps), so tools that read Spark's progress JSON
read ours. Users get it as PySpark gives it: a
``pyspark.sql.streaming.listener.StreamingQueryProgress`` made from that JSON, as
PySpark's ``StreamingQuery.lastProgress`` makes it (dict access, ``id`` and ``runId`` as
strings by key and ``uuid.UUID`` as attributes, ``eventTime`` ``{}`` when the JSON has
none, ``.json``, ``.prettyJson``). Rates are rounded to one decimal as Spark prints them.
"""
from __future__ import annotations

import collections
import math
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator

from pyspark.sql import Row
from pyspark.sql.streaming.listener import StreamingQueryProgress

from microbatch import spark_internals


def format_timestamp(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _rate(rows: int, seconds: float) -> float:
    if seconds <= 0 or math.isinf(seconds) or math.isnan(seconds):
        return 0.0
    return round(rows / seconds, 1)


class ProgressReporter:
    def __init__(self, query_id: str, run_id: str, name: str | None, clock,
                 num_recent: int = 100, no_data_event_interval_ms: int = 10_000):
        self.id = query_id
        self.run_id = run_id
        self.name = name
        self.clock = clock
        self.no_data_event_interval_ms = no_data_event_interval_ms
        self._recent: collections.deque[StreamingQueryProgress] = collections.deque(maxlen=num_recent)
        self._lock = threading.Lock()
        self._status = {"message": "Initializing StreamExecution", "isDataAvailable": False,
                        "isTriggerActive": False}
        self._durations: dict[str, int] = {}
        self._trigger_start_ms = -1
        self._trigger_start_ns = 0
        self._last_trigger_start_ms = -1
        self._last_idle_event_ms: int | None = None

    # -- status -----------------------------------------------------------
    @property
    def status(self) -> dict:
        with self._lock:
            return dict(self._status)

    def update_status(self, **fields: Any) -> None:
        with self._lock:
            self._status.update(fields)

    def update_status_message(self, message: str) -> None:
        self.update_status(message=message)

    # -- progress ---------------------------------------------------------
    @property
    def recent_progress(self) -> list[StreamingQueryProgress]:
        with self._lock:
            return list(self._recent)

    @property
    def last_progress(self) -> StreamingQueryProgress | None:
        with self._lock:
            return self._recent[-1] if self._recent else None

    def start_trigger(self) -> None:
        self._durations = {}
        self._trigger_start_ms = self.clock.get_time_millis()
        self._trigger_start_ns = time.perf_counter_ns()
        self.update_status(isTriggerActive=True)

    @contextmanager
    def time_phase(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to ``durationMs[phase]``."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            elapsed = (time.perf_counter_ns() - start) // 1_000_000
            self._durations[phase] = self._durations.get(phase, 0) + int(elapsed)

    def finish_trigger(self, has_executed: bool, batch_id: int, sources: list[dict],
                       sink: dict, event_time: dict | None = None,
                       state_operators: list | None = None,
                       observed_metrics: dict[str, tuple[dict, Row]] | None = None
                       ) -> tuple[str, Any]:
        """Close the trigger. Returns ("progress", (progress, progress for the listener
        event)), ("idle", timestamp) or ("none", None). ``observed_metrics``: per name, the
        row as Spark's ``Row.json`` writes it and as a Python ``Row``."""
        processing_ms = (time.perf_counter_ns() - self._trigger_start_ns) // 1_000_000
        self._durations["triggerExecution"] = int(processing_ms)
        if self._last_trigger_start_ms >= 0:
            input_seconds = (self._trigger_start_ms - self._last_trigger_start_ms) / 1000.0
        else:
            input_seconds = math.inf
        processing_seconds = processing_ms / 1000.0
        timestamp = format_timestamp(self._trigger_start_ms)
        self._last_trigger_start_ms = self._trigger_start_ms
        self.update_status(isTriggerActive=False)
        if not has_executed:
            now = self.clock.get_time_millis()
            if (self._last_idle_event_ms is None
                    or now - self.no_data_event_interval_ms >= self._last_idle_event_ms):
                self._last_idle_event_ms = now
                return "idle", timestamp
            return "none", None
        self._last_idle_event_ms = None
        num_input_rows = sum(s["numInputRows"] for s in sources)
        for s in sources:
            s["inputRowsPerSecond"] = _rate(s["numInputRows"], input_seconds)
            s["processedRowsPerSecond"] = _rate(s["numInputRows"], processing_seconds)
        data: dict[str, Any] = {
            "id": self.id,
            "runId": self.run_id,
            "name": self.name,
            "timestamp": timestamp,
            "batchId": batch_id,
            "batchDuration": int(processing_ms),
            "numInputRows": num_input_rows,
            "inputRowsPerSecond": _rate(num_input_rows, input_seconds),
            "processedRowsPerSecond": _rate(num_input_rows, processing_seconds),
            "durationMs": dict(sorted(self._durations.items())),
        }
        if event_time:
            data["eventTime"] = event_time
        data["stateOperators"] = [_without_empty(op, "customMetrics") for op in state_operators or []]
        data["sources"] = [_without_empty(s, "metrics") for s in sources]
        data["sink"] = _without_empty(sink, "metrics")
        if observed_metrics:
            data["observedMetrics"] = {name: row_json for name, (row_json, _) in observed_metrics.items()}
        progress = StreamingQueryProgress.fromJson(data)
        with self._lock:
            self._recent.append(progress)
        # PySpark's listener events carry the observed rows with their Python types, its
        # lastProgress the rows as read back from JSON.
        event_progress = progress
        if observed_metrics:
            event_progress = spark_internals.with_observed_rows(
                StreamingQueryProgress.fromJson(data), {name: row for name, (_, row) in observed_metrics.items()})
        return "progress", (progress, event_progress)


def _without_empty(entry: dict, key: str) -> dict:
    """Spark leaves an empty map out of the JSON."""
    if key in entry and not entry[key]:
        entry = {k: v for k, v in entry.items() if k != key}
    return entry
