"""The state step of a streaming limit: one Spark task over the batch's rows.

Spark's ``StreamingGlobalLimitExec``: the batch's rows (already limited to ``n`` by a
plain limit, in the batch's order) arrive in one partition; the task reads how many rows
the query let through before (the store's one key, null), passes rows until the total
reaches ``n``, stores the new total when it grew, and commits version N+1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from microbatch.state.store import StateStoreConf, StateStoreId, end_task, load_provider, task_metrics

KEY_SCHEMA = pa.schema([pa.field("key", pa.null())])
VALUE_SCHEMA = pa.schema([pa.field("value", pa.int64())])
KEY = (None,)


@dataclass(frozen=True)
class LimitTask:
    """The function of the limit's single task (shipped to it by cloudpickle)."""

    state_root: str
    operator_id: int
    version: int
    limit: int
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        started = time.monotonic()
        store = load_provider(StateStoreId(self.state_root, self.operator_id, partition),
                              KEY_SCHEMA, VALUE_SCHEMA, self.conf).get_store(self.version)
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
        end_task(self.metrics, task_metrics(partition, store.metrics(), numRowsUpdated=int(total > before),
                                      allUpdatesTimeMs=int(updates_ms)))
