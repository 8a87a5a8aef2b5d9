"""PySpark's state variables over one task's stores: a subclass of PySpark's
``StatefulProcessorHandle`` and of its ``ValueState``, ``ListState`` and ``MapState``, with
values converted as PySpark's state client converts them."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from microbatch.operators.pandas_groups import storage_value, stored_value, user_value
from microbatch.operators.transform_with_state.variables import LIST, MAP, VALUE, StateVariable

def _fields(stored: Any) -> tuple:
    """A stored struct as a tuple of its fields (files give structs back as dicts)."""
    return tuple(stored.values()) if isinstance(stored, dict) else tuple(stored)


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
    return stored_value(spark_type, storage_value(value))


def _codec_in(schema: Any) -> Callable[[Any], tuple]:
    """A stored tuple (or dict, as files give a struct back) of ``schema`` as the processor
    gets it."""
    fields = schema.fields

    def decode(stored: Any) -> tuple:
        return tuple(user_value(f.dataType, v) for f, v in zip(fields, _fields(stored)))
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


def _handle_class():  # noqa: C901 - the classes it defines: they subclass PySpark's, imported in the task
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
            value = self._encode(newValue) + self._handle._expiry(self._variable)
            self._handle._put(self._variable, value)
            self._handle._log(self._variable, "update", value)
            self._handle._counts.updated += 1

        def clear(self) -> None:
            self._handle._check_live(self._variable, "clearing value state")
            self._handle._remove(self._variable)
            self._handle._log(self._variable, "delete", None)   # (Spark's store logs each clear too)
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
            # Spark's store logs a put of the first element, a merge of each other one
            for i, element in enumerate(encoded):
                self._handle._log(self._variable, "append" if i else "update", ([element],))
            if not encoded:
                self._handle._log(self._variable, "delete", None)
            self._handle._counts.removed += removed
            self._handle._counts.updated += len(encoded)

        def appendValue(self, newState) -> None:
            self._handle._check_live(self._variable, "updating value state")
            element = self._encode_element(newState)
            self._write(self._elements() + [element])
            self._handle._log(self._variable, "append", ([element],))
            self._handle._counts.updated += 1

        def appendList(self, newState) -> None:
            self._handle._check_live(self._variable, "updating value state")
            encoded = [self._encode_element(v) for v in newState]
            self._write(self._elements() + encoded)
            for element in encoded:
                self._handle._log(self._variable, "append", ([element],))
            self._handle._counts.updated += len(encoded)

        def clear(self) -> None:
            self._handle._check_live(self._variable, "clearing value state")
            self._handle._counts.removed += len(self._elements())
            self._handle._remove(self._variable)
            self._handle._log(self._variable, "delete", None)

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
            user_key = self._encode_key(key)
            entries[user_key] = (self._encode(value),) + self._handle._expiry(self._variable)
            self._write(entries)
            self._handle._log(self._variable, "update", ([(user_key,) + entries[user_key]],))
            self._handle._counts.updated += 1

        def iterator(self):
            return iter([(self._decode_key(k), self._decode(v[0])) for k, v in self._entries().items()])

        def keys(self):
            return iter([self._decode_key(k) for k in self._entries()])

        def values(self):
            return iter([self._decode(v[0]) for v in self._entries().values()])

        def removeKey(self, key) -> None:
            entries = self._entries("removing key from map state")
            user_key = self._encode_key(key)
            if entries.pop(user_key, None) is not None:
                self._write(entries)
            self._handle._log(self._variable, "delete", self._handle._map_entry_gone(self._variable, user_key))
            self._handle._counts.removed += 1

        def clear(self) -> None:
            self._handle._check_live(self._variable, "clearing map state")
            stored = self._handle._get(self._variable)
            self._handle._counts.removed += len(stored[0] or []) if stored is not None else 0
            for entry in (stored[0] or []) if stored is not None else []:   # (Spark removes each entry)
                self._handle._log(self._variable, "delete",
                                  self._handle._map_entry_gone(self._variable, _fields(_fields(entry)[0])))
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
            #: per state variable, the changes Spark's store would log (its change feed): (type,
            #: grouping key, the value as this variable's store keeps it, one element or entry)
            self.changes: dict[str, list] = {}

        def _log(self, variable: StateVariable, change_type: str, value: Any) -> None:
            self.changes.setdefault(variable.name, []).append((change_type, self._current_key(), value))

        @staticmethod
        def _map_entry_gone(variable: StateVariable, user_key: tuple) -> tuple:
            """A removed map entry as a change holds it: its user key, no value."""
            return ([(user_key, None) + ((None,) if variable.ttl_ms is not None else ())],)

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
            the end of the batch, as Spark's TTL eviction); how many. Each removal is logged
            as Spark's store logs it (its change feed): a value's delete; a list's delete,
            then its live elements put back (the first an update, the others appends); a
            delete of each expired map entry."""
            removed = 0
            for variable in self._variables.values():
                if variable.ttl_ms is None:
                    continue
                store = self._stores[variable.name]
                for key, stored in list(store.iterator()):
                    self._key = key
                    if variable.kind == VALUE:
                        if self._expired(stored[-1]):
                            store.remove(key)
                            self._log(variable, "delete", None)
                            removed += 1
                        continue
                    items = [_fields(e) for e in stored[0] or []]
                    live = [e for e in items if not self._expired(e[-1])]
                    if len(live) == len(items):
                        continue
                    removed += len(items) - len(live)
                    if live:
                        store.put(key, (live,))
                    else:
                        store.remove(key)
                    if variable.kind == MAP:
                        for entry in items:
                            if self._expired(entry[-1]):
                                self._log(variable, "delete", self._map_entry_gone(variable, _fields(entry[0])))
                        continue
                    self._log(variable, "delete", None)
                    for i, element in enumerate(live):
                        self._log(variable, "append" if i else "update", ([element],))
            self._key = None
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
