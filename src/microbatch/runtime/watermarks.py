"""WatermarkTracker: the query's event-time watermark, its one owner (Spark's
WatermarkTracker and WatermarkPropagator): restored from the checkpoint at a restart, its
policy, its propagation to each stateful operator, and its advance after each batch.

Each ``withWatermark`` node gives a watermark: the largest event time it has seen, minus
its delay. After each batch the tracker takes each watermark's event-time statistics of
the batch, keeps each watermark's largest value, and moves the query's watermark to the
smallest of them (``spark.sql.streaming.multipleWatermarkPolicy=min``; ``max`` takes the
largest). It never moves back. Batch N runs with the watermark the batches before it
reached (recorded in ``offsets/N``); rows at or before the watermark batch N-1 ran with
are late in batch N (``previous_ms``), state at or before batch N's is evicted
(``operator_watermarks``: both propagated to each operator, as Spark 3.4+ propagates
them: a watermark node gives the query's watermark; a stateful operator gives what it may
still emit, as it answers, ``output_watermark_ms``; an operator's input is the smallest of
its children's). A trigger with no data runs a batch when some operator would evict with
the watermark it would run with (``requires_another_batch``).

Where a watermark's statistics come from (max for the watermark; max, min, avg for the
progress ``eventTime``):

- from the stateful operator right above it (``statistics_of``), when every row the
  watermark sees reaches that operator with its event time: an aggregation's partial
  aggregation, a deduplication's row filter or an applyInPandasWithState's task, through
  steps that only project (``withColumn``, ``select``, renames, drops: Spark's analysed plan
  of the steps, checked once per run, must be projections down to the watermark's rows
  with the event-time column passed through unchanged), or a stream-stream join's task
  for each side (through the join's own null filter on the event time). The tasks report
  them under their operator's metrics (``operators.event_time_stats``);
- otherwise from an ``Observation`` at the watermark (``observe``), a node that stops
  Spark's whole-stage code generation (150-200 ms a 1M-row batch). A filter between the
  watermark and the operator keeps the ``Observation``; the planner first moves below the
  watermark the filters that do not use the event time, as Spark's optimizer does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.operators.base import ms_column
from microbatch.operators.event_time_stats import reported_statistics
from microbatch.plan.logical import PlanNode, StatefulNode, Transform, Watermark
from microbatch.runtime.progress import format_timestamp
from microbatch.runtime.segments import PreparedSegment

log = logging.getLogger(__name__)

#: DataFrame methods that may only project a watermark's rows; whether they do, Spark's
#: analysed plan of the steps says (``spark_internals.projections_keep_column``)
PROJECTING_METHODS = frozenset({"select", "selectExpr", "withColumn", "withColumns", "withColumnRenamed",
                                "withColumnsRenamed", "drop", "toDF", "alias", "withMetadata"})


def watermark_below(node: PlanNode) -> tuple[Watermark, tuple[Transform, ...]] | None:
    """The watermark under ``node`` (a stateful operator's input) when only steps that may
    project lie between, with those steps (top-down); else None."""
    steps: list[Transform] = []
    while True:
        if isinstance(node, Watermark):
            return node, tuple(steps)
        if isinstance(node, PreparedSegment):
            node = node.template
        elif type(node) is Transform and node.method in PROJECTING_METHODS:
            steps.append(node)
            node = node.child
        else:
            return None


def statistics_candidates(stateful: list[StatefulNode]) -> dict[Watermark, tuple[Transform, ...]]:
    """Watermarks whose event-time statistics the stateful operator above can compute, with
    the steps between them, as each operator answers (``statistics_inputs``): every row of
    the watermark reaches the operator's partial aggregation or its task (right below a
    side of a stream-stream join; below an aggregation, a deduplication or an
    applyInPandasWithState through steps that may only project, which the tracker checks,
    once per run, do and keep its column)."""
    found: dict[Watermark, tuple[Transform, ...]] = {}
    for n in stateful:
        found.update(n.statistics_inputs(watermark_below).values())
    return found


@dataclass(frozen=True)
class OperatorWatermarks:
    """The watermarks an operator uses in a batch, in ms: rows at or before ``late_ms``
    are dropped as late, state at or before ``eviction_ms`` is evicted."""

    late_ms: int
    eviction_ms: int


class WatermarkTracker:
    """The query's watermark, each ``withWatermark``'s, each operator's, and where their
    statistics come from."""

    def __init__(self, policy: str = "min"):
        self.policy = policy.lower()
        self.watermark_ms = 0      # the query's watermark: what the next batch runs with
        self.running_ms = 0        # what the running batch runs with (``offsets/N`` records it)
        self.previous_ms = 0       # what the batch before the running one ran with (late rows)
        self.nodes: list[Watermark] = []
        self.ids: dict[Watermark, int] = {}            # each watermark node's place in the plan
        self._identity: dict[Watermark, Any] = {}      # which watermark a node is (``_values``' key)
        self._values: dict[Any, int] = {}              # each watermark's value
        self._candidates: dict[Watermark, tuple] = {}
        self._plan: PlanNode | None = None
        self._stateful: list[StatefulNode] = []
        self._reportable: dict[int, bool] = {}         # per watermark: may the operator report

    # -- at a restart, and for a run ----------------------------------------------------------
    def restore(self, running_ms: int, ran_before_ms: int | None, committed_next_ms: int | None) -> None:
        """The watermarks the checkpoint records: the one ``offsets/N`` gives the last
        planned batch N (``running_ms``), the one batch N-1 ran with (rows behind it are
        late in N; None for batch 0), and, when N was committed, the one its commit gives
        the next batch (``committed_next_ms``: N+1 runs next)."""
        self.watermark_ms = self.running_ms = running_ms
        if ran_before_ms is not None:
            self.previous_ms = ran_before_ms
        if committed_next_ms is not None:
            self.previous_ms = running_ms
            self.watermark_ms = max(running_ms, committed_next_ms)

    def plan(self, plan: PlanNode, nodes: list[Watermark], stateful: list[StatefulNode], policy: str = "min") -> None:
        """The run's plan (the planner's), its watermarks (in plan order: their ids), its
        stateful operators and the policy (``spark.sql.streaming.multipleWatermarkPolicy``,
        as the checkpoint fixed it)."""
        self._plan = plan
        self.policy = policy.lower()
        self.nodes = list(nodes)
        self.ids = {node: i for i, node in enumerate(self.nodes)}
        # Spark 4 keys a watermark by its logical node, which the copies of one share (the
        # largest of their event times moves it); Spark 3.5 by its place in the physical plan
        shared = spark_internals.running_version().at_least_4
        self._identity = {node: node.node_id if shared else i for i, node in enumerate(self.nodes)}
        self._stateful = list(stateful)
        self._candidates = statistics_candidates(self._stateful)
        self._reportable = {}

    # -- propagation to the operators ---------------------------------------------------------
    def begin_batch(self, running_ms: int) -> None:
        """The batch about to be planned runs with ``running_ms`` (its ``offsets/N``)."""
        self.running_ms = running_ms

    def input_watermarks(self, watermark_ms: int) -> dict[StatefulNode, int | None]:
        """Spark's propagation of the query's watermark ``watermark_ms``: per stateful
        operator, the watermark of its input (None: no watermark below it)."""
        found: dict[StatefulNode, int | None] = {}

        def output(node: PlanNode) -> int | None:
            below = [w for w in (output(c) for c in node.children) if w is not None]
            given = min(below) if below else None
            if isinstance(node, Watermark):
                return watermark_ms
            if node.stateful:
                found[node] = given
                return None if given is None else node.output_watermark_ms(given)
            return given

        if self._plan is not None:
            output(self._plan)
        return found

    def operator_watermarks(self, late_ms: int | None = None,
                            eviction_ms: int | None = None) -> dict[StatefulNode, OperatorWatermarks]:
        """Each operator's watermarks: rows are late against the propagation of the
        watermark the batch before ran with (``late_ms``), state is evicted against that of
        the running batch's (``eviction_ms``)."""
        late = self.input_watermarks(self.previous_ms if late_ms is None else late_ms)
        evict = self.input_watermarks(self.running_ms if eviction_ms is None else eviction_ms)
        return {node: OperatorWatermarks(late.get(node) or 0, evict.get(node) or 0) for node in self._stateful}

    def requires_another_batch(self, output_mode: str, new_watermark_ms: int | None = None,
                               eviction_ms: int | None = None) -> bool:
        """Spark's IncrementalExecution.shouldRunAnotherBatch: whether some operator would
        evict with the watermark the next batch runs with (``new_watermark_ms``, by default
        the query's) that it does not with the running batch's (``eviction_ms``), as each
        operator answers (``evicts_with``, ``runs_every_batch``)."""
        now = self.input_watermarks(self.running_ms if eviction_ms is None else eviction_ms)
        then = self.input_watermarks(self.watermark_ms if new_watermark_ms is None else new_watermark_ms)
        if any(node.runs_every_batch() for node in self._stateful):
            return True   # Spark's rule: timeouts in processing time may fire in any batch
        return any(now.get(node) is not None and then[node] > now[node] and node.evicts_with(output_mode)
                   for node in self._stateful)

    # -- per batch, while it is planned ---------------------------------------------------
    def observe(self, node: Watermark, df: DataFrame, batch_id: int, observations: dict) -> DataFrame:
        """``df`` (the watermark's rows), with an ``Observation`` of its event-time
        statistics (added to ``observations``) unless the operator above computes them."""
        if node in self._candidates and self._operator_reports(node, df):
            return df
        observation = Observation(f"microbatch_event_time_{self.ids[node]}_{batch_id}")
        observations[node] = observation
        ms = ms_column(node.event_time)
        return df.observe(observation, F.max(ms).alias("max"), F.min(ms).alias("min"),
                          F.avg(ms).alias("avg"), F.count(ms).alias("count"))

    def statistics_of(self, node: StatefulNode, observations: dict) -> dict[int, Watermark]:
        """For a stateful operator being planned: the watermark right below each of its
        inputs (by index) whose statistics its task may compute this batch (one the
        tracker did not observe)."""
        return {index: w for index, (w, _) in node.statistics_inputs(watermark_below).items()
                if w in self._candidates and w not in observations}

    def _operator_reports(self, node: Watermark, df: DataFrame) -> bool:
        """Whether the operator above can compute ``node``'s statistics from its rows
        (``df``: the watermark's), decided once per run: the steps between, replayed over
        ``df``, only project its rows and keep its event-time column as it is; an
        aggregation, dedup or applyInPandasWithState computes them from any event time; a
        join's task from a timestamp column (a window's end it leaves to an Observation)."""
        key = self.ids[node]
        if key not in self._reportable:
            self._reportable[key] = self._reports(node, df, self._candidates[node])
        return self._reportable[key]

    def _reports(self, node: Watermark, df: DataFrame, steps: tuple) -> bool:
        if steps:
            projected = df
            try:
                for step in reversed(steps):
                    projected = step.over(projected)
            except AnalysisException:   # (a step reads what only its segment's binding gives: _metadata)
                return False
            if not spark_internals.projections_keep_column(projected, df, node.event_time):
                return False
        return all(op.reports_statistics(node, df.schema) for op in self._stateful
                   if any(w is node for w, _ in op.statistics_inputs(watermark_below).values()))

    # -- after the batch ----------------------------------------------------------------------
    def advance(self, observations: dict, reported: dict, observed: Callable[[Observation], dict | None],
                metrics_of: Callable[[int], dict]) -> dict | None:
        """Move the watermark by the batch's event-time statistics; return the progress
        ``eventTime`` (None without a watermark). ``observations``: watermark -> its Observation; ``reported``:
        watermark -> (operator id, tag) of the statistics an operator's tasks reported;
        ``observed`` reads an Observation, ``metrics_of`` an operator's metrics."""
        statistics: list[tuple[Watermark, Any]] = [(node, observed(o)) for node, o in observations.items()]
        statistics += [(node, reported_statistics(metrics_of(op), tag)) for node, (op, tag) in reported.items()]
        merged: dict[str, Any] = {}   # the first watermark (plan order) that saw rows
        for node, stats in sorted(statistics, key=lambda item: self.ids[item[0]]):
            if not stats or not stats.get("count"):
                continue
            index = self._identity[node]
            candidate = int(stats["max"]) - node.delay_ms
            self._values[index] = max(self._values.get(index, candidate), candidate)
            if not merged:   # progress shows the first watermark's statistics, as Spark's does
                merged = {"max": int(stats["max"]), "min": int(stats["min"]),
                          "avg": float(stats["avg"]), "count": int(stats["count"])}
        for node in self.nodes:     # (a watermark that has seen no rows yet counts as 0, as in Spark)
            self._values.setdefault(self._identity[node], 0)
        if self._values:
            values = self._values.values()
            chosen = max(values) if self.policy == "max" else min(values)
            if chosen > self.watermark_ms:
                log.info("Updating event-time watermark from %d to %d ms", self.watermark_ms, chosen)
                self.watermark_ms = chosen
            else:
                log.debug("Event time didn't move: %d <= %d", chosen, self.watermark_ms)
        self.previous_ms = self.running_ms
        if not self.nodes:
            return None
        event_time = {"watermark": format_timestamp(self.running_ms)}
        if merged:
            event_time.update(avg=format_timestamp(int(merged["avg"])), max=format_timestamp(merged["max"]),
                              min=format_timestamp(merged["min"]))
        return dict(sorted(event_time.items()))
