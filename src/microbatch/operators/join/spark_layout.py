"""A stream-stream join's state in Spark's engine (``operators.base.StateLayout``;
docs/porting.md): state format 2, per side ``<side>-keyToNumValues`` (join key -> count)
and ``<side>-keyWithIndexToValue`` ((join key, index) -> the side's row and ``matched``),
as in microbatch; Spark names the join key's columns ``field0..``, microbatch ``__k0..``.
"""
from __future__ import annotations

from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from microbatch.operators.base import StateLayout
from microbatch.operators.spark_stores import SparkStore, renamed


class JoinLayout(StateLayout):
    names = ("symmetricHashJoin",)
    known_as = "stream-stream joins"
    one_store = False
    sides = ("left", "right")

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        ours = StructType([StructField(f"__k{i}", f.dataType, f.nullable) for i, f in enumerate(key.fields)])
        theirs = renamed(key, [f"field{i}" for i in range(len(key.fields))])
        index = StructField("index", LongType())
        count = StructType([StructField("value", LongType())])
        stores = []
        for side in cls.sides:
            row = value[side].dataType
            with_matched = StructType(list(row.fields) + [StructField("matched", BooleanType())])
            stores += [SparkStore(f"{side}-keyToNumValues", ours, count, theirs, count),
                       SparkStore(f"{side}-keyWithIndexToValue", StructType(list(ours.fields) + [index]),
                                  with_matched, StructType(list(theirs.fields) + [index]), with_matched)]
        return stores

    @classmethod
    def side_store(cls, side: str, key: StructType, value: StructType) -> tuple[str, StructType, StructType]:
        """A side's rows per join key (``field0..``), from its ``keyWithIndexToValue``
        store (the state reader drops the index and ``matched``)."""
        return (f"{side}-keyWithIndexToValue",
                StructType([StructField(f"field{i}", f.dataType, f.nullable) for i, f in enumerate(key.fields)]),
                value[side].dataType)
