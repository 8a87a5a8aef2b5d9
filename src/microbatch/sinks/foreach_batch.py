"""``foreachBatch(fn)``: call ``fn(df, batch_id)`` with each batch's DataFrame.

At-least-once: a batch re-run after a crash calls ``fn`` again with the same
batch id and the same rows, so ``fn`` can make its writes idempotent by batch id.

An error in ``fn`` fails the query as in Spark: ``[STREAM_FAILED] ... terminated with
exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided
function in foreach batch sink. Reason: ...`` with the function's traceback.
"""
from __future__ import annotations

from typing import Any, Callable

from pyspark.sql import DataFrame

from microbatch import crash_points, spark_internals
from microbatch.errors import UserFunctionError
from microbatch.sinks.base import Sink, SinkContext, SinkProvider


#: Spark 4.3's conf: over Spark Connect the batch's DataFrame is the query's cloned
#: session's (true, the default), or the user's own session's (false, as before 4.3)
USE_CLONED_SESSION = "spark.sql.connect.streaming.foreachBatch.useClonedSession"


class ForeachBatchSink(Sink):
    def __init__(self, fn: Callable[[DataFrame, int], None], root_session: Any = None):
        self.fn = fn
        self._root_session = root_session   # (over Connect, USE_CLONED_SESSION false: the user's)

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        if self._root_session is not None:
            df = spark_internals.in_session(df, self._root_session)
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
        spark = context.spark
        root = spark if spark_internals.is_connect(spark) and \
            (spark.conf.get(USE_CLONED_SESSION, "true") or "true").lower() == "false" else None
        return ForeachBatchSink(context.extra["foreach_batch"], root)
