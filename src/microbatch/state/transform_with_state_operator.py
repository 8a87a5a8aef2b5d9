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
                                                   PandasConversion, without_late_rows)
from microbatch.state.store import StateStoreConf, StateStoreId, end_task, load_provider, task_metrics

#: The store of a partition's timers (a name no state variable can take in Spark either).
TIMERS_STORE = "$timers"
#: With a TTL, a value, list element or map entry keeps when it expires (ms), as Spark's does.
EXPIRATION = "ttlExpirationMs"
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


def declared_state_variables(processor: Any, time_mode: str = "none") -> tuple[StateVariable, ...]:
    """The state variables the processor's ``init`` declares, found by running ``init`` on
    a copy of it with a declaring handle (Spark runs it on the driver the same way, to
    learn the state's schemas before the query starts)."""
    from copy import deepcopy

    from pyspark.sql.streaming.stateful_processor import (ListState, MapState, StatefulProcessorHandle,
                                                          ValueState)
    declared: dict[str, StateVariable] = {}
    deleted: set[str] = set()

    def declare(variable: StateVariable) -> None:
        if variable.ttl_ms is not None:
            if time_mode != "processingtime":
                from microbatch import spark_internals
                raise spark_internals.spark_error(
                    "AnalysisException", "STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL",
                    stateName=variable.name, timeMode="NoTime" if time_mode == "none" else "EventTime")
            if int(variable.ttl_ms) <= 0:
                raise ValueError(f"The TTL of the state variable {variable.name!r} must be positive, "
                                 f"not {variable.ttl_ms} ms.")
        if variable.name in declared and variable.name not in deleted:
            raise ValueError(f"The state variable {variable.name!r} is declared twice in init().")
        deleted.discard(variable.name)
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
            deleted.add(stateName)   # it may be declared again (an empty one)

    try:   # the user's instance stays as it was; its copies go to the tasks
        copy = deepcopy(processor)
    except Exception:  # noqa: BLE001 - an attribute that cannot be copied: declare on the instance
        copy = processor
    copy.init(DeclaringHandle())
    copy.close()
    if TIMERS_STORE in declared:
        raise ValueError(f"{TIMERS_STORE!r} is the timers' store: name the state variable otherwise.")
    return tuple(declared.values())


#: Spark's conf of how state rows are encoded; "avro" lets transformWithState's schemas evolve.
ENCODING_FORMAT_CONF = "spark.sql.streaming.stateStore.encodingFormat"

#: A Spark type as Avro writes it (Spark's SchemaConverters), for Avro's rules of which
#: written type a reader of another type can read.
_AVRO_KINDS = {"ByteType": "int", "ShortType": "int", "IntegerType": "int", "DateType": "int",
               "LongType": "long", "TimestampType": "long", "TimestampNTZType": "long",
               "FloatType": "float", "DoubleType": "double", "StringType": "string",
               "BinaryType": "bytes", "BooleanType": "boolean"}
#: Avro's promotions: (written, read)
_AVRO_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
                    ("long", "double"), ("float", "double"), ("string", "bytes"), ("bytes", "string")}


def avro_readable(written: Any, reading: Any) -> bool:
    """Whether state written as ``written`` can be read as ``reading`` by Avro's schema
    resolution, as Spark checks a transformWithState's evolved state (every field is
    nullable with a null default there, so a field may be added or dropped; fields match
    by name)."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    if written == reading:
        return True
    if isinstance(written, StructType) and isinstance(reading, StructType):
        old = {f.name: f.dataType for f in written.fields}
        return all(avro_readable(old[f.name], f.dataType) for f in reading.fields if f.name in old)
    if isinstance(written, ArrayType) and isinstance(reading, ArrayType):
        return avro_readable(written.elementType, reading.elementType)
    if isinstance(written, MapType) and isinstance(reading, MapType):
        return avro_readable(written.keyType, reading.keyType) and avro_readable(written.valueType, reading.valueType)
    kinds = (_AVRO_KINDS.get(type(written).__name__), _AVRO_KINDS.get(type(reading).__name__))
    return None not in kinds and (kinds[0] == kinds[1] or kinds in _AVRO_PROMOTIONS)


def _same_by_position(a: Any, b: Any) -> bool:
    """Spark's unsafe-row rule: the same number of fields of the same types, names aside."""
    return len(a.fields) == len(b.fields) and all(
        x.dataType == y.dataType for x, y in zip(a.fields, b.fields))


def check_nullable_state(variables: tuple, encoding: str) -> None:
    """With Avro encoding, Spark needs every field of a state variable's schema nullable
    (TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE), checked when the query is planned."""
    from microbatch import spark_internals
    if encoding != "avro":
        return
    for v in variables:
        if any(not f.nullable for f in v.schema.fields):
            raise spark_internals.spark_error(
                "SparkUnsupportedOperationException", "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE",
                columnFamilyName=v.name, schema=spark_internals.schema_string(v.schema))


def state_schema_history(doc: dict, variables: tuple, key: Any, value: Any, encoding: str) -> list | None:
    """Spark's checks of a transformWithState's state schemas at a restart
    (StateSchemaCompatibilityChecker), against the operator's stored schema document:
    the grouping key (and a map's user key) of the same types; no state variable of
    another kind; each variable's value schema the same, or, with Avro encoding, one Avro
    can read every earlier version of as (fields added, dropped, reordered, widened).
    Raises Spark's error; returns the history of value schemas to record when the value
    schema changed (None when it did not)."""
    from pyspark.sql.types import StructType

    from microbatch import spark_internals
    stored_key = StructType.fromJson(doc["keySchema"])
    if not _same_by_position(stored_key, key):
        raise spark_internals.spark_error(
            "SparkUnsupportedOperationException", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
            storedKeySchema=spark_internals.schema_string(stored_key), newKeySchema=spark_internals.schema_string(key))
    history = [StructType.fromJson(d) for d in doc.get("valueSchemaHistory", [])]
    stored_value = StructType.fromJson(doc["valueSchema"])
    if stored_value == value:
        return None
    kinds = {v["name"]: v["kind"] for v in doc.get("stateVariables", [])}
    versions = history + [stored_value]
    for v in variables:
        if v.name not in kinds:
            continue   # a new state variable: a new store
        if kinds[v.name] != v.kind:
            raise spark_internals.spark_error(
                "SparkUnsupportedOperationException", "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE", stateVarName=v.name,
                newType=f"{v.kind.capitalize()}State", oldType=f"{kinds[v.name].capitalize()}State")
        written = [_variable_schemas(version, v) for version in versions]
        written = [w for w in written if w is not None]
        if v.kind == MAP and written and not _same_by_position(written[-1][1], v.key_schema):
            raise spark_internals.spark_error(
                "SparkUnsupportedOperationException", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
                storedKeySchema=spark_internals.schema_string(written[-1][1]),
                newKeySchema=spark_internals.schema_string(v.key_schema))
        for schema, _ in reversed(written):   # the newest first, as Spark checks them
            if schema == v.schema:
                continue
            if encoding == "avro":
                if not avro_readable(schema, v.schema):
                    raise spark_internals.spark_error(
                        "SparkUnsupportedOperationException", "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
                        oldValueSchema=spark_internals.schema_string(schema),
                        newValueSchema=spark_internals.schema_string(v.schema))
            elif not _same_by_position(schema, v.schema):
                raise spark_internals.spark_error(
                    "SparkUnsupportedOperationException", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
                    storedValueSchema=spark_internals.schema_string(schema),
                    newValueSchema=spark_internals.schema_string(v.schema))
    return [d.jsonValue() for d in versions]


def _variable_schemas(value: Any, variable: StateVariable) -> tuple | None:
    """A state variable's (value schema, map user key schema) in an operator's value schema
    as ``state_value_type`` records it, or None when the variable is not in it."""
    field = next((f for f in value.fields if f.name == variable.name), None)
    if field is None:
        return None
    stored = field.dataType
    if variable.kind == VALUE:
        return stored, None
    element = getattr(stored, "elementType", None)
    if variable.kind == LIST:
        return element, None
    names = getattr(element, "names", [])
    if names != ["key", "value"]:
        return None
    return element["value"].dataType, element["key"].dataType


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
        expiry = [pa.field(EXPIRATION, pa.int64())] if v.ttl_ms is not None else []
        if v.kind == VALUE:
            schemas[v.name] = pa.schema([_arrow_field(f) for f in v.schema.fields] + expiry)
        elif v.kind == LIST:
            element = pa.struct(list(_arrow_struct(v.schema)) + expiry)
            schemas[v.name] = pa.schema([pa.field("values", pa.list_(element))])
        else:
            entry = pa.struct([pa.field("key", _arrow_struct(v.key_schema)),
                               pa.field("value", _arrow_struct(v.schema))] + expiry)
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


def to_user(spark_type: Any, value: Any) -> Any:
    """A stored value as PySpark's state client gives it (Spark's rows unpickled): a nested
    struct a ``Row``, an array a list, a map a dict, a timestamp a datetime."""
    from pyspark.sql import Row
    from pyspark.sql.types import ArrayType, MapType, StructType
    if value is None:
        return None
    if isinstance(spark_type, StructType):
        fields = _fields(value)
        return Row(**{f.name: to_user(f.dataType, v) for f, v in zip(spark_type.fields, fields)})
    if isinstance(spark_type, ArrayType):
        return [to_user(spark_type.elementType, v) for v in value]
    if isinstance(spark_type, MapType):
        pairs = value.items() if isinstance(value, dict) else value
        return {to_user(spark_type.keyType, k): to_user(spark_type.valueType, v) for k, v in pairs}
    return _python(spark_type, value)


def to_storage(spark_type: Any, value: Any) -> Any:
    """A processor's value as the store keeps it (plain tuples, lists and pairs; timestamps
    as µs; numpy and pandas scalars as Python's): a struct from a tuple, ``Row`` or named
    tuple (by position) or a dict (by name), as PySpark's ``StructType.toInternal`` takes it."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    if value is None:
        return None
    if isinstance(spark_type, StructType):
        if isinstance(value, dict):
            return tuple(to_storage(f.dataType, value.get(f.name)) for f in spark_type.fields)
        return tuple(to_storage(f.dataType, v) for f, v in zip(spark_type.fields, value))
    if isinstance(spark_type, ArrayType):
        return [to_storage(spark_type.elementType, v) for v in value]
    if isinstance(spark_type, MapType):
        pairs = value.items() if isinstance(value, dict) else value
        return [(to_storage(spark_type.keyType, k), to_storage(spark_type.valueType, v)) for k, v in pairs]
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    return _stored(spark_type, _storage_value(value))


def _codec_in(schema: Any) -> Callable[[Any], tuple]:
    """A stored tuple (or dict, as files give a struct back) of ``schema`` as the processor
    gets it."""
    fields = schema.fields

    def decode(stored: Any) -> tuple:
        return tuple(to_user(f.dataType, v) for f, v in zip(fields, _fields(stored)))
    return decode


def _codec_out(schema: Any, what: str) -> Callable[[Any], tuple]:
    """A processor's tuple of ``schema`` as the store keeps it."""
    fields = schema.fields

    def encode(value: Any) -> tuple:
        if not isinstance(value, (tuple, list)):
            try:   # PySpark's client takes any iterable of the fields (``tuple(map(..., value))``):
                value = tuple(value)   # a one-character string is a struct of one string
            except TypeError:
                raise TypeError(f"{what} takes a tuple of {schema.simpleString()}, not {value!r}") from None
        if len(value) != len(fields):
            raise ValueError(f"{what} takes a tuple of {len(fields)} value(s) "
                             f"({schema.simpleString()}), not {len(value)}: {value!r}")
        return tuple(to_storage(f.dataType, v) for f, v in zip(fields, value))
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

        def _stored(self, doing: str = "checking value state exists"):
            self._handle._check_live(self._variable, doing)
            stored = self._handle._get(self._variable)
            if stored is not None and self._variable.ttl_ms is not None and self._handle._expired(stored[-1]):
                return None
            return stored

        def exists(self) -> bool:
            return self._stored() is not None

        def get(self):
            stored = self._stored("getting value state")
            return None if stored is None else self._decode(stored)

        def update(self, newValue) -> None:
            self._handle._check_live(self._variable, "updating value state")
            self._handle._put(self._variable, self._encode(newValue) + self._handle._expiry(self._variable))
            self._handle._counts.updated += 1

        def clear(self) -> None:
            self._handle._check_live(self._variable, "clearing value state")
            self._handle._remove(self._variable)
            self._handle._counts.removed += 1      # Spark counts a clear whether or not a value was there

    class StoreListState(ListState):
        def __init__(self, handle: "TaskHandle", variable: StateVariable):
            self._handle, self._variable = handle, variable
            self._stateName = variable.name
            self._decode = _codec_in(variable.schema)
            self._encode = _codec_out(variable.schema, f"ListState {variable.name}")

        def _elements(self) -> list:
            """The stored elements (with their expiry, under a TTL), expired ones included."""
            stored = self._handle._get(self._variable)
            return [] if stored is None else [_fields(e) for e in stored[0] or []]

        def _live(self) -> list:
            if self._variable.ttl_ms is None:
                return self._elements()
            return [e for e in self._elements() if not self._handle._expired(e[-1])]

        def exists(self) -> bool:
            self._handle._check_live(self._variable, "checking value state exists")   # (PySpark's words)
            return bool(self._live())

        def get(self) -> Iterator[tuple]:
            if self._variable.name in self._handle._deleted:   # PySpark's iterator ends at the error
                return iter([])
            return iter([self._decode(e) for e in self._live()])

        def _encode_element(self, value) -> tuple:
            return self._encode(value) + self._handle._expiry(self._variable)

        def put(self, newState) -> None:
            self._handle._check_live(self._variable, "updating value state")
            removed = len(self._elements())
            encoded = [self._encode_element(v) for v in newState]
            self._write(encoded)
            self._handle._counts.removed += removed
            self._handle._counts.updated += len(encoded)

        def appendValue(self, newState) -> None:
            self._handle._check_live(self._variable, "updating value state")
            self._write(self._elements() + [self._encode_element(newState)])
            self._handle._counts.updated += 1

        def appendList(self, newState) -> None:
            self._handle._check_live(self._variable, "updating value state")
            encoded = [self._encode_element(v) for v in newState]
            self._write(self._elements() + encoded)
            self._handle._counts.updated += len(encoded)

        def clear(self) -> None:
            self._handle._check_live(self._variable, "clearing value state")
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

        def _entries(self, doing: str | None = None) -> dict:
            if doing is not None:
                self._handle._check_live(self._variable, doing)
            elif self._variable.name in self._handle._deleted:   # PySpark's iterators end at the error
                return {}
            stored = self._handle._get(self._variable)
            entries: dict = {}
            ttl = self._variable.ttl_ms is not None
            for entry in (stored[0] or []) if stored is not None else []:
                entry = _fields(entry)
                if ttl and self._handle._expired(entry[2]):
                    continue
                entries[_fields(entry[0])] = (_fields(entry[1]),) + tuple(entry[2:])
            return entries

        def _write(self, entries: dict) -> None:
            """``entries``: user key -> (value, [expiry]); expired entries written back too."""
            stored = self._handle._get(self._variable)
            kept = []
            if self._variable.ttl_ms is not None and stored is not None:
                kept = [e for e in map(_fields, stored[0] or [])
                        if self._handle._expired(e[2]) and _fields(e[0]) not in entries]
            rows = [(k,) + v for k, v in entries.items()] + kept
            if rows:
                self._handle._put(self._variable, (rows,))
            else:
                self._handle._remove(self._variable)

        def exists(self) -> bool:
            return bool(self._entries("checking map state exists"))

        def getValue(self, key):
            from pyspark.sql import Row
            value = self._entries("getting value").get(self._encode_key(key))
            if value is None:
                return None
            return Row(**dict(zip(self._variable.schema.names, self._decode(value[0]))))   # PySpark's: a Row

        def containsKey(self, key) -> bool:
            return self._encode_key(key) in self._entries("checking if map state contains key")

        def updateValue(self, key, value) -> None:
            entries = self._entries("updating map state value")
            entries[self._encode_key(key)] = (self._encode(value),) + self._handle._expiry(self._variable)
            self._write(entries)
            self._handle._counts.updated += 1

        def iterator(self):
            return iter([(self._decode_key(k), self._decode(v[0])) for k, v in self._entries().items()])

        def keys(self):
            return iter([self._decode_key(k) for k in self._entries()])

        def values(self):
            return iter([self._decode(v[0]) for v in self._entries().values()])

        def removeKey(self, key) -> None:
            entries = self._entries("removing key from map state")
            if entries.pop(self._encode_key(key), None) is not None:
                self._write(entries)
            self._handle._counts.removed += 1

        def clear(self) -> None:
            self._handle._check_live(self._variable, "clearing map state")
            stored = self._handle._get(self._variable)
            self._handle._counts.removed += len(stored[0] or []) if stored is not None else 0
            self._handle._remove(self._variable)

    classes = {VALUE: StoreValueState, LIST: StoreListState, MAP: StoreMapState}

    class TaskHandle(StatefulProcessorHandle):
        """PySpark's handle over one task's stores; the current grouping key is implicit,
        as in Spark."""

        def __init__(self, stores: dict, variables: dict, timers, counts: _Counts, time_mode: str,
                     batch_timestamp_ms: int):
            super().__init__(None)
            self._stores, self._variables, self._timers = stores, variables, timers
            self._counts, self._time_mode = counts, time_mode
            self._now_ms = batch_timestamp_ms
            self._key: tuple | None = None
            self._deleted: set[str] = set()   # deleteIfExists'd and not asked for since

        def _check_live(self, variable: StateVariable, doing: str) -> None:
            """A state variable deleted with ``deleteIfExists`` (and not asked for again) fails
            as PySpark's client fails over Spark's state server."""
            if variable.name in self._deleted:
                from pyspark.errors import PySparkRuntimeError
                raise PySparkRuntimeError(
                    f"Error {doing}: {variable.kind.capitalize()} state {variable.name} is not initialized.")

        # -- TTL: expiry in processing time, the batch timestamp --------------------
        def _expiry(self, variable: StateVariable) -> tuple:
            return () if variable.ttl_ms is None else (self._now_ms + int(variable.ttl_ms),)

        def _expired(self, expiration_ms) -> bool:
            return expiration_ms is not None and expiration_ms <= self._now_ms

        def _remove_expired(self) -> int:
            """Every expired value, list element and map entry removed from the stores (at
            the end of the batch, as Spark's TTL eviction); how many."""
            removed = 0
            for variable in self._variables.values():
                if variable.ttl_ms is None:
                    continue
                store = self._stores[variable.name]
                for key, stored in list(store.iterator()):
                    if variable.kind == VALUE:
                        if self._expired(stored[-1]):
                            store.remove(key)
                            removed += 1
                        continue
                    items = [_fields(e) for e in stored[0] or []]
                    live = [e for e in items if not self._expired(e[-1])]
                    if len(live) != len(items):
                        removed += len(items) - len(live)
                        if live:
                            store.put(key, (live,))
                        else:
                            store.remove(key)
            return removed

        # -- the state variables -------------------------------------------------
        def _declared(self, name: str, kind: str) -> StateVariable:
            variable = self._variables.get(name)
            if variable is None or variable.kind != kind:
                raise ValueError(
                    f"The state variable {name!r} ({kind}) was not declared when the query started: "
                    "declare every state variable in init(), the same way in every call.")
            return variable

        def getValueState(self, stateName, schema, ttlDurationMs=None):
            self._deleted.discard(stateName)
            return classes[VALUE](self, self._declared(stateName, VALUE))

        def getListState(self, stateName, schema, ttlDurationMs=None):
            self._deleted.discard(stateName)
            return classes[LIST](self, self._declared(stateName, LIST))

        def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
            self._deleted.discard(stateName)
            return classes[MAP](self, self._declared(stateName, MAP))

        def deleteIfExists(self, stateName: str) -> None:
            """Removes the state variable's values for every key; using it afterwards fails
            until it is asked for again (Spark drops its column family)."""
            store = self._stores.get(stateName)
            if store is not None:
                store.remove_many([k for k, _ in list(store.iterator())])
                self._counts.deleted_vars += 1
                self._deleted.add(stateName)

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
    initial_names: tuple[str, ...]     # the initial state's columns, in the first batch of a query with one
    pandas: PandasConversion           # rows to pandas and the processor's DataFrames back
    batch_timestamp_ms: int
    watermark_ms: int                  # this batch's (eviction) watermark
    late_us: int | None                # EventTime: rows at or before this are late
    event_time_index: int | None
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum
    #: eventTimeColumnName: the output's event-time column, and the watermark for late
    #: rows its values must be after (Spark's UpdateEventTimeColumnExec)
    output_event_time_index: int | None = None
    output_late_us: int | None = None

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
        handle = _handle_class()(stores, {v.name: v for v in self.variables}, timers, counts, self.time_mode,
                                 self.batch_timestamp_ms)
        started = time.monotonic()
        table, initial = self._split_initial(_table(list(batches)))
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
                python_key = tuple(_python(t, v) for t, v in zip(self.key_types, key))
                yield from self._batches(processor.handleExpiredTimer(python_key, timer_values,
                                                                      ExpiredTimerInfo(ts)))
                handle.deleteTimer(ts)
        handle._key = None
        processor.close()
        ttl_removed = handle._remove_expired()
        counts.removed += ttl_removed
        updates_ms = (time.monotonic() - started) * 1000
        total, memory, commit_ms = 0, 0, 0
        for name, store in list(stores.items()) + [(TIMERS_STORE, timers)]:
            variable = next((v for v in self.variables if v.name == name), None)
            if variable is not None and variable.kind == MAP:   # (read before the commit ends the store's use)
                total += sum(len(value[0] or []) for _, value in store.iterator())
            store.commit()
            m = store.metrics()
            memory += m.memory_used_bytes
            commit_ms += m.commit_time_ms
            if variable is not None and variable.kind != MAP:
                total += m.num_keys
        kinds = [(v.kind, v.ttl_ms is not None) for v in self.variables]
        end_task(self.metrics, {
            **task_metrics(partition, _combined(total, memory, commit_ms)),
            "numRowsUpdated": counts.updated, "numRowsRemoved": counts.removed,
            "numRowsDroppedByWatermark": late, "allUpdatesTimeMs": int(updates_ms),
            "numRegisteredTimers": counts.registered_timers, "numDeletedTimers": counts.deleted_timers,
            "numDeletedStateVars": counts.deleted_vars, "numValuesRemovedDueToTTLExpiry": ttl_removed,
            **{f"num{kind.capitalize()}State{'WithTTL' if ttl else ''}Vars": kinds.count((kind, ttl))
               for kind in (VALUE, LIST, MAP) for ttl in (False, True)}})

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
                python_key = tuple(_python(t, v) for t, v in zip(self.key_types, key))
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
