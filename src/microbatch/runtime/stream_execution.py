"""StreamExecution: one run of a streaming query on its own daemon thread.

Lifecycle (Spark's): INITIALIZING -> ACTIVE -> TERMINATED. ``start()`` returns
once the thread has posted QueryStartedEvent; ``stop()`` marks the query
terminated, cancels the Spark jobs of the running batch (job group = run id)
and waits for the thread.

A failure ends the query as Spark ends it: PySpark's ``StreamingQueryException``
(``[STREAM_FAILED] Query [id = ..., runId = ...] terminated with exception: ...``) over
a JVM ``StreamingQueryException`` (``spark_internals``), so ``getCondition()``,
``getMessageParameters()``, ``getSqlState()`` and the stack trace answer as they do in
PySpark; its cause is the failure's JVM exception (a Spark job's, or a stand-in that
carries a Python error). ``QueryTerminatedEvent.exception`` is that cause as Spark's
``Utils.exceptionString`` prints it, ``errorClassOnException`` the failure's error class.

The batch runner itself lives in ``micro_batch.MicroBatchExecution``.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from typing import Any, Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from microbatch import spark_internals
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.run_lease import (DEFAULT_TIMEOUT_MS as DEFAULT_LEASE_TIMEOUT_MS,
                                              TIMEOUT_CONF as LEASE_TIMEOUT_CONF, RunLease)
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.checkpoint.markers import unfinished_rollback
from microbatch.errors import CheckpointError, UserFunctionError, pyspark_error, raised_in_worker
from microbatch.util import conf_bool, time_string_as_ms
from microbatch.runtime.clock import Clock
from microbatch.runtime.events import (ListenerBus, QueryIdleEvent, QueryProgressEvent,
                                         QueryTerminatedEvent)
from microbatch.runtime.progress import ProgressReporter, format_timestamp

log = logging.getLogger(__name__)
#: How long stop() waits for the query thread (Spark's conf, in ms or a time string; 0: no limit)
STOP_TIMEOUT = "spark.sql.streaming.stopTimeout"


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
        #: spark.sql.streaming.stopTimeout as the query starts (Spark reads its clone of the session)
        self.stop_timeout_ms = time_string_as_ms(str(spark.conf.get(STOP_TIMEOUT, "0")))
        self.checkpoint_root = checkpoint_root
        self.delete_checkpoint_on_stop = delete_checkpoint_on_stop
        self.clock = clock
        self.fs = fs
        self.listener_bus = listener_bus
        self.on_terminated = on_terminated
        if conf_bool(spark, "spark.sql.streaming.checkpoint.verifyMetadataExists.enabled", True) \
                and StreamMetadata.missing_with_logs(fs, checkpoint_root):
            raise spark_internals.spark_error(
                "SparkRuntimeException", "STREAMING_CHECKPOINT_MISSING_METADATA_FILE",
                checkpointLocation=checkpoint_root)
        unfinished = unfinished_rollback(fs, checkpoint_root)
        if unfinished is not None:
            raise CheckpointError(unfinished)
        self.id = StreamMetadata.read_or_create(fs, checkpoint_root).id
        self.run_id = str(uuid.uuid4())
        #: one run at a time per checkpoint: taken by the query manager at start
        self.lease = RunLease(fs, checkpoint_root, self.id, self.run_id,
                              conf_ms(spark, LEASE_TIMEOUT_CONF, DEFAULT_LEASE_TIMEOUT_MS))
        self.state = State.INITIALIZING
        self.stream_death_cause_spark: Any = None    # Spark's own StreamingQueryException object
        self._error_class_on_exception: str | None = None
        self._job_tags: set[str] = set()
        self.progress = ProgressReporter(
            self.id, self.run_id, name, clock,
            num_recent=int(spark.conf.get("spark.sql.streaming.numRecentProgressUpdates", "100")),
            no_data_event_interval_ms=conf_ms(
                spark, "spark.sql.streaming.noDataProgressEventInterval", 10_000))
        self.interrupt = threading.Event()      # set by stop(): ends waits and sleeps
        self.stopped_by_user = False
        self._python_cause: BaseException | None = None
        self._failure_message: str | None = None
        # without a JVM exception (a Spark Connect client, or the JVM gone): what
        # awaitTermination raises and what exception() returns
        self._fallback_cause: StreamingQueryException | None = None
        self.reported_fallback_cause: StreamingQueryException | None = None
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

    @property
    def failed(self) -> bool:
        return self.stream_death_cause_spark is not None or self._fallback_cause is not None

    @property
    def stream_death_cause(self) -> StreamingQueryException | None:
        """The exception that ended the query, as PySpark raises it from a call into Spark
        (chained to the Python error behind it, for Python tracebacks)."""
        if self.stream_death_cause_spark is None:
            return self._fallback_cause
        exception = spark_internals.captured(self.stream_death_cause_spark)
        exception.__cause__ = self._python_cause
        return exception

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        log.info("Starting %s. Use %s to store the query checkpoint.", self.pretty_id,
                 self.checkpoint_root)
        # Spark's query thread inherits the starting thread's job tags; ours is a Python
        # thread, so carry them over (they tag the batches' jobs too).
        self._job_tags = spark_internals.job_tags(self.spark)
        self.thread.start()
        self.start_latch.wait()

    def _run_stream(self) -> None:
        try:
            spark_internals.enter_query_thread(self.jobs_session(), self.run_id, self.id, self._job_tags,
                                               self.batch_description("init"))
            self.post(spark_internals.query_started_event(
                uuid.UUID(self.id), uuid.UUID(self.run_id), self.name, format_timestamp(self.clock.get_time_millis()),
                set(self._job_tags)))
            self.start_latch.set()
            self.progress.update_status_message("Initializing sources")
            self.initialize()
            if self.state is State.INITIALIZING:
                self.state = State.ACTIVE
                self.initialization_latch.set()
                self.run_activated_stream()
            self.progress.update_status_message("Stopped")
        except BaseException as e:  # every failure ends the query
            if self.stopped_by_user:
                log.info("Query %s was interrupted by stop(): %s", self.pretty_id,
                         str(e).splitlines()[0] if str(e) else type(e).__name__)
            else:
                message = self._fail(e)
                self._failure_message = message
                self.progress.update_status_message(f"Terminated with exception: {message}")
                log.error("Query %s terminated with error", self.pretty_id, exc_info=e)
        finally:
            self.start_latch.set()
            self.initialization_latch.set()
            self.stop_sources()
            self.lease.release(self._failure_message)
            self.state = State.TERMINATED
            self.progress.update_status(isTriggerActive=False, isDataAvailable=False)
            with self.await_progress:
                self.await_progress.notify_all()
            self.on_terminated(self)
            self.post(QueryTerminatedEvent(
                uuid.UUID(self.id), uuid.UUID(self.run_id), self._terminated_exception_text(),
                self._error_class_on_exception))
            if self.delete_checkpoint_on_stop and not self.failed:
                self.fs.delete_tree(self.checkpoint_root)
            self.termination_latch.set()

    def _fail(self, error: BaseException) -> str:
        """Record ``error`` as the reason the query ended (Spark's ``streamDeathCause``);
        return its message."""
        error = raised_in_worker(error) or error
        # as Spark unwraps a user function's error, so that users get their own
        self._python_cause = (error.__cause__ if isinstance(error, UserFunctionError)
                              and error.__cause__ is not None else error)
        if spark_internals.is_connect(self.spark):
            failure = spark_internals.query_failure(error, self.debug_string(), self.id, self.run_id)
            self._fallback_cause, self.reported_fallback_cause = failure.raised, failure.reported
            self._fallback_cause.__cause__ = self.reported_fallback_cause.__cause__ = self._python_cause
            self._error_class_on_exception = failure.error_class
            return failure.message
        try:
            return self._fail_through_spark(error)
        except Exception:  # e.g. the SparkContext stopped under the query
            log.warning("Cannot build the JVM exception of query %s", self.pretty_id, exc_info=True)
            message = str(error)
            self._fallback_cause = pyspark_error(
                StreamingQueryException, "STREAM_FAILED",
                {"id": self.id, "runId": self.run_id, "message": message},
                message=f"Query [id = {self.id}, runId = {self.run_id}] terminated with exception: {message}")
            self._fallback_cause.__cause__ = error
            self.reported_fallback_cause = self._fallback_cause
            return message

    def _fail_through_spark(self, error: BaseException) -> str:
        jerror = spark_internals.jvm_throwable(error)
        message = spark_internals.exception_message(jerror)
        # Spark unwraps a foreach/foreachBatch user function's error, so that the cause
        # users get is their own; the error class stays FOREACH_BATCH_USER_FUNCTION_ERROR.
        cause = spark_internals.user_error_cause(jerror)
        committed, available = self.offsets_description()
        self.stream_death_cause_spark = spark_internals.streaming_query_exception(
            self.debug_string(), cause, committed, available, self.id, self.run_id, message)
        self._error_class_on_exception = spark_internals.error_condition(jerror)
        return message

    def _terminated_exception_text(self) -> str | None:
        if self.stream_death_cause_spark is not None:
            return spark_internals.cause_string(self.stream_death_cause_spark)
        if self._fallback_cause is not None:
            return str(self._python_cause)
        return None

    def debug_string(self) -> str:
        """Spark's ``StreamExecution.toDebugString``, the tail of a failure's message."""
        committed, available = self.offsets_description()
        text = (f"=== Streaming Query ===\nIdentifier: {self.pretty_id}\n"
                f"Current Committed Offsets: {committed}\n"
                f"Current Available Offsets: {available}\n\n"
                f"Current State: {self.state.value}\nThread State: RUNNABLE")
        plan = self.logical_plan_string()
        return text + f"\n\nLogical Plan:\n{plan}" if plan else text

    def jobs_session(self) -> Any:
        """The session the query's batches run their jobs on (tagged with the run)."""
        return self.spark

    def stop(self) -> None:
        """Stop the query; blocks until its thread has ended, or for at most
        ``spark.sql.streaming.stopTimeout`` (as the query started; 0 or less: no limit), then
        fails with Spark's TimeoutException."""
        self.stopped_by_user = True
        self.state = State.TERMINATED
        self.interrupt.set()
        if threading.current_thread() is not self.thread:
            # Cancel the running batch's jobs (job group = run id) until the thread has ended;
            # a job that starts during the stop is cancelled on the next round.
            timeout_ms = max(self.stop_timeout_ms, 0)
            deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
            while self.thread.is_alive():
                spark_internals.cancel_run(self.jobs_session(), self.run_id)
                if deadline is not None and time.monotonic() >= deadline:
                    from microbatch.spark_internals.errors import java_exception
                    raise java_exception(
                        "java.util.concurrent.TimeoutException",
                        f"Stream Execution thread for stream {self.pretty_id} failed to stop within "
                        f"{timeout_ms} milliseconds (specified by {STOP_TIMEOUT}). See the cause on "
                        "what was being executed in the streaming query thread.")
                self.thread.join(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
        log.info("Query %s was stopped", self.pretty_id)

    def await_termination(self, timeout: float | None = None) -> bool:
        if threading.current_thread() is self.thread:
            raise RuntimeError("Cannot wait for a query state from the same thread that is running the query")
        finished = self.termination_latch.wait(timeout)
        if self.failed:
            raise self.stream_death_cause
        return finished

    def process_all_available(self) -> None:
        """Block until every source's available data is processed, or the query ends."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("Cannot wait for a query state from the same thread that is running the query")
        if self.failed:
            raise self.stream_death_cause
        if not self.is_active:
            return
        with self.await_progress:
            self.no_new_data = False
            while True:
                self.await_progress.wait(10.0)
                if self.failed:
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
            progress, event_progress = payload
            log.info("Streaming query made progress: %s", progress.json)
            self.post(QueryProgressEvent(event_progress))
        elif kind == "idle":
            self.post(QueryIdleEvent(uuid.UUID(self.id), uuid.UUID(self.run_id), payload))

    def initialize(self) -> None:
        raise NotImplementedError

    def run_activated_stream(self) -> None:
        raise NotImplementedError

    def stop_sources(self) -> None:
        pass

    def offsets_description(self) -> tuple[str, str]:
        """The committed and available offsets as Spark prints them in a failure."""
        return "{}", "{}"

    def logical_plan_string(self) -> str:
        return ""
