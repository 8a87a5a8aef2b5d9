"""IncrementalExecution: the plan of one micro-batch, as a PySpark DataFrame.

Given each source's batch DataFrame and the batch metadata, build the stream's
plan on them and replace ``current_timestamp()``, ``now()``, ``current_date()``
and ``localtimestamp()`` by the batch timestamp recorded in ``offsets/N``, so a
re-run batch computes exactly what the first attempt computed (Spark's
``CurrentBatchTimestamp``). The replacement is a catalyst plan transform done in
the JVM with a Scala Map used as the partial function, and only for plans that
contain such an expression.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

from py4j.java_collections import MapConverter
from pyspark.sql import DataFrame, SparkSession

from microbatch.checkpoint.offsets import OffsetSeqMetadata
from microbatch.plan.logical import PlanNode, StreamingRelation

log = logging.getLogger(__name__)

_CURRENT_LIKE = ("current_timestamp()", "now()", "current_date(", "localtimestamp(")


def uses_current_time(df: DataFrame) -> bool:
    """Whether the analyzed plan refers to the current time or date."""
    text = df._jdf.queryExecution().analyzed().toString()
    return any(token in text for token in _CURRENT_LIKE)


class IncrementalExecution:
    """Plans batches of one query run; created once per run, used for every batch."""

    def __init__(self, spark: SparkSession, plan: PlanNode, needs_batch_time: bool):
        self.spark = spark
        self.plan = plan
        self.needs_batch_time = needs_batch_time

    def batch_dataframe(self, inputs: Mapping[StreamingRelation, DataFrame],
                        metadata: OffsetSeqMetadata, ctx: Any = None) -> DataFrame:
        """The batch's DataFrame; ``ctx`` (an ``execution.stateful.BatchContext``) runs
        the stateful steps and event-time observation."""
        df = self.plan.build(inputs, ctx)
        if self.needs_batch_time:
            df = self._with_batch_timestamp(df, metadata.batch_timestamp_ms)
        return df

    def _with_batch_timestamp(self, df: DataFrame, timestamp_ms: int) -> DataFrame:
        log.info("Current batch timestamp = %d", timestamp_ms)
        jvm = self.spark._jvm
        expressions = jvm.org.apache.spark.sql.catalyst.expressions
        types = jvm.org.apache.spark.sql.types
        tz = self.spark.conf.get("spark.sql.session.timeZone")
        some_tz = jvm.scala.Some(tz)

        def batch_time(type_name: str):
            data_type = getattr(getattr(types, type_name + "$"), "MODULE$")
            return expressions.CurrentBatchTimestamp(timestamp_ms, data_type, some_tz)

        timestamp = batch_time("TimestampType")
        replacements = {
            expressions.CurrentTimestamp(): timestamp,
            expressions.Now(): timestamp,
            expressions.CurrentDate(some_tz): batch_time("DateType"),
            expressions.LocalTimestamp(some_tz): batch_time("TimestampNTZType"),
        }
        java_map = MapConverter().convert(replacements, self.spark._sc._gateway._gateway_client)
        scala_map = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(java_map)
        plan = df._jdf.queryExecution().analyzed().transformAllExpressions(scala_map)
        jdf = jvm.org.apache.spark.sql.classic.Dataset.ofRows(self.spark._jsparkSession, plan)
        return DataFrame(jdf, self.spark)
