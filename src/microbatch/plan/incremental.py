"""IncrementalExecution: the planner of a query run, and the plan of each micro-batch.

Made once per query run, when the checkpoint's confs are fixed (Spark's
IncrementalExecution, which Spark re-creates every batch; here the analysis is done
once and a batch binds its inputs, its batch timestamp and its watermarks):

- **Rewrites, once.** In append mode a limit above a stateful operator becomes the
  streaming limit (whose count is state). A deterministic filter right above ``withWatermark`` that does not
  use the event time is moved below it, as Spark's optimizer pushes it, so the watermark
  sees only the rows that pass (decided on the template, the query over empty inputs).
  Whether the query reads the current time (``current_timestamp()`` and friends, then
  replaced by the batch timestamp recorded in ``offsets/N``) is decided once too.
- **Stateful operators.** Each gets Spark's operator id (top down, in plan order), its
  state location ``<checkpoint>/state/<id>`` and its number of state stores (the
  checkpoint's shuffle partitions; one for a global aggregation and for a limit).
- **Prepared plans.** Each largest run of stateless steps is a ``PreparedSegment`` and
  each stateful step a ``PreparedStep``: analysed once, bound to each batch's inputs (and
  a stateful step to the batch's task, which carries its state version and watermarks).
- **Watermarks per operator** (Spark 3.4+'s watermark propagation): a watermark node
  gives the query's watermark; a stateful operator gives what it may still emit (a
  stream-stream join: the smallest of its input watermark and each side's state
  watermark; the others: their input watermark); an operator's input is the smallest of
  its children's. Rows are late against the propagation of the previous batch's
  watermark, state is evicted against that of this batch's.
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

from pyspark.sql import DataFrame, SparkSession

from microbatch import spark_internals
from microbatch.plan.logical import (Aggregate, Apply, Deduplicate, FlatMapGroupsWithState, PlanNode,
                                     StatefulNode, StaticJoin, StreamingLimit, StreamingRelation,
                                     StreamJoin, Transform, TransformWithState, Union, Watermark)

log = logging.getLogger(__name__)


def operator_name(node: StatefulNode) -> str:
    """The operator's name in progress and in its state schema file, as Spark names it."""
    if isinstance(node, Deduplicate):
        return "dedupeWithinWatermark" if node.within_watermark else "dedupe"
    if isinstance(node, Aggregate):
        return "stateStoreSave" if node.session_index is None else "sessionWindowStateStoreSaveExec"
    if isinstance(node, StreamingLimit):
        return "globalLimit"
    if isinstance(node, StreamJoin):
        return "symmetricHashJoin"
    if isinstance(node, FlatMapGroupsWithState):
        return "applyInPandasWithState"
    if isinstance(node, TransformWithState):
        return "transformWithStateInPySparkExec" if node.rows_api else "transformWithStateInPandasExec"
    return type(node).__name__


def state_partitions(node: StatefulNode, shuffle_partitions: int) -> int:
    """State partitions of an operator: a global aggregation (or a session window without
    other keys) and a limit have one; the others the checkpoint's shuffle partitions."""
    if isinstance(node, Aggregate) and len(node.spec.key_names) == (node.session_index is not None):
        return 1
    if isinstance(node, StreamingLimit):
        return 1
    return shuffle_partitions


@dataclass(frozen=True, eq=False)
class StatefulOperator:
    """A stateful operator as the planner placed it (Spark's StatefulOperatorStateInfo)."""

    id: int
    node: StatefulNode
    name: str
    state_location: str
    num_state_stores: int

    def evicts_with(self, output_mode: str) -> bool:
        """Whether the operator evicts state when its watermark moves (Spark's
        shouldRunAnotherBatch of the operator, given a watermark below it)."""
        node = self.node
        if isinstance(node, Aggregate):
            return output_mode in ("append", "update")
        if isinstance(node, StreamJoin):
            return node.evicts()
        if isinstance(node, FlatMapGroupsWithState):
            return node.timeout == "EventTimeTimeout"
        if isinstance(node, TransformWithState):
            return node.time_mode == "eventtime"
        return isinstance(node, Deduplicate)


@dataclass(frozen=True)
class OperatorWatermarks:
    """The watermarks an operator uses in a batch, in ms: rows at or before ``late_ms``
    are dropped as late, state at or before ``eviction_ms`` is evicted."""

    late_ms: int
    eviction_ms: int


def _children_replaced(node: PlanNode, children: list[PlanNode]) -> PlanNode:
    if list(node.children) == children:
        return node
    if len(children) == 2:
        changes = {"left": children[0], "right": children[1]}
        if isinstance(node, StreamJoin):
            changes["_inputs"] = {}
        return dataclasses.replace(node, **changes)
    return dataclasses.replace(node, child=children[0])


def _limits_over_appends(plan: PlanNode) -> PlanNode:
    """In append mode a stateful operator's output is appends too, so a ``limit(n)`` above
    one (written as a plain limit, which is what it is in complete mode) is Spark's
    streaming limit, with its count in state."""
    plan = _children_replaced(plan, [_limits_over_appends(c) for c in plan.children])
    if isinstance(plan, Transform) and plan.method == "limit" \
            and any(isinstance(n, StatefulNode) for n in plan.child.nodes()):
        return StreamingLimit(plan.child, plan.args[0] if plan.args else plan.kwargs["num"])
    return plan


#: The steps a prepared segment is made of: stateless, and the same in every batch.
_SEGMENT_STEPS = (Transform, Apply, Union, StaticJoin)


@dataclass(eq=False)
class Placeholder(PlanNode):
    """A leaf standing for a segment's input while the segment is analysed."""

    df: DataFrame

    def build(self, inputs, ctx=None):
        return self.df

    def describe(self) -> str:
        return "Placeholder"


@dataclass(eq=False)
class PreparedSegment(PlanNode):
    """Stateless steps of the user's query (``template``), analysed by Spark once per run
    and bound to each batch's inputs (Spark's binding of a batch into the analysed query).

    Its children (``holes``) are what the segment reads, in the template's order: sources,
    watermarks, observations and stateful operators, each built per batch. The segment is
    analysed over one empty placeholder per hole the first time it is built, and again
    only if a hole's columns change; every build after that replaces the placeholders in
    the analysed plan by the batch's plans (``spark_internals.BindablePlan``)
    instead of replaying the steps through PySpark, each of which Spark analyses."""

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

    def build(self, inputs, ctx=None):
        built = [spark_internals.BatchInput(hole.build(inputs, ctx)) for hole in self.holes]
        key = self._columns_keys.key(built)
        if key not in self._prepared:
            self._prepared[key] = self._prepare([given.df for given in built])
        return self._prepared[key].bind(built)

    def _prepare(self, built: list[DataFrame]) -> spark_internals.BindablePlan:
        """The steps analysed over empty placeholders with the columns of ``built``."""
        empties = [spark_internals.empty_dataframe(df.sparkSession, df.schema) for df in built]
        remaining = iter(empties)

        def over_placeholders(node: PlanNode) -> PlanNode:
            if isinstance(node, _SEGMENT_STEPS):
                return _children_replaced(node, [over_placeholders(c) for c in node.children])
            return Placeholder(next(remaining))

        self.analyses += 1
        analyzed = spark_internals.analyzed_plan(over_placeholders(self.template).build({}))
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


class PreparedStep:
    """A stateful step of the query (its Spark steps around the Python task that runs the
    step on the state store), analysed by Spark once per run and bound to each batch's
    inputs and task (Spark's IncrementalExecution giving each batch's stateful operators
    their state version and watermarks in an otherwise unchanged plan).

    ``build(inputs, task)`` makes the step's DataFrame over ``inputs`` and returns it with
    the reference of the task's Python function in it (``spark_internals.PythonFunctionRef``).
    It is called once, over an empty placeholder per input; a batch then binds its inputs
    and its own task (``bind``): one DataFrame a batch instead of one per Spark step."""

    def __init__(self, inputs: list[DataFrame], task: Any, build):
        empties = [spark_internals.empty_dataframe(df.sparkSession, df.schema) for df in inputs]
        step, function = build(empties, task)
        self.plan = spark_internals.BindablePlan(spark_internals.analyzed_plan(step),
                                                 [spark_internals.analyzed_plan(df) for df in empties],
                                                 {"task": function})

    def bind(self, inputs: list[spark_internals.BatchInput], task: Any) -> DataFrame:
        return self.plan.bind(inputs, {"task": task})


def _segments_prepared(node: PlanNode) -> PlanNode:
    """``node`` with each largest run of stateless steps (at least one) made a
    ``PreparedSegment``."""
    if not isinstance(node, _SEGMENT_STEPS):
        if isinstance(node, StreamJoin):   # it builds its sides as it reads them
            sides = {side: _segments_prepared(node.side_input(side)) for side in (0, 1)}
            return dataclasses.replace(node, _inputs=sides)
        return _children_replaced(node, [_segments_prepared(c) for c in node.children])
    holes: list[PlanNode] = []

    def over_holes(step: PlanNode) -> PlanNode:
        if isinstance(step, _SEGMENT_STEPS):
            return _children_replaced(step, [over_holes(c) for c in step.children])
        hole = _segments_prepared(step)
        holes.append(hole)
        return hole

    template = over_holes(node)
    return PreparedSegment(template, tuple(holes))


def _built_children(node: PlanNode) -> tuple[PlanNode, ...]:
    """A node's children as a batch builds them: a stream-stream join reads its sides
    through their null filters (``StreamJoin.side_input``)."""
    if isinstance(node, StreamJoin):
        return node.side_input(0), node.side_input(1)
    return node.children


def _built_nodes(node: PlanNode):
    yield node
    for child in _built_children(node):
        yield from _built_nodes(child)


class IncrementalExecution:
    """Plans the batches of one query run; made once per run, used for every batch."""

    def __init__(self, spark: SparkSession, plan: PlanNode, *, checkpoint_root: str,
                 shuffle_partitions: int, output_mode: str,
                 empty_inputs: Mapping[StreamingRelation, DataFrame]):
        self.spark = spark
        self.output_mode = output_mode
        if output_mode == "append":
            plan = _limits_over_appends(plan)
        self.plan = _segments_prepared(self._push_filters_below_watermarks(plan, empty_inputs))
        self.needs_batch_time = spark_internals.uses_current_time(self.plan.build(empty_inputs))
        nodes = list(_built_nodes(self.plan))
        stateful = [n for n in nodes if isinstance(n, StatefulNode)]
        self.operators = [StatefulOperator(i, node, operator_name(node), f"{checkpoint_root}/state/{i}",
                                           state_partitions(node, shuffle_partitions))
                          for i, node in enumerate(stateful)]
        self.operator = {op.node: op for op in self.operators}
        self.watermark_nodes = [n for n in nodes if isinstance(n, Watermark)]
        self.watermark_ids = {node: i for i, node in enumerate(self.watermark_nodes)}

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
        plan = _children_replaced(plan, children)
        if isinstance(plan, StreamJoin):   # its sides as it reads them, with their null filters
            plan = dataclasses.replace(plan, _inputs={})
            plan._inputs = {side: self._push_filters_below_watermarks(plan.side_input(side), empty_inputs)
                            for side in (0, 1)}
        if isinstance(plan, Transform) and plan.method in ("filter", "where"):
            return self._sink_filter(plan, empty_inputs) or plan
        return plan

    def _sink_filter(self, filtered: Transform,
                     empty_inputs: Mapping[StreamingRelation, DataFrame]) -> PlanNode | None:
        """``filtered`` moved below the watermark under it, or None if it cannot move."""
        below = filtered.child
        moved = dataclasses.replace(filtered, child=below.child) if below.children else None
        if isinstance(below, Watermark):
            if spark_internals.filter_can_skip_column(moved.build(empty_inputs), below.event_time):
                log.debug("Filter %s runs below the watermark on %s", filtered.describe(), below.event_time)
                return dataclasses.replace(below, child=moved)
            return self._split_filter(filtered, below, empty_inputs)
        if isinstance(below, Transform) and below.method != "limit" and (
                spark_internals.filter_passes_filter(filtered.build(empty_inputs))
                if below.method in ("filter", "where")
                else spark_internals.filter_passes_projection(filtered.build(empty_inputs))):
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
        except Exception:  # noqa: BLE001 - a part whose SQL text does not read back: keep it whole
            log.debug("Filter %s stays whole above the watermark", filtered.describe(), exc_info=True)
            return None
        log.debug("Filter %s: %s runs below the watermark on %s", filtered.describe(), pushed, below.event_time)
        return split

    # -- per batch -------------------------------------------------------------
    def operator_watermarks(self, late_ms: int, eviction_ms: int) -> dict[StatefulNode, OperatorWatermarks]:
        """Each operator's watermarks, given the query's watermark of the previous batch
        (``late_ms``) and of this batch (``eviction_ms``)."""
        late, evict = self.input_watermarks(late_ms), self.input_watermarks(eviction_ms)
        return {op.node: OperatorWatermarks(late.get(op.node) or 0, evict.get(op.node) or 0)
                for op in self.operators}

    def input_watermarks(self, watermark_ms: int) -> dict[StatefulNode, int | None]:
        """Spark's propagation: per stateful operator, the watermark of its input (None:
        no watermark below it)."""
        found: dict[StatefulNode, int | None] = {}

        def output(node: PlanNode) -> int | None:
            below = [w for w in (output(c) for c in _built_children(node)) if w is not None]
            given = min(below) if below else None
            if isinstance(node, Watermark):
                return watermark_ms
            if isinstance(node, StatefulNode):
                found[node] = given
                if given is not None and isinstance(node, StreamJoin):
                    return node.output_watermark_ms(given)
                if isinstance(node, TransformWithState) and not node.output_watermarked():
                    return None
            return given

        output(self.plan)
        return found

    def should_run_another_batch(self, new_watermark_ms: int, eviction_ms: int) -> bool:
        """Spark's IncrementalExecution.shouldRunAnotherBatch: whether some operator would
        evict with the watermark the next batch runs with."""
        now, then = self.input_watermarks(eviction_ms), self.input_watermarks(new_watermark_ms)
        if any((isinstance(op.node, FlatMapGroupsWithState) and op.node.timeout == "ProcessingTimeTimeout")
               or (isinstance(op.node, TransformWithState) and op.node.time_mode == "processingtime")
               for op in self.operators):
            return True   # Spark's rule: timeouts in processing time may fire in any batch
        return any(now.get(op.node) is not None and then[op.node] > now[op.node]
                   and op.evicts_with(self.output_mode) for op in self.operators)

    def batch_dataframe(self, inputs: Mapping[StreamingRelation, DataFrame],
                        batch_timestamp_ms: int, ctx: Any = None) -> DataFrame:
        """The batch's DataFrame; ``ctx`` (an ``execution.stateful.BatchContext``) runs
        the stateful steps and event-time observation."""
        df = self.plan.build(inputs, ctx)
        if self.needs_batch_time:
            log.info("Current batch timestamp = %d", batch_timestamp_ms)
            df = spark_internals.with_batch_timestamp(self.spark, df, batch_timestamp_ms)
        return df

    def explain_string(self, run_id: str, batch_id: int) -> str:
        """The plan, each stateful operator with its state info as Spark prints it."""
        def state_info(node: PlanNode) -> str:
            op = self.operator.get(node)
            if op is None:
                return ""
            return (f", state info [ checkpoint = {op.state_location.rsplit('/', 1)[0]}, "
                    f"runId = {run_id}, opId = {op.id}, ver = {max(batch_id, 0)}, "
                    f"numPartitions = {op.num_state_stores}]")
        return self.plan.tree_string(annotate=state_info)
