"""A stream-stream join's plan node: what it means, and its policy (the watermarks its
state is evicted by, its output watermark, its output-mode rules), with the rewrites the
planner makes of it once per run as Spark's optimizer does (the null filters Spark infers,
filters pushed into its sides)."""
from __future__ import annotations

import collections
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.errors import AnalysisException
from microbatch.operators.base import quoted
from microbatch.operators.join.step import JoinStep, join_statistics_column
from microbatch.plan.checks import unsupported_operation
from microbatch.plan.logical import (BatchFilter, NullFilter, PlanNode, ScanFilter, StatefulNode, StreamingRelation, Transform, Union,
                                     Watermark, children_replaced, filters_reading_back, rebound)

log = logging.getLogger(__name__)

#: Spark's conf of the join's state layout (format 2 since Spark 3.0: the one read and written)
JOIN_FORMAT_CONF = "spark.sql.streaming.join.stateFormatVersion"
_JOIN_NAMES = {"left": "LeftOuter", "right": "RightOuter", "full": "FullOuter", "semi": "LeftSemi"}


@dataclass(eq=False)
class StreamJoin(StatefulNode):
    """A join of two streams (Spark's StreamingSymmetricHashJoinExec): on column names both
    sides have (``using``), or on a condition of equal columns and time comparisons between
    the sides (``a.ts BETWEEN b.ts AND b.ts + INTERVAL 1 HOUR``). Each side's rows are kept
    in state, per key, to meet the other side's later rows. State is evicted by a join key
    that is a side's watermarked event time, or by the time comparisons (Spark's "state
    value watermark" of a side); rows at or before the previous batch's watermark are
    late and dropped."""

    left: PlanNode
    right: PlanNode
    keys: tuple[str, ...]                  # the left side's key columns
    how: str = "inner"
    right_keys: tuple[str, ...] = ()       # the right side's (using: the same names)
    comparisons: tuple = ()                # (op, TimeTerm, TimeTerm) of the condition
    condition: Any = None                  # the user's Column (not using), for templates
    side_columns: tuple = ((), ())         # each side's column names (TimeTerm indexes)
    side_times: tuple = (None, None)       # each side's watermarked event-time column
    #: per side: the watermarked column Spark's engine's join exec finds in its input where
    #: it is not the one Spark's analysis marks (``side_times``): a column of the frame
    #: before ``withWatermark`` (``engine_event_times``); None: the analysis's
    engine_times: tuple | None = None
    side_qualifiers: tuple = ((), ())      # each side's columns' qualifiers (``l`` of ``l.id``)
    positions: tuple = ({}, {})            # (Transform's: of the condition's Columns, per side)
    #: per side: whether Spark's optimizer prunes its event time from the join's input
    #: (``joins_times_pruned``), so that Spark's join exec sees no event time on it
    times_pruned: tuple = (False, False)
    #: per side, the columns Spark's optimizer prunes from the join's input
    #: (``joins_times_pruned``: neither its condition nor a step above reads them; of a
    #: left semi join's right side, nothing above can): its state rows hold the others
    #: only, as Spark's do
    pruned: tuple = ((), ())
    #: the condition's parts beside its keys and time comparisons (``a.num >= b.maxn``): per
    #: side, as SQL text over its columns, those reading that side only; Spark's join exec
    #: filters the side's new rows by them (a row failing them is never stored, and comes
    #: out at once with nulls on an outer side), where its optimizer has not pushed them
    #: into the side (``condition_sides_pushed``)
    side_conditions: tuple = ((), ())
    #: per side, beside each of ``side_conditions``: the state value watermark (ms) Spark's
    #: StreamingJoinHelper finds in it while it stays in the condition (``num > 2``: 2000,
    #: a literal read as seconds), else None
    side_bounds: tuple = ((), ())
    #: the parts reading both sides, as the task evaluates them on a pair
    #: (``spark_internals.join_condition_parts``; ``step.evaluate``)
    pair_conditions: tuple = ()
    #: per side: the columns Spark infers "not null" for from those parts
    condition_nulls: tuple = ((), ())
    #: per side: every column Spark's analysis marks with a watermark, (name, delay ms);
    #: more than one where the side is a join's output keeping both its sides' event times
    side_marks: tuple = ((), ())
    #: the join type Spark's engine's exec runs where its optimizer changes it after the
    #: filters it infers (``outer_joins_narrowed``): its state rules and null-padded rows;
    #: None: ``how``
    exec_how: str | None = None
    deferred_refusal: Exception | None = None    # (plan.logical.StatefulNode's)

    def __post_init__(self):
        if not self.right_keys:
            self.right_keys = self.keys

    @property
    def using(self) -> bool:
        return self.condition is None

    @property
    def children(self):
        return (self.left, self.right)

    # -- its policy (plan.logical.StatefulNode) ----------------------------------------------
    def hidden_column_children(self) -> tuple[tuple[int, int | None], ...]:
        """Spark's Join gives both sides' hidden columns (a left semi join its left side's):
        its output is the left side's columns, then the right side's."""
        if self.using:     # (its output is the keys first: not a side's columns, then the other's)
            return ()
        if self.how == "semi":
            return ((0, None),)
        return ((0, len(self.side_columns[0])), (1, len(self.side_columns[1])))

    def child_column_qualifiers(self, child: int) -> tuple[tuple[str, ...], ...]:
        return self.side_qualifiers[child]

    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> JoinStep:
        return JoinStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        return shuffle_partitions

    def evicts_with(self, output_mode: str) -> bool:
        return self.evicts()

    def runs_every_batch(self) -> bool:
        return False

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        """Each side's watermark right below it (through the join's own null filters), when
        the two sides do not read one watermark (a self-join)."""
        sides = [self.side_watermark(0), self.side_watermark(1)]
        if sides[0] is sides[1]:
            return {}
        return {side: (w, ()) for side, w in enumerate(sides) if w is not None}

    def reports_statistics(self, watermark: Watermark, schema: StructType) -> bool:
        """A side's task reports its watermark's statistics from a timestamp column (a
        window's end it leaves to an ``Observation``)."""
        return join_statistics_column(watermark, schema) is not None

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        if self.how == "anti" and (mode != "complete" or spark_internals.running_version().at_least(4, 2)):
            # (Spark's checker: a left anti join of two streams is refused, in any output mode
            # since 4.2, where the output-mode rule of a join of two streams names the others)
            return unsupported_operation("LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported;")
        if (self.how in ("left", "right", "full") and mode != "append") or mode == "complete":
            named = f"{_JOIN_NAMES.get(self.how, 'Inner')} join" \
                if spark_internals.running_version().at_least(4, 2) else "Join"
            allowed = "Append and Update output modes" if self.how in ("inner", "semi") \
                and spark_internals.running_version().at_least(4, 2) else "Append output mode"
            return unsupported_operation(
                f"{named} between two streaming DataFrames/Datasets is not "
                f"supported in {mode.capitalize()} output mode, only in {allowed};")
        # (Spark's checkForStreamStreamJoinWatermark: the nullable side's watermark bounds the
        # other side's state through a range condition; a full outer join: either way)
        nullable = {"left": (1,), "semi": (1,), "right": (0,), "full": (0, 1)}.get(self.how, ())
        ranged = any(self.value_watermark_ms(1 - side, 0, evicting=False) is not None for side in nullable)
        if self.how != "inner" and self.watermark_key() is None and not ranged:
            return AnalysisException(
                f"Stream-stream {_JOIN_NAMES[self.how]} join between two streaming DataFrame/Datasets "
                "is not supported without a watermark in the join keys, or a watermark on the "
                "nullable side and an appropriate range condition;")
        return None

    def affected_by_late_rows(self) -> bool:
        return True

    def connect_refusal(self, output_mode: str) -> str | None:
        return "A stream-stream join"

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        if recorded_conf.get(JOIN_FORMAT_CONF, "2") != "2":
            return (f"its join state has format version {recorded_conf[JOIN_FORMAT_CONF]} "
                    f"({JOIN_FORMAT_CONF}); only version 2 is read")
        return None

    def planning_refusal(self) -> Exception | None:
        """Spark's join exec finds at most one event time in a side's columns (its
        WatermarkSupport.findEventTimeColumn, with multiple stateful operators allowed):
        a side that is a join's output keeping both that join's event times fails in
        Spark's first batch with MULTIPLE_EVENT_TIME_COLUMNS; here when the query starts,
        in its thread, so the query fails as Spark's does."""
        for marks in self.side_marks:
            if len({name.lower() for name, _ in marks}) > 1:
                named = ",".join(f"{name}-T{delay}ms" for name, delay in marks)
                return spark_internals.spark_error("AnalysisException", "MULTIPLE_EVENT_TIME_COLUMNS",
                                                   eventTimeCols=f"({named})")
        return None

    # -- the state watermarks of its sides (Spark's StreamingJoinHelper) ----------------------

    def side_watermark(self, side: int) -> Watermark | None:
        """The watermark right below a side as the join reads it, when only the join's
        own null filter on the side's event time lies between (it drops only rows without
        an event time, which no statistic of the watermark counts); else None."""
        node = (self.left, self.right)[side].under_null_filters(self.side_event_time(side) or "")
        return node if isinstance(node, Watermark) else None

    def side_event_time(self, side: int) -> str | None:
        """The watermarked event-time column of a side (0: left, 1: right), if it has one:
        the watermark's column, a time window over it, or an earlier aggregation's
        event-time key (``side_times``, found when the join is defined)."""
        return self.side_times[side]

    def exec_event_time(self, side: int) -> str | None:
        """The side's event time as Spark's join exec sees it, in its input's columns: None
        where Spark's optimizer prunes it (nothing above the join reads it, nor the
        condition). Its late rows and its state value eviction go by it: with it pruned,
        Spark's exec drops no late row of the side and evicts none of its state by a time
        comparison (its watermark still moves, from the rows below)."""
        return None if self.times_pruned[side] else self.engine_event_time(side)

    def engine_event_time(self, side: int) -> str | None:
        """The side's watermarked column in the input of Spark's engine's join exec, before
        pruning (``engine_event_times``)."""
        return (self.engine_times or self.side_times)[side]

    def condition_reads(self, side: int, column: str) -> bool:
        """Whether the join's keys or time comparisons read the side's ``column`` (a name
        the side has once): Spark's optimizer then keeps it in the join's input."""
        names = [c.lower() for c in self.side_columns[side]]
        if names.count(column.lower()) != 1:
            return False
        keys = self.keys if side == 0 else self.right_keys
        if column.lower() in (k.lower() for k in keys):
            return True
        index = names.index(column.lower())
        return any(term.side == side and term.index == index
                   for _, *terms in self.comparisons for term in terms)

    def watermark_key(self) -> int | None:
        """The index of the join key that is a side's watermarked event time (Spark looks
        at the left keys first), or None."""
        for side, names in ((0, self.keys), (1, self.right_keys)):
            column = self.side_event_time(side)
            lowered = [k.lower() for k in names]
            if column is not None and column.lower() in lowered:
                return lowered.index(column.lower())
        return None

    def value_watermark_ms(self, side: int, watermark_ms: int, *, evicting: bool = True) -> int | None:
        """Spark's state value watermark of a side (StreamingJoinHelper): from each time
        comparison ``other.t + c1 < this.t + c2`` (or ``<=``, or the same turned around)
        where ``other.t`` is the other side's watermarked column, ``watermark + c1 - c2``
        in ms (minus 1 for ``<=``); the smallest. Rows of this side whose watermarked
        column is at or before it can meet no later row. None when no comparison gives one,
        the other side has no watermark or, ``evicting``, this side has none (Spark evicts
        by it only then; its checker, ``evicting=False``, asks only that it exists): each
        side's as its exec sees it (``exec_event_time``; a column a comparison reads is
        never pruned)."""
        this_time, other_time = self.exec_event_time(side), self.exec_event_time(1 - side)
        if other_time is None or (evicting and this_time is None):
            return None
        other_columns = [c.lower() for c in self.side_columns[1 - side]]
        found = []
        for op, a, b in self.comparisons:
            if op in (">", ">="):
                a, b, op = b, a, "<" if op == ">" else "<="
            if b.side != side or a.side != 1 - side:
                continue
            if other_columns[a.index] != other_time.lower():
                continue   # Spark substitutes only the watermarked column
            value = int((watermark_ms * 1000 + a.offset_us - b.offset_us) / 1000)
            found.append(value - 1 if op == "<=" else value)
        found += [b for b in self.side_bounds[side] if b is not None]
        return min(found) if found else None

    def output_watermark_ms(self, watermark_ms: int) -> int:
        """The watermark an operator above the join sees (Spark's produceOutputWatermark):
        the smallest of the input watermark and each side's state watermark (the input
        watermark with a watermarked key; the state value watermark otherwise)."""
        if self.watermark_key() is not None:
            return watermark_ms
        found = [self.value_watermark_ms(side, watermark_ms) for side in (0, 1)]
        return min([watermark_ms] + [v for v in found if v is not None])

    def evicts(self) -> bool:
        """Whether state is ever evicted: by a watermarked key, or a state value watermark."""
        return self.watermark_key() is not None or any(
            self.value_watermark_ms(side, 0) is not None for side in (0, 1))

    def watermark_column(self) -> str | None:
        index = self.watermark_key()
        return None if index is None else self.keys[index]

    def build(self, inputs):
        left, right = self.left.build(inputs), self.right.build(inputs)

        def joined() -> DataFrame:
            on = list(self.keys) if self.using else rebound(self.condition, list(zip((left, right), self.positions)))
            return left.join(right, on, self.how)
        return self.built_over((left, right), joined)

    def describe(self) -> str:
        on = ", ".join(self.keys) if self.using else str(self.condition)
        return f"StreamingSymmetricHashJoin {self.how}, [{on}]"


# -- the rewrites the planner makes once per run (Spark's optimizer's) -----------------------
def with_null_filters(join: StreamJoin) -> StreamJoin:
    """The join as a batch reads it (a rewrite the planner makes once per run): Spark infers
    "not null" for the columns of the condition on a side whose rows only come out matched
    (both sides of an inner join, the other side of an outer one), one filter per column
    (Spark splits the conjunction), so the planner can push each that does not use the
    event time below the side's watermark; those rows then move no watermark."""
    outer = {"left": (0,), "right": (1,), "full": (0, 1)}.get(join.how, ())
    sides: list[PlanNode] = [join.left, join.right]
    for side in (0, 1):
        if side in outer:
            continue
        plan = sides[side]
        event_time = (join.side_event_time(side) or "").lower()
        names = list((join.keys, join.right_keys)[side])
        columns = join.side_columns[side]
        for _op, a, b in join.comparisons:
            for t in (a, b):
                if t.side == side and columns[t.index] not in names:
                    names.append(columns[t.index])
        names += [c for c in join.condition_nulls[side] if c not in names]
        for timed in (False, True):   # the event time's filter outermost
            for k in names:
                if (k.lower() == event_time) == timed:
                    condition = F.col(quoted(k)).isNotNull()
                    plan = NullFilter(plan, "where", (condition,), column=k)
        sides[side] = plan
    return dataclasses.replace(join, left=sides[0], right=sides[1])


#: the sides into which Spark's optimizer pushes a join condition's parts that read that
#: side only (PushPredicateThroughJoin); the others stay in the join's condition
_CONDITION_PUSHED_SIDES = {"inner": (0, 1), "semi": (0, 1), "left": (1,), "right": (0,), "full": ()}


def condition_sides_pushed(plan: PlanNode) -> PlanNode:
    """A rewrite the planner makes once per run: the parts of each stream-stream join's
    condition that read one side only, as filters on that side (below the join, and from
    there below the side's watermark where they do not read its event time), where
    Spark's optimizer pushes them (PushPredicateThroughJoin: both sides of an inner or
    left semi join, the right side of a left outer join, the left of a right outer one);
    the join keeps the others, which its exec checks on the side's new rows."""
    plan = children_replaced(plan, [condition_sides_pushed(c) for c in plan.children])
    if not isinstance(plan, StreamJoin) or not any(plan.side_conditions):
        return plan
    sides, kept, bounds = [plan.left, plan.right], [(), ()], [(), ()]
    for side in (0, 1):
        parts = plan.side_conditions[side]
        if not parts:
            continue
        if side in _CONDITION_PUSHED_SIDES.get(plan.how, ()):
            sides[side] = Transform(sides[side], "where", (F.expr(" AND ".join(f"({p})" for p in parts)),))
        else:
            kept[side], bounds[side] = parts, plan.side_bounds[side]
    return dataclasses.replace(plan, left=sides[0], right=sides[1], side_conditions=tuple(kept),
                               side_bounds=tuple(bounds))


def joins_null_filtered(plan: PlanNode) -> PlanNode:
    """Every stream-stream join of ``plan`` with the null filters Spark infers (``with_null_filters``)."""
    plan = children_replaced(plan, [joins_null_filtered(c) for c in plan.children])
    return with_null_filters(plan) if isinstance(plan, StreamJoin) else plan


def engine_event_times(template: DataFrame, side_columns: tuple, side_times: tuple) -> tuple | None:
    """Each side's watermarked column as Spark's engine's join exec finds it in its input,
    for a join whose ``template`` (its analysed frame) marks none on a side: a column of
    the frame before ``withWatermark`` (``w = df; df.withWatermark("ts", ..)
    .select(w.ts.alias("t"))``) carries no mark in Spark's analysis, but over a v1 source
    (a file source) Spark's optimizer gives it the watermark's marked attribute in the plan
    its engine runs (``spark_internals.engine_join_event_times``), and its join drops that
    side's late rows by it. None where no side gains one (or the join is not found)."""
    try:
        found = spark_internals.engine_join_event_times(template)
    except Exception:  # a plan Spark's optimizer does not take so: the analysis's marks
        log.debug("No event times read for the join's exec", exc_info=True)
        return None
    if found is None:
        return None
    times = list(side_times)
    for side, name in enumerate(found):
        columns = {c.lower(): c for c in side_columns[side]}
        if times[side] is None and name is not None and name.lower() in columns:
            times[side] = columns[name.lower()]
    return None if tuple(times) == tuple(side_times) else tuple(times)


class _SideRead(PlanNode):
    """A join's side in the batch plan ``joins_times_pruned`` builds: the side's DataFrame
    kept, to find its columns in the whole plan's."""

    def __init__(self, child: PlanNode):
        self.child, self.df = child, None

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        self.df = self.child.build(inputs)
        return self.df

    def describe(self) -> str:
        return "Side read"


def joins_times_pruned(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run: each stream-stream join with the sides
    whose event time Spark's optimizer prunes from the join's input (``times_pruned``),
    and with each side's columns it prunes (``pruned``), read from the query built as a
    batch (each stateful node what stands for it in Spark's optimizer, reading what the
    operator reads, ``pruning_stand_in``): a side's watermarked column that nothing above the join
    reads, nor its condition, never reaches Spark's join exec, which then drops no late
    row of that side (``exec_event_time``); nor does any column nothing reads, which
    Spark's join state then does not hold. A column whose name a side has twice is never
    counted pruned (its name does not say which)."""
    joins = [n for n in plan.nodes() if isinstance(n, StreamJoin)]
    if not joins:
        return plan
    reads: dict[StreamJoin, tuple[_SideRead, _SideRead]] = {}

    def batch_plan(node: PlanNode) -> PlanNode:
        children = [batch_plan(c) for c in node.children]
        if any(node is j for j in joins):
            reads[node] = (_SideRead(children[0]), _SideRead(children[1]))
            children = list(reads[node])
        node = children_replaced(node, children)
        return node.pruning_stand_in() if node.stateful else node

    asked = [(join, side) for join in joins for side in (0, 1)
             if join.engine_event_time(side) is not None and not join.condition_reads(side, join.engine_event_time(side))]
    try:
        whole = batch_plan(plan).build(empty_inputs)
        columns = {(join, side): _once_named(reads[join][side].df.columns) for join in joins for side in (0, 1)}
        pruned = spark_internals.pruned_from_joins(
            whole, [(reads[join][side].df, join.engine_event_time(side)) for join, side in asked]
            + [(reads[join][side].df, name) for (join, side), names in columns.items() for name in names])
    except Exception:  # a plan that does not build as a batch: the joins stay as they are
        log.debug("No pruned columns read for the joins of %s", plan.describe(), exc_info=True)
        return plan
    found: dict[StreamJoin, list[bool]] = {}
    for (join, side), gone in zip(asked, pruned):
        found.setdefault(join, [False, False])[side] = gone
    found = {j: f for j, f in found.items() if any(f)}
    gone = iter(pruned[len(asked):])
    side_found: dict[StreamJoin, list[tuple]] = {}
    for (join, side), names in columns.items():
        side_found.setdefault(join, [(), ()])[side] = tuple(n for n in names if next(gone))
    side_found = {j: f for j, f in side_found.items() if any(f)}
    if not found and not side_found:
        return plan

    def with_pruned(node: PlanNode) -> PlanNode:
        replaced = children_replaced(node, [with_pruned(c) for c in node.children])
        if node in found:
            log.debug("Join %s: Spark's optimizer prunes the event time of sides %s", node.describe(), found[node])
            replaced = dataclasses.replace(replaced, times_pruned=tuple(found[node]))
        if node in side_found:
            log.debug("Join %s: Spark's optimizer prunes %s from its sides", node.describe(), side_found[node])
            replaced = dataclasses.replace(replaced, pruned=tuple(side_found[node]))
        return replaced
    return with_pruned(plan)


def _once_named(names: list[str]) -> list[str]:
    """The names a side's columns have once (case-insensitively)."""
    lowered = [n.lower() for n in names]
    return [n for n in names if lowered.count(n.lower()) == 1]


def outer_joins_eliminated(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run, first: each stream-stream outer join that
    Spark's optimizer removes from the query (EliminateOuterJoin: an aggregation over a left
    outer join that reads only the left side's columns, with aggregate functions that do
    not care for duplicates, ``min(v)`` by ``window(ts)``, aggregates the left side alone;
    a full outer join is a left one first under a filter that drops rows with a null left
    column, as the tumbling window's ``isnotnull(ts)``), read from the query built as a
    batch (each stateful node what stands for it, ``scan_filter_stand_in``;
    ``spark_internals.outer_joins_eliminated``). Spark's engine optimizes every batch so:
    the join is no operator of its plan (no state, no operator id: the operators below and
    after it are numbered without it) and the aggregation reads the kept side's rows as
    they come. The join becomes the side Spark keeps, with the other side's columns null
    in their places (nothing above reads them: the optimizer removed the join for that).
    A join on column names, or one whose removed side reads a source nothing else in the
    query reads (the source would leave the query's sources), stays as it is."""
    joins = [n for n in plan.nodes() if isinstance(n, StreamJoin) and n.how in ("left", "right", "full")
             and not n.using]
    if not joins:
        return plan
    reads: dict[StreamJoin, _SideRead] = {}

    def batch_plan(node: PlanNode) -> PlanNode:
        built = children_replaced(node, [batch_plan(c) for c in node.children])
        built = built.scan_filter_stand_in() if built.stateful else built
        if any(node is j for j in joins):
            reads[node] = _SideRead(built)
            return reads[node]
        return built

    try:
        whole = batch_plan(plan).build(empty_inputs)
        kept = spark_internals.outer_joins_eliminated(whole, [reads[j].df for j in joins])
    except Exception:  # a plan that does not build as a batch: the joins stay
        log.debug("No joins eliminated in %s", plan.describe(), exc_info=True)
        return plan
    found = {}
    for join, side in zip(joins, kept):
        if side is None:
            continue
        gone = _reads(join.children[1 - side])
        if any(_reads(plan)[r] <= n for r, n in gone.items()):
            log.debug("Join %s: Spark's optimizer removes it, its side %d's sources with it: kept", join.describe(), 1 - side)
            continue
        found[join] = side
    if not found:
        return plan

    def without(node: PlanNode) -> PlanNode:
        if node in found:
            return _as_join_output(node, found[node], empty_inputs)
        return children_replaced(node, [without(c) for c in node.children])
    return without(plan)


def outer_joins_narrowed(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run, after ``outer_joins_eliminated``: each
    stream-stream outer join on a condition whose type Spark's optimizer changes
    (EliminateOuterJoin: a full outer join under a filter that drops rows with a null left
    column is a left outer join; such a filter is often the one Spark infers from a join
    above on the join's columns, ``a.join(b, ..., "full").join(c, "id = cid AND ts = cts")``),
    read from the query built as a batch (``spark_internals.outer_joins_narrowed``), runs its
    task as the join Spark's engine runs (``exec_how``), with that join's state rules (a
    right row behind the watermark that matched nothing is kept only by a right or full
    outer join) and null-padded rows (those the filter above drops never come out). Its
    other rewrites stay those of the join as written: Spark narrows it after its optimizer
    inferred the filters (its "Infer Filters" batch runs once, before), so the newly
    inner side gets none."""
    joins = [n for n in plan.nodes() if isinstance(n, StreamJoin) and n.how in ("left", "right", "full")
             and not n.using]
    if not joins:
        return plan
    reads: dict[StreamJoin, _SideRead] = {}

    def batch_plan(node: PlanNode) -> PlanNode:
        built = children_replaced(node, [batch_plan(c) for c in node.children])
        built = built.scan_filter_stand_in() if built.stateful else built
        if any(node is j for j in joins):
            reads[node] = _SideRead(built)
            return reads[node]
        return built

    try:
        whole = batch_plan(plan).build(empty_inputs)
        narrowed = spark_internals.outer_joins_narrowed(whole, [reads[j].df for j in joins])
    except Exception:  # a plan that does not build as a batch: the joins stay
        log.debug("No joins narrowed in %s", plan.describe(), exc_info=True)
        return plan
    found = {j: how for j, how in zip(joins, narrowed) if how is not None and how != "semi"}
    if not found:
        return plan

    def narrowed_joins(node: PlanNode) -> PlanNode:
        replaced = children_replaced(node, [narrowed_joins(c) for c in node.children])
        if node in found:
            log.debug("Join %s: Spark's optimizer makes it a %s join", node.describe(), found[node])
            return dataclasses.replace(replaced, exec_how=found[node])
        return replaced
    return narrowed_joins(plan)


def _reads(plan: PlanNode) -> collections.Counter:
    """How many times ``plan`` reads each source (by its id)."""
    return collections.Counter(id(n) for n in plan.nodes() if isinstance(n, StreamingRelation))


def _as_join_output(join: StreamJoin, side: int, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """``join``'s ``side`` with the join's columns: its own where the join has them, the other
    side's null (of their types)."""
    output = join.build(empty_inputs).schema.fields
    own = join.children[side].build(empty_inputs).columns
    width = len(join.children[0].build(empty_inputs).columns)
    columns = []
    for i, f in enumerate(output):
        if (i < width) == (side == 0):
            columns.append(F.col(quoted(own[i if side == 0 else i - width])))
        else:
            columns.append(F.lit(None).cast(f.dataType).alias(f.name))
    log.debug("Join %s: Spark's optimizer removes it and reads side %d alone", join.describe(), side)
    return Transform(join.children[side], "select", tuple(columns))


class _InferredFilters:
    """The filters Spark's optimizer infers for the sides of one stream-stream join
    (``spark_internals.join_inferred_filters``), by the sources without data in a batch:
    Spark's engine reads such a source as an empty relation of a stream's, and its
    optimizer makes the projections and filters over it an empty relation too
    (PropagateEmptyRelation) before it infers filters: a side read so in a batch gives
    the other side nothing (a watermark or a stateful operator over the source stops
    that: Spark's optimizer keeps them). Found once per such set of sources, when a batch
    first has it."""

    def __init__(self, join: StreamJoin, empty_inputs: Mapping[Any, DataFrame]):
        self.join, self.empty_inputs = join, empty_inputs
        self.relations = frozenset(join.relations())
        self._found: dict[frozenset, tuple[list[str], list[str]]] = {}
        self._conditions: dict[tuple[frozenset, int], Any] = {}

    def filters(self, empty: frozenset) -> tuple[list[str], list[str]]:
        """Each side's filters (SQL text parts) in a batch where ``empty`` have no data."""
        if empty not in self._found:
            self._found[empty] = self._find(empty)
        return self._found[empty]

    def condition(self, side: int, empty: frozenset) -> Any:
        """The side's filter (a Column, or None) in a batch where ``empty`` have no data."""
        empty = empty & self.relations
        if empty == self.relations:     # (no rows reach the join)
            empty = frozenset()
        if (empty, side) not in self._conditions:
            try:
                parts = self.filters(empty)[side]
            except Exception:  # a plan Spark's optimizer does not take so: the filters of a batch with data
                log.debug("No filters inferred for %s without data from %s", self.join.describe(), empty, exc_info=True)
                parts = self._found[frozenset()][side]
            self._conditions[(empty, side)] = F.expr(" AND ".join(f"({p})" for p in parts)) if parts else None
        return self._conditions[(empty, side)]

    def _find(self, empty: frozenset) -> tuple[list[str], list[str]]:
        inputs = {r: spark_internals.stream_without_data(df) if r in empty else df
                  for r, df in self.empty_inputs.items()}

        def batch_plan(node: PlanNode) -> PlanNode:
            streaming = isinstance(node, Watermark) and bool(empty.intersection(node.relations()))
            node = children_replaced(node, [batch_plan(c) for c in node.children])
            if streaming:   # (Spark's EventTimeWatermark stays over a stream's relation: no empty relation passes it)
                return Transform(node.child, "withWatermark", (node.event_time, node.delay))
            return node.scan_filter_stand_in() if node.stateful else node
        join = self.join
        sides = [batch_plan(join.left), batch_plan(join.right)]
        found = spark_internals.join_inferred_filters(dataclasses.replace(join, left=sides[0], right=sides[1])
                                                      .build(inputs))
        if found is None:
            return [], []
        kept: tuple[list[str], list[str]] = ([], [])
        for side, parts in enumerate(found):
            if not parts:
                continue
            # (each part read back from its SQL text, over the side's columns; one that does
            # not: the side goes without it)
            over = (join.left, join.right)[side].build(self.empty_inputs)
            kept[side].extend(text for text, reads_back in zip(parts, filters_reading_back(over, list(parts)))
                              if reads_back)
        return kept


def join_filters_inferred(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run: each stream-stream join's sides with the
    filters Spark's optimizer infers for them from the other side's (InferFiltersFromConstraints:
    ``l.ts >= x`` on the left side of a join on ``l.ts = r.ts`` filters the right side by
    ``r.ts >= x`` too), on top of the side (``BatchFilter``), where Spark's optimizer
    pushes them down from: through projections, and below a watermark the parts that do
    not read its event time, into a file scan (``runtime.scan_filters``); a part that
    reads the event time stays above the watermark, so the watermark sees the rows it
    drops, and the side's state does not keep them. Each batch's are those of the sources
    with data in it (``_InferredFilters``)."""
    plan = children_replaced(plan, [join_filters_inferred(c, empty_inputs) for c in plan.children])
    if not isinstance(plan, StreamJoin) or plan.how == "full":
        return plan
    finder = _InferredFilters(plan, empty_inputs)
    try:
        found = finder.filters(frozenset())
    except Exception:  # a join that does not build as a batch: its sides stay as they are
        log.debug("No filters inferred for %s", plan.describe(), exc_info=True)
        return plan
    if not any(found):
        return plan
    sides = [plan.left, plan.right]
    for side, parts in enumerate(found):
        if parts:
            log.debug("Join %s: Spark's optimizer infers %s for side %d", plan.describe(), parts, side)
            sides[side] = BatchFilter(sides[side], " AND ".join(parts),
                                      lambda empty, side=side: finder.condition(side, empty))
    return dataclasses.replace(plan, left=sides[0], right=sides[1])


#: the sides of a stream-stream join a filter above it may move into: the sides whose rows
#: the join keeps whatever the other side has (Spark's PushPredicateThroughJoin)
_PRESERVED_SIDES = {"inner": (0, 1), "left": (0,), "right": (1,), "semi": (0,)}


def filters_pushed_into_joins(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A filter right above a stream-stream join on a condition: each deterministic part
    of it that reads one side's columns only runs on that side, below the join, as Spark's
    optimizer pushes it (so the side's rows it drops are neither joined nor kept in the
    join's state, and, below the side's watermark, not in its event-time statistics)."""
    plan = children_replaced(plan, [filters_pushed_into_joins(c, empty_inputs) for c in plan.children])
    if not (isinstance(plan, Transform) and plan.method in ("filter", "where") and isinstance(plan.child, StreamJoin)):
        return plan
    join = plan.child
    if join.using or join.how not in _PRESERVED_SIDES:
        return plan
    parts = spark_internals.conjunct_sides(plan.build(empty_inputs), len(join.side_columns[0]))
    if parts is None or not any(side in _PRESERVED_SIDES[join.how] for _, side in parts):
        return plan
    sides, kept = [join.left, join.right], []
    try:
        for sql, side in parts:
            if side in _PRESERVED_SIDES[join.how]:
                sides[side] = Transform(sides[side], "where", (F.expr(sql),))
                sides[side].build(empty_inputs)    # (reads back on its side, or stays above)
            else:
                kept.append(sql)
    except Exception:  # a part that does not read back (a Python UDF): the filter stays
        log.debug("Filter %s stays whole above the join", plan.describe(), exc_info=True)
        return plan
    moved = dataclasses.replace(join, left=sides[0], right=sides[1])
    log.debug("Filter %s: parts run on the join's sides", plan.describe())
    return Transform(moved, "where", (F.expr(" AND ".join(f"({k})" for k in kept)),)) if kept else moved


def _rows_steps_over_union(node: PlanNode) -> tuple[list[Transform], Union] | None:
    """The stateless steps (top down) between ``node`` and a union under them, and the
    union; None when something else comes first."""
    steps = []
    while isinstance(node, Transform) and node.method != "limit":
        steps.append(node)
        node = node.child
    return (steps, node) if isinstance(node, Union) else None


def _as_union_output(union: Union, side: int, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode | None:
    """One input of ``union`` with the union's columns (names, order), as Spark's optimizer
    reads each input once it moves the steps above the union into them; None when a column
    is missing (``allowMissingColumns``)."""
    child = union.children[side]
    if side == 0:
        return child
    names = union.build(empty_inputs).columns
    own = child.build(empty_inputs).columns
    if union.by_name:
        lowered = {c.lower(): c for c in own}
        if any(n.lower() not in lowered for n in names):
            return None
        ordered = tuple(lowered[n.lower()] for n in names)
        if list(ordered) != own:
            child, own = Transform(child, "select", ordered), list(ordered)
    return child if list(own) == list(names) else Transform(child, "toDF", tuple(names))


def _read_once(side: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """The other side of a join that runs once per input of a union, each of its reads of a
    source ended by an exchange, which Spark reuses in every copy of the side: the source's
    rows are read (and counted in ``numInputRows``) once a batch, as Spark's engine reads
    the side once and reuses its exchange in each join. A side that keeps state stays as
    it is."""
    if any(n.stateful for n in side.nodes()):
        return side

    def ended(node: PlanNode) -> PlanNode:
        if isinstance(node, StreamingRelation) or (isinstance(node, ScanFilter)
                                                   and isinstance(node.child, StreamingRelation)):
            columns = node.build(empty_inputs).columns
            return Transform(node, "repartition", tuple(F.col(quoted(c)) for c in columns))
        return children_replaced(node, [ended(c) for c in node.children])
    return ended(side)


def _pushed_through_union(join: StreamJoin, empty_inputs: Mapping[Any, DataFrame]) -> list[PlanNode] | None:
    """``join`` (a left semi join) as one join per input of the union under its left side,
    each with the steps between (an input that is a union again: one per input of that
    one, as Spark's optimizer combines the unions first); None when its left side is no
    union under stateless steps."""
    found = _rows_steps_over_union(join.left)
    if found is None:
        return None
    steps, union = found
    branches: list[PlanNode] = []
    for side in (0, 1):
        left = _as_union_output(union, side, empty_inputs)
        if left is None:
            return None
        for step in reversed(steps):
            left = dataclasses.replace(step, child=left)
        branch = dataclasses.replace(join, left=left)
        branches.extend(_pushed_through_union(branch, empty_inputs) or [branch])
    return branches


def semi_joins_through_unions(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run: a left semi join whose left side is a union
    (under projections and filters) becomes a union of one join per input of the union,
    each its own operator with its own state (each keeps the right side's rows), where
    Spark's optimizer pushes the join through the union (PushDownLeftSemiAntiJoin, read
    from the join built as a batch: ``spark_internals.semi_join_branches``). The steps
    between run on each input, below its join, as Spark's optimizer moves them there."""
    plan = children_replaced(plan, [semi_joins_through_unions(c, empty_inputs) for c in plan.children])
    if not (isinstance(plan, StreamJoin) and plan.how == "semi"):
        return plan
    try:
        branches = _pushed_through_union(dataclasses.replace(plan, right=_read_once(plan.right, empty_inputs)),
                                         empty_inputs)
        if branches is None:
            return plan
        made = spark_internals.semi_join_branches(plan.build(empty_inputs))
        if made != len(branches):
            log.debug("Join %s: Spark makes %d joins of it, not %d", plan.describe(), made, len(branches))
            return plan
        pushed = branches[0]
        for branch in branches[1:]:
            pushed = Union(pushed, branch)
        pushed.build(empty_inputs)
    except Exception:  # a plan that does not build so: the join stays above the union
        log.debug("Join %s stays above its union", plan.describe(), exc_info=True)
        return plan
    log.debug("Join %s runs once per input of its union", plan.describe())
    return pushed
