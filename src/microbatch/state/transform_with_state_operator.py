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

from microbatch.state.group_state_operator import (_python, _storage_value, _stored, _table,
                                                   pandas_to_arrow)
from microbatch.state.store import StateStoreConf, StateStoreId, load_provider, task_metrics

#: The store of a partition's timers (a name no state variable can take in Spark either).
TIMERS_STORE = "$timers"
VALUE, LIST, MAP = "value", "list", "map"


@dataclass(frozen=True)
class StateVariable:
    """A state variable as the processor's ``init`` declares it (collected on the driver,
    as Spark collects them before the query starts)."""

    name: str
    kind: str                      # value, list or map
    schema: Any                    # the value's (element's) StructType
    key_schema: Any = None         # a map state's user key StructType
    ttl_ms: int | None = None

    def describe(self) -> str:
        if self.kind == MAP:
            return f"{self.name}: map<{self.key_schema.simpleString()}, {self.schema.simpleString()}>"
        return f"{self.name}: {self.kind}<{self.schema.simpleString()}>"


def _struct(schema: Any) -> Any:
    from pyspark.sql.types import StructType
    if isinstance(schema, str):
        from microbatch import spark_internals
        return spark_internals.parse_schema_ddl(schema)
    if not isinstance(schema, StructType):
        raise TypeError(f"A state schema must be a StructType or a DDL string, not {schema!r}")
    return schema


def declared_state_variables(processor: Any) -> tuple[StateVariable, ...]:
    """The state variables the processor's ``init`` declares, found by running ``init`` on
    a copy of it with a declaring handle (Spark runs it on the driver the same way, to
    learn the state's schemas before the query starts)."""
    from pyspark import cloudpickle
    from pyspark.sql.streaming.stateful_processor import (ListState, MapState, StatefulProcessorHandle,
                                                          ValueState)
    declared: dict[str, StateVariable] = {}

    def declare(variable: StateVariable) -> None:
        if variable.ttl_ms is not None:
            from microbatch.plan.checks import not_yet
            raise not_yet(f"State TTL (ttlDurationMs of the state variable {variable.name!r})",
                          "state TTL in transformWithState (issue 18)")
        if variable.name in declared:
            raise ValueError(f"The state variable {variable.name!r} is declared twice in init().")
        declared[variable.name] = variable

    class DeclaringHandle(StatefulProcessorHandle):
        def __init__(self):
            super().__init__(None)

        def getValueState(self, stateName, schema, ttlDurationMs=None):
            declare(StateVariable(stateName, VALUE, _struct(schema), ttl_ms=ttlDurationMs))
            return ValueState(None, stateName)

        def getListState(self, stateName, schema, ttlDurationMs=None):
            declare(StateVariable(stateName, LIST, _struct(schema), ttl_ms=ttlDurationMs))
            return ListState(None, stateName)

        def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
            declare(StateVariable(stateName, MAP, _struct(valueSchema), _struct(userKeySchema), ttlDurationMs))
            return MapState(None, stateName)

        def registerTimer(self, expiryTimestampMs):
            pass

        def deleteTimer(self, expiryTimestampMs):
            pass

        def listTimers(self):
            return iter([])

        def deleteIfExists(self, stateName):
            pass

    copy = cloudpickle.loads(cloudpickle.dumps(processor))
    copy.init(DeclaringHandle())
    copy.close()
    if TIMERS_STORE in declared:
        raise ValueError(f"{TIMERS_STORE!r} is the timers' store: name the state variable otherwise.")
    return tuple(declared.values())


def _arrow_field(field: Any) -> pa.Field:
    from pyspark.sql.pandas.types import to_arrow_type
    from microbatch.state.files import storage_type
    return pa.field(field.name, storage_type(to_arrow_type(field.dataType, timezone="UTC")))


def _arrow_struct(schema: Any) -> pa.DataType:
    return pa.struct([_arrow_field(f) for f in schema.fields])


def state_store_schemas(variables: tuple) -> dict[str, pa.Schema]:
    """Each state variable's store value schema, and the timers'."""
    schemas = {}
    for v in variables:
        if v.kind == VALUE:
            schemas[v.name] = pa.schema([_arrow_field(f) for f in v.schema.fields])
        elif v.kind == LIST:
            schemas[v.name] = pa.schema([pa.field("values", pa.list_(_arrow_struct(v.schema)))])
        else:
            entry = pa.struct([pa.field("key", _arrow_struct(v.key_schema)),
                               pa.field("value", _arrow_struct(v.schema))])
            schemas[v.name] = pa.schema([pa.field("entries", pa.list_(entry))])
    schemas[TIMERS_STORE] = pa.schema([pa.field("timestamps", pa.list_(pa.int64()))])
    return schemas


def state_value_type(variable: StateVariable) -> Any:
    """A state variable's type in the state schema file (Spark types)."""
    from pyspark.sql.types import ArrayType, StructField, StructType
    if variable.kind == VALUE:
        return variable.schema
    if variable.kind == LIST:
        return ArrayType(variable.schema)
    return ArrayType(StructType([StructField("key", variable.key_schema), StructField("value", variable.schema)]))


def _fields(stored: Any) -> tuple:
    """A stored struct as a tuple of its fields (files give structs back as dicts)."""
    return tuple(stored.values()) if isinstance(stored, dict) else tuple(stored)


def _codec_in(schema: Any) -> Callable[[Any], tuple]:
    """A stored tuple (or dict, as files give a struct back) of ``schema`` as the processor
    gets it."""
    fields = schema.fields

    def decode(stored: Any) -> tuple:
        return tuple(_python(f.dataType, v) for f, v in zip(fields, _fields(stored)))
    return decode


def _codec_out(schema: Any, what: str) -> Callable[[Any], tuple]:
    """A processor's tuple of ``schema`` as the store keeps it."""
    fields = schema.fields

    def encode(value: Any) -> tuple:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{what} takes a tuple of {schema.simpleString()}, not {value!r}")
        if len(value) != len(fields):
            raise ValueError(f"{what} takes a tuple of {len(fields)} value(s) "
                             f"({schema.simpleString()}), not {len(value)}: {value!r}")
        return tuple(_stored(f.dataType, _storage_value(v)) for f, v in zip(fields, value))
    return encode


class _Counts:
    def __init__(self) -> None:
        self.updated = 0
        self.removed = 0
        self.registered_timers = 0
        self.deleted_timers = 0
        self.deleted_vars = 0


def _handle_class():
    """PySpark's state classes, subclassed over this task's stores (imported in the task)."""
    from pyspark.sql.streaming.stateful_processor import (ListState, MapState, StatefulProcessorHandle,
                                                          ValueState)

    class StoreValueState(ValueState):
        def __init__(self, handle: "TaskHandle", variable: StateVariable):
            self._handle, self._variable = handle, variable
            self._stateName = variable.name
            self._decode, self._encode = _codec_in(variable.schema), _codec_out(variable.schema,
                                                                                 f"ValueState {variable.name}.update")

        def exists(self) -> bool:
            return self._handle._get(self._variable) is not None

        def get(self):
            stored = self._handle._get(self._variable)
            return None if stored is None else self._decode(stored)

        def update(self, newValue) -> None:
            self._handle._put(self._variable, self._encode(newValue))
            self._handle._counts.updated += 1

        def clear(self) -> None:
            self._handle._remove(self._variable)
            self._handle._counts.removed += 1      # Spark counts a clear whether or not a value was there

    class StoreListState(ListState):
        def __init__(self, handle: "TaskHandle", variable: StateVariable):
            self._handle, self._variable = handle, variable
            self._stateName = variable.name
            self._decode = _codec_in(variable.schema)
            self._encode = _codec_out(variable.schema, f"ListState {variable.name}")

        def _elements(self) -> list:
            stored = self._handle._get(self._variable)
            return [] if stored is None else [_fields(e) for e in stored[0] or []]

        def exists(self) -> bool:
            return bool(self._elements())

        def get(self) -> Iterator[tuple]:
            return iter([self._decode(e) for e in self._elements()])

        def put(self, newState) -> None:
            removed = len(self._elements())
            encoded = [self._encode(v) for v in newState]
            self._write(encoded)
            self._handle._counts.removed += removed
            self._handle._counts.updated += len(encoded)

        def appendValue(self, newState) -> None:
            self._write(self._elements() + [self._encode(newState)])
            self._handle._counts.updated += 1

        def appendList(self, newState) -> None:
            encoded = [self._encode(v) for v in newState]
            self._write(self._elements() + encoded)
            self._handle._counts.updated += len(encoded)

        def clear(self) -> None:
            self._handle._counts.removed += len(self._elements())
            self._handle._remove(self._variable)

        def _write(self, elements: list) -> None:
            if elements:
                self._handle._put(self._variable, (elements,))
            else:
                self._handle._remove(self._variable)

    class StoreMapState(MapState):
        def __init__(self, handle: "TaskHandle", variable: StateVariable):
            self._handle, self._variable = handle, variable
            self._stateName = variable.name
            self._decode_key, self._decode = _codec_in(variable.key_schema), _codec_in(variable.schema)
            self._encode_key = _codec_out(variable.key_schema, f"MapState {variable.name} key")
            self._encode = _codec_out(variable.schema, f"MapState {variable.name} value")

        def _entries(self) -> dict:
            stored = self._handle._get(self._variable)
            entries: dict = {}
            for entry in (stored[0] or []) if stored is not None else []:
                key, value = (entry["key"], entry["value"]) if isinstance(entry, dict) else entry
                entries[_fields(key)] = _fields(value)
            return entries

        def _write(self, entries: dict) -> None:
            if entries:
                self._handle._put(self._variable, ([(k, v) for k, v in entries.items()],))
            else:
                self._handle._remove(self._variable)

        def exists(self) -> bool:
            return bool(self._entries())

        def getValue(self, key):
            value = self._entries().get(self._encode_key(key))
            return None if value is None else self._decode(value)

        def containsKey(self, key) -> bool:
            return self._encode_key(key) in self._entries()

        def updateValue(self, key, value) -> None:
            entries = self._entries()
            entries[self._encode_key(key)] = self._encode(value)
            self._write(entries)
            self._handle._counts.updated += 1

        def iterator(self):
            return iter([(self._decode_key(k), self._decode(v)) for k, v in self._entries().items()])

        def keys(self):
            return iter([self._decode_key(k) for k in self._entries()])

        def values(self):
            return iter([self._decode(v) for v in self._entries().values()])

        def removeKey(self, key) -> None:
            entries = self._entries()
            if entries.pop(self._encode_key(key), None) is not None:
                self._write(entries)
            self._handle._counts.removed += 1

        def clear(self) -> None:
            entries = self._entries()
            self._handle._counts.removed += len(entries)
            self._handle._remove(self._variable)

    classes = {VALUE: StoreValueState, LIST: StoreListState, MAP: StoreMapState}

    class TaskHandle(StatefulProcessorHandle):
        """PySpark's handle over one task's stores; the current grouping key is implicit,
        as in Spark."""

        def __init__(self, stores: dict, variables: dict, timers, counts: _Counts, time_mode: str):
            super().__init__(None)
            self._stores, self._variables, self._timers = stores, variables, timers
            self._counts, self._time_mode = counts, time_mode
            self._key: tuple | None = None

        # -- the state variables -------------------------------------------------
        def _declared(self, name: str, kind: str) -> StateVariable:
            variable = self._variables.get(name)
            if variable is None or variable.kind != kind:
                raise ValueError(
                    f"The state variable {name!r} ({kind}) was not declared when the query started: "
                    "declare every state variable in init(), the same way in every call.")
            return variable

        def getValueState(self, stateName, schema, ttlDurationMs=None):
            return classes[VALUE](self, self._declared(stateName, VALUE))

        def getListState(self, stateName, schema, ttlDurationMs=None):
            return classes[LIST](self, self._declared(stateName, LIST))

        def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
            return classes[MAP](self, self._declared(stateName, MAP))

        def deleteIfExists(self, stateName: str) -> None:
            store = self._stores.get(stateName)
            if store is not None:
                store.remove_many([k for k, _ in list(store.iterator())])
                self._counts.deleted_vars += 1

        def _current_key(self) -> tuple:
            if self._key is None:
                raise RuntimeError("State can only be read or written while a grouping key is "
                                   "handled (in handleInputRows, handleExpiredTimer or handleInitialState).")
            return self._key

        def _get(self, variable: StateVariable):
            return self._stores[variable.name].get(self._current_key())

        def _put(self, variable: StateVariable, value: tuple) -> None:
            self._stores[variable.name].put(self._current_key(), value)

        def _remove(self, variable: StateVariable) -> None:
            store = self._stores[variable.name]
            if store.get(self._current_key()) is not None:
                store.remove(self._current_key())

        # -- timers ----------------------------------------------------------------
        def _timer_list(self) -> list[int]:
            stored = self._timers.get(self._current_key())
            return [] if stored is None else list(stored[0] or [])

        def _write_timers(self, timestamps: list[int]) -> None:
            if timestamps:
                self._timers.put(self._current_key(), (sorted(timestamps),))
            elif self._timers.get(self._current_key()) is not None:
                self._timers.remove(self._current_key())

        def registerTimer(self, expiryTimestampMs: int) -> None:
            if self._time_mode == "none":
                raise ValueError("Timers need a time mode: use timeMode='ProcessingTime' or 'EventTime'.")
            timestamps = self._timer_list()
            if int(expiryTimestampMs) not in timestamps:
                self._write_timers(timestamps + [int(expiryTimestampMs)])
            self._counts.registered_timers += 1

        def deleteTimer(self, expiryTimestampMs: int) -> None:
            timestamps = self._timer_list()
            if int(expiryTimestampMs) in timestamps:
                timestamps.remove(int(expiryTimestampMs))
                self._write_timers(timestamps)
            self._counts.deleted_timers += 1

        def listTimers(self) -> Iterator[int]:
            return iter(self._timer_list())

    return TaskHandle


@dataclass(frozen=True)
class TransformWithStateTask:
    """The per-partition function of a ``transformWithState`` (shipped by cloudpickle)."""

    state_root: str
    operator_id: int
    version: int
    processor: Any                     # the user's StatefulProcessor (each task unpickles its own)
    variables: tuple                   # StateVariable, as init declared them on the driver
    rows_api: bool                     # transformWithState (Rows) rather than ...InPandas
    time_mode: str                     # none, processingtime, eventtime
    key_indexes: tuple[int, ...]
    key_types: tuple                   # the grouping columns' Spark types
    key_schema: pa.Schema
    store_schemas: dict                # variable name -> arrow value schema
    input_names: tuple[str, ...]
    output_schema: pa.Schema
    batch_timestamp_ms: int
    watermark_ms: int                  # this batch's (eviction) watermark
    late_us: int | None                # EventTime: rows at or before this are late
    event_time_index: int | None
    timezone: str
    max_records_per_batch: int
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

        partition = TaskContext.get().partitionId()
        stores = {}
        for name, schema in list(self.store_schemas.items()):
            store_id = StateStoreId(self.state_root, self.operator_id, partition, name)
            stores[name] = load_provider(store_id, self.key_schema, schema, self.conf).get_store(self.version)
        timers = stores.pop(TIMERS_STORE)
        counts = _Counts()
        handle = _handle_class()(stores, {v.name: v for v in self.variables}, timers, counts, self.time_mode)
        started = time.monotonic()
        table = _table(list(batches))
        late = 0
        if self.late_us is not None and self.event_time_index is not None and table.num_rows:
            import pyarrow.compute as pc
            times = pc.cast(table.column(self.event_time_index), pa.int64())
            keep = pc.invert(pc.fill_null(pc.less_equal(times, self.late_us), False))
            late = table.num_rows - pc.sum(pc.cast(keep, pa.int64())).as_py()
            table = table.filter(keep)
        if self.time_mode == "none":
            timer_values = TimerValues(-1, -1)
        else:
            timer_values = TimerValues(self.batch_timestamp_ms, self.watermark_ms)
        processor = self.processor
        processor.init(handle)
        if table.num_rows:
            for key, python_key, rows in self._groups(table):
                handle._key = key
                yield from self._batches(processor.handleInputRows(python_key, rows, timer_values))
        if self.time_mode != "none":
            threshold = self.batch_timestamp_ms if self.time_mode == "processingtime" else self.watermark_ms
            expired = sorted(((ts, key) for key, value in list(timers.iterator())
                              for ts in (value[0] or []) if ts <= threshold),
                             key=lambda entry: (entry[0], tuple((v is not None, v) for v in entry[1])))
            for ts, key in expired:
                handle._key = key
                python_key = tuple(_python(t, v) for t, v in zip(self.key_types, key))
                yield from self._batches(processor.handleExpiredTimer(python_key, timer_values,
                                                                      ExpiredTimerInfo(ts)))
                handle.deleteTimer(ts)
        handle._key = None
        processor.close()
        updates_ms = (time.monotonic() - started) * 1000
        total, memory, commit_ms = 0, 0, 0
        for name, store in list(stores.items()) + [(TIMERS_STORE, timers)]:
            store.commit()
            m = store.metrics()
            memory += m.memory_used_bytes
            commit_ms += m.commit_time_ms
            variable = next((v for v in self.variables if v.name == name), None)
            if variable is not None and variable.kind == MAP:
                total += sum(len(value[0] or []) for _, value in store.iterator())
            elif variable is not None:
                total += m.num_keys
        kinds = [v.kind for v in self.variables]
        self.metrics.add({
            **task_metrics(partition, _combined(total, memory, commit_ms)),
            "numRowsUpdated": counts.updated, "numRowsRemoved": counts.removed,
            "numRowsDroppedByWatermark": late, "allUpdatesTimeMs": int(updates_ms),
            "numRegisteredTimers": counts.registered_timers, "numDeletedTimers": counts.deleted_timers,
            "numDeletedStateVars": counts.deleted_vars,
            "numValueStateVars": kinds.count(VALUE), "numListStateVars": kinds.count(LIST),
            "numMapStateVars": kinds.count(MAP)})

    def _groups(self, table: pa.Table):
        """(stored key, the key as the processor gets it, its rows) in ascending key order."""
        from pyspark.sql import Row
        from microbatch.state.files import state_values
        keys = list(zip(*[state_values(table.column(i), as_key=True) for i in self.key_indexes]))
        rows_of: dict[tuple, list[int]] = {}
        for row, key in enumerate(keys):
            rows_of.setdefault(key, []).append(row)
        key_types = self.key_types
        if self.rows_api:
            names = list(self.input_names)
            records = table.to_pylist()
            for key in sorted(rows_of, key=lambda k: tuple((v is not None, v) for v in k)):
                python_key = tuple(_python(t, v) for t, v in zip(key_types, key))
                yield key, python_key, iter([Row(**{n: records[i][n] for n in names}) for i in rows_of[key]])
            return
        frame = self._pandas(table)
        size = max(self.max_records_per_batch, 1)
        for key in sorted(rows_of, key=lambda k: tuple((v is not None, v) for v in k)):
            positions = rows_of[key]
            python_key = tuple(frame.iat[positions[0], i] for i in self.key_indexes)
            frames = (frame.take(positions[start:start + size]).reset_index(drop=True)
                      for start in range(0, len(positions), size))
            yield key, python_key, frames

    def _pandas(self, rows: pa.Table):
        frame = rows.to_pandas()
        for field in rows.schema:
            if pa.types.is_timestamp(field.type) and field.type.tz is not None:
                frame[field.name] = frame[field.name].dt.tz_convert(self.timezone).dt.tz_localize(None)
        return frame

    def _batches(self, results) -> Iterator[pa.RecordBatch]:
        """The processor's output (pandas DataFrames, or Rows) as Arrow batches of the
        declared output schema."""
        if results is None:
            return
        if self.rows_api:
            rows = [self._row_values(r) for r in results]
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=self.output_schema)
            return
        for frame in results:
            batch = pandas_to_arrow(frame, self.output_schema, self.timezone)
            if batch.num_rows:
                yield batch

    def _row_values(self, row: Any) -> dict:
        from pyspark.errors import PySparkRuntimeError
        names = self.output_schema.names
        values = tuple(row)
        if len(values) != len(names):
            raise PySparkRuntimeError(
                errorClass="RESULT_COLUMN_SCHEMA_MISMATCH",
                messageParameters={"expected": str(len(names)), "actual": str(len(values))})
        fields = getattr(row, "__fields__", None)
        if fields:
            by_name = dict(zip(fields, values))
            missing = sorted(set(names) - set(by_name))
            if missing:
                raise PySparkRuntimeError(
                    errorClass="RESULT_COLUMN_NAMES_MISMATCH",
                    messageParameters={"missing": f" Missing: {', '.join(missing)}.",
                                       "extra": f" Unexpected: {', '.join(sorted(set(by_name) - set(names)))}."})
            return {n: _storage_value(by_name[n]) for n in names}
        return {n: _storage_value(v) for n, v in zip(names, values)}


def _combined(total: int, memory: int, commit_ms: int):
    from microbatch.state.store import StateStoreMetrics
    return StateStoreMetrics(num_keys=total, memory_used_bytes=memory, commit_time_ms=commit_ms, custom={})
