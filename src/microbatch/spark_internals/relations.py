"""The relations a batch reads: empty batches and placeholders, file and range batches
made in the JVM with the same output columns every batch."""
from __future__ import annotations

import functools

from typing import Any, Mapping

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from microbatch.spark_internals.analysis import analyzed_plan
from microbatch.spark_internals.jvm import jvm_class, scala_map
from microbatch.spark_internals.versions import running_version


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


def metadata_column(name: str, plan_id: int | None = None) -> Any:
    """A Column naming a relation's hidden (metadata) column by name, unresolved, as Spark
    Connect's ``DataFrame.metadataColumn`` makes it: classic PySpark's resolves it against
    the DataFrame's own plan, whose attribute a stream's batches do not have. With
    ``plan_id``, the column of the plan tagged with it (``with_plan_id``), as Connect
    resolves a DataFrame's column (Spark's PLAN_ID_TAG): over a join of two sides that
    both have the column, it is the tagged side's."""
    from pyspark.sql import Column
    node = jvm_class("org.apache.spark.sql.internal.UnresolvedAttribute").apply(
        name, jvm_class("scala.None$") if plan_id is None else jvm_class("scala.Some")(_long(plan_id)), True)
    return Column(jvm_class("org.apache.spark.sql.Column")(node))


#: plan ids microbatch tags plans with start here: py4j passes a Python int of more than 32
#: bits as a Java Long, which the tag's value must be (Connect's own ids are small)
PLAN_IDS_FROM = 1 << 40


def _long(plan_id: int) -> int:
    if plan_id < PLAN_IDS_FROM:
        raise ValueError(f"a plan id of microbatch's is at least {PLAN_IDS_FROM}, not {plan_id}")
    return plan_id


def with_plan_id(df: Any, plan_id: int, in_place: bool = False) -> Any:
    """``df`` with its plan's root tagged with ``plan_id`` (Spark's PLAN_ID_TAG), which a
    ``metadata_column(name, plan_id)`` resolves against: a copy of the plan (``in_place``:
    the plan itself, which the plans of the DataFrames made from ``df`` share)."""
    from pyspark.sql import DataFrame
    plan = df._jdf.logicalPlan()
    if not in_place:
        plan = plan.clone()
    plan.setTagValue(jvm_class("org.apache.spark.sql.catalyst.plans.logical.LogicalPlan$").PLAN_ID_TAG(),
                     _long(plan_id))
    if in_place:
        return df
    return DataFrame(jvm_class(running_version().dataset_class).ofRows(df.sparkSession._jsparkSession, plan),
                     df.sparkSession)


class FileBatches:
    """Batch DataFrames of files a file source's log names, made as Spark's
    FileStreamSource.getBatch makes them: a ``DataSource`` of the files with the stream's
    schema and the reader's options, resolved without checking that each file exists
    (the source has just checked, and ``spark.read.load`` would check each again in a
    thread pool: 10-20 ms a batch of one file)."""

    def __init__(self, spark: SparkSession, fmt: str, schema: StructType, options: Mapping[str, str],
                 partition_columns: tuple[str, ...] = ()):
        self._spark = spark
        self._format = fmt
        self._data_source = jvm_class("org.apache.spark.sql.execution.datasources.DataSource")
        self._logical_relation = jvm_class("org.apache.spark.sql.execution.datasources.LogicalRelation$")
        self._dataset = jvm_class(running_version().dataset_class)
        self._utils = jvm_class("org.apache.spark.api.python.PythonUtils")
        self._schema = jvm_class("scala.Some")(spark._jsparkSession.parseDataType(schema.json()))
        self._options = scala_map(options)
        self._none = jvm_class("scala.None$")
        self._partition_columns = self._utils.toSeq(list(partition_columns))
        # DataSource's trailing Options (catalogTable; 4.2+ also a source name) and
        # resolveRelation's flags (checkFilesExist; readOnly from 4.0, forceNullable from
        # 4.2) vary by version: counted once from the class
        self._constructor_options, self._resolve_flags = _data_source_arity()

    def dataframe(self, paths: list[str]) -> Any:
        from pyspark.sql import DataFrame
        source = self._data_source(self._spark._jsparkSession, self._format, self._utils.toSeq(paths),
                                   self._schema, self._partition_columns, self._none, self._options,
                                   *([self._none] * self._constructor_options))
        # (checkFilesExist, readOnly, forceNullable), as DataFrameReader.load resolves it
        flags = (False, True, True)[:self._resolve_flags]
        relation = self._logical_relation.apply(source.resolveRelation(*flags), False)
        return DataFrame(self._dataset.ofRows(self._spark._jsparkSession, relation), self._spark)


@functools.lru_cache(maxsize=1)
def _data_source_arity() -> tuple[int, int]:
    """(the trailing Option parameters of DataSource's constructor, the flags of its
    resolveRelation) in the running Spark."""
    cls = jvm_class("java.lang.Class").forName("org.apache.spark.sql.execution.datasources.DataSource")
    constructor = max(len(c.getParameterTypes()) for c in cls.getConstructors())
    flags = max(len(m.getParameterTypes()) for m in cls.getMethods() if m.getName() == "resolveRelation")
    return constructor - 7, flags


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
        self._dataset = jvm_class(running_version().dataset_class)
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
