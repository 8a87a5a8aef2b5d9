"""``noop``: run each batch to the end and drop the rows (for benchmarks).

Uses Spark's batch ``noop`` writer, so the whole batch is computed.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider


class NoopSink(Sink):
    reads_batch_through = READS_SQL

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        df.write.format("noop").mode("append").save()

    def __str__(self) -> str:
        return "NoopTable"   # as Spark 4.3 describes its noop sink in progress


class NoopSinkProvider(SinkProvider):
    short_name = "noop"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        return NoopSink()
