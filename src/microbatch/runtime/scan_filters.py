"""The filters Spark's engine gives a file source's scans, found once per query run.

Spark's engine reports a source's ``numInputRows`` from the scans of its batch: their
``numOutputRows``, summed over the scans that read the source (``ProgressReporter``). Its
optimizer pushes filters down to each scan: the query's deterministic filters on the
source's columns, through projections and renames, unions, a watermark (the parts that do
not use the event time) and an aggregation (on its keys), and the not-null filters it infers
for a join's keys. Its planner hands the scan those it translates
into the file format's filters (``PushedFilters``: ``v > 2``, ``isnotnull(v)``, not
``isnotnull((v % 4))``) and prunes partitions by those on partition columns; a JSON or CSV
scan (``spark.sql.json.filterPushdown.enabled``, ``spark.sql.csv.filterPushdown.enabled``)
returns only the rows that pass the ones it is handed, so Spark counts the source's rows
after them, and the others run in a filter right above the scan, after its count; the
watermark above sees only the rows that pass them all.

microbatch's batch plan is not Spark's (an ``Observation`` at a watermark, which Spark's
optimizer does not push a filter through; a join run as a task; a SQL step over a rename),
so its scans would get fewer filters and count more rows. Once per run, ``with_scan_filters``
builds the query as a batch whose filters Spark's optimizer pushes as it pushes those of a
batch of the stream (a relation over no files wherever the plan reads a source, and a
generator of the event time where it has a watermark, which keeps the parts of a filter
that read the event time above it, as Spark's EventTimeWatermark does; no streaming
DataFrame: microbatch never asks Spark's streaming engine), and puts what ends right above
each read of a file source right above that read in microbatch's plan (a ``ScanFilter``).
microbatch's scans then get Spark's pushed filters and count the rows
Spark's count (``spark_internals.ScanRowCounter``), and the rows they drop are rows Spark's
engine never reads. The filters Spark's scan does not take are given in a form from which
Spark's optimizer gives microbatch's scan nothing either (``spark_internals.scan_skips_filter``):
as plain filters over the scan, it would infer from ``isnotnull((v % 4))`` the
``isnotnull(v)`` the scan takes (InferFiltersFromConstraints), where Spark's optimizer
pushed ``isnotnull((v % 4))`` (inferred for a join's key ``v % 4``) to its scan after it
inferred, and microbatch's scan would count fewer rows (seed 712). Where microbatch's plan
applies the same filter there already, Spark's optimizer merges the two
(``CombineFilters``): the batch runs as before; a query without filters gets none.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.plan.logical import Apply, PlanNode, ScanFilter, StreamingRelation, Watermark
from microbatch.plan.logical import children_replaced, filters_reading_back

log = logging.getLogger(__name__)


def with_scan_filters(spark: SparkSession, plan: PlanNode,
                      empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode:
    """``plan`` with a ``ScanFilter`` over each read of a file source that Spark's engine
    would filter in its scan; ``plan`` itself when there is none, or when the query does not
    build as a batch (or reads the current time, which Spark's optimizer would
    fix into the filters). Where the query reads more than one source, a read's filter is
    chosen per batch by the sources without data in it (``_ScanFilters``)."""
    if not any(spark_internals.reads_only_files(empty_inputs[r]) for r in plan.relations()):
        return plan
    finder = _ScanFilters(spark, plan, empty_inputs)
    try:
        filters = finder.filters(frozenset())
    except Exception:  # a query that does not build as a batch: its scans stay as they are
        log.debug("No filters pushed to the scans: the query does not build as a batch", exc_info=True)
        return plan
    if filters is None or not any(filters):
        return plan
    return _filtered(plan, iter(enumerate(filters)), finder if len(finder.relations) > 1 else None)


class _ScanFilters:
    """The filters Spark's engine gives each read of a file source in a batch, by the
    sources without data in it: Spark's engine reads such a source as an empty relation
    (``LocalRelation(output, isStreaming = true)``), and its optimizer makes the
    projections and filters over it empty too (PropagateEmptyRelation) before it infers
    filters across a join from them (InferFiltersFromConstraints): a filter on one side
    of a join that Spark infers for the other side's keys, and pushes into its scan, is
    not there in a batch where the first side's source has no data. Found once per such
    set of sources, when a batch first has it."""

    def __init__(self, spark: SparkSession, plan: PlanNode, empty_inputs: Mapping[StreamingRelation, DataFrame]):
        self.spark, self.plan, self.empty_inputs = spark, plan, empty_inputs
        self.relations = frozenset(plan.relations())
        self._found: dict[frozenset, list[str | None] | None] = {}
        self._conditions: dict[tuple[frozenset, int], object] = {}

    def filters(self, empty: frozenset) -> list[str | None] | None:
        """Each read's filter (SQL text, or None) in a batch where the sources ``empty`` have
        no data; None when the query reads the current time."""
        if empty not in self._found:
            self._found[empty] = self._find(empty)
        return self._found[empty]

    def condition(self, k: int, empty: frozenset):
        """Read ``k``'s filter (a Column, or None) in a batch where ``empty`` have no data."""
        empty = empty & self.relations
        if empty == self.relations:     # (a batch without data: no rows to filter)
            empty = frozenset()
        if (empty, k) not in self._conditions:
            try:
                filters = self.filters(empty)
            except Exception:  # a plan Spark's optimizer does not take so: the filters of a batch with data
                log.debug("No filters found for a batch without data from %s", empty, exc_info=True)
                filters = self._found[frozenset()]
            sql = filters[k] if filters else None
            self._conditions[(empty, k)] = None if sql is None else F.expr(sql)
        return self._conditions[(empty, k)]

    def _find(self, empty: frozenset) -> list[str | None] | None:
        reads: list[_Read] = []
        query = _as_batch_query(self.plan, self.spark, reads, empty)
        if not empty and spark_internals.uses_current_time(query):
            return None
        found = spark_internals.scan_filters(query, [read.df for read in reads])
        filters: list[str | None] = []
        for k, read in enumerate(reads):
            taken, kept = [], []
            parts = found.get(k, [])
            if parts and spark_internals.reads_only_files(self.empty_inputs[read.relation]):
                # (each part read back from its SQL text, over the source's columns; one that
                # does not: the scan goes without it)
                readable = filters_reading_back(self.empty_inputs[read.relation], [text for text, _ in parts])
                for (text, scan_takes), reads_back in zip(parts, readable):
                    if reads_back:
                        (taken if scan_takes else kept).append(f"({text})")
            if kept:     # (the rows Spark's scan returns, and its filter above drops: nothing taken from it)
                taken.append(spark_internals.scan_skips_filter(" AND ".join(kept)))
            filters.append(" AND ".join(taken) or None)
        return filters


@dataclass(eq=False)
class _Read(PlanNode):
    """One place the plan reads a source, as a relation of its own in the batch query."""

    relation: StreamingRelation
    df: DataFrame

    def build(self, inputs):
        return self.df

    def describe(self) -> str:
        return f"Stand-in of {self.relation.describe()}"


def _as_batch_query(node: PlanNode, spark: SparkSession, reads: list[_Read],
                    empty: frozenset = frozenset()) -> DataFrame:
    """The plan as a batch DataFrame Spark's optimizer can push filters through as it does
    through a batch of the stream: each read of a source (in plan order, appended to
    ``reads``) a relation of its own over no files, each watermark a generator of its event
    time (``spark_internals.event_time_barrier``: the parts of a filter that read the event
    time stay above it, as above Spark's EventTimeWatermark), each stateful operator what
    stands for it (``scan_filter_stand_in``: a deduplication a limit, which no filter passes,
    as none passes Spark's streaming Deduplicate). A source of ``empty`` (without data in
    the batch) is read as Spark's engine reads it then, an empty relation of a stream's
    (``spark_internals.stream_without_data``)."""
    def batch_plan(node: PlanNode) -> PlanNode:
        if isinstance(node, StreamingRelation):
            read = node.empty_batch(spark)
            reads.append(_Read(node, spark_internals.stream_without_data(read) if node in empty else read))
            return reads[-1]
        streaming = isinstance(node, Watermark) and bool(empty.intersection(node.relations()))
        node = children_replaced(node, [batch_plan(child) for child in node.children])
        if streaming:
            # (over a stream's relation Spark's own EventTimeWatermark stays, and no empty
            # relation passes it, as none passes it in Spark's engine)
            return Apply(node.child, lambda df, w=node: df.withWatermark(w.event_time, w.delay), "watermark")
        if isinstance(node, Watermark):
            return Apply(node.child, lambda df, column=node.event_time: spark_internals.event_time_barrier(df, column),
                         "watermark")
        return node.scan_filter_stand_in() if node.stateful else node
    return batch_plan(node).build({})


def _filtered(node: PlanNode, filters, finder: _ScanFilters | None) -> PlanNode:
    """``node`` with the next of ``filters`` (its index and SQL text, or None) over each read
    of a source, in the order ``_as_batch_query`` met them; chosen per batch by ``finder``
    where given."""
    if isinstance(node, StreamingRelation):
        k, sql = next(filters)
        if sql is None:
            return node
        choose = None if finder is None else (lambda empty, k=k: finder.condition(k, empty))
        return ScanFilter(node, sql, F.expr(sql), choose)
    return children_replaced(node, [_filtered(child, filters, finder) for child in node.children])
