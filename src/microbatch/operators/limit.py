"""A streaming limit (Spark's ``StreamingGlobalLimitExec``): its step, its task, its state.

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
from microbatch.operators.base import OperatorBatch, StatefulStep, StateTask, task_partition

KEY_SCHEMA = pa.schema([pa.field("key", pa.null())])
VALUE_SCHEMA = pa.schema([pa.field("value", pa.int64())])
KEY = (None,)


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
            mapped = inputs[0].limit(limit).mapInArrow(task, schema)
            return mapped, spark_internals.map_in_arrow_function(mapped, schema)

        return self.bind(inputs, task, build)

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        return StructType([StructField("key", NullType())]), StructType([StructField("value", LongType())])
