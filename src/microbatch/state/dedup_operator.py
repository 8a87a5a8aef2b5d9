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

from microbatch.state.map_provider import get_provider, hashable
from microbatch.state.store import (EventTimeStats, StateStoreConf, StateStoreId, StateStoreMetrics,
                                    task_metrics)
from microbatch.state.table_provider import anti_join, get_table_provider, joinable


def python_values(array: pa.Array, is_timestamp: bool = False) -> list:
    """An Arrow column as a list of plain Python values, through numpy when it can."""
    if is_timestamp:
        array = array.cast(pa.int64())
    kind = array.type
    if array.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return array.to_numpy().tolist()
    values = array.to_pylist()
    if not (pa.types.is_primitive(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        values = [hashable(v) for v in values]
    return values


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
    timestamp_keys: tuple[bool, ...]   # per key column: a timestamp, stored as int64 µs
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
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        if all(joinable(f.type) for f in self.key_schema):
            return self._in_bulk(partition, batches)
        return self._key_by_key(partition, batches)

    def _in_bulk(self, partition: int, batches: Iterator[Any]) -> Iterator[pa.Array]:
        """The whole partition at once, on an Arrow table state: a group-by finds each
        key's first row, an anti join against the state the new keys, a filter the
        expired ones (``table_provider``)."""
        store_id = StateStoreId(self.state_root, self.operator_id, partition)
        provider = get_table_provider(store_id, self.key_schema, self.value_schema, self.conf)
        cache_hit = self.version in provider.tables
        state = provider.table(self.version)
        started = time.monotonic()
        names, values = provider.key_names, provider.value_names
        lengths, chunks = [], []
        for columns in batches:   # the UDF may read ahead: it answers as many rows in the end
            columns = columns if isinstance(columns, (tuple, list)) else (columns,)
            lengths.append(len(columns[0]))
            chunks.append(columns)
        total = sum(lengths)
        arrays = [pa.chunked_array([c[i] for c in chunks], type=chunks[0][i].type) if chunks
                  else pa.chunked_array([], pa.null()) for i in range(len(chunks[0]) if chunks else 0)]
        table = pa.table({name: arrays[i].cast(self.key_schema[i].type) for i, name in enumerate(names)}) \
            if chunks else provider.empty().select(names)   # (a timestamp key becomes int64 µs)
        table = table.append_column("__row", pa.array(np.arange(total, dtype=np.int64)))
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
                if late:
                    table = table.filter(on_time)
        on_time_rows = table.num_rows
        first = table
        if on_time_rows:   # each key's first row
            first = table.group_by(names, use_threads=False).aggregate([("__row", "min")])
            first = first.select(names + ["__row_min"]).rename_columns(names + ["__row"])
        new = anti_join(first, state, names)
        rows = new.column("__row")
        if self.expiry_delay_us is not None:
            expiry = pc.add(times.take(rows), self.expiry_delay_us) if times is not None \
                else pa.array([], pa.int64())
            new = new.append_column("v0", expiry)
        keep = np.zeros(total, bool)
        keep[rows.to_numpy()] = True
        offset = 0
        for length in lengths:
            yield pa.array(keep[offset:offset + length], type=pa.bool_())
            offset += length
        new = new.select(names + values)
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        added, expired = new, provider.empty()
        following = pa.concat_tables([state, new]) if new.num_rows else state
        if self.evict_us is not None and (self.expiry_delay_us is not None or self.watermark_key is not None):
            column = "v0" if self.expiry_delay_us is not None else names[self.watermark_key]
            def due(t):
                return pc.fill_null(pc.less_equal(t.column(column), self.evict_us), False)
            expired = state.filter(due(state))
            removed = expired.num_rows + pc.sum(due(new)).as_py() if new.num_rows else expired.num_rows
            added = new.filter(pc.invert(due(new)))
            following = following.filter(pc.invert(due(following)))
            read = state.num_rows + new.num_rows   # every key is read, as in Spark
        removals_ms = (time.monotonic() - started) * 1000
        following = following.combine_chunks()
        commit_ms = provider.commit_table(self.version, following, added, expired)
        metrics = StateStoreMetrics(num_keys=following.num_rows, num_updated=new.num_rows,
                                    num_removed=removed, memory_used_bytes=following.nbytes,
                                    commit_time_ms=commit_ms)
        self.metrics.add(task_metrics(
            partition, metrics, cache_hit, numRowsUpdated=new.num_rows, numRowsRemoved=removed,
            allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
            numRowsDroppedByWatermark=late, numDroppedDuplicateRows=on_time_rows - new.num_rows,
            numRowsReadDuringEviction=read))

    def _key_by_key(self, partition: int, batches: Iterator[Any]) -> Iterator[pa.Array]:
        """Batch by batch, on a Python map state: for keys Arrow cannot join (structs,
        lists, maps, timestamps nested in them)."""
        store_id = StateStoreId(self.state_root, self.operator_id, partition)
        provider = get_provider(store_id, self.key_schema, self.value_schema, self.conf)
        cache_hit = provider.loaded_version == self.version
        store = provider.get_store(self.version)
        updated = late = duplicates = 0
        started = time.monotonic()
        check_late = self.event_time_index is not None and self.late_us is not None
        within = self.expiry_delay_us is not None
        stats = EventTimeStats()
        for columns in batches:
            if not isinstance(columns, (tuple, list)):
                columns = (columns,)
            rows = len(columns[0])
            keys = list(zip(*[python_values(c, t) for c, t in zip(columns, self.timestamp_keys)]))
            on_time_rows = None
            if self.event_time_index is not None:
                times = columns[self.event_time_index].cast(pa.int64())
                if self.event_time_stats:
                    stats.add_micros(times)
            if check_late:
                is_late = pc.fill_null(pc.less_equal(times, self.late_us), False).to_numpy(zero_copy_only=False)
                dropped = int(is_late.sum())
                if dropped:
                    late += dropped
                    on_time_rows = np.flatnonzero(~is_late)
                    keys = [keys[i] for i in on_time_rows.tolist()]
                    times = times.take(pa.array(on_time_rows))
            values = None
            if within:
                values = list(zip(python_values(pc.add(times, self.expiry_delay_us))))
            new = store.put_absent(keys, values)
            kept = int(np.count_nonzero(new))
            updated += kept
            duplicates += len(keys) - kept
            if on_time_rows is not None:   # spread the on-time rows' answers over all rows
                keep = np.zeros(rows, bool)
                keep[on_time_rows] = new
                new = keep
            yield pa.array(new, type=pa.bool_())
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.evict_us is not None and (within or self.watermark_key is not None):
            if within:
                expired = store.keys_at_or_below(self.evict_us, value_field=0)
            else:
                expired = store.keys_at_or_below(self.evict_us, key_field=self.watermark_key)
            store.remove_many(expired)
            removed = len(expired)
            read = len(provider.map) + updated   # every key is read, as in Spark
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        if self.event_time_stats:
            stats.report(self.metrics, partition)
        m = store.metrics()
        self.metrics.add(task_metrics(
            partition, m, cache_hit, numRowsUpdated=updated, numRowsRemoved=removed,
            allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
            numRowsDroppedByWatermark=late, numDroppedDuplicateRows=duplicates,
            numRowsReadDuringEviction=read))
