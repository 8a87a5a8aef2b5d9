"""What every operator's stores in Spark's engine share (docs/porting.md): ``SparkStore``,
one store in both engines, with the row helpers the homes' layouts are made of, and the
questions the readers of a checkpoint ask, answered from the operators' layouts
(``operators.base.StateLayout``): ``spark_stores`` and ``movable``. Each operator's own
layout is in its home, beside its step: ``operators/aggregate/spark_layout.py``
(aggregations, session windows included), ``operators/dedup.py``, ``operators/limit.py``,
``operators/join/spark_layout.py``, ``operators/group_state/spark_layout.py``
(applyInPandasWithState) and ``operators/transform_with_state/spark_layout.py`` (Spark's
column families). Moving a checkpoint between the engines maps them: adopted by
``runtime/spark_state.py``, converted by ``ops/spark_conversion.py``.

microbatch keeps the rows Spark keeps for these operators, store by store; only names
differ, but for a deduplication's value, a session window's sessions (a row per key in
microbatch, a row per session in Spark) and applyInPandasWithState's timeout without one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import pyarrow as pa
from pyspark.sql.types import StructField, StructType

from microbatch.operators.base import state_layout, state_layouts, store_field

Rows = Iterable[tuple[tuple, tuple]]


def same_rows(rows: Rows) -> Rows:
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
    to_spark: Callable[[Rows], Rows] = same_rows
    from_spark: Callable[[Rows], Rows] = same_rows
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


# -- row helpers ---------------------------------------------------------------------------
def values_mapped(function: Callable[[tuple], tuple], rows: Rows) -> Rows:
    """Each row's value through ``function``, its key as it is."""
    return ((key, function(value)) for key, value in rows)


def renamed(struct: StructType, names: list[str]) -> StructType:
    """``struct`` with its fields named ``names``."""
    return StructType([StructField(name, f.dataType, f.nullable, f.metadata) for name, f in zip(names, struct.fields)])


def row_fields(value) -> list:
    """A struct value's fields, as a row or a dict holds them."""
    return list(value.values()) if isinstance(value, dict) else list(value)


def struct_values(value) -> tuple:
    """A struct value as a tuple of its fields."""
    return tuple(value.values()) if isinstance(value, dict) else tuple(value)


# -- what the readers of a checkpoint ask ----------------------------------------------------
def spark_stores(operator_name: str, key: StructType, value: StructType,
                 extras: dict | None = None) -> list[SparkStore] | None:
    """The stores of an operator with this schema file name, state schema
    (``StatefulStep.state_schema``) and what its schema file records besides
    (``StatefulStep._document_extras``: the aggregates, the session column, the timeout),
    or None when its state does not move as stores (``StateLayout.stores``)."""
    return state_layout(operator_name).stores(operator_name, key, value, extras or {})


def movable() -> dict[str, str]:
    """The operators whose state moves between the engines, by the name in their schema
    file, as users know them."""
    return {name: layout.known_as for name, layout in state_layouts().items()}
