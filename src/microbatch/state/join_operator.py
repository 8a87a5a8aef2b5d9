"""The state step of a stream-stream join: one Spark task per state partition.

Spark's ``StreamingSymmetricHashJoinExec`` (inner and left/right/full outer joins on
equal keys, optionally with time comparisons between the sides; state format 2). Both
sides' new rows of the batch arrive in the task of their key's partition (tagged with
their side). Per side the state is two stores, as Spark keeps them:

- ``<side>-keyToNumValues``: join key -> how many rows the side holds for it;
- ``<side>-keyWithIndexToValue``: (join key, index) -> the row and its ``matched`` flag.

The task drops late rows (a side's watermarked event time at or before the previous
batch's watermark); then, left side first, joins each new row with the other side's rows
of its key that pass the time comparisons, and adds it to its own side's state. The
right side's rows so meet the left side's new rows too, and each pair is produced once.
A left row is always added (this batch's right rows have not met it yet); a right row
only if it is not already behind this batch's state watermark (Spark 4's rule) or, in a
right or full outer join, it matched nothing. Then each side's rows behind its state
watermark are evicted — by the key, when a join key is a watermarked event time, or by
the side's state value watermark from the time comparisons — an outer side's rows that
never matched coming out with nulls; and the four stores commit version N+1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from microbatch.state.files import from_state_values, state_values
from microbatch.state.store import (EventTimeStats, StateStoreConf, StateStoreId, StateStoreMetrics,
                                    end_task, load_provider, task_metrics)

SIDES = ("left", "right")
#: The tags of each side's event-time statistics in the operator's metrics.
JOIN_SIDE_TAGS = ("Left", "Right")


@dataclass(frozen=True)
class JoinTask:
    """The per-partition function of a stream-stream join (shipped by cloudpickle). Its
    input columns: ``__side`` (0 left, 1 right), the keys ``__k0..``, the left row
    ``__l0..`` and the right row ``__r0..``; its output: ``__l0..`` then ``__r0..``."""

    state_root: str
    operator_id: int
    version: int
    key_schema: pa.Schema              # the join keys, storage types
    row_schemas: tuple[pa.Schema, pa.Schema]    # each side's row, storage types
    output_types: tuple[tuple[pa.DataType, ...], tuple[pa.DataType, ...]]   # Arrow types out
    event_times: tuple[int | None, int | None]  # per side: its watermarked column in the row
    watermark_key: int | None          # the join key that is a watermarked event time
    how: str                           # inner, left, right or full (outer), semi
    late_us: int | None                # rows at or before this are late
    evict_us: int | None               # state at or before this is evicted
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum
    #: the condition's time comparisons: (op, (side, column, offset µs), (side, column, offset µs))
    comparisons: tuple = ()
    #: per side: rows whose watermarked column is at or before this are evicted (the
    #: state value watermark of the time comparisons), or None
    value_evict_us: tuple = (None, None)
    #: per side: the row column whose event-time statistics the task reports for the
    #: side's watermark (instead of an ``Observation`` of it), or None
    event_time_stats: tuple = (None, None)

    def _stores(self, partition: int) -> dict[str, Any]:
        counts = pa.schema([pa.field("value", pa.int64())])
        indexed = pa.schema(list(self.key_schema) + [pa.field("index", pa.int64())])
        stores = {}
        for side, rows in zip(SIDES, self.row_schemas):
            values = pa.schema(list(rows) + [pa.field("matched", pa.bool_())])
            for name, key, value in ((f"{side}-keyToNumValues", self.key_schema, counts),
                                     (f"{side}-keyWithIndexToValue", indexed, values)):
                store_id = StateStoreId(self.state_root, self.operator_id, partition, name)
                stores[name] = load_provider(store_id, key, value, self.conf).get_store(self.version)
        return stores

    def _side_rows(self, table: pa.Table, side: int, partition: int) -> tuple[list, list, int]:
        """A side's (keys, rows) without its late rows, and how many were late; the
        event-time statistics of all its rows reported, when the task reports them."""
        prefix = "__l" if side == 0 else "__r"
        rows_table = table.filter(pc.equal(table.column("__side"), side))
        if self.event_time_stats[side] is not None:
            stats = EventTimeStats()
            for chunk in rows_table.column(f"{prefix}{self.event_time_stats[side]}").chunks:
                stats.add_micros(chunk.cast(pa.int64()))
            stats.report(self.metrics, partition, JOIN_SIDE_TAGS[side])
        keys = list(zip(*[state_values(rows_table.column(f"__k{i}"), f.type, as_key=True)
                          for i, f in enumerate(self.key_schema)]))
        rows = list(zip(*[state_values(rows_table.column(f"{prefix}{j}"), f.type)
                          for j, f in enumerate(self.row_schemas[side])]))
        time_index = self.event_times[side]
        if time_index is None or self.late_us is None:
            return keys, rows, 0
        kept = [(k, r) for k, r in zip(keys, rows)
                if (t := _time_us(r[time_index])) is None or t > self.late_us]
        return [k for k, _ in kept], [r for _, r in kept], len(rows) - len(kept)

    def _behind_watermark(self, key: tuple, row: tuple = (), side: int = 0) -> bool:
        """Spark's state watermark predicates: the key's, or the side's value predicate."""
        bound = self.value_evict_us[side]
        if bound is not None and row:
            value = _time_us(row[self.event_times[side]])
            if value is not None and value <= bound:
                return True
        if self.watermark_key is None or self.evict_us is None:
            return False
        value = _time_us(key[self.watermark_key])
        return value is not None and value <= self.evict_us

    def _condition(self, left: tuple, right: tuple) -> bool:
        """The time comparisons of the condition on a pair (a null compares false)."""
        for op, a, b in self.comparisons:
            values = []
            for side, index, offset in (a, b):
                value = (left, right)[side][index]
                if value is None:
                    return False
                values.append(value + offset)
            x, y = values
            if not (x < y if op == "<" else x <= y if op == "<=" else x > y if op == ">" else x >= y):
                return False
        return True

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        started = time.monotonic()
        batches = list(batches)
        stores = self._stores(partition)
        late = updated = 0
        output: list[tuple[tuple, tuple]] = []
        if batches:
            table = pa.Table.from_batches(batches)
            for side in ((1, 0) if self.how == "semi" else (0, 1)):   # Spark 4.3: a semi join's right first
                keys, rows, dropped = self._side_rows(table, side, partition)
                late += dropped
                updated += self._store_and_join(stores, side, keys, rows, output)
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = sum(self._evict(stores, side, output) for side in SIDES)
        removals_ms = (time.monotonic() - started) * 1000
        if output:
            yield self._output(output)
        total = memory = commit_ms = 0
        custom: dict[str, int] = {}
        for name, store in stores.items():
            store.commit()
            m = store.metrics()
            if name.endswith("keyWithIndexToValue"):
                total += m.num_keys
            memory += m.memory_used_bytes
            commit_ms += m.commit_time_ms
            for key, value in m.custom.items():
                custom[key] = custom.get(key, 0) + value
        combined = StateStoreMetrics(num_keys=total, memory_used_bytes=memory, commit_time_ms=commit_ms,
                                     custom=custom)
        end_task(self.metrics, task_metrics(
            partition, combined, numRowsUpdated=updated, numRowsRemoved=removed,
            allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
            numRowsDroppedByWatermark=late, numStateStoreInstances=len(stores)))

    def _store_and_join(self, stores, side: int, keys: list, rows: list, output: list) -> int:
        """Join a side's rows with the other side's state and add them to their own."""
        this, other = SIDES[side], SIDES[1 - side]
        counts, values = stores[f"{this}-keyToNumValues"], stores[f"{this}-keyWithIndexToValue"]
        other_counts, other_values = stores[f"{other}-keyToNumValues"], stores[f"{other}-keyWithIndexToValue"]
        semi = self.how == "semi"
        added = 0
        for key, row in zip(keys, rows):
            held = other_counts.get(key)   # (a null key meets a null key, as in Spark's state)
            matched = False
            for index in range(held[0] if held else 0):
                stored = other_values.get(key + (index,))
                other_row = stored[:-1]
                if semi and side == 1 and stored[-1]:
                    continue   # a left row comes out once, at its first match
                pair = (row, other_row) if side == 0 else (other_row, row)
                if self.comparisons and not self._condition(*pair):
                    continue
                if not semi:
                    output.append(pair)
                elif side == 1:
                    output.append((other_row, None))
                matched = True
                if not stored[-1]:   # Spark marks the other side's row as matched
                    other_values.put(key + (index,), other_row + (True,))
            if semi and side == 0 and matched:
                output.append((row, None))   # matched at once: out, and never stored
                continue
            if side == 1 and self._behind_watermark(key, row, 1) and not (
                    self.how in ("right", "full") and not matched):
                continue   # a right row behind the watermark met this batch's left rows already
            count = counts.get(key)
            index = count[0] if count else 0
            values.put(key + (index,), tuple(row) + (matched,))
            counts.put(key, (index + 1,))
            added += 1
        return added

    def _evict(self, stores, side: str, output: list) -> int:
        """Remove a side's rows behind this batch's watermark (by key, or by the side's
        value watermark); on the outer side(s) of an outer join, emit those that never
        matched with nulls. A key's remaining rows keep indexes 0..n-1."""
        index_of_side = SIDES.index(side)
        matched_out = self.how == "semi" and side == "left"   # a matched left row is done
        if (self.watermark_key is None or self.evict_us is None) and self.value_evict_us[index_of_side] is None \
                and not matched_out:
            return 0
        counts, values = stores[f"{side}-keyToNumValues"], stores[f"{side}-keyWithIndexToValue"]
        outer = self.how == "full" or self.how == side
        removed = 0
        for key, count in self._keys_to_evict(counts, values, index_of_side, matched_out):
            stored = [values.get(key + (index,)) for index in range(count)]
            kept = [v for v in stored if not (self._behind_watermark(key, v[:-1], index_of_side)
                                              or (matched_out and v[-1]))]
            if len(kept) == count:
                continue
            if outer:
                for v in stored:
                    if not v[-1] and self._behind_watermark(key, v[:-1], index_of_side):
                        output.append((v[:-1], None) if side == "left" else (None, v[:-1]))
            for index, v in enumerate(kept):
                if stored[index] != v:
                    values.put(key + (index,), v)
            for index in range(len(kept), count):
                values.remove(key + (index,))
            if kept:
                counts.put(key, (len(kept),))
            else:
                counts.remove(key)
            removed += count - len(kept)
        return removed

    def _keys_to_evict(self, counts, values, side: int, matched_out: bool) -> list[tuple[tuple, int]]:
        """(key, row count) of the keys that have a row to evict. By a watermarked key, the
        key decides for all its rows, and no row is read; by the value watermark (or a
        semi join's matched rows), one pass over the rows, without a lookup per key."""
        if self.value_evict_us[side] is None and not matched_out:
            return [(key, count) for key, (count,) in counts.iterator() if self._behind_watermark(key)]
        doomed: dict[tuple, None] = {}
        behind = self._behind_watermark
        for key_index, value in values.iterator():
            key = key_index[:-1]
            if key not in doomed and (behind(key, value[:-1], side) or (matched_out and value[-1])):
                doomed[key] = None
        return [(key, counts.get(key)[0]) for key in doomed]

    def _output(self, pairs: list[tuple[tuple, tuple]]) -> pa.RecordBatch:
        columns, names = [], []
        for side, prefix in ((0, "__l"), (1, "__r")):
            for j, (field, target) in enumerate(zip(self.row_schemas[side], self.output_types[side])):
                columns.append(from_state_values([None if pair[side] is None else pair[side][j] for pair in pairs],
                                                 field.type, target))
                names.append(f"{prefix}{j}")
        return pa.RecordBatch.from_arrays(columns, names=names)


def _time_us(value: Any) -> int | None:
    """An event time in µs: a timestamp, or a time window (Spark compares a window's end
    with the watermark), which the state encoding gives as a tuple or a dict."""
    if isinstance(value, tuple):
        return value[1]
    if isinstance(value, dict):
        return value.get("end")
    return value
