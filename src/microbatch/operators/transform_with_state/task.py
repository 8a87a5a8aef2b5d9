"""The state step of ``transformWithStateInPandas`` and ``transformWithState``: one Spark
task per state partition.

Spark's ``TransformWithStateInPandasExec``. The batch's rows, hash-partitioned by the
grouping keys into the state partitions, reach the task as Arrow; the task opens one store
per state variable of its partition (Spark's column families) and one for the timers, all
at version N (the batch id), and then, as Spark does:

1. ``init(handle)`` on the task's own copy of the user's ``StatefulProcessor``; the
   handle is a PySpark ``StatefulProcessorHandle`` and the state variables are PySpark's
   ``ValueState``, ``ListState`` and ``MapState``, kept in this partition's stores.
2. In ``EventTime`` mode, drops rows at or before the previous batch's watermark (late;
   counted as ``numRowsDroppedByWatermark``).
3. Calls ``handleInputRows(key, rows, TimerValues)`` once per key that has rows, in
   ascending key order: ``rows`` an iterator of pandas DataFrames (chunks of
   ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows) or, for ``transformWithState``,
   of ``Row``.
4. Fires timers: in ``EventTime`` mode every timer at or before this batch's watermark, in
   ``ProcessingTime`` mode every timer at or before the batch timestamp, in timestamp
   order: ``handleExpiredTimer(key, TimerValues, ExpiredTimerInfo)``, then the timer is
   deleted (so the handler still lists it).
5. ``close()``, and every store commits version N+1.

``TimerValues`` carry the batch timestamp and this batch's watermark (-1 for both when the
time mode is ``None``), as PySpark's runner gives them.

Stores, each keyed by the grouping key: a value state keeps the value's fields; a list
state ``values`` (a list of the element's fields); a map state ``entries`` (a list of
(user key, value) pairs); the timers ``timestamps`` (ms). Timestamps are kept as µs and
given to the processor as datetimes.

The progress counts follow Spark's (found by running both side by side): ``numRowsTotal``
counts a value, a key's list and each map entry as one row; ``numRowsUpdated`` each value
written, list element appended and map entry written; ``numRowsRemoved`` each value
cleared, list element and map entry removed. Timers are not rows; they are counted in the
custom metrics ``numRegisteredTimers`` and ``numDeletedTimers``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from microbatch.errors import pyspark_error
from microbatch.operators.base import StateTask, task_partition
from microbatch.operators.pandas_groups import PandasConversion, arrow_table, python_value, storage_value, without_late_rows
from microbatch.operators.transform_with_state.state import _Counts, _handle_class
from microbatch.operators.transform_with_state.variables import LIST, MAP, TIMERS_STORE, VALUE
from microbatch.state.files import nullable_schema

@dataclass(frozen=True)
class TransformWithStateTask(StateTask):
    """The per-partition function of a ``transformWithState`` (shipped by cloudpickle)."""

    processor: Any = None              # the user's StatefulProcessor (each task unpickles its own)
    variables: tuple = ()              # StateVariable, as init declared them on the driver
    rows_api: bool = False             # transformWithState (Rows) rather than ...InPandas
    time_mode: str = "none"            # none, processingtime, eventtime
    key_indexes: tuple = ()
    key_types: tuple = ()              # the grouping columns' Spark types
    key_schema: pa.Schema = None
    store_schemas: dict = None         # variable name -> arrow value schema
    input_names: tuple = ()
    initial_names: tuple = ()          # the initial state's columns, in the first batch of a query with one
    pandas: PandasConversion = None    # rows to pandas and the processor's DataFrames back
    batch_timestamp_ms: int = 0
    watermark_ms: int = -1             # this batch's (eviction) watermark
    late_us: int | None = None         # EventTime: rows at or before this are late
    event_time_index: int | None = None
    #: eventTimeColumnName: the output's event-time column, and the watermark for late
    #: rows its values must be after (Spark's UpdateEventTimeColumnExec)
    output_event_time_index: int | None = None
    output_late_us: int | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

        partition = task_partition()
        stores = {}
        for name, schema in list(self.store_schemas.items()):
            stores[name] = self.store(partition, self.key_schema, schema, name)
        timers = stores.pop(TIMERS_STORE)
        counts = _Counts()
        handle = _handle_class()(stores, {v.name: v for v in self.variables}, timers, counts, self.time_mode,
                                 self.batch_timestamp_ms)
        started = time.monotonic()
        table, initial = self._split_initial(arrow_table(list(batches)))
        table, late = without_late_rows(table, self.event_time_index, self.late_us)
        if self.time_mode == "none":
            timer_values = TimerValues(-1, -1)
        else:
            timer_values = TimerValues(self.batch_timestamp_ms, self.watermark_ms)
        processor = self.processor
        processor.init(handle)
        input_keys, input_rows = self._grouped(table, self.key_indexes, self.input_names)
        initial_keys: dict = {}
        if initial is not None and initial.num_rows:
            initial_keys, initial_rows = self._grouped(initial, tuple(range(len(self.key_indexes))),
                                                       self.initial_names)
        for key in sorted(set(input_keys) | set(initial_keys), key=lambda k: tuple((v is not None, v) for v in k)):
            handle._key = key
            if key in initial_keys:   # the first batch: the key's initial state, then its rows
                python_key, states = initial_rows(key)
                for state in states:
                    processor.handleInitialState(python_key, state, timer_values)
            if key in input_keys:
                python_key, rows = input_rows(key)
                yield from self._batches(processor.handleInputRows(python_key, rows, timer_values))
        if self.time_mode != "none":
            threshold = self.batch_timestamp_ms if self.time_mode == "processingtime" else self.watermark_ms
            expired = sorted(((ts, key) for key, value in list(timers.iterator())
                              for ts in (value[0] or []) if ts <= threshold),
                             key=lambda entry: (entry[0], tuple((v is not None, v) for v in entry[1])))
            for ts, key in expired:
                handle._key = key
                python_key = tuple(python_value(t, v) for t, v in zip(self.key_types, key))
                yield from self._batches(processor.handleExpiredTimer(python_key, timer_values,
                                                                      ExpiredTimerInfo(ts)))
                handle.deleteTimer(ts)
        handle._key = None
        processor.close()
        ttl_removed = handle._remove_expired()
        counts.removed += ttl_removed
        updates_ms = (time.monotonic() - started) * 1000
        total, memory, commit_ms, tracked = 0, 0, 0, True
        for name, store in list(stores.items()) + [(TIMERS_STORE, timers)]:
            variable = next((v for v in self.variables if v.name == name), None)
            if variable is not None and variable.kind == MAP:   # (read before the commit ends the store's use)
                total += sum(len(value[0] or []) for _, value in store.iterator())
            if name in handle.changes:
                self.log_changes(partition, self.key_schema, nullable_schema(self.store_schemas[name]),
                                 handle.changes[name], name)
            store.commit()
            m = store.metrics()
            tracked = tracked and m.rows_tracked
            memory += m.memory_used_bytes
            commit_ms += m.commit_time_ms
            if variable is not None and variable.kind != MAP:
                total += m.num_keys
        kinds = [(v.kind, v.ttl_ms is not None) for v in self.variables]
        self.finish(partition, _combined(total, memory, commit_ms, tracked),
                    numRowsUpdated=counts.updated, numRowsRemoved=counts.removed,
                    numRowsDroppedByWatermark=late, allUpdatesTimeMs=int(updates_ms),
                    numRegisteredTimers=counts.registered_timers, numDeletedTimers=counts.deleted_timers,
                    numDeletedStateVars=counts.deleted_vars, numValuesRemovedDueToTTLExpiry=ttl_removed,
                    **{f"num{kind.capitalize()}State{'WithTTL' if ttl else ''}Vars": kinds.count((kind, ttl))
                       for kind in (VALUE, LIST, MAP) for ttl in (False, True)})

    def _grouped(self, table: pa.Table, key_indexes, names) -> tuple[dict, Callable]:
        """A table's rows by stored key, and a function giving a key's (key as the processor
        gets it, rows as the processor takes them: pandas DataFrames in chunks, or Rows)."""
        from pyspark.sql import Row
        from microbatch.state.files import state_values
        if not table.num_rows:
            return {}, None
        names = list(names)   # the columns the processor gets, of the table's
        keys = list(zip(*[state_values(table.column(i), as_key=True) for i in key_indexes]))
        rows_of: dict[tuple, list[int]] = {}
        for row, key in enumerate(keys):
            rows_of.setdefault(key, []).append(row)
        if self.rows_api:
            records = table.to_pylist()

            def rows(key):
                python_key = tuple(python_value(t, v) for t, v in zip(self.key_types, key))
                return python_key, iter([Row(**{n: records[i][n] for n in names}) for i in rows_of[key]])
            return rows_of, rows
        frame = self.pandas.to_pandas(table)
        data = frame if list(frame.columns) == names else frame.loc[:, names]
        size = self.pandas.chunk_rows(table)

        def frames(key):
            positions = rows_of[key]
            python_key = tuple(frame.iat[positions[0], i] for i in key_indexes)
            return python_key, (data.take(positions[start:start + size]).reset_index(drop=True)
                                for start in range(0, len(positions), size))
        return rows_of, frames

    def _split_initial(self, table: pa.Table) -> tuple[pa.Table, pa.Table | None]:
        """The first batch of a query with an initial state reads the batch's rows and the
        initial state's together (``__side`` 0 and 1): each part with its own columns."""
        if not self.initial_names:
            return table, None
        import pyarrow.compute as pc
        if not table.num_rows:
            return table, None
        side = table.column("__side")
        keys = len(self.key_indexes)
        inputs = table.filter(pc.equal(side, 0))
        columns = [n for n in table.column_names if n.startswith("__in")]   # keys of expressions too
        inputs = pa.table([inputs.column(n) for n in columns],
                          names=list(self.input_names) + columns[len(self.input_names):])
        initial = table.filter(pc.equal(side, 1))
        initial = pa.table([initial.column(f"__k{i}") for i in range(keys)]
                           + [initial.column(f"__st{j}") for j in range(len(self.initial_names))],
                           names=[f"__k{i}" for i in range(keys)] + list(self.initial_names))
        return inputs, initial

    def _batches(self, results) -> Iterator[pa.RecordBatch]:
        """The processor's output (pandas DataFrames, or Rows) as Arrow batches of the
        declared output schema."""
        if results is None:
            return
        if self.rows_api:
            rows = [self._row_values(r) for r in results]
            if rows:
                yield self._after_watermark(pa.RecordBatch.from_pylist(rows, schema=self.pandas.arrow_schema))
            return
        for frame in results:
            batch = self.pandas.batch(frame)
            if batch.num_rows:
                yield self._after_watermark(batch)

    def _after_watermark(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch``, whose event times (``eventTimeColumnName``) must be after the watermark
        for late rows: operators above would drop an older row as late, so Spark fails the
        query instead (EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED)."""
        if self.output_event_time_index is None or self.output_late_us is None:
            return batch
        import pyarrow.compute as pc
        times = pc.cast(batch.column(self.output_event_time_index), pa.int64())
        old = pc.filter(times, pc.less_equal(times, self.output_late_us))
        if len(old):
            watermark_ms = self.output_late_us // 1000
            raise RuntimeError(
                "[EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED] Previous node emitted a row with "
                f"eventTime={old[0].as_py()} which is older than current_watermark_value={watermark_ms}\n"
                "This can lead to correctness issues in the stateful operators downstream in the "
                "execution pipeline.\nPlease correct the operator logic to emit rows after current "
                "global watermark value. SQLSTATE: 42815")
        return batch

    def _row_values(self, row: Any) -> dict:
        from pyspark.errors import PySparkRuntimeError
        names = self.pandas.arrow_schema.names
        values = tuple(row)
        if len(values) != len(names):
            raise pyspark_error(PySparkRuntimeError, "RESULT_COLUMN_SCHEMA_MISMATCH", {"expected": str(len(names)), "actual": str(len(values))})
        fields = getattr(row, "__fields__", None)
        if fields:
            by_name = dict(zip(fields, values))
            missing = sorted(set(names) - set(by_name))
            if missing:
                raise pyspark_error(PySparkRuntimeError, "RESULT_COLUMN_NAMES_MISMATCH", {"missing": f" Missing: {', '.join(missing)}.",
                                       "extra": f" Unexpected: {', '.join(sorted(set(by_name) - set(names)))}."})
            return {n: storage_value(by_name[n]) for n in names}
        return {n: storage_value(v) for n, v in zip(names, values)}


def _combined(total: int, memory: int, commit_ms: int, tracked: bool = True):
    from microbatch.state.store import StateStoreMetrics
    return StateStoreMetrics(num_keys=total, memory_used_bytes=memory, commit_time_ms=commit_ms, custom={},
                             rows_tracked=tracked)
