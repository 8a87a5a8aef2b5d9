"""The state step of deduplication: one Spark task per state partition.

``dropDuplicates`` and ``dropDuplicatesWithinWatermark`` (Spark's
``StreamingDeduplicateExec`` and ``StreamingDeduplicateWithinWatermarkExec``): the
task opens the store of its partition at version N (the batch id), keeps each row
whose key it has not seen, commits N+1 and adds its metrics to the operator's
accumulator. Keys are tuples of plain values; timestamps are int64 microseconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from itertools import compress, repeat

import pyarrow as pa
import pyarrow.compute as pc

from microbatch.state.map_provider import get_provider
from microbatch.state.store import StateStoreConf, StateStoreId, task_metrics


@dataclass(frozen=True)
class DedupTask:
    """The per-partition function of a ``Deduplicate`` (shipped to tasks by cloudpickle).

    Spark's rules (``StreamingDeduplicateExec``, ``...WithinWatermarkExec``): a row whose
    event time is at or before the previous batch's watermark is late and dropped; a
    row whose key is in the store is a duplicate; otherwise its key is stored. After
    the rows, keys are evicted: by the event-time key (plain, when it is a key) or by
    the stored expiry, event time + delay (within watermark), at or before this
    batch's watermark.
    """

    state_root: str
    operator_id: int
    version: int
    key_indexes: tuple[int, ...]
    timestamp_keys: tuple[bool, ...]
    key_schema: pa.Schema
    value_schema: pa.Schema
    event_time_index: int | None       # index in the row of the event-time column
    watermark_key: int | None          # index in the key of the event-time column
    expiry_delay_us: int | None        # within watermark: the delay
    late_us: int | None                # rows at or before this are late
    evict_us: int | None               # state at or before this is evicted
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum

    def __call__(self, batches):
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        store_id = StateStoreId(self.state_root, self.operator_id, partition)
        provider = get_provider(store_id, self.key_schema, self.value_schema, self.conf)
        cache_hit = provider.loaded_version == self.version
        store = provider.get_store(self.version)
        updated = late = duplicates = 0
        started = time.monotonic()
        check_late = self.event_time_index is not None and self.late_us is not None
        within = self.expiry_delay_us is not None
        empty: tuple = ()
        for batch in batches:
            columns = []
            for index, is_timestamp in zip(self.key_indexes, self.timestamp_keys):
                column = batch.column(index)
                columns.append((column.cast(pa.int64()) if is_timestamp else column).to_pylist())
            keys = list(zip(*columns))
            times = batch.column(self.event_time_index).cast(pa.int64()) \
                if self.event_time_index is not None else None
            if check_late:
                on_time = pc.invert(pc.fill_null(pc.less_equal(times, self.late_us), False))
                late += batch.num_rows - pc.sum(on_time).as_py() if batch.num_rows else 0
                keys = list(compress(keys, on_time.to_pylist()))
            else:
                on_time = None
            if within:
                on_time_times = times.filter(on_time) if on_time is not None else times
                values = [(t + self.expiry_delay_us,) for t in on_time_times.to_pylist()]
            else:
                values = repeat(empty)
            new = store.put_absent(keys, values)
            kept = sum(new)
            updated += kept
            duplicates += len(keys) - kept
            if kept:
                if on_time is not None:   # spread the on-time rows' flags over all rows
                    flags = iter(new)
                    mask = [next(flags) if ok else False for ok in on_time.to_pylist()]
                else:
                    mask = new
                yield batch.filter(pa.array(mask, type=pa.bool_()))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.evict_us is not None and (within or self.watermark_key is not None):
            wm, evict = self.watermark_key, self.evict_us
            if within:
                expired = store.keys_where(lambda k, v: v[0] is not None and v[0] <= evict)
            else:
                expired = store.keys_where(lambda k, v: k[wm] is not None and k[wm] <= evict)
            store.remove_many(expired)
            removed = len(expired)
            read = len(provider.map) + updated   # every key is read, as in Spark
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        m = store.metrics()
        self.metrics.add(task_metrics(
            partition, m, cache_hit, numRowsUpdated=updated, numRowsRemoved=removed,
            allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
            numRowsDroppedByWatermark=late, numDroppedDuplicateRows=duplicates,
            numRowsReadDuringEviction=read))
