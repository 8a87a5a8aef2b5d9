"""The logical plan of a stream: a small tree of dataclasses.

A leaf ``StreamingRelation`` stands for one source; the other nodes are the
steps applied to it, and say what they mean (a join's watermarks, a deduplication's
event time, ...). Every node can be ``build``-t into a PySpark DataFrame from one
DataFrame per relation, as a batch query: over empty DataFrames that is the stream's
*template*, which gives it its schema and checks each step when it is defined (so a
wrong column fails at definition, as in Spark); a stateful node builds its batch
equivalent there.

A micro-batch is built by the run's planner (``runtime.incremental``), which walks this
plan: the watermarks' event-time statistics go to the ``WatermarkTracker``, and each
stateful node's part is its operator's step (``operators/``). No node calls back into
the runtime.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from microbatch import spark_internals

_relation_ids = itertools.count()


def rebound(values: Any, sides: list[tuple[DataFrame, dict]]) -> Any:
    """``values`` (a step's arguments) over the DataFrames ``sides`` pairs with the
    positions of the attributes the step's Columns were bound to when it was defined
    (``spark_internals.rebound``); unchanged when none was."""
    if not any(positions for _, positions in sides):
        return values
    return spark_internals.rebound(values, [(df, positions) for df, positions in sides if positions])


class PlanNode:
    children: tuple["PlanNode", ...] = ()

    def build(self, inputs: Mapping["StreamingRelation", DataFrame]) -> DataFrame:
        """The node over ``inputs`` (a DataFrame per relation) as a batch query: the
        stream's *template* over empty inputs. A micro-batch is built by the planner
        (``runtime.incremental``), which runs the stateful nodes' steps."""
        raise NotImplementedError

    def relations(self) -> list["StreamingRelation"]:
        """Source relations in plan order, each once (Spark's uniqueSources order)."""
        seen: list[StreamingRelation] = []
        for child in self.children:
            for r in child.relations():
                if r not in seen:
                    seen.append(r)
        return seen

    def nodes(self):
        yield self
        for child in self.children:
            yield from child.nodes()

    def describe(self) -> str:
        raise NotImplementedError

    def under_null_filters(self, column: str) -> "PlanNode":
        """What this node reads once the join's null filters on ``column``
        (``NullFilter``) are passed; a node that is none: itself."""
        return self

    def tree_string(self, indent: int = 0, annotate: Callable[["PlanNode"], str] | None = None) -> str:
        """The plan as an indented tree; ``annotate`` adds text after a node's line."""
        extra = annotate(self) if annotate else ""
        lines = ["   " * indent + ("+- " if indent else "") + self.describe() + extra]
        for child in self.children:
            lines.append(child.tree_string(indent + 1, annotate))
        return "\n".join(lines)


@dataclass(eq=False)
class StreamingRelation(PlanNode):
    """A source in the plan. ``eq=False``: two loads of the same format are two sources."""

    source_name: str
    options: Mapping[str, str]
    schema: StructType
    user_schema: StructType | None
    provider: Any                      # sources.base.SourceProvider
    source_instance: Any = None        # a ready Source (MemoryStream), reused on restarts
    user_name: str | None = None       # DataStreamReader.name(...): its id in the checkpoint
    id: int = field(default_factory=lambda: next(_relation_ids))

    def build(self, inputs):
        return inputs[self]

    def empty_batch(self, spark: Any) -> DataFrame:
        """A batch of no rows with the source's columns, hidden ones included (its provider's;
        a MemoryStream has none)."""
        if self.provider is None:
            return spark_internals.empty_batch(spark, self.schema)
        return self.provider.empty_batch(spark, self.options, self.schema)

    def relations(self):
        return [self]

    def describe(self) -> str:
        cols = ", ".join(self.schema.fieldNames())
        named = f" AS {self.user_name}" if self.user_name else ""
        return f"StreamingRelation {self.source_name}{named}, [{cols}]"


@dataclass(eq=False)
class Transform(PlanNode):
    """A stateless DataFrame method replayed on every batch (select, filter, ...)."""

    child: PlanNode
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    #: where the Columns of ``args`` taken from a frame (``frame.ts``) are bound: their
    #: attribute ids' positions in the child's output (empty: none is)
    positions: dict = field(default_factory=dict)

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        return self.over(self.child.build(inputs))

    def over(self, df: DataFrame) -> DataFrame:
        """The step applied to ``df`` (its child's DataFrame)."""
        args, kwargs = rebound((self.args, self.kwargs), [(df, self.positions)])
        return getattr(df, self.method)(*args, **kwargs)

    def describe(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        text = ", ".join(shown)
        return f"{self.method}({text if len(text) < 120 else text[:117] + '...'})"


@dataclass(eq=False)
class NullFilter(Transform):
    """A stream-stream join's ``column IS NOT NULL`` on one of its sides
    (``operators.join.with_null_filters``), with the column it tests."""

    column: str = ""

    def under_null_filters(self, column: str) -> PlanNode:
        return self.child.under_null_filters(column) if self.column.lower() == column.lower() else self


@dataclass(eq=False)
class ScanFilter(PlanNode):
    """The filter Spark's engine gives the scan of a file source where the plan reads it
    (``runtime.scan_filters``), right above that read: part of the source's batch, not a
    step of the plan (a segment's hole, as the source is)."""

    child: "StreamingRelation"
    sql: str
    condition: Any = None                  # the Column of ``sql``

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        return self.child.build(inputs).where(self.condition)

    def describe(self) -> str:
        return f"Filter pushed to the scan: {self.sql}"


@dataclass(eq=False)
class Apply(PlanNode):
    """``frame.transform(fn)`` style steps that take a DataFrame and return one."""

    child: PlanNode
    fn: Callable[[DataFrame], DataFrame]
    name: str

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        return self.fn(self.child.build(inputs))

    def describe(self) -> str:
        return self.name


@dataclass(eq=False)
class Union(PlanNode):
    left: PlanNode
    right: PlanNode
    by_name: bool = False
    allow_missing_columns: bool = False

    @property
    def children(self):
        return (self.left, self.right)

    def build(self, inputs):
        left, right = self.left.build(inputs), self.right.build(inputs)
        if self.by_name:
            return left.unionByName(right, allowMissingColumns=self.allow_missing_columns)
        return left.union(right)

    def describe(self) -> str:
        return "UnionByName" if self.by_name else "Union"


@dataclass(eq=False)
class StaticJoin(PlanNode):
    """A join of the stream with a static DataFrame (the stream on ``stream_side``)."""

    child: PlanNode
    static: DataFrame
    on: Any
    how: str
    stream_side: str = "left"
    positions: dict = field(default_factory=dict)   # (Transform's: of the stream side)

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        stream = self.child.build(inputs)
        on = rebound(self.on, [(stream, self.positions)])
        if self.stream_side == "left":
            return stream.join(self.static, on, self.how)
        return self.static.join(stream, on, self.how)

    def describe(self) -> str:
        return f"Join {self.how}, stream on the {self.stream_side}, on {self.on!r} with a static DataFrame"


#: The metadata key of a watermarked column, and its delay in ms (Spark's EventTimeWatermark.delayKey).
WATERMARK_DELAY = "spark.watermarkDelayMs"


@dataclass(eq=False)
class Watermark(PlanNode):
    """``withWatermark``: rows pass unchanged; a batch's event times are observed
    (min, max, avg) to move the watermark after the batch.

    As in Spark, a deterministic filter right after ``withWatermark`` that does not
    refer to the event time runs before the observation: the planner moves it below
    (``plan.incremental``)."""

    child: PlanNode
    event_time: str
    delay: str
    delay_ms: int

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        return self.child.build(inputs)

    def describe(self) -> str:
        return f"EventTimeWatermark {self.event_time}, {self.delay}"



@dataclass(eq=False)
class Observe(PlanNode):
    """``observe(name, *exprs)``: named metrics of every batch, aggregated over the rows
    that pass, reported in the batch's progress ``observedMetrics`` (Spark's
    CollectMetrics). Each batch observes through an ``Observation`` of the batch's
    DataFrame (``BatchContext.observe``); the template observes by name."""

    child: PlanNode
    name: str
    exprs: tuple
    positions: dict = field(default_factory=dict)   # (Transform's)

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        df = self.child.build(inputs)
        return df.observe(self.name, *rebound(self.exprs, [(df, self.positions)]))

    def describe(self) -> str:
        return f"CollectMetrics {self.name}, [{', '.join(str(e) for e in self.exprs)}]"


class StatefulNode(PlanNode):
    """A step that keeps state across batches; the engine gives each an operator id."""

    child: PlanNode

    @property
    def children(self):
        return (self.child,)

    def watermark_column(self) -> str | None:
        """The event-time column of a watermark below this node, if the node uses it."""
        return None

    def watermarked_input(self) -> str | None:
        """The event-time column of the first watermark below this node, if any."""
        for node in self.child.nodes():
            if isinstance(node, Watermark):
                return node.event_time
        return None


@dataclass(eq=False)
class Deduplicate(StatefulNode):
    """``dropDuplicates(keys)``: the first row of each key ever seen. With a watermark,
    rows whose event time is at or before it are dropped as late; with the event-time
    column among the keys, keys behind the watermark are also evicted (Spark's rules).

    ``within_watermark``: ``dropDuplicatesWithinWatermark(keys)``, where a key is kept
    until the watermark passes the event time of its first row plus the delay."""

    child: PlanNode
    keys: tuple[str, ...]
    within_watermark: bool = False
    #: the input's event-time column and its delay, as Spark's analysis marks it (the first
    #: column with ``spark.watermarkDelayMs``: a renamed event time too; none when the
    #: column was computed anew, ``ts + INTERVAL 1 SECOND AS ts``), found at definition
    marked_event_time: tuple[str, int] | None = None

    def event_time(self) -> tuple[str, int] | None:
        """The event-time column of this node's input and its watermark's delay."""
        return self.marked_event_time

    def watermark_column(self) -> str | None:
        found = self.event_time()
        if found and not self.within_watermark and found[0] in self.keys:
            return found[0]
        return None

    def build(self, inputs):
        df = self.child.build(inputs)
        if self.within_watermark:
            return df.dropDuplicatesWithinWatermark(list(self.keys))
        return df.dropDuplicates(list(self.keys))

    def describe(self) -> str:
        name = "DeduplicateWithinWatermark" if self.within_watermark else "Deduplicate"
        return f"{name} [{', '.join(self.keys)}]"


@dataclass(eq=False)
class Aggregate(StatefulNode):
    """``groupBy(keys).agg(...)``: per key, the aggregates of every row seen so far,
    emitted by the output mode's rule (``state.aggregate_operator``)."""

    child: PlanNode
    keys: tuple                               # the user's grouping columns
    apply: Callable[[Any], DataFrame]         # GroupedData -> the batch query (for templates)
    spec: Any                                 # plan.aggregation.AggregateSpec
    event_time_key: int | None = None         # the grouping key that carries event time
    event_time_is_window: bool = False        # a window or session: its end is the time
    session_index: int | None = None          # the session_window key, if any
    session_time_column: str | None = None    # session_window(column, gap)
    grouping: Any = None                      # plan.aggregation.Grouping: groupBy, rollup, ...
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

    def build(self, inputs):
        df = self.child.build(inputs)
        return self.apply(self.grouped(df), lambda values: rebound(values, [(df, self.positions)]))

    def describe(self) -> str:
        outputs = ", ".join(name for name, _ in self.spec.outputs)
        kind = "" if self.grouping is None or not self.grouping.has_sets else f" ({self.grouping.kind})"
        return f"Aggregate{kind} [{', '.join(self.spec.key_names)}], [{outputs}]"


@dataclass(eq=False)
class FlatMapGroupsWithState(StatefulNode):
    """``groupBy(keys).applyInPandasWithState(func, ...)`` (Spark's
    FlatMapGroupsInPandasWithStateExec): per key, the user's function over the key's rows
    of the batch and its ``GroupState``; keys whose timeout passed are called with no rows
    (``state.group_state_operator``)."""

    child: PlanNode
    keys: tuple[str, ...]
    func: Callable
    output_schema: StructType
    state_schema: StructType
    func_mode: str                         # the function's output mode: append or update
    timeout: str                           # a GroupStateTimeout value
    data_columns: int | None = None        # the input's leading columns the function gets (None: all)

    def build(self, inputs):
        df = self.child.build(inputs)
        return spark_internals.empty_batch(df.sparkSession, self.output_schema)

    def describe(self) -> str:
        return (f"FlatMapGroupsInPandasWithState [{', '.join(self.keys)}], {self.func_mode}, "
                f"{self.timeout}, {getattr(self.func, '__name__', 'function')}")


@dataclass(eq=False)
class TransformWithState(StatefulNode):
    """``groupBy(keys).transformWithStateInPandas(processor, ...)`` and
    ``transformWithState`` (Spark's TransformWithStateInPandasExec): the user's
    ``StatefulProcessor`` per key, over the key's rows of the batch and its state variables,
    with timers in processing or event time (``state.transform_with_state_operator``)."""

    child: PlanNode
    keys: tuple[str, ...]
    processor: Any                         # the user's StatefulProcessor
    output_schema: StructType
    output_mode: str                       # append or update
    time_mode: str                         # none, processingtime or eventtime
    variables: tuple                       # StateVariable, as the processor's init declares them
    rows_api: bool = False                 # transformWithState: Rows in and out
    initial_state: Any = None              # a DataFrame of initial state, read in the query's first batch
    initial_keys: tuple[str, ...] = ()     # the columns it is grouped by
    data_columns: int | None = None        # the input's leading columns the processor gets (None: all)
    event_time_column: str | None = None   # eventTimeColumnName: the output's watermarked column

    def event_time_delay_ms(self) -> int:
        """The delay of the watermark nearest below (Spark's UpdateEventTimeWatermarkColumn
        copies it onto ``event_time_column``)."""
        return next(n.delay_ms for n in self.child.nodes() if isinstance(n, Watermark))

    def output_watermarked(self) -> bool:
        """Whether operators above see a watermark out of this one: Spark passes its input
        watermark on, except in processing time."""
        return self.time_mode != "processingtime"

    def build(self, inputs):
        df = self.child.build(inputs)
        return spark_internals.empty_batch(df.sparkSession, self.output_schema)

    def describe(self) -> str:
        api = "TransformWithState" if self.rows_api else "TransformWithStateInPandas"
        return (f"{api} [{', '.join(self.keys)}], {self.time_mode}, {self.output_mode}, "
                f"{type(self.processor).__name__}")


@dataclass(eq=False)
class StreamingLimit(StatefulNode):
    """``limit(n)`` of a stream whose rows are appends (Spark's StreamingGlobalLimitExec over
    a local limit): at most n rows over the whole run, the first ones of each batch in the
    batch's order. Its state is one key (null) holding how many rows it let through."""

    child: PlanNode
    limit: int

    def build(self, inputs):
        return self.child.build(inputs).limit(self.limit)

    def describe(self) -> str:
        return f"StreamingGlobalLimit {self.limit}"


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
    side_qualifiers: tuple = ((), ())      # each side's columns' qualifiers (``l`` of ``l.id``)
    positions: tuple = ({}, {})            # (Transform's: of the condition's Columns, per side)

    def __post_init__(self):
        if not self.right_keys:
            self.right_keys = self.keys

    @property
    def using(self) -> bool:
        return self.condition is None

    @property
    def children(self):
        return (self.left, self.right)

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

    def watermark_key(self) -> int | None:
        """The index of the join key that is a side's watermarked event time (Spark looks
        at the left keys first), or None."""
        for side, names in ((0, self.keys), (1, self.right_keys)):
            column = self.side_event_time(side)
            lowered = [k.lower() for k in names]
            if column is not None and column.lower() in lowered:
                return lowered.index(column.lower())
        return None

    def value_watermark_ms(self, side: int, watermark_ms: int) -> int | None:
        """Spark's state value watermark of a side (StreamingJoinHelper): from each time
        comparison ``other.t + c1 < this.t + c2`` (or ``<=``, or the same turned around)
        where ``other.t`` is the other side's watermarked column, ``watermark + c1 - c2``
        in ms (minus 1 for ``<=``); the smallest. Rows of this side whose watermarked
        column is at or before it can meet no later row. None when no comparison gives one
        or a side has no watermark."""
        this_time, other_time = self.side_event_time(side), self.side_event_time(1 - side)
        if this_time is None or other_time is None:
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
        on = list(self.keys) if self.using else rebound(self.condition, list(zip((left, right), self.positions)))
        return left.join(right, on, self.how)

    def describe(self) -> str:
        on = ", ".join(self.keys) if self.using else str(self.condition)
        return f"StreamingSymmetricHashJoin {self.how}, [{on}]"
