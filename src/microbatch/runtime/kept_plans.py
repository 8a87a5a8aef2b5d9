"""The plans a run keeps across batches: a query without state, ``observe`` or current
time (``IncrementalExecution.keeps_batch_plan``), whose every source binds its batch at
run time (``Source.bound_batch``), into a sink that may run one DataFrame again
(``Sink.runs_kept_plans``), keeps its first batch's DataFrame for each shape of the
sources' batches and runs it again: Spark plans it once per run, not once per batch."""
from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import SparkSession

from microbatch import spark_internals
from microbatch.runtime.incremental import PlannedBatch
from microbatch.sinks.base import Sink
from microbatch.sources.base import BoundBatch, Source
from microbatch.util import conf_bool

log = logging.getLogger(__name__)

#: Whether a stateless query over sources that bind their batches at run time plans its
#: batch once and runs that plan for each batch ("a plan kept across batches", below)
KEEP_BATCH_PLAN_CONF = "spark.sql.streaming.microbatch.keepBatchPlan.enabled"
#: the most plans a run keeps, the oldest dropped first
KEPT_PLANS = 8


class KeptPlans:
    """A run's kept plans: the batch planned for each tuple of the sources' shapes.
    Keeps none until ``decide`` says the run may."""

    def __init__(self) -> None:
        self.plans: dict[tuple, PlannedBatch] = {}
        self.keeps = False

    def decide(self, keeps_batch_plan: bool, sink: Sink, session: SparkSession) -> None:
        """Whether this run keeps plans (once the run is planned): the planner's
        ``keeps_batch_plan``, a sink that runs kept plans, a classic session and the conf
        (``KEEP_BATCH_PLAN_CONF``, default true)."""
        self.keeps = (keeps_batch_plan and sink.runs_kept_plans
                      and not spark_internals.is_connect(session)
                      and conf_bool(session, KEEP_BATCH_PLAN_CONF, True))
        self.plans = {}

    def bound_batches(self, sources: list[Source], available_offsets: dict[int, Any],
                      committed_offsets: dict[int, Any]) -> list[BoundBatch] | None:
        """Every source's batch bound at run time (``Source.bound_batch``), or None: the
        batch gets DataFrames of its own. Only for a plan that keeps (``keeps_batch_plan``),
        a sink that may run one DataFrame again (``Sink.runs_kept_plans``), and a batch
        where every source has rows."""
        if not self.keeps:
            return None
        bound = []
        for i, source in enumerate(sources):
            end, start = available_offsets.get(i), committed_offsets.get(i)
            if end is None or end == start:
                return None
            binding = source.bound_batch(source.initial_offset() if start is None else start, end)
            if binding is None:
                return None
            bound.append(binding)
        return bound

    def kept(self, bound: list[BoundBatch]) -> PlannedBatch | None:
        """The plan kept for batches of these bound batches' shapes, if any."""
        return self.plans.get(tuple(b.shape for b in bound))

    def keep(self, bound: list[BoundBatch], planned: PlannedBatch) -> None:
        """Keep the batch's DataFrame for the next batches of these shapes (up to
        ``KEPT_PLANS`` shapes: a source's partitions without new rows make a batch of
        another shape), if Spark's plan of it gives a new batch when run again
        (``spark_internals.runs_again_alike``); if not, no batch of this run keeps one."""
        shapes = tuple(b.shape for b in bound)
        if spark_internals.runs_again_alike(planned.df):
            if len(self.plans) >= KEPT_PLANS:
                self.plans.pop(next(iter(self.plans)))
            self.plans[shapes] = planned
            log.info("Batch %d's plan is kept for the next batches of %s", planned.batch_id, shapes)
        else:
            self.keeps = False
            self.plans = {}
            log.info("Batch %d's plan cannot run again alike (an exchange, a subquery or a scan "
                     "of its own): every batch is planned anew", planned.batch_id)
