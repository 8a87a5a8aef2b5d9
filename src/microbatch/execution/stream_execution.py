"""StreamExecution: one run of a streaming query on its own daemon thread.

Lifecycle (Spark's): INITIALIZING -> ACTIVE -> TERMINATED. ``start()`` returns
once the thread has posted QueryStartedEvent; ``stop()`` marks the query
terminated, cancels the Spark jobs of the running batch (job group = run id)
and waits for the thread. A failure ends the query with a
``StreamingQueryException`` that ``await_termination`` raises.

The batch runner itself lives in ``micro_batch.MicroBatchExecution``.
"""
from __future__ import annotations

import enum
import logging
import threading
import uuid
from typing import Any, Callable

from pyspark.sql import SparkSession

from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import StreamingQueryException
from microbatch.execution.clock import Clock
from microbatch.execution.events import (ListenerBus, QueryIdleEvent, QueryProgressEvent,
                                         QueryStartedEvent, QueryTerminatedEvent)
from microbatch.execution.progress import ProgressReporter, format_timestamp

log = logging.getLogger(__name__)


class State(enum.Enum):
    INITIALIZING = "INITIALIZING"
    ACTIVE = "ACTIVE"
    TERMINATED = "TERMINATED"


def conf_ms(spark: SparkSession, key: str, default_ms: int) -> int:
    """Read a Spark time conf (``"10ms"``, ``"10s"``, or bare milliseconds)."""
    raw = spark.conf.get(key, None)
    if raw is None:
        return default_ms
    text = str(raw).strip().lower()
    for suffix, factor in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)):
        if text.endswith(suffix) and text[:-len(suffix)].strip().isdigit():
            return int(text[:-len(suffix)]) * factor
    return int(text)


class StreamExecution:
    def __init__(self, spark: SparkSession, name: str | None, checkpoint_root: str,
                 delete_checkpoint_on_stop: bool, clock: Clock, fs: CheckpointFileSystem,
                 listener_bus: ListenerBus, on_terminated: Callable[["StreamExecution"], None]):
        self.spark = spark
        self.name = name
        self.checkpoint_root = checkpoint_root
        self.delete_checkpoint_on_stop = delete_checkpoint_on_stop
        self.clock = clock
        self.fs = fs
        self.listener_bus = listener_bus
        self.on_terminated = on_terminated
        self.id = StreamMetadata.read_or_create(fs, checkpoint_root).id
        self.run_id = str(uuid.uuid4())
        self.state = State.INITIALIZING
        self.stream_death_cause: StreamingQueryException | None = None
        self.progress = ProgressReporter(
            self.id, self.run_id, name, clock,
            num_recent=int(spark.conf.get("spark.sql.streaming.numRecentProgressUpdates", "100")),
            no_data_event_interval_ms=conf_ms(
                spark, "spark.sql.streaming.noDataProgressEventInterval", 10_000))
        self.interrupt = threading.Event()      # set by stop(): ends waits and sleeps
        self.stopped_by_user = False
        self.start_latch = threading.Event()
        self.initialization_latch = threading.Event()
        self.termination_latch = threading.Event()
        self.await_progress = threading.Condition()
        self.no_new_data = False
        self.thread = threading.Thread(
            target=self._run_stream, daemon=True,
            name=f"stream execution thread for {self.pretty_id}")

    @property
    def pretty_id(self) -> str:
        ids = f"[id = {self.id}, runId = {self.run_id}]"
        return f"{self.name} {ids}" if self.name else ids

    @property
    def is_active(self) -> bool:
        return self.state is not State.TERMINATED

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        log.info("Starting %s. Use %s to store the query checkpoint.", self.pretty_id,
                 self.checkpoint_root)
        self.thread.start()
        self.start_latch.wait()

    def _run_stream(self) -> None:
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(self.run_id, self.batch_description("init"), interruptOnCancel=True)
            sc.setLocalProperty("sql.streaming.queryId", self.id)
            self.post(QueryStartedEvent(self.id, self.run_id, self.name,
                                        format_timestamp(self.clock.get_time_millis())))
            self.start_latch.set()
            self.progress.update_status_message("Initializing sources")
            self.initialize()
            if self.state is State.INITIALIZING:
                self.state = State.ACTIVE
                self.initialization_latch.set()
                self.run_activated_stream()
            self.progress.update_status_message("Stopped")
        except BaseException as e:  # noqa: BLE001 - every failure ends the query
            if self.stopped_by_user:
                log.info("Query %s was interrupted by stop(): %s", self.pretty_id,
                         str(e).splitlines()[0] if str(e) else type(e).__name__)
            else:
                self.stream_death_cause = StreamingQueryException(
                    f"Query {self.pretty_id} terminated with exception: {e}", cause=e,
                    query_desc=self.pretty_id)
                self.progress.update_status_message(f"Terminated with exception: {e}")
                log.error("Query %s terminated with error", self.pretty_id, exc_info=e)
        finally:
            self.start_latch.set()
            self.initialization_latch.set()
            self.stop_sources()
            self.state = State.TERMINATED
            self.progress.update_status(isTriggerActive=False, isDataAvailable=False)
            with self.await_progress:
                self.await_progress.notify_all()
            self.on_terminated(self)
            cause = self.stream_death_cause
            self.post(QueryTerminatedEvent(self.id, self.run_id,
                                           None if cause is None else str(cause.cause or cause)))
            if self.delete_checkpoint_on_stop and cause is None:
                self.fs.delete_tree(self.checkpoint_root)
            self.termination_latch.set()

    def stop(self) -> None:
        """Stop the query; blocks until its thread has ended."""
        self.stopped_by_user = True
        self.state = State.TERMINATED
        self.interrupt.set()
        if threading.current_thread() is not self.thread:
            tracker = self.spark.sparkContext.statusTracker()
            # Cancel the running batch's jobs (job group = run id) until the thread has ended;
            # a job that starts during the stop is cancelled on the next round.
            while self.thread.is_alive():
                if set(tracker.getJobIdsForGroup(self.run_id)) & set(tracker.getActiveJobsIds()):
                    self.spark.sparkContext.cancelJobGroup(self.run_id)
                self.thread.join(0.1)
        log.info("Query %s was stopped", self.pretty_id)

    def await_termination(self, timeout: float | None = None) -> bool:
        if threading.current_thread() is self.thread:
            raise RuntimeError("Cannot wait for a query state from the same thread that is running the query")
        finished = self.termination_latch.wait(timeout)
        if self.stream_death_cause is not None:
            raise self.stream_death_cause
        return finished

    def process_all_available(self) -> None:
        """Block until every source's available data is processed, or the query ends."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("Cannot wait for a query state from the same thread that is running the query")
        if self.stream_death_cause is not None:
            raise self.stream_death_cause
        if not self.is_active:
            return
        with self.await_progress:
            self.no_new_data = False
            while True:
                self.await_progress.wait(10.0)
                if self.stream_death_cause is not None:
                    raise self.stream_death_cause
                if self.no_new_data or not self.is_active:
                    return

    # -- for subclasses ----------------------------------------------------
    def batch_description(self, batch: Any) -> str:
        return f"{self.name or ''}\nid = {self.id}\nrunId = {self.run_id}\nbatch = {batch}"

    def post(self, event: Any) -> None:
        self.listener_bus.post(event)

    def report(self, kind: str, payload: Any) -> None:
        if kind == "progress":
            log.info("Streaming query made progress: %s", payload)
            self.post(QueryProgressEvent(payload))
        elif kind == "idle":
            self.post(QueryIdleEvent(self.id, self.run_id, payload))

    def initialize(self) -> None:
        raise NotImplementedError

    def run_activated_stream(self) -> None:
        raise NotImplementedError

    def stop_sources(self) -> None:
        pass
