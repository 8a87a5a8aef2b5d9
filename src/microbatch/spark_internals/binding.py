"""Binding a batch into a plan analysed once per run (Spark's binding of a batch into
its analysed query), with the batch's own Python task and batch timestamp."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from microbatch.spark_internals.jvm import SparkContext   # (None in PySpark's Connect-only client)
from pyspark.sql import SparkSession

from microbatch.spark_internals.analysis import analyzed_plan
from microbatch.spark_internals.jvm import jvm_class
from microbatch.spark_internals.versions import running_version


def with_batch_timestamp(spark: SparkSession, df: Any, timestamp_ms: int) -> Any:
    """``df`` with ``current_timestamp()``, ``now()``, ``current_date()`` and
    ``localtimestamp()`` replaced by the batch timestamp (Spark's ``CurrentBatchTimestamp``):
    a catalyst transform of the analyzed plan, with a Scala Map as the partial function."""
    from pyspark.sql import DataFrame
    plan = df._jdf.queryExecution().analyzed().transformAllExpressions(_batch_time_replacements(spark, timestamp_ms))
    return DataFrame(jvm_class(running_version().dataset_class).ofRows(spark._jsparkSession, plan), spark)


def uses_current_time(df: Any) -> bool:
    """Whether ``df``'s analyzed plan calls the current time or date anywhere: whether
    ``with_batch_timestamp`` would change it (Catalyst's transform gives the same plan back
    when its function matches nothing). The plan's text would say it too, but costs as
    much as its size (44 ms for Nexmark q5's), and ``toString`` shortens a node's lists
    past ``spark.sql.debug.maxToStringFields`` (a projection's 26th column)."""
    plan = df._jdf.queryExecution().analyzed()
    return not plan.equals(plan.transformAllExpressions(_batch_time_replacements(df.sparkSession, 0)))


def _batch_time_replacements(spark: SparkSession, timestamp_ms: int) -> Any:
    """The current-time expressions of an analysed plan, each to its batch-time one, as a
    Scala Map (a partial function for Catalyst's transforms)."""
    from py4j.java_collections import MapConverter
    expressions = "org.apache.spark.sql.catalyst.expressions."
    some_tz = jvm_class("scala.Some")(spark.conf.get("spark.sql.session.timeZone"))

    def batch_time(type_name: str):
        data_type = jvm_class(f"org.apache.spark.sql.types.{type_name}$")
        return jvm_class(expressions + "CurrentBatchTimestamp")(timestamp_ms, data_type, some_tz)

    timestamp = batch_time("TimestampType")
    replacements = {
        jvm_class(expressions + "CurrentTimestamp")(): timestamp,
        jvm_class(expressions + "Now")(): timestamp,
        jvm_class(expressions + "CurrentDate")(some_tz): batch_time("DateType"),
        jvm_class(expressions + "LocalTimestamp")(some_tz): batch_time("TimestampNTZType"),
    }
    java_map = MapConverter().convert(replacements, spark._sc._gateway._gateway_client)
    return jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap(java_map)


@dataclass(frozen=True)
class PythonFunctionRef:
    """A Python function a plan calls (a ``PythonUDF`` expression, e.g. the function of a
    ``mapInArrow``), found again after analysis by its result id, with the return type
    PySpark pickled with it."""

    result_id: Any
    return_type: Any      # pyspark.sql.types.DataType


def map_in_arrow_function(mapped: Any, return_type: Any) -> PythonFunctionRef:
    """The function of ``mapped``, a DataFrame whose last step is ``mapInArrow``."""
    return PythonFunctionRef(analyzed_plan(mapped).functionExpr().resultId(), return_type)


def projected_function(projected: Any, return_type: Any) -> PythonFunctionRef:
    """The function of ``projected``, a DataFrame whose last step is a projection whose
    last column is a Python UDF (``withColumn(name, udf(...))``)."""
    columns = analyzed_plan(projected).projectList()
    return PythonFunctionRef(columns.apply(columns.size() - 1).child().resultId(), return_type)


class BatchInput:
    """A batch DataFrame with its analysed plan and output columns, each read once
    through py4j (a round trip is about 0.1 ms, and a batch's binding makes a few
    hundred of them without this)."""

    __slots__ = ("df", "plan", "output")

    def __init__(self, df: Any):
        self.df = df
        self.plan = analyzed_plan(df)
        self.output = self.plan.output()


class ColumnsKeys:
    """The columns of each input of a prepared plan, as a key of the plan analysed for
    them (the schemas' JSON). The JSON is read again only when an input's output
    attributes differ from those it had the batch before: a bound plan, and a source
    that prepares its batches, keep theirs from batch to batch."""

    def __init__(self):
        self._last: dict[int, tuple[Any, str]] = {}

    def key(self, inputs: list[BatchInput]) -> tuple[str, ...]:
        key = []
        for slot, given in enumerate(inputs):
            last = self._last.get(slot)
            if last is None or not given.output.equals(last[0]):
                last = (given.output, given.plan.schema().json())
                self._last[slot] = last
            key.append(last[1])
        return tuple(key)


#: The column in which a batch that is no file relation (a deduplication's output, a
#: watermark's over other steps) carries the hidden ``_metadata`` of the file relation it
#: was read from, last, for a plan above that reads it as the hidden column
#: (``runtime.segments.hidden_columns_carried``).
CARRIED_METADATA = "__microbatch_carried_metadata"


def hidden_columns_read(analyzed: Any, placeholders: list[Any]) -> list[bool]:
    """For each placeholder (an analysed plan among ``analyzed``'s leaves), whether the
    plan reads its hidden columns: Spark's analyser (AddMetadataColumns) put the
    placeholder with them exposed in its place."""
    leaves = analyzed.collectLeaves()
    leaves = [leaves.apply(i) for i in range(leaves.size())]
    found = []
    for placeholder in placeholders:
        exposed = _exposed(placeholder) if placeholder.metadataOutput().nonEmpty() else None
        found.append(exposed is not None and any(leaf.equals(exposed) for leaf in leaves))
    return found


def _exposed(plan: Any) -> Any:
    """``plan`` with its hidden columns exposed (``withMetadataColumns``), or None for a
    plan that has hidden columns but cannot expose them itself (not an
    ExposesMetadataColumns: a union of two streams' batches)."""
    from py4j.protocol import Py4JError
    try:
        return plan.withMetadataColumns()
    except Py4JError:
        return None


def _join_as_read(prepared: Any, placeholder: Any) -> Any:
    """A placeholder that is a join of stand-ins (a stream-stream join's output whose sides'
    hidden columns a step above may read) as ``prepared`` holds it: the sides whose hidden
    columns the plan reads exposed (AddMetadataColumns), which puts them in the join's
    output after each side's columns, where the batch's join carries them
    (``CARRIED_METADATA``)."""
    wanted = {placeholder.output().apply(i).exprId().id() for i in range(placeholder.output().size())}
    pending = [prepared]
    while pending:
        node = pending.pop()
        if node.getClass().getSimpleName() == "Join":
            output = [node.output().apply(i) for i in range(node.output().size())]
            ids = {a.exprId().id() for a in output}
            # (its output is the stand-in's and hidden columns only: not a join above it)
            if wanted <= ids and all(a.name() == "_metadata" for a in output if a.exprId().id() not in wanted):
                return node
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))
    return placeholder


def has_hidden_columns(df: Any) -> bool:
    """Whether ``df``'s plan has hidden columns (a file relation's ``_metadata``)."""
    return analyzed_plan(df).metadataOutput().nonEmpty()


#: Nodes over a batch's relation that pass its rows' columns as they are, which a batch's
#: hidden columns are exposed under (Spark's AddMetadataColumns passes them so).
_PASSING_ROWS = ("Filter", "CollectMetrics")


class BindablePlan:
    """An analysed plan with placeholder leaves, bound to each batch's DataFrames.

    Spark's MicroBatchExecution binds a batch the same way: each StreamingExecutionRelation
    of the analysed query becomes the batch's plan under a projection that gives the batch's
    columns the relation's attribute ids, so everything above still refers to them and the
    analyser has nothing left to resolve. The bound plan is marked analysed (it is: the
    analysed template over the batch's analysed plans, whose columns have the placeholders'
    exact types, which the caller guarantees), so Spark does not analyse it again. What
    each binding needs from the placeholders (names, attribute ids) is read once, and the
    projection's columns are made again only when a batch's input columns are not the
    attributes of the batch before (a bound plan's output keeps its attributes).

    ``functions`` names Python functions of the plan a binding may replace: a stateful
    step's task carries its batch's state version and watermarks, so each batch binds its
    own. The new function is pickled as PySpark pickles a UDF's and takes the place of the
    old one in its ``PythonUDF`` (same inputs, type and result id), as Spark's
    IncrementalExecution gives each batch's stateful operators their state info."""

    def __init__(self, prepared: Any, placeholders: list[Any],
                 functions: Mapping[str, PythonFunctionRef] | None = None):
        self.prepared = prepared
        self.placeholders = []
        #: per placeholder whose hidden columns the plan reads (a file source's ``_metadata``):
        #: the placeholder as the analyser rewrote it to expose them, and those columns
        self._hidden: list[tuple[Any, list[tuple[str, Any, Any]]] | None] = []
        leaves = prepared.collectLeaves()
        leaves = [leaves.apply(i) for i in range(leaves.size())]
        for placeholder in placeholders:
            if placeholder.getClass().getSimpleName() == "Join":
                placeholder = _join_as_read(prepared, placeholder)
            output = placeholder.output()
            self.placeholders.append((placeholder, [(output.apply(i).name(), output.apply(i).exprId())
                                                    for i in range(output.size())]))
            hidden = placeholder.metadataOutput()
            exposed = _exposed(placeholder) if hidden.nonEmpty() else None
            if exposed is not None and any(leaf.equals(exposed) for leaf in leaves):
                self._hidden.append((exposed, [(hidden.apply(i).name(), hidden.apply(i).exprId(),
                                                hidden.apply(i).dataType()) for i in range(hidden.size())]))
            else:
                self._hidden.append(None)
        #: per placeholder, the batch columns it was last bound to and their projection
        self._projections: list[tuple[Any, Any] | None] = [None] * len(self.placeholders)
        self._alias = jvm_class("org.apache.spark.sql.catalyst.expressions.Alias")
        self._project = jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project")
        self._python_udf = jvm_class("org.apache.spark.sql.catalyst.expressions.PythonUDF")
        self._simple_function = jvm_class("org.apache.spark.api.python.SimplePythonFunction")
        self._hash_map = jvm_class("java.util.HashMap")
        self._dataset = jvm_class(running_version().dataset_class)
        self._utils = jvm_class("org.apache.spark.api.python.PythonUtils")
        self._no_names = self._utils.toSeq([])
        self._none = jvm_class("scala.None$")
        self.functions = {name: self._find_function(ref) for name, ref in (functions or {}).items()}
        if self.functions:
            sc = SparkContext._active_spark_context
            self._broadcast_threshold = self._utils.getBroadcastThreshold(sc._jsc)
            self._no_broadcasts = jvm_class("java.util.ArrayList")()

    def _find_function(self, ref: PythonFunctionRef) -> tuple:
        """The ``PythonUDF`` of ``ref`` in the prepared plan (a node's expression, or under
        an alias of a projection), with the fields a replacement keeps."""
        pending = [self.prepared]
        while pending:
            node = pending.pop()
            expressions = node.expressions()
            for i in range(expressions.size()):
                expression = expressions.apply(i)
                if expression.getClass().getSimpleName() == "Alias":
                    expression = expression.child()
                if expression.getClass().getSimpleName() == "PythonUDF" \
                        and expression.resultId().equals(ref.result_id):
                    function = expression.func()
                    return (expression, ref.return_type, expression.name(), expression.dataType(),
                            expression.children(), expression.evalType(), expression.udfDeterministic(),
                            (function.envVars(), function.pythonIncludes(), function.pythonExec(),
                             function.pythonVer(), function.accumulator()))
            children = node.children()
            pending.extend(children.apply(i) for i in range(children.size()))
        raise ValueError(f"No Python function with result id {ref.result_id} in the plan")

    def bind(self, inputs: list[BatchInput], functions: Mapping[str, Any] | None = None) -> Any:
        """The plan with placeholder i replaced by ``inputs[i]``'s plan, and each named
        function by the Python callable given for it, as a DataFrame of the session."""
        from pyspark.sql import DataFrame
        session = inputs[0].df.sparkSession
        plan = self.prepared
        if functions:
            replaced = self._hash_map()
            for name, func in functions.items():
                old, return_type, udf_name, data_type, children, eval_type, deterministic, context = \
                    self.functions[name]
                new_function = self._python_function(session.sparkContext, func, return_type, context)
                replaced.put(old, self._python_udf(udf_name, new_function, data_type, children, eval_type,
                                                   deterministic, old.resultId()))
            plan = plan.transformAllExpressions(self._utils.toScalaMap(replaced))
        replacements = self._hash_map()
        for i, ((placeholder, columns), given) in enumerate(zip(self.placeholders, inputs)):
            last = self._projections[i]
            if last is None or not given.output.equals(last[0]):
                aliases = [self._alias(given.output.apply(j), name, expr_id, self._no_names, self._none,
                                       self._no_names)
                           for j, (name, expr_id) in enumerate(columns)]
                last = (given.output, self._utils.toSeq(aliases))
                self._projections[i] = last
            replacements.put(placeholder, self._project(last[1], given.plan))
            if self._hidden[i] is not None:
                exposed, hidden = self._hidden[i]
                replacements.put(exposed, self._with_hidden_columns(given, last[1], hidden))
        plan = plan.transform(self._utils.toScalaMap(replacements))
        plan.setAnalyzed()
        return DataFrame(self._dataset.ofRows(session._jsparkSession, plan), session)

    def _with_hidden_columns(self, given: BatchInput, aliases: Any, hidden: list[tuple[str, Any, Any]]) -> Any:
        """The batch's plan under the placeholder's columns and its hidden ones, as Spark's
        AddMetadataColumns exposes them: the batch's file relation (under the projection
        that orders its partition columns, if any) with its metadata columns added. A batch
        without such a relation (none of the source's files) has no rows: nulls stand in.
        A batch whose last column is ``CARRIED_METADATA`` gives that column as ``_metadata``.
        A filter over the batch (the one Spark's engine gives the scan: ``ScanFilter``) and
        the observation of a watermark's event times over it (``CollectMetrics``) stay over
        it."""
        plan, found, filters = given.plan, {}, []
        last = given.output.apply(given.output.size() - 1)
        if last.name() == CARRIED_METADATA:     # (the batch carries them in a column of its own)
            found = {"_metadata": last}
        while not found and plan.getClass().getSimpleName() in _PASSING_ROWS:
            filters.append(plan)
            plan = plan.child()
        relation = plan.children().apply(0) if plan.getClass().getSimpleName() == "Project" else plan
        if not found and relation.getClass().getSimpleName() == "LogicalRelation" and relation.metadataOutput().nonEmpty():
            metadata = relation.metadataOutput()
            found = {metadata.apply(j).name(): metadata.apply(j) for j in range(metadata.size())}
            exposed = relation.withMetadataColumns()
            plan = exposed if relation is plan else self._project(
                plan.projectList().appendedAll(metadata), exposed)
        for filtered in reversed(filters):
            plan = filtered.withNewChildren(self._utils.toSeq([plan]))
        literal = jvm_class("org.apache.spark.sql.catalyst.expressions.Literal")
        columns = [self._alias(found[name] if name in found else literal.create(None, data_type), name, expr_id,
                               self._no_names, self._none, self._no_names)
                   for name, expr_id, data_type in hidden]
        return self._project(aliases.appendedAll(self._utils.toSeq(columns)), plan)

    def _python_function(self, sc: SparkContext, func: Any, return_type: Any, context: tuple) -> Any:
        """``func`` as the JVM's PythonFunction, as PySpark's ``udf._wrap_function`` makes it
        (the pickled ``(func, return_type)``), with the interpreter, environment and
        accumulator of the function it replaces. A command that PySpark would broadcast
        (too large, or holding broadcast variables) goes through PySpark's own path."""
        from pyspark.serializers import CloudPickleSerializer
        from pyspark.sql.udf import _wrap_function
        pickled = CloudPickleSerializer().dumps((func, return_type))
        if len(pickled) > self._broadcast_threshold or any(True for _ in sc._pickled_broadcast_vars):
            return _wrap_function(sc, func, return_type)
        env, includes, python_exec, python_ver, accumulator = context
        return self._simple_function(bytearray(pickled), env, includes, python_exec, python_ver,
                                     self._no_broadcasts, accumulator)


#: Executed-plan leaves a kept batch plan may have: they read nothing outside the plan
#: (the sources' own frames, ``spark.range(tasks).mapInArrow(...)``, and literal rows).
_RERUNNABLE_LEAVES = {"RangeExec", "LocalTableScanExec"}


def runs_again_alike(df: Any) -> bool:
    """Whether ``df``'s executed plan, planned once, gives a new batch's rows when run
    again: no exchange (a shuffle's map output, a broadcast's relation are kept by the
    plan and would be read again instead of made anew), no subquery (its result is kept
    too), and only leaves that read nothing outside the plan (a file scan keeps its
    listing). Plans it; the sink's action reuses that planning."""
    plan = df._jdf.queryExecution().executedPlan()
    leaves = plan.collectLeaves()
    for i in range(leaves.size()):
        if leaves.apply(i).getClass().getSimpleName() not in _RERUNNABLE_LEAVES:
            return False
    text = plan.toString()
    return "Exchange" not in text and "Subquery" not in text
