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

import copy
import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from microbatch import spark_internals

log = logging.getLogger(__name__)
_relation_ids = itertools.count()
_watermark_ids = itertools.count()


def rebound(values: Any, sides: list[tuple[DataFrame, dict]]) -> Any:
    """``values`` (a step's arguments) over the DataFrames ``sides`` pairs with the
    positions of the attributes the step's Columns were bound to when it was defined
    (``spark_internals.rebound``); unchanged when none was."""
    if not any(positions for _, positions in sides):
        return values
    return spark_internals.rebound(values, [(df, positions) for df, positions in sides if positions])


def filters_reading_back(df: DataFrame, texts: list[str]) -> list[bool]:
    """Which filters (SQL text, as Spark's optimizer printed them) read back over ``df``'s
    columns: one analysis of their conjunction where all do, else one each."""
    try:
        df.where(F.expr(" AND ".join(f"({text})" for text in texts)))
        return [True] * len(texts)
    except Exception:  # Spark's analysis error: one of them does not read back
        log.debug("Filters %s do not all read back over %s", texts, df, exc_info=True)
    readable = []
    for text in texts:
        try:
            df.where(F.expr(text))
            readable.append(True)
        except Exception:  # a part that does not read back (a Python UDF's)
            log.debug("Filter %s does not read back over %s", text, df, exc_info=True)
            readable.append(False)
    return readable


class PlanNode:
    children: tuple["PlanNode", ...] = ()
    #: whether it keeps state across batches (a ``StatefulNode``)
    stateful = False

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

    def built_over(self, over: tuple, make: Callable[[], DataFrame]) -> DataFrame:
        """``make()``: the node's DataFrame over its children's DataFrames ``over``; over
        the very DataFrames of its last call, what that call made. The planner's rewrites
        build the same steps over the same inputs many times once per run (each asks Spark's
        analysis of another part of the query); DataFrames do not change, nor a node's
        arguments. (Kept outside the dataclass fields: a node made by ``replace`` starts
        afresh; ``copied`` drops it.)"""
        last = self.__dict__.get("_last_built")
        if last is not None and len(last[0]) == len(over) and all(a is b for a, b in zip(last[0], over)):
            return last[1]
        made = make()
        self.__dict__["_last_built"] = (over, made)
        return made

    def copied(self) -> "PlanNode":
        """A copy of the node that is an occurrence of its own: it shares nothing it built
        with the node (its DataFrames' attributes are its own)."""
        node = copy.copy(self)
        node.__dict__.pop("_last_built", None)
        return node

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


def stood_in(node: PlanNode) -> PlanNode:
    """``node`` as a batch Spark's optimizer reads as it reads a batch of the stream: each
    stateful node what stands for it (``StatefulNode.scan_filter_stand_in``)."""
    node = children_replaced(node, [stood_in(child) for child in node.children])
    return node.scan_filter_stand_in() if node.stateful else node


def children_replaced(node: PlanNode, children: list[PlanNode]) -> PlanNode:
    """``node`` with other children (the same node when they are its own)."""
    if list(node.children) == children:
        return node
    if len(children) == 2:
        return dataclasses.replace(node, left=children[0], right=children[1])
    return dataclasses.replace(node, child=children[0])



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

    def empty_batch(self, spark: Any, schema: StructType | None = None) -> DataFrame:
        """A batch of no rows with the source's columns (or ``schema``'s), hidden ones
        included (its provider's; a MemoryStream has none); tagged with the source's plan id
        where a ``metadataColumn`` names its hidden column by it (``hidden_column_plan_id``)."""
        schema = schema or self.schema
        if self.provider is None:
            return spark_internals.empty_batch(spark, schema)
        batch = self.provider.empty_batch(spark, self.options, schema)
        plan_id = self.__dict__.get("_hidden_column_plan_id")
        return batch if plan_id is None else spark_internals.with_plan_id(batch, plan_id)

    def hidden_column_plan_id(self) -> int:
        """The plan id (Spark Connect's PLAN_ID_TAG) by which a frame's ``metadataColumn``
        names this source's hidden column where its name alone would not say which side of a
        join it is (sides whose columns have no qualifier): from now on, every placeholder
        of the source's batches is tagged with it (``empty_batch``). Kept outside the
        dataclass fields, as a copy (``copied``) keeps it: the same source read twice."""
        return self.__dict__.setdefault("_hidden_column_plan_id", spark_internals.PLAN_IDS_FROM + self.id)

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
        """The step applied to ``df`` (its child's DataFrame; ``built_over``)."""
        def made() -> DataFrame:
            args, kwargs = rebound((self.args, self.kwargs), [(df, self.positions)])
            return getattr(df, self.method)(*args, **kwargs)
        return self.built_over((df,), made)

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
    #: the filter of a batch some of whose sources have no data (``chosen``): given
    #: those sources, the Column (or None); where absent, ``condition`` in every batch
    choose: Callable[[frozenset], Any] | None = None

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        df = self.child.build(inputs)
        return self.built_over((df,), lambda: df.where(self.condition))

    def chosen(self, empty: frozenset) -> Any:
        """The filter Spark gives the scan in a batch where the sources ``empty`` have no
        data (Spark's optimizer reads such a source as an empty relation, whose filters it
        drops before it infers others from them): a Column, or None."""
        return self.condition if self.choose is None or not empty else self.choose(empty)

    def describe(self) -> str:
        return f"Filter pushed to the scan: {self.sql}"


@dataclass(eq=False)
class BatchFilter(PlanNode):
    """A filter Spark's optimizer infers from the rest of the query (a stream-stream join's
    side filtered by what the other side's filters say of its keys: InferFiltersFromConstraints),
    which can change from batch to batch: Spark's optimizer makes an empty relation of a
    source without data in the batch, and of the projections and filters over it
    (PropagateEmptyRelation), before it infers filters from them. ``choose`` gives the
    filter (a Column, or None) from the sources without data; ``sql`` describes the one
    of a batch where every source has data. Built by the planner, per batch (``for_batch``)."""

    child: PlanNode
    sql: str
    choose: Callable[[frozenset], Any]

    @property
    def children(self):
        return (self.child,)

    def build(self, inputs):
        df = self.child.build(inputs)
        return self.built_over((df,), lambda: self.for_batch(df, frozenset()))

    def for_batch(self, df: DataFrame, empty: frozenset) -> DataFrame:
        condition = self.choose(empty)
        return df if condition is None else df.where(condition)

    def describe(self) -> str:
        return f"Filter inferred by Spark's optimizer: {self.sql}"


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
        static = spark_internals.in_session(self.static, stream.sparkSession)
        if self.stream_side == "left":
            return stream.join(static, on, self.how)
        return static.join(stream, on, self.how)

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
    (``runtime.incremental``)."""

    child: PlanNode
    event_time: str
    delay: str
    delay_ms: int
    #: which ``withWatermark`` it is: the copies the planner makes of one (a stream branched
    #: into two paths, each its own operators) keep it, and are one watermark, as Spark 4's
    #: WatermarkTracker keys its watermarks by the logical node's id
    node_id: int = field(default_factory=lambda: next(_watermark_ids))

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
    """A step that keeps state across batches (Spark's stateful operators); the planner
    gives each an operator id.

    Each kind is defined in its operator's home (``operators/<kind>``), beside its step and
    its task, and answers there for its own policy: the methods named in ``POLICY``, as each
    of Spark's stateful execs answers for itself (``produceOutputWatermark``,
    ``shouldRunAnotherBatch``). The runtime, the checks and the api ask them and never look
    at the kind. A kind that leaves one of them to this class fails when it is defined, at
    import, not in a batch."""

    stateful = True
    #: Spark's checker counts it as a streaming aggregation (complete mode, sorting, limits)
    aggregation = False
    #: its place in the query's template (``build``) is a relation of its output alone, so
    #: the steps below it are not in the template's plan (a Python function's operator)
    template_hides_input = False
    #: a shape of it microbatch does not plan yet, refused when the query starts, after the
    #: rules of Spark's checker (which refuse first on Spark's engine); set where defined
    deferred_refusal: Exception | None = None
    child: PlanNode

    #: what every kind answers for itself
    POLICY = ("make_step", "state_partitions", "output_watermark_ms", "evicts_with", "runs_every_batch",
              "statistics_inputs", "output_mode_refusal", "affected_by_late_rows", "connect_refusal",
              "spark_state_refusal")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [name for name in StatefulNode.POLICY if getattr(cls, name) is getattr(StatefulNode, name)]
        if missing:
            raise TypeError(f"The stateful operator {cls.__name__} does not answer for {', '.join(missing)}: "
                            "define each in its home in operators/ (plan.logical.StatefulNode says what each is)")

    @property
    def children(self):
        return (self.child,)

    # -- the policy each kind answers for -------------------------------------------------
    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> Any:
        """Its planning step for a query run (an ``operators.base.StatefulStep``)."""
        raise NotImplementedError

    def state_partitions(self, shuffle_partitions: int) -> int:
        """How many state stores (partitions) it has, given the checkpoint's shuffle partitions."""
        raise NotImplementedError

    def output_watermark_ms(self, input_ms: int) -> int | None:
        """The watermark an operator above it sees, given the watermark of its input (Spark's
        ``produceOutputWatermark``); None: none passes it."""
        raise NotImplementedError

    def evicts_with(self, output_mode: str) -> bool:
        """Whether it evicts state (or fires timers) when the watermark below it moves, in
        ``output_mode`` (Spark's ``shouldRunAnotherBatch`` of the operator)."""
        raise NotImplementedError

    def runs_every_batch(self) -> bool:
        """Whether a trigger with no data must run a batch whatever the watermark (timers
        in processing time may fire in any batch)."""
        raise NotImplementedError

    def statistics_inputs(self, watermark_below: Callable[["PlanNode"], Any]) -> dict[int, tuple]:
        """The watermarks whose event-time statistics its tasks may compute, by input index:
        (the watermark, the steps between), where every row the watermark sees reaches the
        task with its event time. ``watermark_below(node)`` gives the watermark under
        ``node`` through steps that may only project, with them, or None."""
        raise NotImplementedError

    def output_mode_refusal(self, mode: str, aggregations: list["StatefulNode"]) -> Exception | None:
        """Spark's error (its UnsupportedOperationChecker's) for this operator in output
        mode ``mode``, or None; ``aggregations``: the plan's aggregations, the top one first."""
        raise NotImplementedError

    def affected_by_late_rows(self) -> bool:
        """Whether rows an aggregation below emits after the watermark passed them (update
        or complete mode) would be dropped or wrongly kept here (Spark's
        ``checkStreamingQueryGlobalWatermarkLimit``)."""
        raise NotImplementedError

    def connect_refusal(self, output_mode: str) -> str | None:
        """What of it does not run over Spark Connect yet (named in the refusal), or None."""
        raise NotImplementedError

    def spark_state_refusal(self, recorded_conf: Mapping[str, str], provider: str) -> str | None:
        """Why its state cannot move to or from Spark's state files (its layout there, the
        state format the checkpoint's confs record, the provider), or None."""
        raise NotImplementedError

    # -- answers most kinds share -----------------------------------------------------------
    def hidden_column_children(self) -> tuple[tuple[int, int | None], ...]:
        """The children whose hidden columns (a file source's ``_metadata``) a step above
        may read through it, as Spark's logical node gives their ``metadataOutput`` (a
        Deduplicate: its child; a Join: both sides; not an Aggregate), each with how many
        of its output's columns are that child's, in order (None: all of them); none: a
        step above reads no hidden column through it."""
        return ()

    def child_column_qualifiers(self, child: int) -> tuple[tuple[str, ...], ...]:
        """The qualifiers of the columns of its output that are child ``child``'s, as the
        query was written (``a`` of a join side's ``a.id``), which a batch's output may have
        lost (a prepared segment's binding drops them); () where it does not say."""
        return ()

    def output_marks_event_time(self) -> bool:
        """Whether its output carries the event-time mark of its input (a ``withWatermark``
        above it would redefine the watermark)."""
        return True

    def planning_refusal(self) -> Exception | None:
        """An error Spark's planner raises for it at start, after the output-mode checks."""
        return None

    def reports_statistics(self, watermark: "Watermark", schema: StructType) -> bool:
        """Whether its tasks can compute the statistics of ``watermark`` (one of
        ``statistics_inputs``) from rows of ``schema``."""
        return True

    def scan_filter_stand_in(self) -> "PlanNode":
        """What stands for it in the batch plans Spark's optimizer reads (for the filters a
        file scan gets, ``runtime.scan_filters``; a grouping set's filter; the columns a
        join's sides keep, ``stood_in``): itself, or a step that stops filters where
        Spark's streaming operator stops them (and builds as a batch where the operator
        does not, as ``dropDuplicatesWithinWatermark``)."""
        return self

    def pruning_stand_in(self) -> "PlanNode":
        """What stands for it in the batch plans whose optimizer says which columns Spark
        prunes from an operator's input (``joins_times_pruned``): its
        ``scan_filter_stand_in``, which must read every column Spark's streaming operator
        reads (its keys)."""
        return self.scan_filter_stand_in()

    def watermark_column(self) -> str | None:
        """The event-time column of a watermark below this node, if the node uses it."""
        return None

    def watermarked_input(self) -> str | None:
        """The event-time column of the first watermark below this node, if any."""
        for node in self.child.nodes():
            if isinstance(node, Watermark):
                return node.event_time
        return None
