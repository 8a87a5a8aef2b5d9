"""The state step of ``applyInPandasWithState``: one Spark task per state partition.

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

from microbatch.state.store import (EventTimeStats, StateStoreConf, StateStoreId, end_task, load_provider,
                                    task_metrics)

NO_TIMESTAMP = -1
TIMEOUT_FIELD = "timeoutTimestamp"


@dataclass(frozen=True)
class GroupStateTask:
    """The per-partition function of an ``applyInPandasWithState`` (shipped by cloudpickle)."""

    state_root: str
    operator_id: int
    version: int
    func: Callable
    key_indexes: tuple[int, ...]       # the grouping columns among the input columns
    key_types: tuple                   # their Spark types
    input_names: tuple[str, ...]       # the input columns
    key_schema: pa.Schema              # as stored
    value_schema: pa.Schema            # groupState (struct of the state's fields), timeoutTimestamp
    state_type: Any                    # the state's StructType (GroupState's valueSchema)
    output_schema: pa.Schema
    timeout_conf: str                  # GroupStateTimeout.NoTimeout, ...
    batch_timestamp_ms: int
    watermark_ms: int                  # this batch's (eviction) watermark, or -1 without one
    watermark_present: bool
    late_us: int | None                # event-time timeout: rows at or before this are late
    event_time_index: int | None       # the watermarked column among the input columns
    timezone: str
    max_records_per_batch: int
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum
    #: the watermarked column whose event-time statistics the task reports, for the
    #: watermark below (all rows, late ones too, as Spark's watermark node counts them)
    event_time_stats_index: int | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        store = load_provider(StateStoreId(self.state_root, self.operator_id, partition),
                              self.key_schema, self.value_schema, self.conf).get_store(self.version)
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
            frame = self._pandas(table)   # once per partition; a key's rows are taken from it
            for key, rows in self._groups(table):
                yield from self._call(store, key, (frame, rows), False, counts)
        if self.timeout_conf != "NoTimeout":
            threshold = self.batch_timestamp_ms if self.timeout_conf == "ProcessingTimeTimeout" else self.watermark_ms
            timed_out = [key for key, value in list(store.iterator())
                         if value[-1] != NO_TIMESTAMP and value[-1] < threshold]
            for key in timed_out:
                yield from self._call(store, key, None, True, counts)
        updates_ms = (time.monotonic() - started) * 1000
        store.commit()
        end_task(self.metrics, task_metrics(partition, store.metrics(), numRowsUpdated=counts["updated"],
                                      numRowsRemoved=counts["removed"], numRowsDroppedByWatermark=late,
                                      allUpdatesTimeMs=int(updates_ms)))

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
        """Calls the function for ``key``: with its rows (the partition's pandas frame and
        the rows' positions), or timed out (``rows`` None); then writes its state."""
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
            frame, positions = rows
            size = max(self.max_records_per_batch, 1)
            frames = (frame.take(positions[start:start + size]).reset_index(drop=True)
                      for start in range(0, len(positions), size))
            python_key = tuple(frame.iat[positions[0], i] for i in self.key_indexes)
        for result in self.func(python_key, frames, state):
            batch = pandas_to_arrow(result, self.output_schema, self.timezone)
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

    def _pandas(self, rows: pa.Table):
        """A key's rows as pandas, as PySpark gives them: timestamps in the session time
        zone, without a zone."""
        frame = rows.to_pandas()
        for field in rows.schema:
            if pa.types.is_timestamp(field.type) and field.type.tz is not None:
                frame[field.name] = frame[field.name].dt.tz_convert(self.timezone).dt.tz_localize(None)
        return frame

def pandas_to_arrow(frame: Any, output_schema: pa.Schema, timezone: str) -> pa.RecordBatch:
    """A function's pandas DataFrame as an Arrow batch of ``output_schema``: columns matched
    by name (by position when the labels are not strings), as PySpark matches them."""
    import pandas as pd
    from pyspark.errors import PySparkRuntimeError, PySparkTypeError

    if not isinstance(frame, pd.DataFrame):
        raise PySparkTypeError(
            errorClass="UDF_RETURN_TYPE",
            messageParameters={"expected": "iterator of pandas.DataFrame",
                               "actual": f"iterator of {type(frame).__name__}"})
    names = output_schema.names
    if len(frame.columns) == 0 and frame.empty:
        return pa.RecordBatch.from_pylist([], schema=output_schema)
    if len(frame.columns) != len(names):
        raise PySparkRuntimeError(
            errorClass="RESULT_COLUMN_SCHEMA_MISMATCH",
            messageParameters={"expected": str(len(names)), "actual": str(len(frame.columns))})
    if any(isinstance(c, str) for c in frame.columns):
        # by name, as PySpark assigns them; where PySpark would give nulls for a name
        # it does not find, this says which names are wrong
        missing = sorted(set(names) - set(frame.columns))
        extra = sorted(set(frame.columns) - set(names))
        if missing or extra:
            raise PySparkRuntimeError(
                errorClass="RESULT_COLUMN_NAMES_MISMATCH",
                messageParameters={"missing": f" Missing: {', '.join(missing)}." if missing else "",
                                   "extra": f" Unexpected: {', '.join(extra)}." if extra else ""})
        columns = [frame[name] for name in names]
    else:
        columns = [frame.iloc[:, i] for i in range(len(names))]
    arrays = []
    for field, series in zip(output_schema, columns):
        if pa.types.is_timestamp(field.type) and getattr(series.dt, "tz", None) is None \
                and str(series.dtype).startswith("datetime64"):
            series = series.dt.tz_localize(timezone).dt.tz_convert("UTC")
        arrays.append(pa.array(series, type=field.type, from_pandas=True))
    return pa.RecordBatch.from_arrays(arrays, schema=output_schema)


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
