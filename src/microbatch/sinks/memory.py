"""``memory``: keep every batch's rows in the driver and expose them as a temp view.

The view is named after ``queryName`` and registered in the user's session, as
Spark's memory sink does. Exactly-once: a batch id already stored is skipped
("Skipping already committed batch N"). For tests and small debugging outputs:
all rows live in driver memory.
"""
from __future__ import annotations

import logging
import threading

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider

log = logging.getLogger(__name__)


class MemorySink(Sink):
    reads_batch_through = READS_SQL

    def __init__(self, spark: SparkSession, schema: StructType, output_mode: str,
                 view_name: str | None = None):
        self.spark = spark
        self.schema = schema
        self.output_mode = output_mode
        self.view_name = view_name
        self._batches: dict[int, list[Row]] = {}
        self._lock = threading.Lock()
        if view_name:
            self._publish()

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        with self._lock:
            if self._batches and batch_id <= max(self._batches):
                log.info("Skipping already committed batch %d", batch_id)
                self.last_num_output_rows = 0
                return
        rows = df.collect()
        with self._lock:
            if self.output_mode == "complete":
                self._batches.clear()
            self._batches[batch_id] = rows
            self.last_num_output_rows = len(rows)
        if self.view_name:
            self._publish()

    def _publish(self) -> None:
        self.spark.createDataFrame(self.all_data(), self.schema).createOrReplaceTempView(self.view_name)

    # -- for tests and users ------------------------------------------------
    def all_data(self) -> list[Row]:
        with self._lock:
            return [r for b in sorted(self._batches) for r in self._batches[b]]

    def batch_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._batches)

    def batch(self, batch_id: int) -> list[Row]:
        with self._lock:
            return list(self._batches.get(batch_id, []))

    def latest_batch_id(self) -> int | None:
        with self._lock:
            return max(self._batches) if self._batches else None

    def clear(self) -> None:
        with self._lock:
            self._batches.clear()

    def __str__(self) -> str:
        return "MemorySink"


class MemorySinkProvider(SinkProvider):
    short_name = "memory"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        if not context.query_name:
            raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1194")
        return MemorySink(context.spark, context.schema, context.output_mode, context.query_name)
