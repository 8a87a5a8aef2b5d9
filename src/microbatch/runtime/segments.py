"""Prepared segments: the stateless steps of a query, analysed by Spark once per run and
bound to each batch's inputs (Spark's binding of a batch into its analysed query).

Each largest run of stateless steps (select, filter, withColumn, unions, static joins,
mapInPandas, ...) becomes a ``PreparedSegment``. Its children (``holes``) are what the
segment reads, in the template's order: sources, watermarks, observations and stateful
operators, each built per batch. The segment is analysed over one empty placeholder per
hole the first time it is bound, and again only if a hole's columns change; every batch
after that replaces the placeholders in the analysed plan by the batch's plans
(``spark_internals.BindablePlan``) instead of replaying the steps through PySpark, each of
which Spark analyses: a batch makes as many DataFrames for a query of 40 steps as for one
of 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame

from microbatch import spark_internals
from microbatch.plan.logical import (Apply, PlanNode, ScanFilter, StaticJoin, StreamingRelation, Transform, Union,
                                     Watermark, children_replaced)


#: The steps a prepared segment is made of: stateless, and the same in every batch.
SEGMENT_STEPS = (Transform, Apply, Union, StaticJoin)


@dataclass(eq=False)
class Placeholder(PlanNode):
    """A leaf standing for a segment's input while the segment is analysed."""

    df: DataFrame

    def build(self, inputs):
        return self.df

    def describe(self) -> str:
        return "Placeholder"


@dataclass(eq=False)
class PreparedSegment(PlanNode):
    """Stateless steps of the user's query (``template``) over ``holes``, analysed once per
    run and bound to each batch's inputs."""

    template: PlanNode
    holes: tuple[PlanNode, ...]
    _prepared: dict = field(default_factory=dict, repr=False)
    _columns_keys: spark_internals.ColumnsKeys = field(default_factory=spark_internals.ColumnsKeys,
                                                       repr=False)
    analyses: int = 0          # how often the steps were analysed (one per run, normally)

    @property
    def children(self):
        return self.holes

    def nodes(self):
        yield self
        yield from self.template.nodes()

    def build(self, inputs):
        return self.bind([hole.build(inputs) for hole in self.holes])

    def bind(self, built: list[DataFrame]) -> DataFrame:
        """The segment over its holes' DataFrames of a batch."""
        if built and not spark_internals.binds_plans(built[0]):   # Spark Connect: rebuilt, no RPC
            remaining = iter(built)

            def over(node: PlanNode) -> PlanNode:
                if isinstance(node, SEGMENT_STEPS):
                    return children_replaced(node, [over(c) for c in node.children])
                return Placeholder(next(remaining))
            return over(self.template).build({})
        given = [spark_internals.BatchInput(df) for df in built]
        key = self._columns_keys.key(given)
        if key not in self._prepared:
            self._prepared[key] = self._prepare([g.df for g in given])
        return self._prepared[key].bind(given)

    def _prepare(self, built: list[DataFrame]) -> spark_internals.BindablePlan:
        """The steps analysed over empty placeholders with the columns of ``built``: a
        source read directly (or under its watermark, which a batch's plan does not show)
        stands as its own empty batch, so its hidden columns (``_metadata``) resolve (under
        the filter Spark's engine gives its scan too, ``ScanFilter``)."""
        empties = []
        for hole, df in zip(self.holes, built):
            source = hole
            while isinstance(source, (Watermark, ScanFilter)):
                source = source.child
            empty = source.empty_batch(df.sparkSession) if isinstance(source, StreamingRelation) else None
            if empty is None or empty.schema != df.schema:
                # (with the columns' qualifiers: a stream-stream join's ``l.id`` and ``r.id``)
                empty = spark_internals.requalified(spark_internals.empty_dataframe(df.sparkSession, df.schema),
                                                    spark_internals.output_qualifiers(df))
            empties.append(empty)
        remaining = iter(empties)

        def over_placeholders(node: PlanNode) -> PlanNode:
            if isinstance(node, SEGMENT_STEPS):
                return children_replaced(node, [over_placeholders(c) for c in node.children])
            return Placeholder(next(remaining))

        self.analyses += 1
        try:
            analyzed = spark_internals.analyzed_plan(over_placeholders(self.template).build({}))
        except AnalysisException as e:
            if "_metadata" not in str(e):
                raise
            raise AnalysisException(
                "The file source's hidden column _metadata is read here after a withWatermark "
                "that follows other steps, or after a stateful step: microbatch exposes it only "
                "up to the source's own withWatermark. Select it right after the source, "
                "e.g. readStream...load().select('*', '_metadata'), and use that column "
                f"afterwards. ({e})") from e
        return spark_internals.BindablePlan(analyzed, [spark_internals.analyzed_plan(df) for df in empties])

    def describe(self) -> str:
        return self.template.describe()

    def under_null_filters(self, column: str) -> PlanNode:
        """The hole right under the template's null filters on ``column``, if the template
        is only those; else the segment itself."""
        inner = self.template.under_null_filters(column)
        return inner if inner is not self.template and any(inner is hole for hole in self.holes) else self

    def tree_string(self, indent: int = 0, annotate=None) -> str:
        return self.template.tree_string(indent, annotate)


def segments_prepared(node: PlanNode) -> PlanNode:
    """``node`` with each largest run of stateless steps (at least one) made a
    ``PreparedSegment``."""
    if not isinstance(node, SEGMENT_STEPS):
        return children_replaced(node, [segments_prepared(c) for c in node.children])
    holes: list[PlanNode] = []

    def over_holes(step: PlanNode) -> PlanNode:
        if isinstance(step, SEGMENT_STEPS):
            return children_replaced(step, [over_holes(c) for c in step.children])
        hole = segments_prepared(step)
        holes.append(hole)
        return hole

    template = over_holes(node)
    return PreparedSegment(template, tuple(holes))
