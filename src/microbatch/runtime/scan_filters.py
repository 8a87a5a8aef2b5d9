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
builds the query as Spark's engine runs it (a Spark streaming DataFrame with a stand-in
source wherever the plan reads a source, and ``withWatermark`` where it has a watermark),
has Spark's optimizer push its filters down, and puts what ends right above each stand-in
of a file source right above that read of the source in microbatch's plan (a
``ScanFilter``). microbatch's scans then get Spark's pushed filters and count the rows
Spark's count (``spark_internals.ScanRowCounter``), and the rows they drop are rows Spark's
engine never reads. Where microbatch's plan applies the same filter there already, Spark's
optimizer merges the two (``CombineFilters``): the batch runs as before; a query without
filters gets none.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.plan.logical import PlanNode, ScanFilter, StreamingRelation, Transform, Watermark
from microbatch.runtime.segments import children_replaced

log = logging.getLogger(__name__)


def with_scan_filters(spark: SparkSession, plan: PlanNode,
                      empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode:
    """``plan`` with a ``ScanFilter`` over each read of a file source that Spark's engine
    would filter in its scan; ``plan`` itself when there is none, or when the query does not
    build as Spark's streaming query (or reads the current time, which Spark's optimizer would
    fix into the filters)."""
    if not any(spark_internals.reads_only_files(empty_inputs[r]) for r in plan.relations()):
        return plan
    reads: list[_Read] = []
    try:
        query = _as_spark_query(plan, spark, empty_inputs, reads)
        if spark_internals.uses_current_time(query):
            return plan
        found = spark_internals.scan_filters(query, [read.df for read in reads])
    except Exception:  # noqa: BLE001 - a query Spark's engine would not analyse alike: its scans stay as they are
        log.debug("No filters pushed to the scans: the query does not build as Spark's", exc_info=True)
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
    """One place the plan reads a source, as a stand-in of it in Spark's streaming query."""

    relation: StreamingRelation
    df: DataFrame

    def build(self, inputs):
        return self.df

    def describe(self) -> str:
        return f"Stand-in of {self.relation.describe()}"


def _as_spark_query(node: PlanNode, spark: SparkSession, empty_inputs: Mapping[StreamingRelation, DataFrame],
                    reads: list[_Read]) -> DataFrame:
    """The plan as a Spark streaming DataFrame: each read of a source (in plan order,
    appended to ``reads``) a streaming DataFrame of its columns over no files (a glob of a
    directory that does not exist: Spark checks no path it globs), each watermark a
    ``withWatermark`` (a batch's plan leaves them to the engine)."""
    def spark_plan(node: PlanNode) -> PlanNode:
        if isinstance(node, StreamingRelation):
            stand_in = spark.readStream.schema(empty_inputs[node].schema).format("json") \
                .load(f"file:/microbatch-stand-in-{uuid.uuid4().hex}/*")
            reads.append(_Read(node, stand_in))
            return reads[-1]
        node = children_replaced(node, [spark_plan(child) for child in node.children])
        if isinstance(node, Watermark):
            return Transform(node.child, "withWatermark", (node.event_time, node.delay))
        return node
    return spark_plan(node).build({})


def _filtered(node: PlanNode, filters) -> PlanNode:
    """``node`` with the next of ``filters`` (SQL text, or None) over each read of a source,
    in the order ``_as_spark_query`` met them."""
    if isinstance(node, StreamingRelation):
        sql = next(filters)
        return node if sql is None else ScanFilter(node, sql, F.expr(sql))
    return children_replaced(node, [_filtered(child, filters) for child in node.children])
