"""A streaming aggregation's state in Spark's engine (``operators.base.StateLayout``;
docs/porting.md):

- an aggregation (``stateStoreSave``, no session window): the grouping key -> the
  aggregation buffers, as in microbatch; Spark names the buffers after the function
  (``count``, ``sum``...);
- an aggregation over session windows (``sessionWindowStateStoreSaveExec``): microbatch
  keeps a key's sessions in one row (key -> the list of (start, end, buffers)); Spark a row
  per session (key and session start -> the grouping columns with the session window,
  and the buffers), scanned by the key as a prefix.
"""
from __future__ import annotations

from functools import partial
from itertools import groupby

from pyspark.sql.types import StructField, StructType, TimestampType

from microbatch.operators.aggregate.task import sessions_schema
from microbatch.operators.base import StateLayout, store_field
from microbatch.operators.spark_stores import Rows, SparkStore, renamed, row_fields

#: The names Spark gives an aggregate function's buffers
SPARK_BUFFER_NAMES = {"count": ["count"], "sum": ["sum"], "avg": ["sum", "count"], "mean": ["sum", "count"],
                      "max": ["max"], "min": ["min"], "first": ["first", "valueSet"],
                      "last": ["last", "valueSet"]}


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
    return renamed(value, names)


class AggregationLayout(StateLayout):
    names = ("stateStoreSave",)
    known_as = "aggregations"

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        return [SparkStore("default", key, value, key, _buffer_names(value, extras.get("aggregates", [])))]


def _sessions_to_spark(index: int, rows: Rows) -> Rows:
    """key -> [(start, end, buffers...)] as (key, start) -> (grouping columns with the
    session window at ``index``, buffers...), a row per session."""
    for key, (sessions,) in rows:
        for session in sessions or ():
            start, end, *buffers = row_fields(session)
            grouping = list(key)
            grouping.insert(index, {"start": start, "end": end})
            yield key + (start,), tuple(grouping) + tuple(buffers)


def _sessions_from_spark(index: int, key_count: int, rows: Rows) -> Rows:
    """Spark's rows of sessions back to a row per key, its sessions in start order."""
    for key, group in groupby(sorted(rows, key=lambda kv: (repr(kv[0][:-1]), kv[0][-1])), key=lambda kv: kv[0][:-1]):
        sessions = []
        for _, value in group:
            start, end = row_fields(value[index])
            sessions.append((start, end, *value[key_count + 1:]))
        yield key, (sessions,)


class SessionWindowLayout(StateLayout):
    names = ("sessionWindowStateStoreSaveExec",)
    known_as = "session windows"
    read_as_spark = True
    logs_changes = True
    unnamed_in_progress_before_4 = True

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        index = extras.get("sessionIndex")
        if index is None:      # (recorded since this version)
            return None
        element = value["sessions"].dataType.elementType
        window = StructType(element.fields[:2])
        grouping = list(key.fields)
        grouping.insert(index, StructField(extras.get("sessionColumn", "session_window"), window,
                                           metadata=extras.get("sessionMetadata")))
        buffers = _buffer_names(StructType(element.fields[2:]), extras.get("aggregates", []))
        return [SparkStore("default", key, value,
                           StructType(list(key.fields) + [StructField("sessionStartTime", TimestampType())]),
                           StructType(grouping + list(buffers.fields)),
                           partial(_sessions_to_spark, index), partial(_sessions_from_spark, index, len(key.fields)),
                           prefix_key_columns=len(key.fields),
                           value_storage=sessions_schema([store_field(f) for f in element.fields[2:]]))]
