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

import pyarrow as pa

from microbatch.state.map_provider import get_provider
from microbatch.state.store import StateStoreConf, StateStoreId


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
        for batch in batches:
            columns = []
            for index, is_timestamp in zip(self.key_indexes, self.timestamp_keys):
                column = batch.column(index)
                columns.append((column.cast(pa.int64()) if is_timestamp else column).to_pylist())
            times = batch.column(self.event_time_index).cast(pa.int64()).to_pylist() \
                if self.event_time_index is not None else None
            keep = []
            for row, key in enumerate(zip(*columns)):
                if check_late and times[row] is not None and times[row] <= self.late_us:
                    late += 1
                    keep.append(False)
                elif store.get(key) is None:
                    store.put(key, (times[row] + self.expiry_delay_us,) if within else ())
                    updated += 1
                    keep.append(True)
                else:
                    duplicates += 1
                    keep.append(False)
            if any(keep):
                yield batch.filter(pa.array(keep, type=pa.bool_()))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.evict_us is not None and (within or self.watermark_key is not None):
            wm = self.watermark_key
            for key, value in list(store.iterator()):
                read += 1
                expires = value[0] if within else key[wm]
                if expires is not None and expires <= self.evict_us:
                    store.remove(key)
                    removed += 1
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        m = store.metrics()
        self.metrics.add({
            "numRowsTotal": m.num_keys, "numRowsUpdated": updated, "numRowsRemoved": removed,
            "allUpdatesTimeMs": int(updates_ms), "allRemovalsTimeMs": int(removals_ms),
            "commitTimeMs": m.commit_time_ms, "memoryUsedBytes": m.memory_used_bytes,
            "numRowsDroppedByWatermark": late, "numStateStoreInstances": 1,
            f"partition_{partition}": 1,
            "numDroppedDuplicateRows": duplicates, "numRowsReadDuringEviction": read,
            "loadedMapCacheHitCount": int(cache_hit), "loadedMapCacheMissCount": int(not cache_hit)})
