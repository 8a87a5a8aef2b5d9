"""What differs between the Spark versions microbatch runs on (PySpark 3.5.x to 4.3.x,
classic sessions), chosen once per JVM by the running Spark's version.

Spark 4.0 moved the classic ``Dataset`` and ``Column`` plumbing into
``org.apache.spark.sql.classic`` (``Dataset``, ``ExpressionUtils``) and PySpark's
classic ``Column`` into ``pyspark.sql.classic.column``; 3.5 has them in
``org.apache.spark.sql`` and ``pyspark.sql.column``, a ``Column`` built straight from an
expression. Features are gated here too: a feature a version's PySpark lacks is refused
on that version with a message naming the version that has it (``require``), never
silently degraded.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from microbatch.spark_internals.jvm import jvm_class


@dataclass(frozen=True)
class SparkVersion:
    """The running Spark's version and the names that follow from it."""

    text: str                  # e.g. "4.3.0"
    major: int
    minor: int

    @property
    def at_least_4(self) -> bool:
        return self.major >= 4

    def at_least(self, major: int, minor: int = 0) -> bool:
        return (self.major, self.minor) >= (major, minor)

    @property
    def dataset_class(self) -> str:
        return "org.apache.spark.sql.classic.Dataset" if self.at_least_4 else "org.apache.spark.sql.Dataset"


def parse_version(text: str) -> SparkVersion:
    parts = text.split("-")[0].split(".")
    return SparkVersion(text, int(parts[0]), int(parts[1]))


@functools.lru_cache(maxsize=1)
def running_version() -> SparkVersion:
    """The version of the PySpark this process runs (a classic session's JVM is the same
    release: PySpark refuses another)."""
    import pyspark
    return parse_version(pyspark.__version__)


def dataframe_of_plan(spark: Any, plan: Any) -> Any:
    """The PySpark DataFrame of an analysed logical plan (``Dataset.ofRows``)."""
    from pyspark.sql import DataFrame
    return DataFrame(jvm_class(running_version().dataset_class).ofRows(spark._jsparkSession, plan), spark)


def column_of_expression(expression: Any) -> Any:
    """PySpark's classic ``Column`` of a Catalyst expression."""
    if running_version().at_least_4:
        from pyspark.sql.classic.column import Column
        return Column(jvm_class("org.apache.spark.sql.classic.ExpressionUtils").column(expression))
    from pyspark.sql.column import Column
    return Column(jvm_class("org.apache.spark.sql.Column")(expression))


def expression_of_column(column: Any) -> Any:
    """The Catalyst expression of PySpark's classic ``Column``."""
    if running_version().at_least_4:
        return jvm_class("org.apache.spark.sql.classic.ExpressionUtils").expression(column._jc)
    return column._jc.expr()


@functools.lru_cache(maxsize=1)
def _arrow_timezone_keyword() -> bool:
    import inspect

    from pyspark.sql.pandas.types import to_arrow_type
    return "timezone" in inspect.signature(to_arrow_type).parameters


def arrow_type(data_type: Any) -> Any:
    """PySpark's Arrow type of a Spark type, timestamps in UTC (4.3 takes the zone as
    ``timezone``; earlier releases make UTC timestamps by default)."""
    from pyspark.sql.pandas.types import to_arrow_type
    return to_arrow_type(data_type, timezone="UTC") if _arrow_timezone_keyword() else to_arrow_type(data_type)


def arrow_schema(schema: Any) -> Any:
    """PySpark's Arrow schema of a StructType, timestamps in UTC (see ``arrow_type``)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC") if _arrow_timezone_keyword() else to_arrow_schema(schema)


def query_started_event(query_id: Any, run_id: Any, name: Any, timestamp: str, job_tags: set[str]) -> Any:
    """PySpark's ``QueryStartedEvent`` (its job tags from 4.1 on)."""
    import inspect

    from pyspark.sql.streaming.listener import QueryStartedEvent
    if "jobTags" in inspect.signature(QueryStartedEvent.__init__).parameters:
        return QueryStartedEvent(query_id, run_id, name, timestamp, job_tags)
    return QueryStartedEvent(query_id, run_id, name, timestamp)


def progress_shuffle_partitions(state_partitions: int, shuffle_partitions: int, store_instances: int) -> int:
    """A state operator's ``numShufflePartitions`` in progress: the run's shuffle
    partitions from 4.0 on; on 3.5 a count of the tasks that reported their stores: the
    operator's own state partitions (one for a global aggregation or a limit), none where
    no store instance was reported (a session window in complete mode)."""
    if running_version().at_least_4:
        return shuffle_partitions
    return state_partitions if store_instances else 0


def progress_operator_name(name: str, unnamed_before_4: bool = False) -> str:
    """A state operator's ``operatorName`` in progress: Spark 3.5 gives some no short name
    (``defaultName``: the session window's, whose home says so)."""
    if unnamed_before_4 and not running_version().at_least_4:
        return "defaultName"
    return name


def user_progress(progress: Any) -> Any:
    """What ``StreamingQuery.lastProgress``/``recentProgress`` give for a
    ``StreamingQueryProgress``: itself from 4.0 on (a dict); the JSON as a dict on 3.5."""
    if running_version().at_least_4:
        return progress
    import json
    return json.loads(progress.json)


def with_observed_rows(progress: Any, rows: dict) -> Any:
    """``progress`` carrying ``rows`` (Python ``Row`` objects) as its observed metrics, as
    PySpark's listener events carry them (a dict entry from 4.0 on, an attribute on 3.5)."""
    if running_version().at_least_4:
        dict.__setitem__(progress, "observedMetrics", rows)
    else:
        progress._observedMetrics = rows
    return progress


def dataframe_of_arrow(spark: Any, table: Any, schema: Any) -> Any:
    """A DataFrame of an Arrow table already on the driver (PySpark 4.0+ takes the table;
    3.5 its rows). A struct with two fields of one name (Spark's state rows have them: an
    aggregation's buffers of two ``count``s) goes over Arrow under unique names, which
    Spark's Arrow conversion requires (``DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT``), and is
    cast back to its own type, field by field in order."""
    if not running_version().at_least_4:
        return spark.createDataFrame(table.to_pylist(), schema)
    unique = _unique_field_names(schema)
    if unique == schema:
        return spark.createDataFrame(table, schema)
    import pyarrow as pa
    renamed = pa.Table.from_arrays([_renamed_array(column.combine_chunks(), field.dataType)
                                    for column, field in zip(table.columns, unique.fields)],
                                   names=unique.fieldNames())
    frame = spark.createDataFrame(renamed, unique)
    return frame.select(*[frame[i].cast(field.dataType).alias(field.name) for i, field in enumerate(schema.fields)])


def _unique_field_names(data_type: Any) -> Any:
    """``data_type`` with every struct's fields named apart (``count``, ``count_1``)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType
    if isinstance(data_type, StructType):
        seen: set[str] = set()
        fields = []
        for field in data_type.fields:
            name, n = field.name, 0
            while name in seen:
                n += 1
                name = f"{field.name}_{n}"
            seen.add(name)
            fields.append(StructField(name, _unique_field_names(field.dataType), field.nullable, field.metadata))
        return StructType(fields)
    if isinstance(data_type, ArrayType):
        return ArrayType(_unique_field_names(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, MapType):
        return MapType(_unique_field_names(data_type.keyType), _unique_field_names(data_type.valueType),
                       data_type.valueContainsNull)
    return data_type


def _renamed_array(array: Any, unique_type: Any) -> Any:
    """An Arrow array of structs (nested in structs) renamed to ``unique_type``'s names."""
    import pyarrow as pa
    from pyspark.sql.types import StructType
    if not isinstance(unique_type, StructType) or not pa.types.is_struct(array.type):
        return array
    children = [_renamed_array(array.field(i), field.dataType) for i, field in enumerate(unique_type.fields)]
    return pa.StructArray.from_arrays(children, names=unique_type.fieldNames(),
                                      mask=array.is_null() if array.null_count else None)


def na_functions(frame: Any) -> Any:
    """PySpark's ``DataFrameNaFunctions`` over ``frame`` (a DataFrame-like object)."""
    if running_version().at_least_4:
        from pyspark.sql.classic.dataframe import DataFrameNaFunctions
    else:
        from pyspark.sql.dataframe import DataFrameNaFunctions
    return DataFrameNaFunctions(frame)


def has_arrow_udf() -> bool:
    """Whether PySpark has scalar Arrow UDFs (``arrow_udf``, 4.1): before, a row-filtering
    task runs as a ``mapInArrow`` of the whole rows (``operators.base.row_filter_udf``)."""
    return running_version().at_least(4, 1)


def observation_has_row() -> bool:
    """Whether Spark's ``Observation`` keeps the observed row (``getRow``, 4.1): before,
    it keeps a map, and the row is read from the executions that ran it
    (``metrics.observed_rows``)."""
    return running_version().at_least(4, 1)


#: the oldest Spark line microbatch runs on (docs/spark-versions.md)
OLDEST_SUPPORTED = (3, 5)


def check_supported(spark: Any = None) -> None:
    """Refuse a Spark older than microbatch runs on before any query, saying why (a
    Spark Connect session: ``connect.session.check_supported``)."""
    from microbatch.errors import UnsupportedOperationError
    version = running_version()
    if not version.at_least(*OLDEST_SUPPORTED):
        raise UnsupportedOperationError(
            f"microbatch runs on PySpark {OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} to 4.3; this session runs "
            f"Spark {version.text}. Use PySpark {OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} or later.")


#: confs a checkpoint fixes (Spark's OffsetSeqMetadata.relevantSQLConfs) that came after
#: Spark 3.5, with the version that first records them in ``offsets/N`` (read from the
#: ``offsets/0`` each release's own engine writes)
CHECKPOINTED_CONF_SINCE: dict[str, tuple[int, int]] = {
    "spark.sql.streaming.stateStore.encodingFormat": (4, 0),
    "spark.sql.function.protobufExtensions.enabled": (4, 2),
    "spark.sql.streaming.queryEvolution.enableSourceEvolution": (4, 2),
    "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion": (4, 2),
    "spark.sql.streaming.stateStore.rowChecksum.enabled": (4, 2),
    "spark.sql.dropDuplicates.deterministicKeyOrder.enabled": (4, 3),
    "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled": (4, 3),
}


def records_conf(key: str) -> bool:
    """Whether the running Spark's engine records ``key`` in a checkpoint's offsets."""
    since = CHECKPOINTED_CONF_SINCE.get(key)
    return since is None or running_version().at_least(*since)


def max_offset_log_version() -> int:
    """The newest offset log format the running Spark reads: 2 (named sources, source
    evolution) from 4.2 on, 1 before."""
    return 2 if running_version().at_least(4, 2) else 1


#: features a PySpark version lacks, and the version that brought them
FEATURES: dict[str, tuple[int, int]] = {
    "transformWithStateInPandas": (4, 0),
    "transformWithState": (4, 1),
    "Python data sources": (4, 0),
    "named sources (readStream.name)": (4, 2),
    "metadataColumn": (4, 0),
    "clusterBy": (4, 0),
    "the state data source (format 'statestore')": (4, 0),
}


def require(feature: str) -> None:
    """Refuse ``feature`` on a Spark older than the one that has it, naming both."""
    from microbatch.errors import UnsupportedOperationError
    needed = FEATURES[feature]
    version = running_version()
    if not version.at_least(*needed):
        raise UnsupportedOperationError(
            f"{feature} needs Spark {needed[0]}.{needed[1]} or later; this session runs Spark {version.text}. "
            f"Run the query on PySpark {needed[0]}.{needed[1]}+, or without {feature}.")
