"""The calls into Spark's JVM that PySpark has no public API for, in one place.

microbatch gives users PySpark's own objects. Some of them only exist with a JVM
object behind them: PySpark's ``StreamingQueryException`` answers ``getCondition()``,
``getMessageParameters()`` and ``getSqlState()`` from the JVM exception it wraps, and
Spark's error messages are formatted by the JVM from its error-condition catalogue.
This module builds those JVM objects (py4j) and hands back what PySpark would hand
back, so a Spark upgrade that moves one of them breaks here and nowhere else. The
side-by-side tests exercise every call (``tests/test_pyspark_objects.py``,
``test_argument_checks.py``, ``test_tables.py``, ``test_named_sources.py``).
"""
from __future__ import annotations

import json
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from py4j.protocol import Py4JJavaError
from pyspark import SparkContext
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException, convert_exception
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

#: JVM exception classes by the short names this module takes; each is built with
#: ``(errorClass, messageParameters)`` and formatted from Spark's error catalogue.
_ERROR_CLASSES = {
    "AnalysisException": "org.apache.spark.sql.AnalysisException",
    "SparkIllegalArgumentException": "org.apache.spark.SparkIllegalArgumentException",
    "SparkUnsupportedOperationException": "org.apache.spark.SparkUnsupportedOperationException",
}


def _jvm():
    jvm = SparkContext._jvm
    if jvm is None:
        raise RuntimeError("No active SparkContext: start a SparkSession first.")
    return jvm


#: JVM classes and Scala objects by name, per JVM (``jvm_class``)
_JVM_NAMES: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def jvm_class(path: str) -> Any:
    """The JVM class named ``path`` (``"java.util.HashMap"``), or the Scala object when
    the name ends in ``$`` (its ``MODULE$``), looked up once per JVM: py4j resolves each
    dotted name in a round trip, 1-2 ms for a class."""
    jvm = _jvm()
    known = _JVM_NAMES.setdefault(jvm, {})
    found = known.get(path)
    if found is None:
        found = jvm
        for part in path.split("."):
            found = getattr(found, part)
        if path.endswith("$"):
            found = getattr(found, "MODULE$")
        known[path] = found
    return found


def scala_map(values: Mapping[str, str]) -> Any:
    """A ``scala.collection.immutable.Map[String, String]``."""
    java_map = jvm_class("java.util.HashMap")()
    for key, value in values.items():
        java_map.put(str(key), str(value))
    return jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap(java_map)


def spark_error(kind: str, error_class: str, **parameters: Any) -> CapturedException:
    """Spark's exception for ``error_class`` with its catalogued message, as PySpark
    raises it (e.g. ``pyspark.errors.AnalysisException`` with ``getCondition()``)."""
    params = scala_map({k: str(v) for k, v in parameters.items()})
    if kind == "SparkRuntimeException":
        jexception = _jvm().org.apache.spark.SparkRuntimeException(
            error_class, params, None, _empty_query_contexts(), "")
    elif kind == "SparkIllegalStateException":   # (class, parameters, contexts, cause, summary)
        jexception = _jvm().org.apache.spark.SparkIllegalStateException(
            error_class, params, _empty_query_contexts(), None, _jvm().scala.Option.apply(None))
    else:
        constructor = _jvm()
        for part in _ERROR_CLASSES[kind].split("."):
            constructor = getattr(constructor, part)
        jexception = constructor(error_class, params)
    exception = convert_exception(jexception)
    if getattr(exception, "_origin", None) is None:
        # PySpark converts a class it does not know (SparkIllegalStateException) to an
        # UnknownException without its origin, whose getCondition() is then None
        exception._origin = jexception
    return exception


def jvm_throwable(error: BaseException) -> Any:
    """The JVM exception behind ``error``, or a JVM stand-in for a Python one.

    An error that came from a Spark job or from Spark's analyzer has its JVM exception
    (PySpark keeps it as ``_origin``); it is used as it is. A Python error becomes a
    ``SparkException`` carrying its message, error class and parameters (when it is a
    ``PySparkException``), with the Python frames as its stack trace, so the JVM's
    exception strings (``QueryTerminatedEvent.exception``) show where it happened."""
    origin = getattr(error, "_origin", None)
    if origin is not None:
        return origin
    java_exception = getattr(error, "java_exception", None)   # py4j.protocol.Py4JJavaError
    if java_exception is not None:
        return java_exception
    jvm = _jvm()
    error_class = params = None
    if isinstance(error, PySparkException):
        error_class = error.getCondition()
        params = error.getMessageParameters()
    message = str(error) if error_class else f"{type(error).__name__}: {error}"
    option = jvm.scala.Option
    cause = getattr(error.__cause__, "_origin", None)   # e.g. the Spark job a task error failed
    jexception = jvm.org.apache.spark.SparkException(
        message, cause, option.apply(error_class), scala_map(params or {}),
        _empty_query_contexts())
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    elements = SparkContext._gateway.new_array(jvm.java.lang.StackTraceElement, len(frames))
    for i, frame in enumerate(reversed(frames)):
        elements[i] = jvm.java.lang.StackTraceElement(
            frame.filename.rsplit("/", 1)[-1].removesuffix(".py"), frame.name,
            frame.filename, frame.lineno or -1)
    jexception.setStackTrace(elements)
    return jexception


def _empty_query_contexts() -> Any:
    return SparkContext._gateway.new_array(_jvm().org.apache.spark.QueryContext, 0)


def python_proxy_error(error: BaseException) -> Any:
    """What the JVM sees when Python code it called raised (py4j's proxy error): the
    message carries the Python traceback, as for a Spark ``foreachBatch`` function."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return _jvm().py4j.Py4JException(
        "An exception was raised by the Python Proxy. Return Message: " + text)


def foreach_batch_user_error(error: BaseException) -> Any:
    """Spark's ``FOREACH_BATCH_USER_FUNCTION_ERROR`` around a user function's error."""
    cause = python_proxy_error(error)
    jvm = _jvm()
    return jvm.org.apache.spark.sql.execution.streaming.sources.ForeachBatchUserFuncException(cause)


def is_foreach_user_error(jexception: Any) -> bool:
    name = jexception.getClass().getName()
    return name.endswith(".ForeachBatchUserFuncException") or name.endswith(".ForeachUserFuncException")


def error_condition(jexception: Any) -> str | None:
    """The error class of a JVM exception, if it is a ``SparkThrowable``."""
    from py4j.java_gateway import is_instance_of
    if is_instance_of(SparkContext._gateway, jexception, "org.apache.spark.SparkThrowable"):
        return _jvm().PythonErrorUtils.getCondition(jexception)
    return None


def exception_string(jexception: Any) -> str:
    """Spark's ``Utils.exceptionString``: class, message and stack trace."""
    return getattr(_jvm(), "org.apache.spark.util.Utils").exceptionString(jexception)


def streaming_query_exception(debug_string: str, cause: Any, start_offsets: str,
                              end_offsets: str, query_id: str, run_id: str,
                              message: str) -> Any:
    """Spark's ``StreamingQueryException`` (``STREAM_FAILED``) as the JVM builds it."""
    return _jvm().org.apache.spark.sql.streaming.StreamingQueryException(
        debug_string, cause, start_offsets, end_offsets, "STREAM_FAILED",
        scala_map({"id": query_id, "runId": run_id, "message": message}))


def captured(jexception: Any) -> CapturedException:
    """PySpark's exception for a JVM one, as py4j calls raise it."""
    return convert_exception(jexception)


def schema_ddl(spark: SparkSession, schema: StructType) -> str:
    """``StructType.toDDL``: column definitions for ``CREATE TABLE``."""
    return spark._jsparkSession.parseDataType(schema.json()).toDDL()


def schema_string(schema: StructType) -> str:
    """A schema as Spark's messages print it (Scala's ``StructType.toString``:
    ``StructType(StructField(id,IntegerType,true),...)``)."""
    return jvm_class("org.apache.spark.sql.types.DataType").fromJson(schema.json()).toString()


@dataclass(frozen=True)
class CatalogTableInfo:
    """What a streaming read or write of a catalog table needs to know about it."""

    name: str                     # the qualified name, e.g. spark_catalog.default.t
    table_type: str               # MANAGED, EXTERNAL or VIEW
    provider: str | None          # parquet, json, ...
    location: str | None          # a file: URI
    partition_columns: list[str]
    storage_properties: dict[str, str]


def temp_view_exists(spark: SparkSession, name: str) -> bool:
    catalog = spark._jsparkSession.sessionState().catalog()
    parts = spark._jsparkSession.sessionState().sqlParser().parseMultipartIdentifier(name)
    return bool(catalog.isTempView(parts))


def catalog_table(spark: SparkSession, name: str) -> CatalogTableInfo | None:
    """The session catalog's metadata of table ``name``, or None if there is none."""
    state = spark._jsparkSession.sessionState()
    identifier = state.sqlParser().parseTableIdentifier(name)
    catalog = state.catalog()
    if not catalog.tableExists(identifier):
        return None
    table = catalog.getTableMetadata(identifier)
    provider = table.provider()
    location = table.storage().locationUri()
    partitions = table.partitionColumnNames()
    properties = table.storage().properties()
    return CatalogTableInfo(
        name=table.qualifiedName(),
        table_type=table.tableType().name(),
        provider=provider.get() if provider.isDefined() else None,
        location=location.get().toString() if location.isDefined() else None,
        partition_columns=[partitions.apply(i) for i in range(partitions.size())],
        storage_properties={k: properties.apply(k) for k in _scala_keys(properties)})


def _scala_keys(scala_mapping: Any) -> list[str]:
    keys, iterator = [], scala_mapping.keys().iterator()
    while iterator.hasNext():
        keys.append(iterator.next())
    return keys


# -- observed metrics ------------------------------------------------------------------
def observation_row(observation: Any, wait_s: float) -> Any:
    """The JVM row an ``Observation`` received, waiting up to ``wait_s`` for the query
    execution listener that fills it (it may lag the action a little); None if the
    action that ran the observed DataFrame was not a SQL action, or none ran."""
    future = observation._jo.future()
    deadline = time.monotonic() + wait_s
    while not future.isCompleted() and time.monotonic() < deadline:
        time.sleep(0.005)
    return observation._jo.getRow() if future.isCompleted() else None


def run_to_end(df: Any) -> int:
    """Runs ``df``'s own executed plan to the end, dropping its rows; how many there were
    (the executed plan keeps its metrics and observations, as for an RDD action)."""
    return int(df._jdf.queryExecution().toRdd().count())


def executed_observation_row(df: Any, name: str) -> Any:
    """The JVM row observed as ``name`` by ``df``'s own executed plan (an RDD action such
    as ``foreachPartition`` runs it); None if that plan has none."""
    found = df._jdf.queryExecution().observedMetrics().get(name)
    return found.get() if found.isDefined() else None


def row_json(jrow: Any) -> Any:
    """A JVM row as Spark's ``Row.json`` writes it (parsed)."""
    return json.loads(jrow.json())


def python_row(jrow: Any) -> Any:
    """A JVM row as PySpark hands one to Python (``Observation.get`` does the same)."""
    from pyspark.serializers import CPickleSerializer
    utils = getattr(_jvm(), "org.apache.spark.sql.api.python.PythonSQLUtils")
    return CPickleSerializer().loads(utils.toPyRow(jrow))


# -- arguments parsed as Spark parses them ------------------------------------------------
def parse_schema_ddl(ddl: str) -> StructType:
    """A DDL schema string parsed by Spark (``StructType.fromDDL``); a bad one raises
    Spark's ``ParseException``, as ``readStream.schema(ddl)`` does in PySpark."""
    jschema = _jvm().org.apache.spark.sql.types.StructType.fromDDL(ddl)
    return StructType.fromJson(json.loads(jschema.json()))


def processing_time_ms(interval: str) -> int:
    """``Trigger.ProcessingTime(interval)`` as Spark parses it (``"5 seconds"``,
    ``"interval 1 minute"``, ...): its error for an interval it refuses."""
    return int(_jvm().org.apache.spark.sql.streaming.Trigger.ProcessingTime(interval).intervalMs())


# -- a stream-stream join's condition, from Spark's analyzed plan ------------------------
@dataclass(frozen=True)
class TimeTerm:
    """One side of a time comparison: ``side``'s column ``index`` (None: no column) plus
    ``offset_us`` microseconds (interval literals)."""

    side: int | None
    index: int | None
    offset_us: int


def join_condition(joined: Any) -> tuple[list[tuple[int, int]], list[tuple[str, TimeTerm, TimeTerm]]]:
    """The equality keys (left index, right index) and the time comparisons
    (op, lhs, rhs) of ``left.join(right, condition)``, read from Spark's analyzed ``Join``;
    ValueError naming the part of the condition that is neither."""
    plan = joined._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "Join" or plan.condition().isEmpty():
        raise ValueError("the join has no condition")
    sides = []
    for child in (plan.left(), plan.right()):
        output = child.output()
        sides.append({output.apply(i).exprId().id(): i for i in range(output.size())})

    def attribute(e: Any) -> tuple[int, int] | None:
        if e.getClass().getSimpleName() != "AttributeReference":
            return None
        for side, ids in enumerate(sides):
            if e.exprId().id() in ids:
                return side, ids[e.exprId().id()]
        return None

    def term(e: Any) -> TimeTerm:
        name = e.getClass().getSimpleName()
        if name == "Cast":
            return term(e.child())
        if name == "DatetimeSub":
            return term(e.replacement())
        if name in ("TimestampAddInterval", "TimeAdd", "DatetimeAdd"):
            base, interval = term(e.children().apply(0)), term(e.children().apply(1))
            if interval.side is not None:
                raise ValueError(f"an interval that is a column ({e.toString()})")
            return TimeTerm(base.side, base.index, base.offset_us + interval.offset_us)
        if name == "UnaryMinus":
            inner = term(e.child())
            if inner.side is not None:
                raise ValueError(f"a negated time column ({e.toString()})")
            return TimeTerm(None, None, -inner.offset_us)
        if name == "Literal" and e.dataType().typeName().startswith("interval"):
            value = e.value()
            if e.dataType().getClass().getSimpleName().startswith("CalendarInterval"):
                if value.months != 0:
                    raise ValueError(f"an interval in months or years ({e.toString()})")
                return TimeTerm(None, None, value.days * 86_400_000_000 + value.microseconds)
            return TimeTerm(None, None, int(value))
        found = attribute(e)
        if found is not None and e.dataType().typeName() in ("timestamp", "timestamp_ntz"):
            return TimeTerm(found[0], found[1], 0)
        raise ValueError(f"'{e.toString()}'")

    keys: list[tuple[int, int]] = []
    comparisons: list[tuple[str, TimeTerm, TimeTerm]] = []
    operators = {"LessThan": "<", "LessThanOrEqual": "<=", "GreaterThan": ">", "GreaterThanOrEqual": ">="}

    def split(e: Any) -> None:
        name = e.getClass().getSimpleName()
        if name == "And":
            split(e.left())
            split(e.right())
            return
        if name == "Between":   # input BETWEEN lower AND upper: input >= lower AND input <= upper
            value, lower, upper = term(e.input()), term(e.lower()), term(e.upper())
            if value.side is not None and {lower.side, upper.side} == {1 - value.side}:
                comparisons.extend([(">=", value, lower), ("<=", value, upper)])
                return
        if name == "EqualTo":
            a, b = attribute(e.left()), attribute(e.right())
            if a and b and a[0] != b[0]:
                keys.append((a[1], b[1]) if a[0] == 0 else (b[1], a[1]))
                return
        if name in operators:
            lhs, rhs = term(e.left()), term(e.right())
            if lhs.side is not None and rhs.side is not None and lhs.side != rhs.side:
                comparisons.append((operators[name], lhs, rhs))
                return
        raise ValueError(f"'{e.toString()}'")

    split(plan.condition().get())
    return keys, comparisons


_CURRENT_LIKE = ("current_timestamp()", "now()", "current_date(", "localtimestamp(")


def uses_current_time(df: Any) -> bool:
    """Whether ``df``'s analyzed plan refers to the current time or date."""
    text = df._jdf.queryExecution().analyzed().toString()
    return any(token in text for token in _CURRENT_LIKE)


def with_batch_timestamp(spark: SparkSession, df: Any, timestamp_ms: int) -> Any:
    """``df`` with ``current_timestamp()``, ``now()``, ``current_date()`` and
    ``localtimestamp()`` replaced by the batch timestamp (Spark's ``CurrentBatchTimestamp``):
    a catalyst transform of the analyzed plan, with a Scala Map as the partial function."""
    from py4j.java_collections import MapConverter
    from pyspark.sql import DataFrame
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
    scala_partial = jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap(java_map)
    plan = df._jdf.queryExecution().analyzed().transformAllExpressions(scala_partial)
    return DataFrame(jvm_class("org.apache.spark.sql.classic.Dataset").ofRows(spark._jsparkSession, plan), spark)


def filter_can_skip_column(filtered: Any, column: str) -> bool:
    """Whether ``filtered`` (a DataFrame whose last step is a filter) filters on a
    deterministic condition that does not refer to the top-level ``column``: what Spark's
    optimizer needs to push such a filter below a watermark on ``column``."""
    analyzed = filtered._jdf.queryExecution().analyzed()
    if analyzed.getClass().getSimpleName() != "Filter":
        return False
    condition = analyzed.condition()
    if not condition.deterministic():
        return False
    output = analyzed.child().output()
    for i in range(output.size()):
        attribute = output.apply(i)
        if attribute.name().lower() == column.lower():
            return not condition.references().contains(attribute)
    return False   # a nested event time: keep the filter after the watermark


def filter_passes_projection(filtered: Any) -> bool:
    """Whether ``filtered`` (a DataFrame whose last step is a filter over a projection)
    can filter before the projection unchanged, as Spark's optimizer pushes it: the
    condition and the projection deterministic, and every column the condition uses
    passed through the projection as it was (not computed, not renamed)."""
    analyzed = filtered._jdf.queryExecution().analyzed()
    if analyzed.getClass().getSimpleName() != "Filter" or not analyzed.condition().deterministic():
        return False
    project = analyzed.child()
    if project.getClass().getSimpleName() != "Project":
        return False
    entries = project.projectList()
    passed = set()
    for i in range(entries.size()):
        entry = entries.apply(i)
        if not entry.deterministic():
            return False
        if entry.getClass().getSimpleName() == "AttributeReference":
            passed.add(entry.exprId().id())
    used = analyzed.condition().references().toSeq()
    return all(used.apply(i).exprId().id() in passed for i in range(used.size()))


def filter_passes_filter(filtered: Any) -> bool:
    """Whether ``filtered`` (a DataFrame whose last step is a filter over another filter)
    can filter before that other filter, as Spark's optimizer combines the two (the lower
    condition deterministic: CombineFilters) and pushes the parts of the result on its
    own; the condition that moves must be deterministic too."""
    analyzed = filtered._jdf.queryExecution().analyzed()
    if analyzed.getClass().getSimpleName() != "Filter" or not analyzed.condition().deterministic():
        return False
    lower = analyzed.child()
    return lower.getClass().getSimpleName() == "Filter" and lower.condition().deterministic()


def projections_keep_column(projected: Any, below: Any, column: str) -> bool:
    """Whether ``projected`` is ``below`` under projections (and aliases) only, so that
    each of its rows is one of ``below``'s, and keeps ``below``'s ``column`` as it is (the
    same attribute, under the same name)."""
    base = analyzed_plan(below)
    base_output = base.output()
    wanted = column.lower()
    attribute = next((base_output.apply(i) for i in range(base_output.size())
                      if base_output.apply(i).name().lower() == wanted), None)
    plan = analyzed_plan(projected)
    output = plan.output()
    if attribute is None or not any(output.apply(i).name().lower() == wanted
                                    and output.apply(i).exprId().equals(attribute.exprId())
                                    for i in range(output.size())):
        return False
    while not plan.equals(base):
        if plan.getClass().getSimpleName() not in ("Project", "SubqueryAlias"):
            return False
        plan = plan.child()
    return True


def job_tags(sc: SparkContext) -> set[str]:
    """The calling thread's job tags, as ``SparkContext.getJobTags()`` gives them, without
    PySpark's walk of the Java set: py4j's iterator ends in a Java exception that PySpark
    converts, about 15 ms of a query's start."""
    tags = sc._jsc.getJobTags()
    return set(tags.toArray()) if tags.size() else set()


def empty_dataframe(spark: SparkSession, schema: StructType) -> Any:
    """An empty DataFrame of ``schema`` (its exact types and nullability), as a local
    relation: PySpark's ``createDataFrame([], schema)`` goes through an RDD, about 17 ms.
    For placeholders that are analysed, never run: Spark's optimizer knows a local
    relation is empty (PropagateEmptyRelation) and drops the steps above one, so a
    batch without rows is ``empty_batch``'s (a stateful task above it still has to run)."""
    return _empty_in_jvm(spark, schema, lambda: jvm_class("java.util.ArrayList")())


def empty_batch(spark: SparkSession, schema: StructType) -> Any:
    """An empty DataFrame of ``schema`` over an RDD, as ``createDataFrame([], schema)``
    makes it (a ``LogicalRDD`` of ``defaultParallelism`` empty partitions, which the
    optimizer does not drop, so the steps above a batch without rows still run), but made
    in the JVM: about 5 ms instead of PySpark's 15-17 (a Python RDD serialized through a
    temporary file)."""
    def rows():
        jsc = spark.sparkContext._jsc
        return jsc.parallelize(jvm_class("java.util.ArrayList")(), jsc.sc().defaultParallelism())
    return _empty_in_jvm(spark, schema, rows)


def _empty_in_jvm(spark: SparkSession, schema: StructType, rows) -> Any:
    """``createDataFrame(rows(), schema)`` on the JVM session (``rows``: a Java list, or a
    JavaRDD of rows); PySpark's ``createDataFrame([], schema)`` where the JVM refuses."""
    from pyspark.sql import DataFrame
    try:
        jschema = spark._jsparkSession.parseDataType(schema.json())
        jdf = spark._jsparkSession.createDataFrame(rows(), jschema)
    except (PySparkException, Py4JJavaError):   # e.g. CHAR/VARCHAR columns, which that path refuses
        return spark.createDataFrame([], schema)
    return DataFrame(jdf, spark)


def analyzed_plan(df: Any) -> Any:
    """``df``'s analysed logical plan (a JVM ``LogicalPlan``)."""
    return df._jdf.queryExecution().analyzed()


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
        for placeholder in placeholders:
            output = placeholder.output()
            self.placeholders.append((placeholder, [(output.apply(i).name(), output.apply(i).exprId())
                                                    for i in range(output.size())]))
        #: per placeholder, the batch columns it was last bound to and their projection
        self._projections: list[tuple[Any, Any] | None] = [None] * len(self.placeholders)
        self._alias = jvm_class("org.apache.spark.sql.catalyst.expressions.Alias")
        self._project = jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project")
        self._python_udf = jvm_class("org.apache.spark.sql.catalyst.expressions.PythonUDF")
        self._simple_function = jvm_class("org.apache.spark.api.python.SimplePythonFunction")
        self._hash_map = jvm_class("java.util.HashMap")
        self._dataset = jvm_class("org.apache.spark.sql.classic.Dataset")
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
        plan = plan.transform(self._utils.toScalaMap(replacements))
        plan.setAnalyzed()
        return DataFrame(self._dataset.ofRows(session._jsparkSession, plan), session)

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


class FileBatches:
    """Batch DataFrames of files a file source's log names, made as Spark's
    FileStreamSource.getBatch makes them: a ``DataSource`` of the files with the stream's
    schema and the reader's options, resolved without checking that each file exists
    (the source has just checked, and ``spark.read.load`` would check each again in a
    thread pool: 10-20 ms a batch of one file)."""

    def __init__(self, spark: SparkSession, fmt: str, schema: StructType, options: Mapping[str, str]):
        self._spark = spark
        self._format = fmt
        self._data_source = jvm_class("org.apache.spark.sql.execution.datasources.DataSource")
        self._logical_relation = jvm_class("org.apache.spark.sql.execution.datasources.LogicalRelation$")
        self._dataset = jvm_class("org.apache.spark.sql.classic.Dataset")
        self._utils = jvm_class("org.apache.spark.api.python.PythonUtils")
        self._schema = jvm_class("scala.Some")(spark._jsparkSession.parseDataType(schema.json()))
        self._options = scala_map(options)
        self._none = jvm_class("scala.None$")
        self._no_columns = self._utils.toSeq([])

    def dataframe(self, paths: list[str]) -> Any:
        from pyspark.sql import DataFrame
        source = self._data_source(self._spark._jsparkSession, self._format, self._utils.toSeq(paths),
                                   self._schema, self._no_columns, self._none, self._options, self._none,
                                   self._none)
        # (checkFilesExist, readOnly, forceNullable), as DataFrameReader.load resolves it
        relation = self._logical_relation.apply(source.resolveRelation(False, True, True), False)
        return DataFrame(self._dataset.ofRows(self._spark._jsparkSession, relation), self._spark)


class RangeBatches:
    """Batch DataFrames of ``spark.range(start, end, 1, partitions)`` with the ids as
    ``value`` and one ``timestamp`` for the whole batch (a ``rate-micro-batch`` batch),
    made from a plan analysed once: a batch builds its ``Range`` and the timestamp's
    literal under the prepared projection, with the same output attributes every batch
    (so a plan prepared over the source binds it without new aliases). Building it through
    PySpark (``range`` then ``selectExpr``, each analysed) cost about 8 ms a batch."""

    def __init__(self, spark: SparkSession, partitions: int):
        self._spark = spark
        template = analyzed_plan(spark.range(0, 1, 1, partitions)
                                 .selectExpr("timestamp_millis(0) AS timestamp", "id AS value"))
        columns = template.projectList()
        timestamp = columns.apply(0)
        self._timestamp_name, self._timestamp_id = timestamp.name(), timestamp.exprId()
        self._value = columns.apply(1)
        range_plan = template.child()
        self._range_output, self._slices = range_plan.output(), range_plan.numSlices()
        catalyst = "org.apache.spark.sql.catalyst."
        self._range = jvm_class(catalyst + "plans.logical.Range")
        self._project = jvm_class(catalyst + "plans.logical.Project")
        self._alias = jvm_class(catalyst + "expressions.Alias")
        self._literal = jvm_class(catalyst + "expressions.Literal$")
        self._instant = jvm_class("java.time.Instant")
        self._timestamp_type = jvm_class("org.apache.spark.sql.types.TimestampType$")
        self._dataset = jvm_class("org.apache.spark.sql.classic.Dataset")
        utils = jvm_class("org.apache.spark.api.python.PythonUtils")
        self._to_seq = utils.toSeq
        self._no_names = utils.toSeq([])
        self._none = jvm_class("scala.None$")
        self._list = jvm_class("java.util.ArrayList")

    def dataframe(self, start: int, end: int, timestamp_ms: int) -> Any:
        from pyspark.sql import DataFrame
        # (a timestamp literal holds a Long of microseconds, and py4j sends small ints as
        # Integer: the literal is made from an Instant)
        instant = self._instant.ofEpochMilli(int(timestamp_ms))
        timestamp = self._alias(self._literal.create(instant, self._timestamp_type), self._timestamp_name,
                                self._timestamp_id, self._no_names, self._none, self._no_names)
        columns = self._list(2)
        columns.add(timestamp)
        columns.add(self._value)
        plan = self._project(self._to_seq(columns),
                             self._range(start, end, 1, self._slices, self._range_output, False))
        plan.setAnalyzed()
        return DataFrame(self._dataset.ofRows(self._spark._jsparkSession, plan), self._spark)


def grouping_columns(grouped: Any) -> list[str | None]:
    """What a PySpark ``GroupedData`` groups by, key by key: a top-level column's name
    (``df.groupBy("id")``, ``df.groupBy(df["id"])``), or None for anything else (an
    expression, a nested field)."""
    expressions = grouped._jgd.groupingExprs()
    names: list[str | None] = []
    for i in range(expressions.size()):
        expression = expressions.apply(i)
        kind = expression.getClass().getSimpleName()
        if kind == "AttributeReference" or (kind == "UnresolvedAttribute" and expression.nameParts().size() == 1):
            names.append(expression.name())
        else:
            names.append(None)
    return names


def grouping_column_names(grouped: Any) -> list[str]:
    """The column names a PySpark ``GroupedData`` groups by (``df.groupBy("id")``); a
    ValueError if it groups by something else than columns."""
    names = grouping_columns(grouped)
    if None in names:
        expressions = grouped._jgd.groupingExprs()
        raise ValueError("The initial state must be grouped by columns, not by "
                         f"{expressions.apply(names.index(None)).sql()}")
    return names  # type: ignore[return-value]


def conjuncts_without_column(filtered: Any, column: str) -> tuple[list[str], list[str]] | None:
    """The conjuncts of the filter that is ``filtered``'s last step, as SQL text, split as
    Spark's optimizer splits a filter above a watermark on ``column``: those it pushes below
    (deterministic, not using the column) and those that stay. None when the last step is
    not a filter or ``column`` is not a top-level column of its input."""
    analyzed = analyzed_plan(filtered)
    if analyzed.getClass().getSimpleName() != "Filter":
        return None
    output = analyzed.child().output()
    target = next((output.apply(i) for i in range(output.size())
                   if output.apply(i).name().lower() == column.lower()), None)
    if target is None:
        return None
    parts: list[Any] = []

    def split(expression: Any) -> None:
        if expression.getClass().getSimpleName() == "And":
            split(expression.left())
            split(expression.right())
        else:
            parts.append(expression)

    split(analyzed.condition())
    pushed, kept = [], []
    for part in parts:
        movable = part.deterministic() and not part.references().contains(target)
        (pushed if movable else kept).append(part.sql())
    return pushed, kept


def python_data_source(spark: SparkSession, name: str) -> type | None:
    """The ``pyspark.sql.datasource.DataSource`` class registered under ``name`` with
    ``spark.dataSource.register`` (or found by Spark among installed packages), as the
    JVM's DataSourceManager holds it: PySpark's serialized class, read back as PySpark's
    workers read it. None when no Python data source has that name."""
    from pyspark.serializers import CloudPickleSerializer
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(name):
        return None
    command = manager.lookupDataSource(name).dataSourceCls().command()
    return CloudPickleSerializer().loads(bytes(command.unsafeArray()))
