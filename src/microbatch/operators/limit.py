"""A streaming limit (Spark's ``StreamingGlobalLimitExec``), its home: its plan node and
policy, its step, its task, its state and that state's layout in Spark's engine
(``LimitLayout``).

The step is the batch's plain limit (one partition, the batch's order), then one task: the batch's rows (already limited to ``n`` by a
plain limit, in the batch's order) arrive in one partition; the task reads how many rows
the query let through before (the store's one key, null), passes rows until the total
reaches ``n``, stores the new total when it grew, and commits version N+1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, NullType, StructField, StructType

from microbatch import spark_internals
from microbatch.errors import AnalysisException
from microbatch.operators.base import OperatorBatch, StatefulStep, StateLayout, StateTask, task_partition
from microbatch.operators.spark_stores import SparkStore
from microbatch.plan.logical import PlanNode, StatefulNode, Transform, children_replaced

KEY_SCHEMA = pa.schema([pa.field("key", pa.null())])
VALUE_SCHEMA = pa.schema([pa.field("value", pa.int64())])
KEY = (None,)


@dataclass(eq=False)
class StreamingLimit(StatefulNode):
    """``limit(n)`` of a stream whose rows are appends (Spark's StreamingGlobalLimitExec over
    a local limit): at most n rows over the whole run, the first ones of each batch in the
    batch's order. Its state is one key (null) holding how many rows it let through."""

    child: PlanNode
    limit: int

    # -- its policy (plan.logical.StatefulNode) ----------------------------------------------
    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> "LimitStep":
        return LimitStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        return 1    # (its one count, in one task)

    def output_watermark_ms(self, input_ms: int) -> int | None:
        return input_ms

    def evicts_with(self, output_mode: str) -> bool:
        return False

    def runs_every_batch(self) -> bool:
        return False

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        return {}

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        if mode == "update":
            return AnalysisException("Limits are not supported on streaming DataFrames/Datasets in Update output mode;")
        return None

    def affected_by_late_rows(self) -> bool:
        return False

    def connect_refusal(self, output_mode: str) -> str | None:
        return None

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        return None

    def build(self, inputs):
        return self.child.build(inputs).limit(self.limit)

    def describe(self) -> str:
        return f"StreamingGlobalLimit {self.limit}"


@dataclass(frozen=True)
class LimitTask(StateTask):
    """The function of the limit's single task (shipped to it by cloudpickle)."""

    limit: int = 0

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = task_partition()
        started = time.monotonic()
        store = self.store(partition, KEY_SCHEMA, VALUE_SCHEMA)
        before = (store.get(KEY) or (0,))[0]
        total = before
        for batch in batches:
            room = self.limit - total
            if room > 0 and batch.num_rows:
                passed = batch.slice(0, room)
                total += passed.num_rows
                yield passed
        if total > before:
            store.put(KEY, (total,))
        updates_ms = (time.monotonic() - started) * 1000
        store.commit()
        self.finish(partition, store.metrics(), numRowsUpdated=int(total > before),
                    allUpdatesTimeMs=int(updates_ms))


class LimitStep(StatefulStep):
    """The batch's first ``n`` rows (a plain limit: one partition, the batch's order), then
    the task that lets through only what the run's total leaves room for."""

    name = "globalLimit"

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        limit = self.node.limit
        task = LimitTask(self.state_root, self.operator_id, batch.batch_id, batch.store_conf, batch.metrics,
                         limit=limit)

        def build(inputs: list[DataFrame], task: LimitTask):
            schema = inputs[0].schema
            mapped = spark_internals.map_state_task(inputs[0].limit(limit), task, schema)
            return mapped, spark_internals.map_in_arrow_function(mapped, schema)

        return self.bind(inputs, task, build)

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        return StructType([StructField("key", NullType())]), StructType([StructField("value", LongType())])


class LimitLayout(StateLayout):
    """A null key -> the rows emitted so far, in both engines, in partition 0 only."""

    names = ("globalLimit",)
    known_as = "limits"
    one_partition = True

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        return [SparkStore("default", key, value, key, value)]


def limits_over_appends(plan: PlanNode) -> PlanNode:
    """A rewrite the planner makes once per run: in append mode a stateful operator's output is appends too, so a ``limit(n)`` above
    one (written as a plain limit, which is what it is in complete mode) is Spark's
    streaming limit, with its count in state."""
    plan = children_replaced(plan, [limits_over_appends(c) for c in plan.children])
    if isinstance(plan, Transform) and plan.method == "limit" \
            and any(n.stateful for n in plan.child.nodes()):
        return StreamingLimit(plan.child, plan.args[0] if plan.args else plan.kwargs["num"])
    return plan
