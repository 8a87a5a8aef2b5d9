"""applyInPandasWithState's step and task (``operators.group_state`` says what they do), and
the pandas conversions it shares with transformWithState."""
from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Iterator

import pyarrow as pa

from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, LongType, MapType, StructField, StructType

from microbatch.operators.base import OperatorBatch, StatefulStep, StateTask, task_partition
from microbatch.operators.event_time_stats import EventTimeStats
from microbatch.operators.pandas_groups import (TIMEOUT_FIELD, PandasConversion, arrow_table, keyed_state_shape,
                                                state_fields, storage_value, stored_value, user_value,
                                                without_late_rows)

NO_TIMESTAMP = -1


@dataclass(frozen=True)
class GroupStateTask(StateTask):
    """The per-partition function of an ``applyInPandasWithState`` (shipped by cloudpickle)."""

    func: Callable = None
    key_indexes: tuple = ()            # the grouping columns among the input columns
    key_types: tuple = ()              # their Spark types
    input_names: tuple = ()            # the input columns the function gets (the leading ones)
    key_schema: pa.Schema = None       # as stored
    key_arrow: pa.Schema = None        # as the input has them (a timed-out key is given to the function so)
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
        table = arrow_table(list(batches))
        if self.event_time_stats_index is not None and table.num_rows:
            stats = EventTimeStats()
            for chunk in table.column(self.event_time_stats_index).chunks:
                stats.add_micros(chunk.cast(pa.int64()))
            stats.report(self.metrics, partition)
        table, late = without_late_rows(table, self.event_time_index, self.late_us)
        counts = {"updated": 0, "removed": 0}
        if table.num_rows:
            size = self.pandas.chunk_rows(table)
            if _dtypes_vary(table):
                # PySpark's worker converts each DataFrame of a key's rows on its own: an int
                # column is float64 only in a DataFrame with a null, an array of ints an int
                # array only where it holds no null; so is each DataFrame converted here
                frame, data = None, table
            else:   # once per partition; a key's rows are taken from it
                frame = self.pandas.to_pandas(table)
                data = frame if frame.shape[1] == len(self.input_names) else frame.iloc[:, :len(self.input_names)]
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
        for key in sorted(rows_of, key=_ascending):
            yield key, rows_of[key]

    def _call(self, store, key: tuple, rows: tuple | None, timed_out: bool, counts: dict):
        """Calls the function for ``key``: with its rows (the partition's pandas frame, its
        columns the function gets, the rows a DataFrame holds, and the rows' positions), or
        timed out (``rows`` None); then writes its state."""
        from pyspark.sql import Row
        from pyspark.sql.streaming.state import GroupState

        stored = store.get(key)
        old_timeout = stored[-1] if stored is not None else NO_TIMESTAMP
        value = self._from_store(state_fields(stored[0])) if stored is not None else None
        state = GroupState(
            optionalValue=Row(*value) if value is not None else None,
            batchProcessingTimeMs=self.batch_timestamp_ms, eventTimeWatermarkMs=self.watermark_ms,
            timeoutConf=self.timeout_conf, hasTimedOut=timed_out, watermarkPresent=self.watermark_present,
            defined=value is not None, updated=False, removed=False, timeoutTimestamp=NO_TIMESTAMP,
            keyAsUnsafe=b"", valueSchema=self.state_type)
        if rows is None:   # as PySpark calls a timed-out key: one empty DataFrame
            import pandas as pd
            frames: Iterator = iter([pd.DataFrame(columns=list(self.input_names))])
            python_key = self._python_key(key)
        elif rows[0] is None:   # each DataFrame converted from the key's rows in the table
            _, table, size, positions = rows
            chunks = [table.take(positions[start:start + size]) for start in range(0, len(positions), size)]
            first = self.pandas.to_pandas(chunks[0])
            python_key = tuple(first.iat[0, i] for i in self.key_indexes)
            width = len(self.input_names)
            frames = (f if f.shape[1] == width else f.iloc[:, :width]
                      for f in chain([first], (self.pandas.to_pandas(c) for c in chunks[1:])))
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

    def _python_key(self, key: tuple) -> tuple:
        """A stored key as the function gets a timed-out key: as PySpark's worker reads the
        key's columns from Arrow (a struct as a dict, an array as a numpy array, a map as a
        dict; numbers as numpy's, timestamps as pandas')."""
        from microbatch.state.files import from_state_values
        columns = [from_state_values([v], stored.type, field.type)
                   for v, stored, field in zip(key, self.key_schema, self.key_arrow)]
        frame = self.pandas.to_pandas(pa.table(columns, names=self.key_arrow.names))
        return tuple(frame.iat[0, i] for i in range(len(columns)))

    def _from_store(self, value: tuple | None) -> tuple | None:
        """A stored state as the function sees it: as PySpark's worker reads the JVM's
        pickled state (``StructType.fromInternal``): timestamps as datetimes, structs as
        ``Row`` s with their names, arrays as lists, maps as dicts."""
        if value is None:
            return None
        return tuple(user_value(f.dataType, v) for f, v in zip(self.state_type.fields, value))

    def _to_store(self, value: tuple) -> tuple:
        """A state value as the store keeps it: as PySpark's worker hands it to the JVM
        (``StructType.toInternal``: timestamps as µs, a struct given as a tuple, ``Row`` or
        dict as its fields), numpy scalars as Python's."""
        return tuple(stored_value(f.dataType, storage_value(v))
                     if not isinstance(f.dataType, (StructType, ArrayType, MapType)) or v is None
                     else f.dataType.toInternal(v)
                     for f, v in zip(self.state_type.fields, value))


def _dtypes_vary(table: pa.Table) -> bool:
    """Whether the pandas types of a key's rows may differ from those of the whole table's:
    a column with a null, or a nested one (its elements' nulls are its children's)."""
    return any(column.null_count or pa.types.is_nested(column.type) for column in table.columns)


def _ascending(key: tuple) -> tuple:
    """The order of Spark's sort of the grouping keys: ascending, nulls first, at every
    depth (a struct field by field, an array element by element)."""
    return tuple((False, ()) if v is None else (True, _ascending(v) if isinstance(v, tuple) else v) for v in key)


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
            key_arrow=shape["key_arrow"],
            value_schema=shape["value_schema"], state_type=node.state_schema,
            pandas=shape["pandas"], timeout_conf=node.timeout,
            batch_timestamp_ms=batch.batch_timestamp_ms,
            watermark_ms=batch.eviction_ms if has_watermark else -1, watermark_present=has_watermark,
            late_us=batch.late_ms * 1000 if node.timeout == "EventTimeTimeout" and event_time is not None else None,
            event_time_index=event_time, event_time_stats_index=stats_index)
        return self.bind([df], task, self.map_by_keys(shape["partition"], shape["output"]))

    def _document_extras(self) -> dict:
        # (Spark keeps no timeoutTimestamp without a timeout: spark_layout.py)
        return {"timeout": self.node.timeout}

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        by_lower = {f.name.lower(): f for f in input_schemas[0].fields}
        key = StructType([by_lower[k.lower()] for k in self.node.keys])
        return key, StructType([StructField("groupState", self.node.state_schema),
                                StructField(TIMEOUT_FIELD, LongType(), False)])
