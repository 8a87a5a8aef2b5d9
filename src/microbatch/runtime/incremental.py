"""IncrementalExecution: the planner of a query run, and the plan of each micro-batch.

Made once per query run, when the checkpoint's confs are fixed (Spark's
IncrementalExecution, which Spark re-creates every batch; here the analysis is done
once and a batch binds its inputs, its batch timestamp and its watermarks):

- **Rewrites, once.** A step that occurs more than once (a stream branched into two paths
  that meet again, as Nexmark's q5 joins counts with their maximum) is copied, so each
  occurrence is an operator of its own with its own state, as in Spark's plan. First, a
  stream-stream outer join Spark's optimizer removes (an aggregation of one side's columns
  by duplicate-agnostic functions: ``operators.join.outer_joins_eliminated``) is that side
  alone, no operator (as in Spark's plan of every batch). A left semi
  join of a union runs once per input of the union where Spark's optimizer pushes it
  through (``operators.join.semi_joins_through_unions``), each join its own operator. In append mode a limit above a stateful operator becomes the
  streaming limit (whose count is state). A stream-stream join's sides get the "not
  null" filters Spark infers for its condition (``operators.join.with_null_filters``). A
  deterministic filter right above ``withWatermark`` that does not use the event time is
  moved below it, as Spark's optimizer pushes it, so the watermark sees only the rows that
  pass (decided on the template, the query over empty inputs); before that, the parts of a
  filter over an aggregation that read only its grouping columns filter its input
  (``operators.aggregate.node.filters_pushed_through_aggregations``). Whether the query reads
  the current time (``current_timestamp()`` and friends, then replaced by the batch
  timestamp recorded in ``offsets/N``) is decided once too.
- **Stateful operators.** Each gets Spark's operator id (top down, in plan order), its
  state location ``<checkpoint>/state/<id>``, its number of state stores (the checkpoint's
  shuffle partitions; one for a global aggregation and for a limit), its accumulator of
  metrics, and its step (``operators/``), which keeps what its batches share.
- **Prepared plans.** Each largest run of stateless steps is a ``PreparedSegment``
  (``runtime.segments``) and each stateful step prepares its Spark steps
  (``operators.base.PreparedStep``): analysed once, bound to each batch's inputs (and a
  stateful step to the batch's task, which carries its state version and watermarks).
- **Watermarks per operator** (Spark 3.4+'s watermark propagation): a watermark node
  gives the query's watermark; a stateful operator gives what it may still emit (a
  stream-stream join: the smallest of its input watermark and each side's state
  watermark; a transformWithState in processing time: none; the others: their input
  watermark); an operator's input is the smallest of its children's. Rows are late
  against the propagation of the previous batch's watermark, state is evicted against
  that of this batch's.
- **A state task's partition** is its Spark task's partition number. Inside a union (a
  stream-stream join's two sides, a union of streams) that number is offset by the
  partitions of the union's inputs before it, so an input whose last stage may run a state
  task ends with an exchange first (``_own_stage``).
- **A batch** (``batch``): the planner walks the plan over the batch's inputs: a prepared
  segment binds its holes, a watermark's rows go to the ``WatermarkTracker`` (which
  observes their event time, or leaves it to the operator above), an ``observe`` gets its
  ``Observation``, and a stateful operator's step builds its part. It returns the batch's
  DataFrame with what to collect once the sink ran (``PlannedBatch``).
- **A plan kept across batches** (``keeps_batch_plan``): a query without state,
  ``observe`` or current time has nothing in its plan that changes from batch to batch but
  its inputs (a watermark's statistics are read from each run's executions, by the name of
  the first batch's ``Observation``); when its sources bind their batches at run time
  (``Source.bound_batch``), the batch runner keeps the batch's DataFrame, which Spark
  planned once, and runs it again.
- **shouldRunAnotherBatch**, per operator, with Spark's rule for each: a watermark below
  it that would move its eviction watermark, and something that evicts (an aggregation
  in append or update mode, a deduplication, a join with a watermarked key or a state
  value watermark; never a limit).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.operators.aggregate.node import filters_pushed_through_aggregations, grouping_set_filters
from microbatch.operators.base import DictSum, OperatorBatch, StatefulStep, committed_partitions, quoted
from microbatch.operators.dedup import dedups_times_pruned
from microbatch.operators.join import (condition_sides_pushed, filters_pushed_into_joins, join_filters_inferred, joins_null_filtered,
                                       joins_times_pruned, outer_joins_eliminated, outer_joins_narrowed,
                                       semi_joins_through_unions)
from microbatch.operators.limit import limits_over_appends
from microbatch.plan.logical import (BatchFilter, NullFilter, Observe, PlanNode, StatefulNode, StaticJoin, StreamingRelation,
                                     Transform, Union, Watermark, children_replaced)
from microbatch.plan.checks import unsupported_operation
from microbatch.runtime.segments import PreparedSegment, hidden_column_not_carried, hidden_columns_carried, segments_prepared
from microbatch.runtime.watermarks import WatermarkTracker
from microbatch.state.store import StateStoreConf

log = logging.getLogger(__name__)

@dataclass(frozen=True, eq=False)
class StatefulOperator:
    """A stateful operator as the planner placed it (Spark's StatefulOperatorStateInfo)."""

    id: int
    node: StatefulNode
    name: str
    state_location: str
    num_state_stores: int
    step: StatefulStep
    metrics: Any                       # the run's accumulator of the operator's metrics (DictSum)



@dataclass
class PlannedBatch:
    """A batch as the planner made it: the DataFrame to hand the sink, and what to collect
    after the sink ran it."""

    batch_id: int
    df: DataFrame = None
    #: watermark -> the Observation of its event-time statistics
    watermark_observations: dict = field(default_factory=dict)
    #: watermark -> (operator id, tag) of the statistics an operator's tasks report
    reported_statistics: dict = field(default_factory=dict)
    #: operator id -> its OperatorBatch (its late-row Observation, if any)
    operators: dict = field(default_factory=dict)
    #: ``observe(name, ...)`` -> its Observation
    user_observations: dict = field(default_factory=dict)


def _each_occurrence_its_own(plan: PlanNode, seen: set[int] | None = None) -> PlanNode:
    """The plan with every step that occurs more than once (a stream branched into two
    paths that meet again: ``counts.join(counts.groupBy(...))``) copied, so that each
    occurrence is an operator of its own, with its own id and state, as in Spark's plan.
    A source read in several places stays one source."""
    seen = set() if seen is None else seen
    if isinstance(plan, StreamingRelation):
        return plan
    node = children_replaced(plan, [_each_occurrence_its_own(c, seen) for c in plan.children])
    if node is plan and id(plan) in seen:
        node = plan.copied()
    seen.add(id(node))
    return node


def _static_joins_null_filtered(plan: PlanNode, empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode:
    """Every join with a static DataFrame with the not-null filters Spark infers on its
    stream side in an inner (or, the stream on the left, semi) join: each column of the
    stream its equalities and comparisons use (a stream-stream join's are its own:
    ``operators.join.joins_null_filtered``)."""
    plan = children_replaced(plan, [_static_joins_null_filtered(c, empty_inputs) for c in plan.children])
    inferred = {"left": ("inner", "semi", "leftsemi", "cross"), "right": ("inner", "cross")}
    if isinstance(plan, StaticJoin) and plan.how.lower().replace("_", "") in inferred[plan.stream_side]:
        try:
            keys, comparisons = spark_internals.join_condition(plan.build(empty_inputs))
        except ValueError:      # (a join on column names, or a condition of other parts: none inferred)
            return plan
        side = 0 if plan.stream_side == "left" else 1
        columns = plan.child.build(empty_inputs).columns
        used = [pair[side] for pair in keys] + [t.index for _, a, b in comparisons for t in (a, b)
                                                if t.side == side and t.index is not None]
        child = plan.child
        for index in dict.fromkeys(used):
            child = NullFilter(child, "where", (F.col(quoted(columns[index])).isNotNull(),), column=columns[index])
        return dataclasses.replace(plan, child=child)
    return plan


def _check_watermarks_not_redefined(plan: PlanNode) -> None:
    """Spark's watermark propagation refuses a ``withWatermark`` whose input already has a
    watermark (one below it, directly or through other operators)."""
    def watermarked(node: PlanNode) -> bool:
        below = [watermarked(c) for c in node.children]
        if isinstance(node, Watermark):
            if any(below):
                raise unsupported_operation(
                    "Redefining watermark is disallowed. You can set the config "
                    "'spark.sql.streaming.statefulOperator.allowMultiple' to 'false' to restore the previous "
                    "behavior. Note that multiple stateful operators will be disallowed.")
            return True
        if node.stateful and not node.output_marks_event_time():
            return False    # (its output carries no watermark in Spark)
        return any(below)
    watermarked(plan)


#: Where a batch's version goes in the printed plan.
_VERSION = "\x00version\x00"


ALWAYS_NULLABLE_OUTPUT = "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled"


class IncrementalExecution:
    """Plans the batches of one query run; made once per run, used for every batch."""

    def __init__(self, spark: SparkSession, plan: PlanNode, *, checkpoint_root: str,
                 shuffle_partitions: int, output_mode: str,
                 empty_inputs: Mapping[StreamingRelation, DataFrame],
                 store_conf: StateStoreConf | None = None,
                 hidden_carriers: Mapping[StreamingRelation, Any] | None = None):
        """``hidden_carriers``: the sources whose batches do not expose their hidden
        columns, by relation (``Source.carry_hidden_columns``)."""
        self.spark = spark
        self.output_mode = output_mode
        #: each source's batch without data (what a batch's inputs hold for a source without data)
        self.empty_inputs = empty_inputs
        self.shuffle_partitions = shuffle_partitions
        self.store_conf = store_conf or StateStoreConf()
        #: Spark 4.3 makes a stateful operator's output nullable (as the checkpoint fixed it)
        self.nullable_output = (spark_internals.records_conf(ALWAYS_NULLABLE_OUTPUT)
                                and spark.conf.get(ALWAYS_NULLABLE_OUTPUT, "true").lower() == "true")
        plan = _each_occurrence_its_own(outer_joins_narrowed(outer_joins_eliminated(plan, empty_inputs), empty_inputs))
        plan = condition_sides_pushed(plan)
        plan = filters_pushed_through_aggregations(plan, empty_inputs)
        if output_mode == "append":
            plan = limits_over_appends(plan)
        plan = filters_pushed_into_joins(plan, empty_inputs)
        # (the join's other side is then read by each of its copies: each its own operators)
        plan = _each_occurrence_its_own(semi_joins_through_unions(plan, empty_inputs))
        plan = join_filters_inferred(plan, empty_inputs)
        plan = _static_joins_null_filtered(joins_null_filtered(plan), empty_inputs)
        plan = grouping_set_filters(self._push_filters_below_watermarks(plan, empty_inputs), empty_inputs)
        plan = dedups_times_pruned(joins_times_pruned(plan, empty_inputs), empty_inputs)
        # (Spark's refusals of the plan's shape come before any analysis of its steps: the
        # planner's, then the watermark propagation's)
        for node in plan.nodes():
            refusal = node.planning_refusal() if node.stateful else None
            if refusal is not None:
                raise refusal
        if spark.conf.get("spark.sql.streaming.statefulOperator.allowMultiple", "true").lower() == "true":
            _check_watermarks_not_redefined(plan)
        self.plan = segments_prepared(hidden_columns_carried(plan, empty_inputs, spark, hidden_carriers or {}))
        nodes = list(self.plan.nodes())
        stateful = [n for n in nodes if n.stateful]
        # (current_timestamp() anywhere: in the template, and below the operators it hides)
        templates = [self.plan] + [c for n in stateful if n.template_hides_input for c in n.children]
        self.needs_batch_time = any(spark_internals.uses_current_time(t.build(empty_inputs)) for t in templates)
        state_root = f"{checkpoint_root}/state"
        self.operators = []
        for i, node in enumerate(stateful):
            step = node.make_step(i, state_root, shuffle_partitions)
            self.operators.append(StatefulOperator(i, node, step.name, f"{state_root}/{i}",
                                                   node.state_partitions(shuffle_partitions), step,
                                                   spark_internals.operator_accumulator(spark, DictSum())))
        self.operator = {op.node: op for op in self.operators}
        self.watermark_nodes = [n for n in nodes if isinstance(n, Watermark)]
        self.watermark_ids = {node: i for i, node in enumerate(self.watermark_nodes)}
        #: nothing in a batch's DataFrame but its inputs changes from batch to batch (a
        #: watermark's event-time statistics are read from each run's executed plan)
        self.keeps_batch_plan = not (self.operators or self.needs_batch_time
                                     or any(isinstance(n, Observe) for n in nodes))
        self._explained: tuple[str, str] | None = None    # (run id, the plan's tree)

    # -- rewrites, once per run ------------------------------------------------
    def _push_filters_below_watermarks(self, plan: PlanNode,
                                       empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode:
        """A filter above ``withWatermark(t)`` (directly, or through projections that pass
        the columns it uses through unchanged, or through deterministic filters, which
        Spark's optimizer combines with it) runs below it when Spark's optimizer would
        push it there: deterministic and not using ``t``; of a conjunction, the parts that
        are. (Spark also pushes through renames and computed columns by substituting them;
        such a filter stays above here.)"""
        children = [self._push_filters_below_watermarks(c, empty_inputs) for c in plan.children]
        plan = children_replaced(plan, children)
        if isinstance(plan, Transform) and plan.method in ("filter", "where"):
            return self._sink_filter(plan, empty_inputs) or plan
        return plan

    def _sink_filter(self, filtered: Transform,
                     empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode | None:
        """``filtered`` moved below the watermark under it, or None if it cannot move."""
        under = filtered.child
        while isinstance(under, Transform) and under.method != "limit":
            under = under.child
        if not isinstance(under, Watermark):   # (no watermark under the steps: nothing to try, no analysis)
            return None
        below = filtered.child
        moved = dataclasses.replace(filtered, child=below.child) if len(below.children) == 1 else None
        if isinstance(below, Watermark):
            if spark_internals.filter_can_skip_column(moved.build(empty_inputs), below.event_time):
                log.debug("Filter %s runs below the watermark on %s", filtered.describe(), below.event_time)
                return dataclasses.replace(below, child=moved)
            return self._split_filter(filtered, below, empty_inputs)
        if isinstance(below, Transform) and below.method == "alias":
            try:    # (a filter that names the alias's qualifier resolves only above it)
                moved.build(empty_inputs)
            except Exception:  # noqa: BLE001 - Spark's analysis error: it stays above
                return None
            sunk = self._sink_filter(moved, empty_inputs)
            return None if sunk is None else dataclasses.replace(below, child=sunk)
        if isinstance(below, Transform) and below.method != "limit" and (
                spark_internals.filter_passes_filter(filtered.build(empty_inputs))
                if below.method in ("filter", "where")
                else spark_internals.filter_passes_projection(filtered.build(empty_inputs))):
            if filtered.positions and below.method not in ("filter", "where"):
                # (a Column bound to the projection's output, ``df["v"]``, is bound below it
                # to the same column's place in the projection's input: seed 5176)
                positions = spark_internals.positions_below_projection(below.build(empty_inputs), filtered.positions)
                if positions is None:
                    return None
                moved = dataclasses.replace(moved, positions=positions)
            sunk = self._sink_filter(moved, empty_inputs)
            return None if sunk is None else dataclasses.replace(below, child=sunk)
        return None

    def _split_filter(self, filtered: Transform, below: Watermark,
                      empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode | None:
        """A conjunction of which only some parts use the event time: the others run below
        the watermark, as Spark's optimizer splits it (each part re-read from its SQL text;
        if any part does not read back, e.g. a Python UDF, the filter stays whole)."""
        from pyspark.sql import functions as F
        parts = spark_internals.conjuncts_without_column(filtered.build(empty_inputs), below.event_time)
        if parts is None or not parts[0] or not parts[1]:
            return None
        pushed, kept = (" AND ".join(f"({p})" for p in group) for group in parts)
        try:
            split = Transform(dataclasses.replace(below, child=Transform(below.child, "where", (F.expr(pushed),))),
                              "where", (F.expr(kept),))
            split.build(empty_inputs)
        except Exception:  # a part whose SQL text does not read back: keep it whole
            log.debug("Filter %s stays whole above the watermark", filtered.describe(), exc_info=True)
            return None
        log.debug("Filter %s: %s runs below the watermark on %s", filtered.describe(), pushed, below.event_time)
        return split

    # -- per batch -------------------------------------------------------------
    def batch(self, inputs: Mapping[StreamingRelation, DataFrame], batch_id: int, batch_timestamp_ms: int,
              watermarks: WatermarkTracker) -> PlannedBatch:
        """Batch ``batch_id`` over its inputs (a DataFrame per relation): its DataFrame and
        what to collect after the sink ran it. ``watermarks``: the query's, with the one the
        batch runs with (``running_ms``) and each operator's from it."""
        planned = PlannedBatch(batch_id)
        operator_watermarks = watermarks.operator_watermarks()
        for op in self.operators:
            op.metrics.value = {}
        # (the sources without data: Spark's engine reads each as an empty relation, which
        # changes the filters its optimizer infers, ``ScanFilter``, ``BatchFilter``)
        empty = frozenset(r for r, df in inputs.items() if df is self.empty_inputs.get(r))

        def build(node: PlanNode) -> DataFrame:
            if isinstance(node, StreamingRelation):
                return inputs[node]
            if isinstance(node, BatchFilter):    # (a scan filter is in its prepared segment)
                return node.for_batch(build(node.child), empty)
            if isinstance(node, PreparedSegment):
                built = [build(hole) for hole in node.holes]
                if any(isinstance(n, Union) for n in node.template.nodes()):
                    built = [self._own_stage(hole, df) for hole, df in zip(node.holes, built)]
                return node.bind(built, empty)
            if isinstance(node, Watermark):
                return watermarks.observe(node, build(node.child), batch_id, planned.watermark_observations)
            if isinstance(node, Observe):
                observation = Observation(node.name)
                planned.user_observations[node.name] = observation
                return build(node.child).observe(observation, *node.exprs)
            if node.stateful:
                op = self.operator[node]
                built = [build(child) for child in node.children]
                if len(built) > 1:   # (a join: its sides meet in one stage, unioned)
                    built = [self._own_stage(child, df) for child, df in zip(node.children, built)]
                marks = operator_watermarks[node]
                given = OperatorBatch(batch_id, batch_timestamp_ms, marks.late_ms, marks.eviction_ms,
                                      self.output_mode, self.store_conf, op.metrics,
                                      statistics_of=watermarks.statistics_of(node, planned.watermark_observations),
                                      nullable_output=self.nullable_output)
                try:
                    df = op.step.build(built, given)
                except AnalysisException as e:    # (its expressions read what no step carried up)
                    refused = hidden_column_not_carried(e)
                    if refused is e:
                        raise
                    raise refused from e
                planned.operators[op.id] = given
                planned.reported_statistics.update((w, (op.id, tag)) for w, tag in given.reported.items())
                return df
            return node.build(inputs)   # (every other step is in a prepared segment)

        df = build(self.plan)
        if self.needs_batch_time:
            log.info("Current batch timestamp = %d", batch_timestamp_ms)
            df = spark_internals.with_batch_timestamp(self.spark, df, batch_timestamp_ms)
        planned.df = df
        return planned

    def _own_stage(self, node: PlanNode, df: DataFrame) -> DataFrame:
        """``df`` (built from ``node``) ended by an exchange when a stateful operator's tasks
        may run in its last stage: a state task knows its partition by the Spark task's
        partition number, which inside a union (a join's two sides, a union of streams) is
        offset by the partitions of the union's inputs before it."""
        if any(n.stateful for n in node.nodes()):
            return df.repartition(self.shuffle_partitions)
        return df

    def operator_metrics(self, op: StatefulOperator, late_rows: dict | None = None) -> dict:
        """An operator's metrics from its tasks, plus rows dropped in Spark before it
        (``late_rows``: what its late-row Observation counted)."""
        metrics = dict(op.metrics.value)
        if late_rows:
            metrics["numRowsDroppedByWatermark"] = metrics.get("numRowsDroppedByWatermark", 0) \
                + int(late_rows.get("late") or 0)
        return metrics

    def every_partition_committed(self) -> bool:
        """Whether every operator's every state partition committed this batch's version."""
        return all(committed_partitions(op.metrics.value) == set(range(op.num_state_stores))
                   for op in self.operators)

    def reset_metrics(self) -> None:
        for op in self.operators:
            op.metrics.value = {}

    def explain_string(self, run_id: str, batch_id: int) -> str:
        """The plan, each stateful operator with its state info as Spark prints it. The
        tree is printed once per run (a step's Columns print through a call into Spark, and the progress
        log writes the plan with every batch); a batch puts in its version."""
        if self._explained is None or self._explained[0] != run_id:
            def state_info(node: PlanNode) -> str:
                op = self.operator.get(node)
                if op is None:
                    return ""
                return (f", state info [ checkpoint = {op.state_location.rsplit('/', 1)[0]}, "
                        f"runId = {run_id}, opId = {op.id}, ver = {_VERSION}, "
                        f"numPartitions = {op.num_state_stores}]")
            self._explained = (run_id, self.plan.tree_string(annotate=state_info))
        return self._explained[1].replace(_VERSION, str(max(batch_id, 0)))
