"""A transformWithState's state in Spark's engine (``operators.base.StateLayout``;
docs/porting.md): Spark runs it on its RocksDB provider only, each state variable, timer
index and TTL index a column family of the partition's RocksDB (``SparkFamily``;
``state/spark_format/rocksdb_families.py`` reads them, ``rocksdb_writer.py`` writes them),
where microbatch keeps a store per state variable and one for the timers
(``schema.state_store_schemas``). ``tws_rows_from_spark`` and ``tws_rows_to_spark`` map the
rows between the two; ``tws_spark_families`` names Spark's families.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from pyspark.sql.types import LongType, NullType, StructField, StructType

from microbatch.operators.base import StateLayout
from microbatch.operators.spark_stores import row_fields, struct_values
from microbatch.operators.transform_with_state.variables import LIST, MAP, TIMERS_STORE, VALUE


class TransformWithStateLayout(StateLayout):
    """Its state moves as Spark's column families (below), not as stores."""

    names = ("transformWithStateInPandasExec", "transformWithStateInPySparkExec")
    known_as = "transformWithState"
    in_column_families = True
    one_store = False
    logs_changes = True


#: Spark's families of a transformWithState's timers, by time mode: (grouping key, expiry) rows
SPARK_TIMER_FAMILIES = ("$eventTimers_keyToTimestamp", "$procTimers_keyToTimestamp")


def _flat(value: tuple, with_ttl: bool) -> tuple:
    """Spark's value row (with a TTL: the value as a struct, then its expiry) as
    microbatch's (the value's fields, then the expiry)."""
    if with_ttl and len(value) == 2 and isinstance(value[0], (dict, tuple)):
        fields = value[0].values() if isinstance(value[0], dict) else value[0]
        return (*fields, value[1])
    return tuple(value)


def tws_rows_from_spark(variables: tuple, family: Callable[[str], dict]) -> dict[str, list[tuple[tuple, tuple]]]:
    """A transformWithState's rows per microbatch store (``transform_with_state.schema.
    state_store_schemas``: one per state variable, and ``$timers``) from Spark's column
    families (``family(name)``: its rows as ``state.spark_format.SparkRocksDBFamilies``
    loads them, {} for a family Spark does not hold)."""
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
                entry = (struct_values(user_key), flat[:count]) + flat[count:]
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
                key, elements = tuple(key), [struct_values(e) for e in elements or ()]
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
                    user_key, value, *expiry = row_fields(entry)
                    pair = (key, struct_values(user_key))
                    if ttl:
                        mine.append((pair, (struct_values(value), expiry[0])))
                        index.append(((expiry[0], pair), (None,)))
                    else:
                        mine.append((pair, struct_values(value)))
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
