"""``applyInPandasWithState``: its step, its task (one Spark task per state partition), its
state; and the pandas conversions it shares with transformWithState.

Spark's ``FlatMapGroupsInPandasWithStateExec``. The batch's rows, hash-partitioned by
the grouping keys into the state partitions, reach the task as Arrow; the task opens
the store of its partition at version N (the batch id) and then, as Spark does:

1. With an event-time timeout, drops rows at or before the previous batch's watermark
   (late; counted as ``numRowsDroppedByWatermark``).
2. Calls the user's function once per key that has rows, in ascending key order (nulls
   first), with the key as a tuple, an iterator of pandas DataFrames (the key's rows, in
   chunks of ``spark.sql.execution.arrow.maxRecordsPerBatch``) and PySpark's own
   ``GroupState`` over the key's stored state. A call starts with no timeout set, as in
   Spark: a function that wants one sets it again each time.
3. With a timeout, calls the function for every stored key whose timeout timestamp is
   set and before the threshold (the batch's processing time, or this batch's watermark
   for an event-time timeout), with ``hasTimedOut`` true and, as PySpark calls it, one
   empty DataFrame of the input's columns.
4. After each call, Spark's rule: a removed state without a timeout is removed from the
   store; else it is written when updated, removed or its timeout changed.

The store keeps per key Spark's value: ``groupState`` (a struct of the state's fields, null
when only a timeout is kept) and ``timeoutTimestamp`` (ms, -1 for none), so the state
reader shows what Spark's shows; timestamps as µs, given to the function as datetimes.
The function's DataFrames become Arrow batches of the declared output schema, columns
matched by name (by position when the labels are not strings), as PySpark matches them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from microbatch.errors import pyspark_error
from microbatch import spark_internals
from microbatch.operators.base import OperatorBatch, StatefulStep, StateTask, quoted, store_field, task_partition
from microbatch.operators.event_time_stats import EventTimeStats

NO_TIMESTAMP = -1
TIMEOUT_FIELD = "timeoutTimestamp"


@dataclass(frozen=True)
class GroupStateTask(StateTask):
    """The per-partition function of an ``applyInPandasWithState`` (shipped by cloudpickle)."""

    func: Callable = None
    key_indexes: tuple = ()            # the grouping columns among the input columns
    key_types: tuple = ()              # their Spark types
    input_names: tuple = ()            # the input columns the function gets (the leading ones)
    key_schema: pa.Schema = None       # as stored
    value_schema: pa.Schema = None     # groupState (struct of the state's fields), timeoutTimestamp
    state_type: Any = None             # the state's StructType (GroupState's valueSchema)
    pandas: PandasConversion = None    # rows to pandas and the function's DataFrames back
    timeout_conf: str = "NoTimeout"    # GroupStateTimeout.NoTimeout, ...
    batch_timestamp_ms: int = 0
    watermark_ms: int = -1             # this batch's (eviction) watermark, or -1 without one
    watermark_present: bool = False
    late_us: int | None = None         # event-time timeout: rows at or before this are late
    event_time_index: int | None = None  # the watermarked column among the input columns
    #: the watermarked column whose event-time statistics the task reports, for the
    #: watermark below (all rows, late ones too, as Spark's watermark node counts them)
    event_time_stats_index: int | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = task_partition()
        store = self.store(partition, self.key_schema, self.value_schema)
        started = time.monotonic()
        table = _table(list(batches))
        if self.event_time_stats_index is not None and table.num_rows:
            stats = EventTimeStats()
            for chunk in table.column(self.event_time_stats_index).chunks:
                stats.add_micros(chunk.cast(pa.int64()))
            stats.report(self.metrics, partition)
        table, late = without_late_rows(table, self.event_time_index, self.late_us)
        counts = {"updated": 0, "removed": 0}
        if table.num_rows:
            frame = self.pandas.to_pandas(table)   # once per partition; a key's rows are taken from it
            data = frame if frame.shape[1] == len(self.input_names) else frame.iloc[:, :len(self.input_names)]
            size = self.pandas.chunk_rows(table)
            for key, rows in self._groups(table):
                yield from self._call(store, key, (frame, data, size, rows), False, counts)
        if self.timeout_conf != "NoTimeout":
            threshold = self.batch_timestamp_ms if self.timeout_conf == "ProcessingTimeTimeout" else self.watermark_ms
            timed_out = [key for key, value in list(store.iterator())
                         if value[-1] != NO_TIMESTAMP and value[-1] < threshold]
            for key in timed_out:
                yield from self._call(store, key, None, True, counts)
        updates_ms = (time.monotonic() - started) * 1000
        store.commit()
        self.finish(partition, store.metrics(), numRowsUpdated=counts["updated"],
                    numRowsRemoved=counts["removed"], numRowsDroppedByWatermark=late,
                    allUpdatesTimeMs=int(updates_ms))

    def _groups(self, table: pa.Table):
        """(stored key, the positions of the key's rows) in ascending key order, nulls first."""
        from microbatch.state.files import state_values
        keys = list(zip(*[state_values(table.column(i), as_key=True) for i in self.key_indexes]))
        rows_of: dict[tuple, list[int]] = {}
        for row, key in enumerate(keys):
            rows_of.setdefault(key, []).append(row)
        for key in sorted(rows_of, key=lambda k: tuple((v is not None, v) for v in k)):
            yield key, rows_of[key]

    def _call(self, store, key: tuple, rows: tuple | None, timed_out: bool, counts: dict):
        """Calls the function for ``key``: with its rows (the partition's pandas frame, its
        columns the function gets, the rows a DataFrame holds, and the rows' positions), or
        timed out (``rows`` None); then writes its state."""
        from pyspark.sql import Row
        from pyspark.sql.streaming.state import GroupState

        stored = store.get(key)
        old_timeout = stored[-1] if stored is not None else NO_TIMESTAMP
        value = self._from_store(_fields(stored[0])) if stored is not None else None
        state = GroupState(
            optionalValue=Row(*value) if value is not None else None,
            batchProcessingTimeMs=self.batch_timestamp_ms, eventTimeWatermarkMs=self.watermark_ms,
            timeoutConf=self.timeout_conf, hasTimedOut=timed_out, watermarkPresent=self.watermark_present,
            defined=value is not None, updated=False, removed=False, timeoutTimestamp=NO_TIMESTAMP,
            keyAsUnsafe=b"", valueSchema=self.state_type)
        if rows is None:   # as PySpark calls a timed-out key: one empty DataFrame
            import pandas as pd
            frames: Iterator = iter([pd.DataFrame(columns=list(self.input_names))])
            python_key = tuple(_python(t, v) for t, v in zip(self.key_types, key))
        else:
            frame, data, size, positions = rows
            frames = (data.take(positions[start:start + size]).reset_index(drop=True)
                      for start in range(0, len(positions), size))
            python_key = tuple(frame.iat[positions[0], i] for i in self.key_indexes)
        for result in self.func(python_key, frames, state):
            batch = self.pandas.batch(result)
            if batch.num_rows:
                yield batch
        timeout = state._timeout_timestamp
        if state._removed and timeout == NO_TIMESTAMP:
            if stored is not None:
                store.remove(key)
                counts["removed"] += 1
        elif state._updated or state._removed or timeout != old_timeout:
            value = self._to_store(state._value) if state.exists else None
            store.put(key, (value, timeout))
            counts["updated"] += 1

    def _from_store(self, value: tuple | None) -> tuple | None:
        """A stored state as the function sees it (timestamps as datetimes, as PySpark's)."""
        if value is None:
            return None
        return tuple(_python(f.dataType, v) for f, v in zip(self.state_type.fields, value))

    def _to_store(self, value: tuple) -> tuple:
        """A state value as the store keeps it (timestamps as µs, numpy scalars as Python's)."""
        return tuple(_stored(f.dataType, _storage_value(v)) for f, v in zip(self.state_type.fields, value))

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


def _table(batches: list) -> pa.Table:
    return pa.Table.from_batches(batches) if batches else pa.table({})


def _fields(value: Any) -> tuple | None:
    """A stored groupState as a tuple (it reads back from the files as a dict)."""
    if isinstance(value, dict):
        return tuple(value.values())
    return value


def _is_timestamp(spark_type: Any) -> bool:
    from pyspark.sql.types import TimestampNTZType, TimestampType
    return isinstance(spark_type, (TimestampType, TimestampNTZType))


def _python(spark_type: Any, value: Any) -> Any:
    """A stored value of ``spark_type`` as PySpark gives it (µs -> datetime)."""
    return spark_type.fromInternal(value) if value is not None and _is_timestamp(spark_type) else value


def _stored(spark_type: Any, value: Any) -> Any:
    """A Python value of ``spark_type`` as the store keeps it (datetime -> µs)."""
    if value is None or not _is_timestamp(spark_type) or isinstance(value, int):
        return value
    return spark_type.toInternal(value)


def _storage_value(value: Any) -> Any:
    """A value as the store keeps it (numpy scalars as Python values)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (bytes, str)) else value


# -- the step --------------------------------------------------------------------------------
def keyed_state_shape(node: Any, df: DataFrame) -> dict:
    """What the batches of an applyInPandasWithState (or of a transformWithState, ``node``)
    share, made once per run."""
    schema = df.schema
    names = [n.lower() for n in schema.fieldNames()]
    event_time = node.watermarked_input()
    conf = df.sparkSession.conf
    state_fields = [store_field(f) for f in getattr(node, "state_schema", StructType()).fields]
    return {
        "key_indexes": tuple(names.index(k.lower()) for k in node.keys),
        # the columns the function gets: without keys added for grouping expressions
        "input_names": schema.fieldNames()[:node.data_columns],
        "key_types": tuple(schema.fields[names.index(k.lower())].dataType for k in node.keys),
        "key_schema": pa.schema([store_field(schema.fields[names.index(k.lower())]) for k in node.keys]),
        "value_schema": pa.schema([pa.field("groupState", pa.struct(state_fields)),
                                   pa.field(TIMEOUT_FIELD, pa.int64())]),
        "pandas": PandasConversion.of(node.output_schema, pa.schema(
            [pa.field(f.name, spark_internals.arrow_type(f.dataType)) for f in node.output_schema.fields]), conf,
            byte_limit=getattr(node, "rows_api", True) is False),   # transformWithStateInPandas
        # Spark widens a stateful operator's output to nullable
        "output": StructType([StructField(f.name, f.dataType, True) for f in node.output_schema.fields]),
        "event_time": names.index(event_time.lower()) if event_time and event_time.lower() in names else None,
        "has_watermark": event_time is not None,
        "encoding": conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow").lower(),
        "output_event_time": node.output_schema.names.index(node.event_time_column)
        if getattr(node, "event_time_column", None) else None,
        "partition": [F.col(quoted(k)) for k in node.keys],
    }


class GroupStateStep(StatefulStep):
    """Rows hash-partitioned by the grouping keys, then the task that calls the user's
    function per key and per timed-out key."""

    name = "applyInPandasWithState"

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        node, df = self.node, inputs[0]
        shape = self.cached("shape", lambda: keyed_state_shape(node, df))
        event_time, has_watermark = shape["event_time"], shape["has_watermark"]
        stats_index = None
        below = batch.statistics_of.get(0)
        if below is not None:
            names = [n.lower() for n in shape["input_names"]]
            if below.event_time.lower() in names:
                stats_index = names.index(below.event_time.lower())
                batch.reported[below] = ""
        task = GroupStateTask(
            self.state_root, self.operator_id, batch.batch_id, batch.store_conf, batch.metrics,
            func=node.func, key_indexes=shape["key_indexes"], key_types=shape["key_types"],
            input_names=tuple(shape["input_names"]), key_schema=shape["key_schema"],
            value_schema=shape["value_schema"], state_type=node.state_schema,
            pandas=shape["pandas"], timeout_conf=node.timeout,
            batch_timestamp_ms=batch.batch_timestamp_ms,
            watermark_ms=batch.eviction_ms if has_watermark else -1, watermark_present=has_watermark,
            late_us=batch.late_ms * 1000 if node.timeout == "EventTimeTimeout" and event_time is not None else None,
            event_time_index=event_time, event_time_stats_index=stats_index)
        return self.bind([df], task, self.map_by_keys(shape["partition"], shape["output"]))

    def _document_extras(self) -> dict:
        # (Spark keeps no timeoutTimestamp without a timeout: spark_stores.py)
        return {"timeout": self.node.timeout}

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        by_lower = {f.name.lower(): f for f in input_schemas[0].fields}
        key = StructType([by_lower[k.lower()] for k in self.node.keys])
        return key, StructType([StructField("groupState", self.node.state_schema),
                                StructField(TIMEOUT_FIELD, LongType(), False)])
