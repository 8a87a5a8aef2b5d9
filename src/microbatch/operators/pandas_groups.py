"""What applyInPandasWithState and transformWithState share: the pandas conversions of a
key's rows and of the function's output (PySpark's), late rows dropped from a key's
rows, stored values as Python values and back, and the shape of their keyed state."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from microbatch import spark_internals
from microbatch.errors import pyspark_error
from microbatch.operators.base import quoted, store_field
from microbatch.plan.logical import Apply, PlanNode

TIMEOUT_FIELD = "timeoutTimestamp"


@dataclass(frozen=True)
class PandasConversion:
    """How a function's rows become pandas DataFrames and its DataFrames Arrow batches of
    its declared output, as PySpark's worker converts them: PySpark's own conversions,
    with the session's settings."""

    spark_schema: Any                  # the declared output StructType
    arrow_schema: pa.Schema            # the batches' schema (timestamps in UTC)
    timezone: str                      # spark.sql.session.timeZone
    safecheck: bool = False            # spark.sql.execution.pandas.convertToArrowArraySafely
    int_to_decimal: bool = False       # spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled
    int_extension_dtypes: bool = False  # spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype
    max_records: int = 10_000          # spark.sql.execution.arrow.maxRecordsPerBatch (<= 0: no limit)
    max_bytes: int | None = None       # spark.sql.execution.arrow.maxBytesPerBatch, where the function honours it

    @classmethod
    def of(cls, spark_schema: Any, arrow_schema: pa.Schema, conf: Any, *, byte_limit: bool = False
           ) -> "PandasConversion":
        """``conf``: the session's RuntimeConfig. ``byte_limit``: a key's rows are chunked by
        their Arrow size too (transformWithStateInPandas)."""
        from microbatch.util import byte_size

        def flag(key: str) -> bool:
            return str(conf.get(key, "false")).lower() == "true"
        return cls(spark_schema, arrow_schema, conf.get("spark.sql.session.timeZone"),
                   flag("spark.sql.execution.pandas.convertToArrowArraySafely"),
                   flag("spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled"),
                   flag("spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype"),
                   int(conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")),
                   byte_size(conf.get("spark.sql.execution.arrow.maxBytesPerBatch", "64m")) if byte_limit else None)

    def to_pandas(self, table: pa.Table):
        """Rows as the function gets them: PySpark's Arrow-to-pandas conversion (timestamps
        in the session time zone without a zone, as nanoseconds)."""
        import pandas as pd
        from pyspark.sql.conversion import ArrowBatchTransformer
        columns = ArrowBatchTransformer.to_pandas(table, timezone=self.timezone,
                                                  prefer_int_ext_dtype=self.int_extension_dtypes)
        frame = pd.concat(columns, axis=1)
        frame.columns = table.column_names
        return frame

    def chunk_rows(self, table: pa.Table) -> int:
        """How many of a key's rows one DataFrame holds: at most ``max_records`` and, with a
        byte limit, as many as reach it at the rows' average Arrow size (PySpark cuts a
        chunk once ``rows * average >= limit``)."""
        size = self.max_records if self.max_records > 0 else 2**31 - 1
        if self.max_bytes is not None and table.num_rows:
            average = table.get_total_buffer_size() / table.num_rows
            if average > 0:
                size = min(size, max(1, -(-self.max_bytes // average)))
        return int(size)

    def batch(self, frame: Any) -> pa.RecordBatch:
        """``frame`` as an Arrow batch of the output: columns matched by name (by position
        when the labels are not strings), as PySpark matches them."""
        import pandas as pd
        from pyspark.errors import PySparkRuntimeError, PySparkTypeError
        from pyspark.sql.conversion import PandasToArrowConversion

        if not isinstance(frame, pd.DataFrame):
            raise pyspark_error(PySparkTypeError, "UDF_RETURN_TYPE", {"expected": "iterator of pandas.DataFrame",
                                   "actual": f"iterator of {type(frame).__name__}"})
        names = self.arrow_schema.names
        if len(frame.columns) == 0 and frame.empty:
            return pa.RecordBatch.from_pylist([], schema=self.arrow_schema)
        if len(frame.columns) != len(names):
            raise pyspark_error(PySparkRuntimeError, "RESULT_COLUMN_SCHEMA_MISMATCH", {"expected": str(len(names)), "actual": str(len(frame.columns))})
        if any(isinstance(c, str) for c in frame.columns):
            # by name, as PySpark assigns them; where PySpark would give nulls for a name
            # it does not find, this says which names are wrong
            missing = sorted(set(names) - set(frame.columns))
            extra = sorted(set(frame.columns) - set(names))
            if missing or extra:
                raise pyspark_error(PySparkRuntimeError, "RESULT_COLUMN_NAMES_MISMATCH", {"missing": f" Missing: {', '.join(missing)}." if missing else "",
                                       "extra": f" Unexpected: {', '.join(extra)}." if extra else ""})
        if not len(frame):   # (PySpark concatenates a batch's results: an empty one adds nothing)
            return pa.RecordBatch.from_pylist([], schema=self.arrow_schema)
        batch = PandasToArrowConversion.convert(
            frame, self.spark_schema, timezone=self.timezone, safecheck=self.safecheck, arrow_cast=True,
            assign_cols_by_name=True, int_to_decimal_coercion_enabled=self.int_to_decimal)
        return batch if batch.schema == self.arrow_schema else batch.cast(self.arrow_schema)


def without_late_rows(table: pa.Table, event_time_index: int | None, late_us: int | None) -> tuple[pa.Table, int]:
    """``table`` without the rows whose event time is at or before ``late_us``, and how
    many those were (nothing is late without a late bound or an event-time column)."""
    if late_us is None or event_time_index is None or not table.num_rows:
        return table, 0
    import pyarrow.compute as pc
    times = pc.cast(table.column(event_time_index), pa.int64())
    keep = pc.invert(pc.fill_null(pc.less_equal(times, late_us), False))
    late = table.num_rows - pc.sum(pc.cast(keep, pa.int64())).as_py()
    return table.filter(keep), late


def arrow_table(batches: list) -> pa.Table:
    return pa.Table.from_batches(batches) if batches else pa.table({})


def state_fields(value: Any) -> tuple | None:
    """A stored groupState as a tuple (it reads back from the files as a dict)."""
    if isinstance(value, dict):
        return tuple(value.values())
    return value


def is_timestamp(spark_type: Any) -> bool:
    from pyspark.sql.types import TimestampNTZType, TimestampType
    return isinstance(spark_type, (TimestampType, TimestampNTZType))


def python_value(spark_type: Any, value: Any) -> Any:
    """A stored value of ``spark_type`` as PySpark gives it (µs -> datetime)."""
    return spark_type.fromInternal(value) if value is not None and is_timestamp(spark_type) else value


def user_value(spark_type: Any, value: Any) -> Any:
    """A stored value as PySpark gives it to a user's function (``fromInternal``; Spark's
    rows unpickled by its state client): a struct a ``Row`` (stored as a tuple, or as a dict
    when read back from files), an array a list, a map a dict (stored as pairs or a dict), a
    timestamp a datetime."""
    from pyspark.sql.types import ArrayType, MapType, _create_row
    if value is None:
        return None
    if isinstance(spark_type, StructType):
        items = [value.get(f.name) for f in spark_type.fields] if isinstance(value, dict) else value
        return _create_row(spark_type.names, [user_value(f.dataType, v) for f, v in zip(spark_type.fields, items)])
    if isinstance(spark_type, ArrayType):
        return [user_value(spark_type.elementType, v) for v in value]
    if isinstance(spark_type, MapType):
        pairs = value.items() if isinstance(value, dict) else value
        return {user_value(spark_type.keyType, k): user_value(spark_type.valueType, v) for k, v in pairs}
    return python_value(spark_type, value)


def stored_value(spark_type: Any, value: Any) -> Any:
    """A Python value of ``spark_type`` as the store keeps it (datetime -> µs)."""
    if value is None or not is_timestamp(spark_type) or isinstance(value, int):
        return value
    return spark_type.toInternal(value)


def storage_value(value: Any) -> Any:
    """A value as the store keeps it (numpy scalars as Python values)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (bytes, str)) else value


def keyed_state_shape(node: Any, df: DataFrame) -> dict:
    """What the batches of an applyInPandasWithState (or of a transformWithState, ``node``)
    share, made once per run."""
    schema = df.schema
    names = [n.lower() for n in schema.fieldNames()]
    event_time = node.watermarked_input()
    late = getattr(node, "late_rows_column", None)
    conf = df.sparkSession.conf
    state_fields = [store_field(f) for f in getattr(node, "state_schema", StructType()).fields]
    return {
        "key_indexes": tuple(names.index(k.lower()) for k in node.keys),
        # the columns the function gets: without keys added for grouping expressions
        "input_names": schema.fieldNames()[:node.data_columns],
        "key_types": tuple(schema.fields[names.index(k.lower())].dataType for k in node.keys),
        "key_schema": pa.schema([store_field(schema.fields[names.index(k.lower())]) for k in node.keys]),
        "key_arrow": pa.schema([pa.field(k, spark_internals.arrow_type(schema.fields[names.index(k.lower())].dataType))
                                for k in node.keys]),
        "value_schema": pa.schema([pa.field("groupState", pa.struct(state_fields)),
                                   pa.field(TIMEOUT_FIELD, pa.int64())]),
        "pandas": PandasConversion.of(node.output_schema, pa.schema(
            [pa.field(f.name, spark_internals.arrow_type(f.dataType)) for f in node.output_schema.fields]), conf,
            byte_limit=getattr(node, "rows_api", True) is False),   # transformWithStateInPandas
        # Spark widens a stateful operator's output to nullable
        "output": StructType([StructField(f.name, f.dataType, True) for f in node.output_schema.fields]),
        # the column late rows are dropped by: the first marked one of Spark's exec's input
        # (a renamed event time, or the column of the frame before the watermark), not the
        # name withWatermark was given
        "event_time": names.index(late.lower()) if late and late.lower() in names else None,
        "has_watermark": event_time is not None,
        "encoding": conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow").lower(),
        "output_event_time": node.output_schema.names.index(node.event_time_column)
        if getattr(node, "event_time_column", None) else None,
        "partition": [F.col(quoted(k)) for k in node.keys],
    }


def opaque_stand_in(node: Any) -> PlanNode:
    """What stands for an applyInPandasWithState or a transformWithState (``node``) in the
    batch plans Spark's optimizer reads (``StatefulNode.scan_filter_stand_in``): its input,
    every column of it read by a Python function that gives the node's output columns
    (``mapInPandas``, never run). Spark's optimizer pushes no filter through it, as it pushes
    none through FlatMapGroupsInPandasWithState or TransformWithStateInPySpark, and the
    filters below it still reach the scans. The node's own batch (an empty relation) left
    its input out of the plan: a filter below it reached no scan, which then counted the
    rows Spark's drops, and a watermark under that filter saw them (fuzzer seeds 1674, 1750,
    1865, 2193)."""
    schema = node.output_schema
    return Apply(node.child, lambda df: df.mapInPandas(_no_rows, schema), node.describe())


def _no_rows(batches):
    return iter(())
