"""applyInPandasWithState's state in Spark's engine (``operators.base.StateLayout``;
docs/porting.md): the key -> ``groupState`` and ``timeoutTimestamp``, as in microbatch,
but that Spark keeps no ``timeoutTimestamp`` when the query has no timeout (microbatch
keeps -1)."""
from __future__ import annotations

from functools import partial

from pyspark.sql.types import StructType

from microbatch.operators.base import StateLayout
from microbatch.operators.spark_stores import SparkStore, values_mapped


def _first(value: tuple) -> tuple:
    return value[:1]


def _with_timeout(value: tuple) -> tuple:
    return (value[0], -1)


class GroupStateLayout(StateLayout):
    names = ("applyInPandasWithState",)
    known_as = "applyInPandasWithState"

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        timeout = extras.get("timeout")
        if timeout is None:    # (recorded since this version)
            return None
        if timeout != "NoTimeout":
            return [SparkStore("default", key, value, key, value)]
        spark_value = StructType(value.fields[:1])
        return [SparkStore("default", key, value, key, spark_value, partial(values_mapped, _first),
                           partial(values_mapped, _with_timeout))]
