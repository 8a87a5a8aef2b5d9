"""``foreachBatch(fn)``: call ``fn(df, batch_id)`` with each batch's DataFrame.

At-least-once: a batch re-run after a crash calls ``fn`` again with the same
batch id and the same rows, so ``fn`` can make its writes idempotent by batch id.
"""
from __future__ import annotations

from typing import Callable

from pyspark.sql import DataFrame

from microbatch.sinks.base import Sink, SinkContext, SinkProvider


class ForeachBatchSink(Sink):
    def __init__(self, fn: Callable[[DataFrame, int], None]):
        self.fn = fn

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        self.fn(df, batch_id)

    def __str__(self) -> str:
        return "ForeachBatchSink"


class ForeachBatchSinkProvider(SinkProvider):
    short_name = "foreachBatch"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        return ForeachBatchSink(context.extra["foreach_batch"])
