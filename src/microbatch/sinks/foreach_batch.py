"""``foreachBatch(fn)``: call ``fn(df, batch_id)`` with each batch's DataFrame.

At-least-once: a batch re-run after a crash calls ``fn`` again with the same
batch id and the same rows, so ``fn`` can make its writes idempotent by batch id.

An error in ``fn`` fails the query as in Spark: ``[STREAM_FAILED] ... terminated with
exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided
function in foreach batch sink. Reason: ...`` with the function's traceback.
"""
from __future__ import annotations

from typing import Callable

from pyspark.sql import DataFrame

from microbatch import crash_points, spark_internals
from microbatch.errors import UserFunctionError
from microbatch.sinks.base import Sink, SinkContext, SinkProvider


class ForeachBatchSink(Sink):
    def __init__(self, fn: Callable[[DataFrame, int], None]):
        self.fn = fn

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        try:
            self.fn(df, batch_id)
        except Exception as e:
            raise UserFunctionError(e, spark_internals.foreach_batch_user_error(df, e)) from e
        crash_points.reached("foreach-batch-returned")

    def __str__(self) -> str:
        return "ForeachBatchSink"


class ForeachBatchSinkProvider(SinkProvider):
    short_name = "foreachBatch"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        return ForeachBatchSink(context.extra["foreach_batch"])
