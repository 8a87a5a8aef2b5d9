"""Memory source: rows added from the driver, for tests and examples.

Like Spark's MemoryStream, each ``add_data`` call is one offset (a number,
starting at 0; -1 means empty). Data is kept in the driver process, so the
source is replayable for the life of the process, not across processes.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.sources.base import ReadLimit, Source

_ids = itertools.count()


class MemoryStreamSource(Source):
    def __init__(self, spark: SparkSession, schema: StructType | str):
        if isinstance(schema, str):
            schema = spark_internals.parse_schema_ddl(schema)
        self._spark = spark
        self._schema = schema
        self._batches: list[list[tuple]] = []
        self._lock = threading.Lock()
        self.id = next(_ids)

    @property
    def schema(self) -> StructType:
        return self._schema

    def _to_row(self, row: Any) -> tuple:
        if isinstance(row, dict):
            return tuple(row.get(f.name) for f in self._schema.fields)
        if isinstance(row, (tuple, list)):
            return tuple(row)
        if len(self._schema.fields) == 1:
            return (row,)
        raise ValueError(
            f"Cannot add {row!r} to a MemoryStream with {len(self._schema.fields)} columns: "
            "give a tuple, a list or a dict per row.")

    def add_data(self, rows: Iterable[Any]) -> int:
        """Append one batch of rows; return its offset."""
        batch = [self._to_row(r) for r in rows]
        with self._lock:
            self._batches.append(batch)
            return len(self._batches) - 1

    addData = add_data

    @property
    def current_offset(self) -> int:
        with self._lock:
            return len(self._batches) - 1

    def initial_offset(self) -> Any:
        return -1

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        current = self.current_offset
        return None if current < 0 else current

    def _rows(self, start: Any, end: Any) -> list[tuple]:
        lo = -1 if start is None else int(start)
        with self._lock:
            if int(end) >= len(self._batches):
                raise ValueError(
                    f"MemoryStream has no data for offset {end}: it holds "
                    f"{len(self._batches)} batches. Memory streams keep their data only in "
                    "the process that added it.")
            return [r for b in self._batches[lo + 1:int(end) + 1] for r in b]

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        return self._spark.createDataFrame(self._rows(start, end), self._schema)

    def num_rows(self, start: Any, end: Any) -> int | None:
        lo = -1 if start is None else int(start)
        with self._lock:
            return sum(len(b) for b in self._batches[lo + 1:int(end) + 1])

    def __str__(self) -> str:
        return f"MemoryStream[{','.join(self._schema.fieldNames())}]"
