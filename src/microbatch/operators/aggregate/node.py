"""A streaming aggregation's plan node: what it groups and computes, and its policy."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from microbatch.operators.aggregate.spec import PANDAS_UDAF
from microbatch.operators.aggregate.step import AggregateStep
from microbatch import spark_internals
from microbatch.plan.checks import output_mode_error, unsupported_operation
from microbatch.plan.logical import PlanNode, StatefulNode, Transform, children_replaced, rebound, stood_in

log = logging.getLogger(__name__)

#: Spark's conf of the aggregation's state layout (format 2 since Spark 2.3: the one read and written)
AGGREGATION_FORMAT_CONF = "spark.sql.streaming.aggregation.stateFormatVersion"


@dataclass(eq=False)
class Aggregate(StatefulNode):
    """``groupBy(keys).agg(...)``: per key, the aggregates of every row seen so far,
    emitted by the output mode's rule (``operators.aggregate.task``)."""

    child: PlanNode
    keys: tuple                               # the user's grouping columns
    apply: Callable[[Any], DataFrame]         # GroupedData -> the batch query (for templates)
    spec: Any                                 # operators.aggregate.spec.AggregateSpec
    event_time_key: int | None = None         # the grouping key that carries event time
    event_time_is_window: bool = False        # a window or session: its end is the time
    session_index: int | None = None          # the session_window key, if any
    session_time_column: str | None = None    # session_window(column, gap)
    grouping: Any = None                      # operators.aggregate.spec.Grouping: groupBy, rollup, ...
    positions: dict = field(default_factory=dict)   # (Transform's: of the keys' and aggregates' Columns)
    #: over grouping sets: the filter Spark's optimizer runs on the expanded rows before the
    #: aggregation (a Column over the keys, the grouping id among them), set by the planner
    key_filter: Any = None

    def grouped(self, df: DataFrame):
        """``df`` grouped by the keys as the user grouped them (PySpark's GroupedData)."""
        keys = rebound(self.keys, [(df, self.positions)])
        return df.groupBy(*keys) if self.grouping is None else self.grouping.of(df, keys)

    def watermark_column(self) -> str | None:
        return None if self.event_time_key is None else self.spec.key_names[self.event_time_key]

    # -- its policy (plan.logical.StatefulNode) ----------------------------------------------
    aggregation = True

    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> AggregateStep:
        return AggregateStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        """One store for a global aggregation (a session window without other keys too)."""
        return 1 if len(self.spec.key_names) == (self.session_index is not None) else shuffle_partitions

    def output_watermark_ms(self, input_ms: int) -> int | None:
        return input_ms

    def evicts_with(self, output_mode: str) -> bool:
        return output_mode in ("append", "update")

    def runs_every_batch(self) -> bool:
        return False

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        """The watermark below, through steps that may only project: every row reaches the
        partial aggregation (not a session window's, which drops late rows before it, nor
        grouping sets', which count a row once per set)."""
        if self.session_index is not None or (self.grouping is not None and self.grouping.has_sets):
            return {}
        below = watermark_below(self.child)
        return {} if below is None else {0: below}

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        if mode == "update" and aggregations and aggregations[0] is self and self.session_index is not None:
            return output_mode_error("update", "session window streaming aggregations")   # (Spark: the top one)
        if mode == "append" and self.event_time_key is None:
            return output_mode_error("append", "streaming aggregations without watermark")
        if any(call.function == PANDAS_UDAF for call in self.spec.calls):
            # Spark's StatefulAggregationStrategy, as it plans the first batch
            # (QueryCompilationErrors.groupAggPandasUDFUnsupportedByStreamingAggError)
            return spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_3067")
        return None

    def affected_by_late_rows(self) -> bool:
        return True

    def connect_refusal(self, output_mode: str) -> str | None:
        if self.grouping is not None and self.grouping.has_sets:   # (its expansion is read from Spark's plan)
            return f"An aggregation by {self.grouping.kind}"
        return None

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        if recorded_conf.get(AGGREGATION_FORMAT_CONF, "2") != "2":
            return (f"its aggregation state has format version {recorded_conf[AGGREGATION_FORMAT_CONF]} "
                    f"({AGGREGATION_FORMAT_CONF}); only version 2 (Spark 2.3 and later) is read")
        return None

    def planning_refusal(self) -> Exception | None:
        if self.session_index is not None and len(self.spec.key_names) == 1:
            return unsupported_operation("Global aggregation with session window in streaming query is not supported.")
        return None

    def build(self, inputs):
        df = self.child.build(inputs)
        return self.built_over((df,), lambda: self.apply(self.grouped(df),
                                                         lambda values: rebound(values, [(df, self.positions)])))

    def describe(self) -> str:
        outputs = ", ".join(name for name, _ in self.spec.outputs)
        kind = "" if self.grouping is None or not self.grouping.has_sets else f" ({self.grouping.kind})"
        return f"Aggregate{kind} [{', '.join(self.spec.key_names)}], [{outputs}]"


def grouping_set_filters(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run: each aggregation over grouping sets with
    the filter Spark's optimizer runs between its expansion and its aggregation (``spark_internals.grouping_set_filters``), read from the
    query's template: a filter above on its keys, such as the ``isnotnull`` of a time window
    over its window (a cube's rows with a null window never reach its state in Spark). The
    template is built with the stand-ins of the other stateful nodes (``stood_in``): a
    ``dropDuplicatesWithinWatermark`` does not build as a batch, and a deduplication
    would let a filter above it through as Spark's streaming one does not."""
    sets = [n for n in plan.nodes() if isinstance(n, Aggregate) and n.grouping is not None and n.grouping.has_sets]
    if not sets:
        return plan
    try:
        filters = spark_internals.grouping_set_filters(stood_in(plan).build(empty_inputs),
                                                       [n.spec.key_names for n in sets])
    except Exception:  # a plan Spark's optimizer refuses here: no filter moves
        log.debug("No filters read for the grouping sets of %s", plan.describe(), exc_info=True)
        return plan
    found = {n: f for n, f in zip(sets, filters or ()) if f is not None}

    def with_filters(node: PlanNode) -> PlanNode:
        replaced = children_replaced(node, [with_filters(c) for c in node.children])
        return dataclasses.replace(replaced, key_filter=found[node]) if node in found else replaced
    return with_filters(plan) if found else plan


def filters_pushed_through_aggregations(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run, first: each filter over an aggregation
    (right over it, or over filters and projections that pass the columns it reads through
    unchanged, as Spark's optimizer combines and pushes them) with the parts Spark's
    optimizer pushes through the aggregation (PushPredicateThroughNonJoin,
    ``spark_internals.conjuncts_through_aggregation``: deterministic, reading only its
    grouping columns) filtering the aggregation's input instead, so the rows they reject
    never reach its state, as in Spark's engine: ``where("k IS NOT NULL")`` over
    ``groupBy("k")`` keeps no null key. From there the planner's other rewrites move it on
    (below a watermark) where Spark's optimizer would; a deduplication under the
    aggregation stops it, as Spark's streaming Deduplicate does. A filter of which only
    some parts go down stays whole above too (the parts that went down pass there again).
    Not through grouping sets (``grouping_set_filters``), nor a part that reads a grouping
    column the aggregation computes (a session window, which the aggregation makes here; a
    time window: its text does not read back over the input)."""
    plan = children_replaced(plan, [filters_pushed_through_aggregations(c, empty_inputs) for c in plan.children])
    if isinstance(plan, Transform) and plan.method in ("filter", "where") and _over_aggregation(plan):
        return _through_aggregation(plan, empty_inputs) or plan
    return plan


def _over_aggregation(filtered: Transform) -> bool:
    """Whether an aggregation is under ``filtered`` through stateless steps (no analysis)."""
    under = filtered.child
    while isinstance(under, Transform) and under.method != "limit":
        under = under.child
    return isinstance(under, Aggregate)


def _through_aggregation(filtered: Transform, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode | None:
    """``filtered``'s plan with the parts of it Spark's optimizer pushes through the
    aggregation under it below that aggregation, or None if none goes."""
    below = filtered.child
    if isinstance(below, Aggregate):
        return _pushed_into(filtered, below, empty_inputs)
    if filtered.positions or not isinstance(below, Transform) or below.method in ("limit", "alias"):
        return None   # (a Column bound to the child's positions stays where it was bound)
    try:
        template = stood_in(filtered).build(empty_inputs)
        passes = (spark_internals.filter_passes_filter(template) if below.method in ("filter", "where")
                  else spark_internals.filter_passes_projection(template))
    except Exception:  # Spark's analysis refuses it here: it stays
        log.debug("Filter %s stays above %s", filtered.describe(), below.describe(), exc_info=True)
        return None
    if not passes:
        return None
    sunk = _through_aggregation(dataclasses.replace(filtered, child=below.child), empty_inputs)
    return None if sunk is None else dataclasses.replace(below, child=sunk)


def _reads_back(child: PlanNode, condition: str, empty_inputs: Mapping[Any, DataFrame]) -> bool:
    try:
        stood_in(Transform(child, "where", (F.expr(condition),))).build(empty_inputs)
    except Exception:  # noqa: BLE001 - Spark's analysis refuses it over the input
        return False
    return True


def _pushed_into(filtered: Transform, aggregate: Aggregate, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode | None:
    if aggregate.grouping is not None and aggregate.grouping.has_sets:
        return None
    try:
        parts = spark_internals.conjuncts_through_aggregation(stood_in(filtered).build(empty_inputs))
        if not parts or not parts[0]:
            return None
        pushed, kept = parts
        if aggregate.session_index is not None:
            # (its session window is a column the aggregation makes here: a part reading it
            # does not read back over the input, and stays above with the whole filter)
            reads_input = [p for p in pushed if _reads_back(aggregate.child, p, empty_inputs)]
            kept = kept + [p for p in pushed if p not in reads_input]
            pushed = reads_input
            if not pushed:
                return None
        condition = F.expr(" AND ".join(f"({p})" for p in pushed))
        moved = dataclasses.replace(aggregate, child=Transform(aggregate.child, "where", (condition,)))
        stood_in(moved).build(empty_inputs)   # (a part whose text does not read back over the input stays)
    except Exception:  # Spark's analysis refuses it: the filter stays whole above
        log.debug("Filter %s stays above %s", filtered.describe(), aggregate.describe(), exc_info=True)
        return None
    log.debug("Filter %s: %s runs below %s", filtered.describe(), " AND ".join(pushed), aggregate.describe())
    return dataclasses.replace(filtered, child=moved) if kept else moved
