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
- a streaming limit (``globalLimit``): a null key -> the rows emitted so far.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql.types import BooleanType, LongType, NullType, StructField, StructType

#: The operators whose state moves, by the name in their schema file, as users know them
MOVABLE = {"stateStoreSave": "aggregations without session windows", "dedupe": "dropDuplicates",
           "dedupeWithinWatermark": "dropDuplicatesWithinWatermark",
           "symmetricHashJoin": "stream-stream joins", "globalLimit": "limits"}
#: The names Spark gives an aggregate function's buffers
SPARK_BUFFER_NAMES = {"count": ["count"], "sum": ["sum"], "avg": ["sum", "count"], "mean": ["sum", "count"],
                      "max": ["max"], "min": ["min"], "first": ["first", "valueSet"],
                      "last": ["last", "valueSet"]}
_DUMMY = StructType([StructField("__dummy__", NullType(), True)])


def _same(value: tuple) -> tuple:
    return value


@dataclass(frozen=True)
class SparkStore:
    """One store of an operator in both engines: its name (its directory in a partition,
    ``default`` for none), microbatch's key and value schemas, Spark's, and the value
    from one engine's rows to the other's (keys are the same rows)."""

    name: str
    key: StructType
    value: StructType
    spark_key: StructType
    spark_value: StructType
    to_spark: Callable[[tuple], tuple] = _same
    from_spark: Callable[[tuple], tuple] = _same


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


def spark_stores(operator_name: str, key: StructType, value: StructType,
                 aggregates: list[str] | None = None) -> list[SparkStore] | None:
    """The stores of an operator with this schema file name and state schema
    (``StatefulStep.state_schema``), or None when its state does not move."""
    if operator_name == "stateStoreSave":
        return [SparkStore("default", key, value, key, _buffer_names(value, aggregates or []))]
    if operator_name == "dedupe":
        return [SparkStore("default", key, value, key, _DUMMY, _null_value, _no_value)]
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
