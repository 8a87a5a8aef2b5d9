"""StreamingQueryManager (``ss.streams``): the active queries and the listeners."""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable, Mapping

from pyspark.errors import PySparkValueError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from microbatch import spark_internals
from microbatch.api.query import StreamingQuery
from microbatch.ops.metrics import SPARK_GAUGES
from microbatch.errors import IllegalArgumentException, pyspark_error
from microbatch.spark_internals.errors import java_exception
from microbatch.util import conf_bool
from microbatch.runtime.events import ListenerBus
from microbatch.runtime.micro_batch import MicroBatchExecution
from microbatch.runtime.real_time import RealTimeExecution
from microbatch.runtime.triggers import RealTime
from microbatch.runtime.stream_execution import StreamExecution

log = logging.getLogger(__name__)
#: Spark's conf: a new run of a query active here stops the old run (true) or is refused
STOP_ACTIVE_RUN_ON_RESTART = "spark.sql.streaming.stopActiveRunOnRestart"
#: Spark's conf: each running query's gauges in Spark's metrics system (its configured sinks)
METRICS_ENABLED = "spark.sql.streaming.metricsEnabled"


class StreamingQueryManager:
    def __init__(self, spark: SparkSession, read_formats: Mapping[str, Callable[[Any], Any]] | None = None):
        self._spark = spark
        self._read_formats = dict(read_formats or {})   # (each query's batch session answers them)
        self._lock = threading.Condition()
        self._active: dict[str, StreamingQuery] = {}          # by query id
        self._executions: dict[str, MicroBatchExecution] = {}  # the active queries' runs, by query id
        self._last_terminated: MicroBatchExecution | None = None
        # (each event on Spark's own bus too: the Spark UI's streaming tab, JVM listeners,
        # the plain session's spark.streams)
        self._bus = ListenerBus(forward=lambda event: spark_internals.post_to_spark_listeners(spark, event))
        self._metrics_sources: dict[str, Any] = {}              # the active queries', by query id

    @property
    def active(self) -> list[StreamingQuery]:
        with self._lock:
            return list(self._active.values())

    def get(self, id: str) -> StreamingQuery | None:
        with self._lock:
            return self._active.get(str(id))

    def awaitAnyTermination(self, timeout: float | None = None) -> bool | None:
        """Wait until any query terminates (since the last ``resetTerminated``); raise
        the exception of a query that failed."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise pyspark_error(PySparkValueError, "VALUE_NOT_POSITIVE", {"arg_name": "timeout", "arg_value": type(timeout).__name__})
        with self._lock:
            self._lock.wait_for(lambda: self._last_terminated is not None, timeout)
            terminated = self._last_terminated
        if terminated is not None and terminated.failed:
            raise terminated.stream_death_cause
        if timeout is not None:
            return terminated is not None
        return None

    def resetTerminated(self) -> None:
        with self._lock:
            self._last_terminated = None

    def addListener(self, listener: StreamingQueryListener) -> None:
        """Register a ``pyspark.sql.streaming.StreamingQueryListener`` for the events of
        this session's queries (see ``runtime.events`` for the delivery rules). Over
        Spark Connect the listener's ``spark`` is the session, as PySpark's Connect
        manager sets it (``self.spark`` inside a callback)."""
        if spark_internals.is_connect(self._spark):
            listener._set_spark_session(self._spark)
        self._bus.add(listener)

    def removeListener(self, listener: StreamingQueryListener) -> None:
        self._bus.remove(listener)

    @property
    def _sqlb(self) -> ListenerBus:
        """The listener bus of PySpark's Connect query manager (``_sqlb``), whose
        ``_listener_bus`` lists the listeners added: PySpark's own Connect tests read it to
        remove each one, so a Connect session's manager answers it alike."""
        return self._bus

    def _wait_for_listeners(self, timeout: float = 10.0) -> bool:
        """Block until every event posted so far has reached the listeners."""
        return self._bus.wait_until_empty(timeout)

    def start_query(self, *, name: str | None, checkpoint_root: str, **kwargs: Any) -> StreamingQuery:
        """Start a run of a query (what ``DataStreamWriter.start`` calls): refused while a
        query of that name, that id or that checkpoint is active here, or while another
        process runs the checkpoint (its run lease). A run of the same query (its id) active
        here is stopped first, as Spark's engine stops it under
        ``spark.sql.streaming.stopActiveRunOnRestart`` (its default), or refused with Spark's
        IllegalStateException when that is false."""
        execution = None
        while True:
            with self._lock:
                if execution is None:
                    execution = self._new_execution(name, checkpoint_root, kwargs)
                old = self._active.get(execution.id)
                if old is None:
                    query = self._register(execution, checkpoint_root)
                    break
            log.warning("Stopping existing streaming query [id=%s, runId=%s], as a new run is being "
                        "started.", execution.id, old.runId)
            old.stop()
        if conf_bool(self._spark, METRICS_ENABLED, False):
            # (Spark's MetricsReporter: source spark.streaming.<name or id>, while the run runs)
            source = spark_internals.register_metrics_source(
                self._spark, f"spark.streaming.{name or execution.id}",
                {gauge: (lambda value=value: value(_last_progress(query))) for gauge, _, value in SPARK_GAUGES})
            with self._lock:
                self._metrics_sources[execution.id] = source
        execution.start()
        return query

    def _new_execution(self, name: str | None, checkpoint_root: str, kwargs: dict) -> MicroBatchExecution:
        if name is not None and any(q.name == name for q in self._active.values()):
            raise IllegalArgumentException(
                f"Cannot start query with name {name} as a query with that name is already "
                "active in this SparkSession. Stop it first, or choose another queryName.")
        execution_type = RealTimeExecution if isinstance(kwargs.get("trigger"), RealTime) else MicroBatchExecution
        execution = execution_type(
            spark=self._spark, name=name, checkpoint_root=checkpoint_root,
            listener_bus=self._bus, on_terminated=self._on_terminated, read_formats=self._read_formats, **kwargs)
        if execution.id in self._active and not conf_bool(self._spark, STOP_ACTIVE_RUN_ON_RESTART, True):
            raise java_exception(
                "java.lang.IllegalStateException",
                f"Cannot start query with id {execution.id} as another query with same id is "
                "already active. Perhaps you are attempting to restart a query from checkpoint "
                "that is already active. You may stop the old query by setting the SQL "
                f'configuration: spark.conf.set("{STOP_ACTIVE_RUN_ON_RESTART}", true) and retry.',
                called="start")   # (PySpark's start() lets the JVM's error through unconverted)
        return execution

    def _register(self, execution: MicroBatchExecution, checkpoint_root: str) -> StreamingQuery:
        """(Under the lock.) The new run's query, once no run of it is active here."""
        for other in self._active.values():
            if other.checkpointLocation == checkpoint_root:
                raise IllegalArgumentException(
                    f"Cannot start a query on checkpoint '{checkpoint_root}': the active "
                    f"query {self._executions[other.id].pretty_id} uses it.")
        execution.lease.acquire()   # another process's run of this checkpoint: refused here
        query = StreamingQuery(execution)
        self._active[execution.id] = query
        self._executions[execution.id] = execution
        return query

    def _on_terminated(self, execution: StreamExecution) -> None:
        with self._lock:
            source = self._metrics_sources.pop(execution.id, None)
        if source is not None:
            spark_internals.remove_metrics_source(source)
        with self._lock:
            query = self._active.pop(execution.id, None)
            self._executions.pop(execution.id, None)
            if query is not None:
                self._last_terminated = execution
            self._lock.notify_all()


def _last_progress(query: StreamingQuery) -> dict:
    """The query's last progress as its JSON (PySpark 3.5 gives the dict, 4 an object)."""
    progress = query.lastProgress
    if progress is None:
        return {}
    return progress if isinstance(progress, dict) else json.loads(progress.json)
