"""What a batch's Spark jobs measured and observed: observations, and the rows each
input gave (from the scans' own metrics).

Rows a batch read from each source, from the scans' own ``numOutputRows`` metrics.

Spark's engine reports a source's ``numInputRows`` from the executed plan of the batch
it ran: the ``numOutputRows`` metric of the scan nodes over that source
(``ProgressReporter``). Our sinks run the batch's DataFrame through their own Spark
actions (``df.write``, ``collect``), so the engine sees those executions through a
``QueryExecutionListener`` registered on the batch session (a py4j callback that only
queues the execution). After ``addBatch`` it waits for the listener bus to deliver them,
finds the file scans whose file index is one of the batch's inputs (the same JVM
object: identity hash, then ``equals``) and reads their metric.

This replaces an ``Observation`` at the scan for file sources that cannot count their
rows up front (json, csv, text, orc): its ``CollectMetrics`` node stops whole-stage code
generation between the scan and the rest of the plan, and costs 2-5% of a 1M-row JSON
batch to parquet (more when the cores are shared: it is CPU per row). A source's count
is the largest over the sink's executions (a sink that writes the batch twice, or a
batch run again to commit its state, is not counted twice), summed over the scans
within one execution (a self-join reads it twice), as often as Spark's engine's plan of
the batch scans it where that differs (``engine_rows``: Spark's optimizer reuses an
exchange in one plan and not in the other).

Where the executions come from depends on how the sink reads the batch
(``Sink.reads_batch_through``): Spark SQL actions (``df.write``, ``collect``) report
theirs to the listener; RDD actions (``foreachPartition``) run the batch DataFrame's own
executed plan, which the engine reads directly. A sink that may do either (user code in
``foreachBatch``) gets both. An input that is not a file relation keeps the
``Observation``.
"""
from __future__ import annotations

import logging
import threading

import json
import time
from typing import Any


from pyspark.sql import DataFrame, SparkSession

from microbatch.spark_internals.jvm import _jvm, jvm_class


def observation_row(observation: Any, wait_s: float) -> Any:
    """The JVM row an ``Observation`` received, waiting up to ``wait_s`` for the query
    execution listener that fills it (it may lag the action a little); None if the
    action that ran the observed DataFrame was not a SQL action, or none ran, or Spark's
    optimizer removed the observation from what ran (a filter it knows drops every row
    above it, ``lit("u").isin("a", "b")``: Spark completes the ``Observation`` with an empty
    row, without a schema). Before Spark 4.1 an ``Observation`` keeps a map, not the row:
    None (``observed_rows``)."""
    from microbatch.spark_internals.versions import observation_has_row
    if not observation_has_row():
        return None
    future = observation._jo.future()
    deadline = time.monotonic() + wait_s
    while not future.isCompleted() and time.monotonic() < deadline:
        time.sleep(0.005)
    row = observation._jo.getRow() if future.isCompleted() else None
    return None if row is None or row.schema() is None else row


def reset_observations(df: Any) -> None:
    """Zero what the ``observe`` nodes of ``df``'s executed plan collected, before that
    plan runs again (a plan kept across batches): each run then observes its own rows.
    Spark 4's ``resetMetrics`` of an action does this; 3.5's leaves a ``CollectMetricsExec``'s
    accumulator as it was, so a kept plan's event-time minimum stayed the first batch's."""
    pending = [df._jdf.queryExecution().executedPlan()]
    while pending:
        node = pending.pop()
        if node.getClass().getSimpleName() == "CollectMetricsExec":
            node.accumulator().reset()
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))


def run_to_end(df: Any) -> int:
    """Runs ``df``'s own executed plan to the end, dropping its rows; how many there were
    (the executed plan keeps its metrics and observations, as for an RDD action; they
    start from zero, as each SQL action's, when the plan runs again)."""
    qe = df._jdf.queryExecution()
    qe.executedPlan().resetMetrics()
    return int(qe.toRdd().count())


def executed_observation_row(df: Any, name: str) -> Any:
    """The JVM row observed as ``name`` by ``df``'s own executed plan (an RDD action such
    as ``foreachPartition`` runs it); None if that plan has none."""
    found = df._jdf.queryExecution().observedMetrics().get(name)
    return found.get() if found.isDefined() else None


def observed_rows(executions: list[Any]) -> dict[str, Any]:
    """The JVM rows the ``executions`` (JVM QueryExecutions that ran) observed, by
    observation name, the first execution's where several observed one (as Spark fills
    an ``Observation``). Spark before 4.1 keeps no row in an ``Observation``: its engine
    reads the executed plan's ``observedMetrics``, as here."""
    rows: dict[str, Any] = {}
    for qe in executions:
        try:
            observed = qe.observedMetrics()
        except Exception:  # an execution that failed in planning
            log.debug("Skipping an execution without observed metrics", exc_info=True)
            continue
        names = observed.keys().iterator()
        while names.hasNext():
            name = names.next()
            if name not in rows:
                rows[name] = observed.apply(name)
    return rows


def row_json(jrow: Any) -> Any:
    """A JVM row as Spark's ``Row.json`` writes it (parsed)."""
    return json.loads(jrow.json())


def python_row(jrow: Any) -> Any:
    """A JVM row as PySpark hands one to Python (``Observation.get`` does the same)."""
    from pyspark.serializers import CPickleSerializer
    utils = getattr(_jvm(), "org.apache.spark.sql.api.python.PythonSQLUtils")
    return CPickleSerializer().loads(utils.toPyRow(jrow))


def query_execution(df: Any) -> Any:
    """The JVM QueryExecution of ``df`` (an RDD action runs its executed plan)."""
    return df._jdf.queryExecution()


log = logging.getLogger(__name__)


def engine_rows(scans: list[int], engine_scans: int | None) -> int:
    """A source's rows in one execution as Spark's engine counts them: ``scans``, the rows
    each scan of the source returned (a self-join reads it twice), summed, as Spark sums
    its scans. Where Spark's engine's plan of the batch scans the source another number of
    times (``engine_scans``: the exchange above a read that microbatch's plan reuses, Spark's
    does not, or the other way) and every scan here returned the same rows (one read of the
    source, the same filters), Spark's count is that many times those rows."""
    if engine_scans is None or engine_scans == len(scans) or len(set(scans)) != 1:
        return sum(scans)
    return engine_scans * scans[0]


#: Leaves that wrap a plan of their own, and the method that returns it.
#: (Spark 4's adaptive plan ends in a ResultQueryStageExec: a stateless query's batch runs
#: adaptively, as in Spark 4.1+'s engine, seeds 5719 and 5744)
_WRAPPERS = {"AdaptiveSparkPlanExec": "executedPlan", "ShuffleQueryStageExec": "plan",
             "BroadcastQueryStageExec": "plan", "TableCacheQueryStageExec": "plan",
             "ResultQueryStageExec": "plan"}
#: How long to wait for the listener bus to deliver the sink's executions.
_DELIVERY_TIMEOUT_MS = 30_000


class _ExecutionListener:
    """``QueryExecutionListener`` in Python: queues the executions of the current batch."""

    def __init__(self, counter: "ScanRowCounter"):
        self._counter = counter

    def onSuccess(self, func_name: str, qe: Any, duration_ns: int) -> None:  # noqa: N802 (Java API)
        self._counter._delivered(qe)

    def onFailure(self, func_name: str, qe: Any, exception: Any) -> None:  # noqa: N802
        self._counter._delivered(qe)

    class Java:
        implements = ["org.apache.spark.sql.util.QueryExecutionListener"]


class ScanRowCounter:
    """Counts, per batch, the rows the sink's Spark executions read from each input."""

    def __init__(self, session: SparkSession):
        self._session = session
        self._lock = threading.Lock()
        self._collecting = False
        self._executions: list[Any] = []
        self._listener: _ExecutionListener | None = None

    def _identity(self, obj: Any) -> int:
        return jvm_class("java.lang.System").identityHashCode(obj)

    def input_keys(self, df: DataFrame) -> dict[int, Any] | None:
        """The file indexes ``df`` scans, by identity hash, or None if any of its leaves is
        not a file relation (the engine then counts its rows another way)."""
        leaves = df._jdf.queryExecution().analyzed().collectLeaves()
        keys = {}
        for j in range(leaves.size()):
            leaf = leaves.apply(j)
            if leaf.getClass().getSimpleName() != "LogicalRelation":
                return None
            relation = leaf.relation()
            if relation.getClass().getSimpleName() != "HadoopFsRelation":
                return None
            location = relation.location()
            keys[self._identity(location)] = location
        return keys or None

    def start(self) -> None:
        """Collect the executions the listener sees from now on (before the sink runs)."""
        if self._listener is None:
            from pyspark.java_gateway import ensure_callback_server_started
            ensure_callback_server_started(self._session.sparkContext._gateway)
            self._listener = _ExecutionListener(self)
            self._session._jsparkSession.listenerManager().register(self._listener)
        with self._lock:
            self._executions = []
            self._collecting = True

    def _delivered(self, qe: Any) -> None:
        with self._lock:
            if self._collecting:
                self._executions.append(qe)

    def finish(self) -> list[Any]:
        """Wait for the sink's executions to be delivered, stop collecting; return them."""
        try:
            self._session.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(_DELIVERY_TIMEOUT_MS)
        except Exception as e:  # noqa: BLE001 (py4j wraps the JVM's TimeoutException)
            log.warning("The listener bus did not deliver the batch's executions within %d ms; "
                        "numInputRows counts the executions delivered so far (%s)",
                        _DELIVERY_TIMEOUT_MS, str(e).splitlines()[0] if str(e) else e)
        with self._lock:
            executions, self._executions = self._executions, []
            self._collecting = False
        return executions

    def count(self, keys_by_source: dict[int, dict[int, Any]], executions: list[Any],
              engine_scans: dict[int, int] | None = None) -> dict[int, int]:
        """Rows per source read by ``executions`` (JVM QueryExecutions that ran), as Spark's
        engine sums them over its scans (``engine_rows``); ``engine_scans``: how many times
        Spark's engine's plan of the batch scans a source, where known
        (``runtime.engine_scans``)."""
        source_of = {key: (i, location) for i, keys in keys_by_source.items()
                     for key, location in keys.items()}
        rows = {i: 0 for i in keys_by_source}
        for qe in executions:
            try:
                scanned = self._scanned(qe, source_of)
            except Exception:  # an execution that failed in planning, caught by the sink
                log.debug("Skipping an execution without an executed plan", exc_info=True)
                continue
            for i, scans in scanned.items():
                rows[i] = max(rows[i], engine_rows(scans, (engine_scans or {}).get(i)))
        return rows

    def _scanned(self, qe: Any, source_of: dict[int, tuple[int, Any]]) -> dict[int, list[int]]:
        """Per source, the rows each file scan of one execution returned."""
        counts: dict[int, list[int]] = {}
        pending = [qe.executedPlan()]
        while pending:
            leaves = pending.pop().collectLeaves()
            for j in range(leaves.size()):
                leaf = leaves.apply(j)
                name = leaf.getClass().getSimpleName()
                if name in _WRAPPERS:
                    pending.append(getattr(leaf, _WRAPPERS[name])())
                elif name == "FileSourceScanExec":
                    location = leaf.relation().location()
                    source, known = source_of.get(self._identity(location), (None, None))
                    if source is not None and known.equals(location):
                        metric = leaf.metrics().get("numOutputRows")
                        if metric.isDefined():
                            counts.setdefault(source, []).append(int(metric.get().value()))
        return counts

    def close(self) -> None:
        """Unregister the listener (the query stopped)."""
        if self._listener is None:
            return
        try:
            self._session._jsparkSession.listenerManager().unregister(self._listener)
        except Exception:  # the JVM may be gone at shutdown
            log.debug("Could not unregister the scan-metrics listener", exc_info=True)
