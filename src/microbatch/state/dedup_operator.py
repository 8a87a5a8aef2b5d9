"""The state step of deduplication: one Spark task per state partition.

``dropDuplicates`` and ``dropDuplicatesWithinWatermark`` (Spark's
``StreamingDeduplicateExec`` and ``StreamingDeduplicateWithinWatermarkExec``). The
task is a scalar-iterator Arrow UDF over the key columns (and the event-time
column): only those columns travel to Python, the rows stay in the JVM, and the
UDF answers one boolean per row, true for a row to keep. It opens the store of its
partition at version N (the batch id), keeps each row whose key it has not seen,
evicts, commits N+1 and adds its metrics to the operator's accumulator. Keys are
tuples of plain values; timestamps are int64 microseconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from microbatch.state.store import (EventTimeStats, StateStoreConf, StateStoreId, end_task, load_provider,
                                    task_metrics)


@dataclass(frozen=True)
class DedupTask:
    """The per-partition function of a ``Deduplicate`` (shipped to tasks by cloudpickle).

    Its input columns are the key columns, in key order, then the event-time column
    when it is not a key. Spark's rules (``StreamingDeduplicateExec``,
    ``...WithinWatermarkExec``): a row whose event time is at or before the previous
    batch's watermark is late and dropped; a row whose key is in the store is a
    duplicate; otherwise its key is stored. After the rows, keys are evicted: by the
    event-time key (plain, when it is a key) or by the stored expiry, event time +
    delay (within watermark), at or before this batch's watermark.
    """

    state_root: str
    operator_id: int
    version: int
    key_schema: pa.Schema
    value_schema: pa.Schema
    event_time_index: int | None       # index among the input columns of the event time
    watermark_key: int | None          # index in the key of the event-time column
    expiry_delay_us: int | None        # within watermark: the delay
    late_us: int | None                # rows at or before this are late
    evict_us: int | None               # state at or before this is evicted
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum
    event_time_stats: bool = False     # report the event-time statistics of the watermark below

    def __call__(self, batches: Iterator[Any]) -> Iterator[pa.Array]:
        """The whole partition at once, through the store's batch calls: a row is kept
        when ``insert_new`` finds its key new; then ``remove_at_or_below`` evicts."""
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        store_id = StateStoreId(self.state_root, self.operator_id, partition)
        store = load_provider(store_id, self.key_schema, self.value_schema, self.conf).get_store(self.version)
        started = time.monotonic()
        lengths, chunks = [], []
        for columns in batches:   # the UDF may read ahead: it answers as many rows in the end
            columns = columns if isinstance(columns, (tuple, list)) else (columns,)
            lengths.append(len(columns[0]))
            chunks.append(columns)
        total = sum(lengths)
        width = len(chunks[0]) if chunks else len(self.key_schema)
        arrays = [pa.chunked_array([c[i] for c in chunks], type=chunks[0][i].type) if chunks
                  else pa.chunked_array([], self.key_schema[i].type) for i in range(width)]
        on_time = None
        late = 0
        times = None
        if chunks and self.event_time_index is not None:
            times = arrays[self.event_time_index].cast(pa.int64())
            if self.event_time_stats:
                stats = EventTimeStats()
                for chunk in times.chunks:
                    stats.add_micros(chunk)
                stats.report(self.metrics, partition)
            if self.late_us is not None:
                on_time = pc.invert(pc.fill_null(pc.less_equal(times, self.late_us), False))
                late = total - (pc.sum(on_time).as_py() or 0)
                if not late:
                    on_time = None
        keys = pa.table([arrays[i] for i in range(len(self.key_schema))], names=self.key_schema.names)
        values = None
        if self.expiry_delay_us is not None:
            values = pa.table([pc.add(times, self.expiry_delay_us) if times is not None
                               else pa.chunked_array([], pa.int64())], names=["expiry"])
        rows = np.arange(total, dtype=np.int64)
        if on_time is not None:
            keys, rows = keys.filter(on_time), rows[on_time.to_numpy(zero_copy_only=False)]
            values = values.filter(on_time) if values is not None else None
        new = store.insert_new(keys, values)
        keep = np.zeros(total, bool)
        keep[rows[new]] = True
        offset = 0
        for length in lengths:
            yield pa.array(keep[offset:offset + length], type=pa.bool_())
            offset += length
        inserted = int(np.count_nonzero(new))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.evict_us is not None and (self.expiry_delay_us is not None or self.watermark_key is not None):
            read = store.num_keys()   # every key is read, as in Spark
            if self.expiry_delay_us is not None:
                removed = store.remove_at_or_below(self.evict_us, value_field=0)
            else:
                removed = store.remove_at_or_below(self.evict_us, key_field=self.watermark_key)
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        end_task(self.metrics, task_metrics(
            partition, store.metrics(), numRowsUpdated=inserted, numRowsRemoved=removed,
            allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
            numRowsDroppedByWatermark=late, numDroppedDuplicateRows=keys.num_rows - inserted,
            numRowsReadDuringEviction=read))
