"""Each stateful operator's stores as Spark's engine keeps them, beside microbatch's: what
moving a checkpoint between the engines maps (docs/porting.md; adopted by
``runtime/spark_state.py``, converted by ``ops/spark_conversion.py``).

microbatch keeps the rows Spark keeps for these operators, store by store; only names
and a deduplication's value differ:

- an aggregation (``stateStoreSave``, no session window): the grouping key -> the
  aggregation buffers (Spark names the buffers after the function: ``count``, ``sum``...);
- ``dropDuplicates`` (``dedupe``): the key -> nothing (Spark: one null ``__dummy__``);
- ``dropDuplicatesWithinWatermark`` (``dedupeWithinWatermark``): the key -> its expiry;
- a stream-stream join (``symmetricHashJoin``, state format 2): per side
  ``<side>-keyToNumValues`` (join key -> count) and ``<side>-keyWithIndexToValue``
  ((join key, index) -> the side's row and ``matched``); Spark names the join key's
  columns ``field0..``;
- a streaming limit (``globalLimit``): a null key -> the rows emitted so far;
- an aggregation over session windows (``sessionWindowStateStoreSaveExec``): microbatch
  keeps a key's sessions in one row (key -> the list of (start, end, buffers)); Spark a row
  per session (key and session start -> the grouping columns with the session window,
  and the buffers), scanned by the key as a prefix;
- ``applyInPandasWithState``: the key -> ``groupState`` and ``timeoutTimestamp``; Spark
  keeps no ``timeoutTimestamp`` when the query has no timeout.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import groupby
from typing import Callable, Iterable

import pyarrow as pa
from pyspark.sql.types import BooleanType, LongType, NullType, StructField, StructType, TimestampType

from microbatch.operators.aggregate.task import sessions_schema
from microbatch.operators.base import store_field

#: The operators whose state moves, by the name in their schema file, as users know them
MOVABLE = {"stateStoreSave": "aggregations", "sessionWindowStateStoreSaveExec": "session windows",
           "dedupe": "dropDuplicates", "dedupeWithinWatermark": "dropDuplicatesWithinWatermark",
           "symmetricHashJoin": "stream-stream joins", "globalLimit": "limits",
           "applyInPandasWithState": "applyInPandasWithState"}
Rows = Iterable[tuple[tuple, tuple]]
#: The names Spark gives an aggregate function's buffers
SPARK_BUFFER_NAMES = {"count": ["count"], "sum": ["sum"], "avg": ["sum", "count"], "mean": ["sum", "count"],
                      "max": ["max"], "min": ["min"], "first": ["first", "valueSet"],
                      "last": ["last", "valueSet"]}
_DUMMY = StructType([StructField("__dummy__", NullType(), True)])


def _same(rows: Rows) -> Rows:
    return rows


@dataclass(frozen=True)
class SparkStore:
    """One store of an operator in both engines: its name (its directory in a partition,
    ``default`` for none), microbatch's key and value schemas, Spark's, the number of key
    columns Spark scans as a prefix, and a store's (key, value) rows from one engine's
    form to the other's."""

    name: str
    key: StructType
    value: StructType
    spark_key: StructType
    spark_value: StructType
    to_spark: Callable[[Rows], Rows] = _same
    from_spark: Callable[[Rows], Rows] = _same
    prefix_key_columns: int = 0
    #: microbatch's value as its task stores it, where the value schema's Arrow form is not
    #: it (nested nullability, a list's item name)
    value_storage: pa.Schema | None = None

    def storage(self) -> tuple[pa.Schema, pa.Schema]:
        """microbatch's key and value schemas as its files hold them (storage types)."""
        return _arrow(self.key), self.value_storage or _arrow(self.value)

    def spark_storage(self) -> tuple[pa.Schema, pa.Schema]:
        """Spark's key and value schemas as storage types (what ``state.spark_format`` reads)."""
        return _arrow(self.spark_key), _arrow(self.spark_value)


def _arrow(struct: StructType) -> pa.Schema:
    return pa.schema([store_field(f) for f in struct.fields])


def _values(function: Callable[[tuple], tuple], rows: Rows) -> Rows:
    return ((key, function(value)) for key, value in rows)


def _renamed(struct: StructType, names: list[str]) -> StructType:
    return StructType([StructField(n, f.dataType, f.nullable, f.metadata) for n, f in zip(names, struct.fields)])


def _buffer_names(value: StructType, aggregates: list[str]) -> StructType:
    """microbatch's buffer columns (``__microbatch_buffer_<aggregate>_<buffer>``) under
    Spark's names, where the function is one whose buffers Spark names alike."""
    names = value.fieldNames()
    per_call: dict[int, list[int]] = {}
    for i, name in enumerate(names):
        parts = name.rsplit("_", 2)
        if name.startswith("__microbatch_buffer_") and len(parts) == 3 and parts[-2].isdigit():
            per_call.setdefault(int(parts[-2]), []).append(i)
    for call, indexes in per_call.items():
        function = aggregates[call].split("(", 1)[0].strip().lower() if call < len(aggregates) else ""
        spark_names = SPARK_BUFFER_NAMES.get(function)
        if spark_names is not None and len(spark_names) == len(indexes):
            for i, spark_name in zip(indexes, spark_names):
                names[i] = spark_name
    return _renamed(value, names)


def _null_value(_: tuple) -> tuple:
    return (None,)


def _no_value(_: tuple) -> tuple:
    return ()


def _fields(value) -> list:
    return list(value.values()) if isinstance(value, dict) else list(value)


def _sessions_to_spark(index: int, rows: Rows) -> Rows:
    """key -> [(start, end, buffers...)] as (key, start) -> (grouping columns with the
    session window at ``index``, buffers...), a row per session."""
    for key, (sessions,) in rows:
        for session in sessions or ():
            start, end, *buffers = _fields(session)
            grouping = list(key)
            grouping.insert(index, {"start": start, "end": end})
            yield key + (start,), tuple(grouping) + tuple(buffers)


def _sessions_from_spark(index: int, key_count: int, rows: Rows) -> Rows:
    """Spark's rows of sessions back to a row per key, its sessions in start order."""
    for key, group in groupby(sorted(rows, key=lambda kv: (repr(kv[0][:-1]), kv[0][-1])), key=lambda kv: kv[0][:-1]):
        sessions = []
        for _, value in group:
            start, end = _fields(value[index])
            sessions.append((start, end, *value[key_count + 1:]))
        yield key, (sessions,)


def _with_timeout(value: tuple) -> tuple:
    return (value[0], -1)


def spark_stores(operator_name: str, key: StructType, value: StructType,
                 extras: dict | None = None) -> list[SparkStore] | None:
    """The stores of an operator with this schema file name, state schema
    (``StatefulStep.state_schema``) and what its schema file records besides
    (``StatefulStep._document_extras``: the aggregates, the session column, the timeout),
    or None when its state does not move."""
    extras = extras or {}
    if operator_name == "stateStoreSave":
        return [SparkStore("default", key, value, key, _buffer_names(value, extras.get("aggregates", [])))]
    if operator_name == "sessionWindowStateStoreSaveExec":
        index = extras.get("sessionIndex")
        if index is None:      # (recorded since this version)
            return None
        element = value["sessions"].dataType.elementType
        window = StructType(element.fields[:2])
        grouping = list(key.fields)
        grouping.insert(index, StructField(extras.get("sessionColumn", "session_window"), window))
        buffers = _buffer_names(StructType(element.fields[2:]), extras.get("aggregates", []))
        return [SparkStore("default", key, value,
                           StructType(list(key.fields) + [StructField("sessionStartTime", TimestampType())]),
                           StructType(grouping + list(buffers.fields)),
                           partial(_sessions_to_spark, index), partial(_sessions_from_spark, index, len(key.fields)),
                           prefix_key_columns=len(key.fields),
                           value_storage=sessions_schema([store_field(f) for f in element.fields[2:]]))]
    if operator_name == "applyInPandasWithState":
        timeout = extras.get("timeout")
        if timeout is None:    # (recorded since this version)
            return None
        if timeout != "NoTimeout":
            return [SparkStore("default", key, value, key, value)]
        spark_value = StructType(value.fields[:1])
        return [SparkStore("default", key, value, key, spark_value, partial(_values, _first),
                           partial(_values, _with_timeout))]
    if operator_name == "dedupe":
        return [SparkStore("default", key, value, key, _DUMMY, partial(_values, _null_value),
                           partial(_values, _no_value))]
    if operator_name in ("dedupeWithinWatermark", "globalLimit"):
        return [SparkStore("default", key, value, key, value)]
    if operator_name == "symmetricHashJoin":
        ours = StructType([StructField(f"__k{i}", f.dataType, f.nullable) for i, f in enumerate(key.fields)])
        theirs = _renamed(key, [f"field{i}" for i in range(len(key.fields))])
        index = StructField("index", LongType())
        count = StructType([StructField("value", LongType())])
        stores = []
        for side in ("left", "right"):
            row = value[side].dataType
            with_matched = StructType(list(row.fields) + [StructField("matched", BooleanType())])
            stores += [SparkStore(f"{side}-keyToNumValues", ours, count, theirs, count),
                       SparkStore(f"{side}-keyWithIndexToValue", StructType(list(ours.fields) + [index]),
                                  with_matched, StructType(list(theirs.fields) + [index]), with_matched)]
        return stores
    return None


def _first(value: tuple) -> tuple:
    return value[:1]


# -- transformWithState: Spark's column families, microbatch's stores ----------------------
#: Spark's families of a transformWithState's timers, by time mode: (grouping key, expiry) rows
SPARK_TIMER_FAMILIES = ("$eventTimers_keyToTimestamp", "$procTimers_keyToTimestamp")


def _flat(value: tuple, with_ttl: bool) -> tuple:
    """Spark's value row (with a TTL: the value as a struct, then its expiry) as
    microbatch's (the value's fields, then the expiry)."""
    if with_ttl and len(value) == 2 and isinstance(value[0], (dict, tuple)):
        fields = value[0].values() if isinstance(value[0], dict) else value[0]
        return (*fields, value[1])
    return tuple(value)


def _struct(value) -> tuple:
    return tuple(value.values()) if isinstance(value, dict) else tuple(value)


def tws_rows_from_spark(variables: tuple, family: Callable[[str], dict]) -> dict[str, list[tuple[tuple, tuple]]]:
    """A transformWithState's rows per microbatch store (``transform_with_state.schema.
    state_store_schemas``: one per state variable, and ``$timers``) from Spark's column
    families (``family(name)``: its rows as ``state.spark_format.SparkRocksDBFamilies``
    loads them, {} for a family Spark does not hold)."""
    from microbatch.operators.transform_with_state.variables import LIST, MAP, TIMERS_STORE, VALUE
    stores: dict[str, list[tuple[tuple, tuple]]] = {}
    for v in variables:
        rows = family(v.name)
        ttl = v.ttl_ms is not None
        if v.kind == VALUE:
            stores[v.name] = [(tuple(k), _flat(value, ttl)) for k, value in rows.items()]
        elif v.kind == LIST:
            stores[v.name] = [(tuple(k), ([_flat(e, ttl) for e in elements],)) for k, elements in rows.items()
                              if elements]
        elif v.kind == MAP:
            entries: dict[tuple, list] = {}
            for (key, user_key), value in rows.items():
                flat = _flat(value, ttl)
                count = len(v.schema.fields)
                entry = (_struct(user_key), flat[:count]) + flat[count:]
                entries.setdefault(tuple(key), []).append(entry)
            stores[v.name] = [(k, (sorted(e, key=repr),)) for k, e in entries.items()]
    timers: dict[tuple, list[int]] = {}
    for name in SPARK_TIMER_FAMILIES:
        for (key, expiry), _ in family(name).items():
            timers.setdefault(tuple(key), []).append(expiry)
    stores[TIMERS_STORE] = [(k, (sorted(t),)) for k, t in timers.items()]
    return stores


@dataclass(frozen=True)
class SparkFamily:
    """One of Spark's column families of a transformWithState store: its name, key and value
    schemas, key encoder spec and (a map state's) user key schema, as its v3 schema file
    records them; whether Spark counts it internal (``$``); whether a key has several
    values (a list state's); whether Spark's RocksDB holds it (a list state with a TTL
    keeps ``$rowCounter_<name>`` in its schema file only)."""

    name: str
    key: StructType
    value: StructType
    spec: dict
    user_key: StructType | None = None
    multi_value: bool = False
    stored: bool = True

    @property
    def internal(self) -> bool:
        return self.name.startswith("$")


_NO_PREFIX = {"keyStateEncoderType": "NoPrefixKeyStateEncoderSpec"}
_PREFIX_1 = {"keyStateEncoderType": "PrefixKeyScanStateEncoderSpec", "numColsPrefixKey": 1}
_RANGE_0 = {"keyStateEncoderType": "RangeKeyScanStateEncoderSpec", "orderingOrdinals": [0]}
#: Spark's timer families by microbatch's time mode
TIMER_FAMILY_PREFIX = {"eventtime": "$eventTimers", "processingtime": "$procTimers"}


def _long(name: str, nullable: bool = True) -> StructField:
    return StructField(name, LongType(), nullable)


def _one(name: str) -> StructType:
    return StructType([StructField(name, NullType(), True)])


def tws_spark_families(key: StructType, variables: tuple, time_mode: str) -> list[SparkFamily]:
    """The column families Spark's engine keeps a transformWithState's state in (the grouping
    key ``key``; the processor's state variables; microbatch's time mode: none,
    processingtime or eventtime), as Spark 4.3 names and encodes them (``rocksdb_families``'
    docstring)."""
    from microbatch.operators.transform_with_state.variables import LIST, MAP, VALUE
    nested = StructField("key", key, True)
    families = []
    for v in variables:
        ttl = v.ttl_ms is not None
        value = StructType([StructField("value", v.schema, True), _long("ttlExpirationMs")]) if ttl else v.schema
        if v.kind == MAP:
            user = StructField("userKey", v.key_schema, True)
            families.append(SparkFamily(v.name, StructType([nested, user]), value, _PREFIX_1, v.key_schema))
            element = StructType([nested, user])
        else:
            families.append(SparkFamily(v.name, key, value, _NO_PREFIX, multi_value=v.kind == LIST))
            element = key
        if v.kind == LIST:
            families.append(SparkFamily(f"$rowCounter_{v.name}", key, StructType([_long("count")]), _NO_PREFIX,
                                        stored=not ttl))
        if ttl:
            families.append(SparkFamily(f"$ttl_{v.name}", StructType([_long("expirationMs"),
                                                                      StructField("elementKey", element, True)]),
                                        _one("__empty__"), _RANGE_0))
            if v.kind == LIST:
                families += [SparkFamily(f"$min_{v.name}", key, StructType([_long("expirationMs")]), _NO_PREFIX),
                             SparkFamily(f"$count_{v.name}", key, StructType([_long("count")]), _NO_PREFIX)]
        assert v.kind in (VALUE, LIST, MAP)
    timers = TIMER_FAMILY_PREFIX.get(time_mode)
    if timers:
        expiry = _long("expiryTimestampMs", False)
        families += [SparkFamily(f"{timers}_keyToTimestamp", StructType([nested, expiry]), _one("__dummy__"),
                                 _PREFIX_1),
                     SparkFamily(f"{timers}_timestampToKey", StructType([expiry, nested]), _one("__dummy__"),
                                 _RANGE_0)]
    return families


def tws_rows_to_spark(variables: tuple, stores: dict[str, Iterable[tuple[tuple, tuple]]],
                      time_mode: str) -> dict[str, list[tuple[tuple, object]]]:
    """Spark's rows per column family (``tws_spark_families``; a list state's value is the
    list of its elements) from microbatch's store per state variable and its timers'
    (``stores``: {store name: (key, value) rows}): the inverse of ``tws_rows_from_spark``,
    with the TTL indexes, minima and counts Spark keeps beside the values."""
    from microbatch.operators.transform_with_state.variables import LIST, MAP, TIMERS_STORE, VALUE
    out: dict[str, list] = {}
    for v in variables:
        rows = stores.get(v.name, ())
        ttl = v.ttl_ms is not None
        width = len(v.schema.fields)
        mine, index = out.setdefault(v.name, []), []
        if v.kind == VALUE:
            for key, value in rows:
                key, value = tuple(key), tuple(value)
                if ttl:
                    mine.append((key, (value[:width], value[width])))
                    index.append(((value[width], key), (None,)))
                else:
                    mine.append((key, value))
        elif v.kind == LIST:
            counts, minima = [], []
            for key, (elements,) in rows:
                key, elements = tuple(key), [_struct(e) for e in elements or ()]
                if not elements:
                    continue
                if ttl:
                    mine.append((key, [(e[:width], e[width]) for e in elements]))
                    least = min(e[width] for e in elements)
                    index.append(((least, key), (None,)))
                    minima.append((key, (least,)))
                else:
                    mine.append((key, elements))
                counts.append((key, (len(elements),)))
            if ttl:
                out[f"$min_{v.name}"], out[f"$count_{v.name}"] = minima, counts
            else:
                out[f"$rowCounter_{v.name}"] = counts
        elif v.kind == MAP:
            for key, (entries,) in rows:
                key = tuple(key)
                for entry in entries or ():
                    user_key, value, *expiry = _fields(entry)
                    pair = (key, _struct(user_key))
                    if ttl:
                        mine.append((pair, (_struct(value), expiry[0])))
                        index.append(((expiry[0], pair), (None,)))
                    else:
                        mine.append((pair, _struct(value)))
        if ttl:
            out[f"$ttl_{v.name}"] = index
    timers = TIMER_FAMILY_PREFIX.get(time_mode)
    if timers:
        by_key, by_time = [], []
        for key, (stamps,) in stores.get(TIMERS_STORE, ()):
            key = tuple(key)
            for stamp in stamps or ():
                by_key.append(((key, stamp), (None,)))
                by_time.append(((stamp, key), (None,)))
        out[f"{timers}_keyToTimestamp"], out[f"{timers}_timestampToKey"] = by_key, by_time
    return out
