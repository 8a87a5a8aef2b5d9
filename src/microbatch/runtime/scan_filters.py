"""The filters Spark's engine gives a file source's scans, found once per query run.

Spark's engine reports a source's ``numInputRows`` from the scans of its batch: their
``numOutputRows``, summed over the scans that read the source (``ProgressReporter``). Its
optimizer pushes filters down to each scan: the query's deterministic filters on the
source's columns, through projections and renames, unions, a watermark (the parts that do
not use the event time) and an aggregation (on its keys), and the not-null filters it infers
for a join's keys. A JSON or CSV scan (``spark.sql.json.filterPushdown.enabled``,
``spark.sql.csv.filterPushdown.enabled``) returns only the rows that pass the ones it can
evaluate, so Spark counts the source's rows after them; and the watermark above a scan
sees only the rows that pass them all.

microbatch's batch plan is not Spark's (an ``Observation`` at a watermark, which Spark's
optimizer does not push a filter through; a join run as a task; a SQL step over a rename),
so its scans would get fewer filters and count more rows. Once per run, ``with_scan_filters``
builds the query as a batch whose filters Spark's optimizer pushes as it pushes those of a
batch of the stream (a relation over no files wherever the plan reads a source, and a
generator of the event time where it has a watermark, which keeps the parts of a filter
that read the event time above it, as Spark's EventTimeWatermark does; no streaming
DataFrame: microbatch never asks Spark's streaming engine), and puts what ends right above
each read of a file source right above that read in microbatch's plan (a ``ScanFilter``). microbatch's scans then get Spark's pushed filters and count the rows
Spark's count (``spark_internals.ScanRowCounter``), and the rows they drop are rows Spark's
engine never reads. Where microbatch's plan applies the same filter there already, Spark's
optimizer merges the two (``CombineFilters``): the batch runs as before; a query without
filters gets none.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.plan.logical import Apply, PlanNode, ScanFilter, StreamingRelation, Watermark
from microbatch.plan.logical import children_replaced

log = logging.getLogger(__name__)


def with_scan_filters(spark: SparkSession, plan: PlanNode,
                      empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode:
    """``plan`` with a ``ScanFilter`` over each read of a file source that Spark's engine
    would filter in its scan; ``plan`` itself when there is none, or when the query does not
    build as a batch (or reads the current time, which Spark's optimizer would
    fix into the filters)."""
    if not any(spark_internals.reads_only_files(empty_inputs[r]) for r in plan.relations()):
        return plan
    reads: list[_Read] = []
    try:
        query = _as_batch_query(plan, spark, reads)
        if spark_internals.uses_current_time(query):
            return plan
        found = spark_internals.scan_filters(query, [read.df for read in reads])
    except Exception:  # noqa: BLE001 - a query that does not build as a batch: its scans stay as they are
        log.debug("No filters pushed to the scans: the query does not build as a batch", exc_info=True)
        return plan
    filters: list[str | None] = []
    for k, read in enumerate(reads):
        parts = []
        if spark_internals.reads_only_files(empty_inputs[read.relation]):
            for text in found.get(k, []):
                try:     # (each part read back from its SQL text, over the source's columns)
                    empty_inputs[read.relation].where(F.expr(text))
                except Exception:  # noqa: BLE001 - a part that does not read back: the scan goes without it
                    log.debug("Filter %s does not read back over %s", text, read.relation.describe(), exc_info=True)
                    continue
                parts.append(f"({text})")
        filters.append(" AND ".join(parts) or None)
    if not any(filters):
        return plan
    return _filtered(plan, iter(filters))


@dataclass(eq=False)
class _Read(PlanNode):
    """One place the plan reads a source, as a relation of its own in the batch query."""

    relation: StreamingRelation
    df: DataFrame

    def build(self, inputs):
        return self.df

    def describe(self) -> str:
        return f"Stand-in of {self.relation.describe()}"


def _as_batch_query(node: PlanNode, spark: SparkSession, reads: list[_Read]) -> DataFrame:
    """The plan as a batch DataFrame Spark's optimizer can push filters through as it does
    through a batch of the stream: each read of a source (in plan order, appended to
    ``reads``) a relation of its own over no files, each watermark a generator of its event
    time (``spark_internals.event_time_barrier``: the parts of a filter that read the event
    time stay above it, as above Spark's EventTimeWatermark), each stateful operator what
    stands for it (``scan_filter_stand_in``: a deduplication a limit, which no filter passes,
    as none passes Spark's streaming Deduplicate)."""
    def batch_plan(node: PlanNode) -> PlanNode:
        if isinstance(node, StreamingRelation):
            reads.append(_Read(node, node.empty_batch(spark)))
            return reads[-1]
        node = children_replaced(node, [batch_plan(child) for child in node.children])
        if isinstance(node, Watermark):
            return Apply(node.child, lambda df, column=node.event_time: spark_internals.event_time_barrier(df, column),
                         "watermark")
        return node.scan_filter_stand_in() if node.stateful else node
    return batch_plan(node).build({})


def _filtered(node: PlanNode, filters) -> PlanNode:
    """``node`` with the next of ``filters`` (SQL text, or None) over each read of a source,
    in the order ``_as_spark_query`` met them."""
    if isinstance(node, StreamingRelation):
        sql = next(filters)
        return node if sql is None else ScanFilter(node, sql, F.expr(sql))
    return children_replaced(node, [_filtered(child, filters) for child in node.children])
