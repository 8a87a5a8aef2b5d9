"""``noop``: run each batch to the end and drop the rows (for benchmarks).

The batch's own executed plan runs to the end, as Spark's ``noop`` writer runs it, and
its rows are counted (Spark's ``numOutputRows``).
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from microbatch import spark_internals
from microbatch.sinks.base import READS_RDD, Sink, SinkContext, SinkProvider


class NoopSink(Sink):
    reads_batch_through = READS_RDD
    runs_kept_plans = True      # (the DataFrame's own executed plan, run again)

    def __init__(self):
        self._last: DataFrame | None = None

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        if df is self._last:        # a kept plan, run again
            spark_internals.reset_observations(df)
        self._last = df
        self.last_num_output_rows = spark_internals.run_to_end(df)

    def __str__(self) -> str:
        return "NoopTable"   # as Spark 4.3 describes its noop sink in progress


class NoopSinkProvider(SinkProvider):
    short_name = "noop"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        return NoopSink()
