"""A stream-stream join's step and task (``operators.join`` says what they do)."""
from __future__ import annotations

import dataclasses
import decimal
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampNTZType, TimestampType

from microbatch import spark_internals
from microbatch.operators.base import OperatorBatch, StatefulStep, StateTask, quoted, task_partition
from microbatch.operators.event_time_stats import EventTimeStats
from microbatch.plan.logical import Watermark
from microbatch.planted_bugs import planted
from microbatch.state.files import from_state_values, state_values, storage_type
from microbatch.state.store import StateStoreMetrics
from microbatch.state.table_form import anti_join, join_pairs, key_groups, ranks_within, row_of_key, table_key

SIDES = ("left", "right")
#: The tags of each side's event-time statistics in the operator's metrics.
JOIN_SIDE_TAGS = ("Left", "Right")


@dataclass(frozen=True)
class JoinTask(StateTask):
    """The per-partition function of a stream-stream join (shipped by cloudpickle). Its
    input columns: ``__side`` (0 left, 1 right), the keys ``__k0..``, the left row
    ``__l0..`` and the right row ``__r0..``; its output: ``__l0..`` then ``__r0..``."""

    key_schema: pa.Schema = None       # the join keys, storage types
    row_schemas: tuple = ()            # each side's row (pa.Schema), storage types
    output_types: tuple = ()           # per side, the Arrow types out
    event_times: tuple = (None, None)  # per side: its watermarked column in the row
    watermark_key: int | None = None   # the join key that is a watermarked event time
    how: str = "inner"                 # inner, left, right or full (outer), semi
    late_us: int | None = None         # rows at or before this are late
    evict_us: int | None = None        # state at or before this is evicted
    #: the condition's time comparisons: (op, (side, column, offset µs), (side, column, offset µs))
    comparisons: tuple = ()
    #: per side: rows whose watermarked column is at or before this are evicted (the
    #: state value watermark of the time comparisons), or None
    value_evict_us: tuple = (None, None)
    #: per side: the input column whose event-time statistics the task reports for the
    #: side's watermark (instead of an ``Observation`` of it): a column of its row, or
    #: ``__e<side>`` where its state rows leave the event time out; or None
    event_time_stats: tuple = (None, None)
    #: whether an outer side's evicted rows count in ``numRowsRemoved`` (Spark 4.3 on;
    #: before, only the other side's cleanup counted, and nothing in a full outer join)
    counts_outer_removals: bool = True
    #: Spark 4.2's semi join: its right side's rows stored before the left's are joined,
    #: and a matched left row evicted at once (it can match nothing more); before 4.2, the
    #: left side first, as the other joins, and left rows kept until the watermark
    semi_evicts_matched: bool = True
    #: per side: whether its rows carry ``__f``, the condition's parts that read that side
    #: only (Spark's pre-join filter): a row failing them is never stored nor joined, and
    #: comes out at once with nulls on an outer side
    pre_filtered: tuple = (False, False)
    #: the condition's parts that read both sides (beside the keys and time comparisons),
    #: as trees ``evaluate`` reads: a pair matches only where each is true
    pair_conditions: tuple = ()

    def _stores(self, partition: int) -> dict[str, Any]:
        counts = pa.schema([pa.field("value", pa.int64())])
        indexed = pa.schema(list(self.key_schema) + [pa.field("index", pa.int64())])
        stores = {}
        for side, rows in zip(SIDES, self.row_schemas):
            values = pa.schema(list(rows) + [pa.field("matched", pa.bool_())])
            for name, key, value in ((f"{side}-keyToNumValues", self.key_schema, counts),
                                     (f"{side}-keyWithIndexToValue", indexed, values)):
                stores[name] = self.store(partition, key, value, name)
        return stores

    def _side_input(self, table: pa.Table, side: int, partition: int) -> pa.Table:
        """A side's rows of the task's input; the event-time statistics of all of them
        reported, when the task reports them."""
        rows_table = table.filter(pc.equal(table.column("__side"), side))
        if self.event_time_stats[side] is not None:
            stats = EventTimeStats()
            for chunk in rows_table.column(self.event_time_stats[side]).chunks:
                stats.add_micros(chunk.cast(pa.int64()))
            stats.report(self.metrics, partition, JOIN_SIDE_TAGS[side])
        return rows_table

    def _side_rows(self, table: pa.Table, side: int, partition: int) -> tuple[list, list, int, list | None]:
        """A side's (keys, rows) without its late rows, how many were late, and whether each
        passes the side's pre-join filter (None: it has none); the event-time statistics of
        all its rows reported, when the task reports them."""
        prefix = "__l" if side == 0 else "__r"
        rows_table = self._side_input(table, side, partition)
        keys = list(zip(*[state_values(rows_table.column(f"__k{i}"), f.type, as_key=True)
                          for i, f in enumerate(self.key_schema)]))
        rows = list(zip(*[state_values(rows_table.column(f"{prefix}{j}"), f.type)
                          for j, f in enumerate(self.row_schemas[side])]))
        passes = rows_table.column("__f").to_pylist() if self.pre_filtered[side] else None
        time_index = self.event_times[side]
        if time_index is None or self.late_us is None:
            return keys, rows, 0, passes
        on_time = [(t := _time_us(r[time_index])) is None or t > self.late_us for r in rows]
        if passes is not None:
            passes = [p for p, kept in zip(passes, on_time) if kept]
        return ([k for k, kept in zip(keys, on_time) if kept], [r for r, kept in zip(rows, on_time) if kept],
                len(rows) - sum(on_time), passes)

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
        partition = task_partition()
        started = time.monotonic()
        batches = list(batches)
        stores = self._stores(partition)
        late = updated = 0
        output: list[tuple[tuple, tuple]] = []
        in_tables = self._in_tables(stores)
        pieces: list[tuple[pa.Table | None, pa.Table | None]] = []
        if batches:
            table = pa.Table.from_batches(batches)
            if in_tables:
                late, updated = self._join_tables(stores, table, partition, pieces)
            else:
                for side in ((1, 0) if self.how == "semi" and self.semi_evicts_matched else (0, 1)):
                    keys, rows, dropped, passes = self._side_rows(table, side, partition)
                    late += dropped
                    updated += self._store_and_join(stores, side, keys, rows, output, passes)
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = 0
        for side in SIDES:
            evicted = self._evict_tables(stores, side, pieces) if in_tables else self._evict(stores, side, output)
            if self.counts_outer_removals or not (self.how == "full" or self.how == side):
                removed += evicted
        removals_ms = (time.monotonic() - started) * 1000
        if output:
            yield self._output(output)
        for piece in pieces:
            if (out := self._output_table(*piece)) is not None:
                yield out
        total = memory = commit_ms = 0
        custom: dict[str, int] = {}
        tracked = True
        for name, store in stores.items():
            store.commit()
            m = store.metrics()
            tracked = tracked and m.rows_tracked
            if name.endswith("keyWithIndexToValue"):
                total += m.num_keys
            memory += m.memory_used_bytes
            commit_ms += m.commit_time_ms
            for key, value in m.custom.items():
                custom[key] = custom.get(key, 0) + value
        combined = StateStoreMetrics(num_keys=total, memory_used_bytes=memory, commit_time_ms=commit_ms,
                                     custom=custom, rows_tracked=tracked)
        self.finish(partition, combined, numRowsUpdated=updated, numRowsRemoved=removed,
                    allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
                    numRowsDroppedByWatermark=late, numStateStoreInstances=len(stores))

    # -- the state as Arrow tables (``state.table_form``) -------------------------------
    # Where the four stores keep their memory as tables, a batch is joined a side at a
    # time as the row-by-row path does it, with Arrow's hash joins in place of lookups:
    # the left rows probe the right rows held for their keys; the right rows probe the
    # left rows held for theirs and the left rows of the batch; each stored row takes the
    # next indexes of its key; a match marks the held row matched. Eviction is a filter,
    # and a key's remaining rows are renumbered 0..n-1 in their order.
    def _in_tables(self, stores: dict) -> bool:
        """Whether this join runs on tables: on keys Arrow joins on, time comparisons of
        integers (µs), and stores that take tables."""
        def integer(side: int, index: int | None) -> bool:
            return index is None or pa.types.is_integer(self.row_schemas[side][index].type)

        def event_time(kind: pa.DataType) -> bool:   # a timestamp, or a window (its end)
            return pa.types.is_integer(kind) or (pa.types.is_struct(kind) and kind.num_fields == 2
                                                 and pa.types.is_integer(kind[1].type))
        return (self.how in ("inner", "left", "right", "full", "semi")
                and len(self.key_schema) > 0 and all(table_key(f.type) for f in self.key_schema)
                and all(integer(a[0], a[1]) and integer(b[0], b[1]) for _, a, b in self.comparisons)
                and all(i is None or event_time(self.row_schemas[side][i].type)
                        for side, i in enumerate(self.event_times))
                and (self.watermark_key is None or event_time(self.key_schema[self.watermark_key].type))
                and all(store.in_tables() for store in stores.values()))

    def _side_table(self, table: pa.Table, side: int, partition: int) -> tuple[pa.Table, int, np.ndarray]:
        """A side's rows (``k..`` its keys, ``v..`` its row, storage types) without its
        late rows, how many were late, and whether each passes the side's pre-join filter;
        the event-time statistics of all its rows reported, when the task reports them."""
        prefix = "__l" if side == 0 else "__r"
        rows_table = self._side_input(table, side, partition)
        columns = [rows_table.column(f"__k{i}").cast(f.type) for i, f in enumerate(self.key_schema)]
        columns += [rows_table.column(f"{prefix}{j}").cast(f.type) for j, f in enumerate(self.row_schemas[side])]
        rows = pa.Table.from_arrays(columns, schema=self._batch_schema(side))
        passes = pc.fill_null(rows_table.column("__f"), False).to_numpy(zero_copy_only=False).astype(bool) \
            if self.pre_filtered[side] else np.ones(rows.num_rows, bool)
        time_index = self.event_times[side]
        if time_index is None or self.late_us is None or rows.num_rows == 0:
            return rows, 0, passes
        times = _times(rows.column(f"v{time_index}"))
        on_time = pc.fill_null(pc.greater(times, self.late_us), True).to_numpy(zero_copy_only=False).astype(bool)
        return rows.filter(pa.array(on_time)), int((~on_time).sum()), passes[on_time]

    def _batch_schema(self, side: int) -> pa.Schema:
        return pa.schema([pa.field(f"k{i}", f.type) for i, f in enumerate(self.key_schema)]
                         + [pa.field(f"v{j}", f.type) for j, f in enumerate(self.row_schemas[side])])

    def _held(self, stores: dict, side: int, keys: pa.Table) -> pa.Table:
        """The rows a side holds for the keys of ``keys`` (``k..`` and the index, ``v..``
        and the matched flag), found through its key counts."""
        key_names = [f"k{i}" for i in range(len(self.key_schema))]
        counts = stores[f"{SIDES[side]}-keyToNumValues"].matching_rows(keys.select(key_names))
        return _rows_counted(stores[f"{SIDES[side]}-keyWithIndexToValue"], counts, key_names)

    def _pairs(self, left: pa.Table, right: pa.Table, left_at: np.ndarray, right_at: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """The pairs (rows of ``left`` and ``right`` with equal keys) that meet the
        condition's time comparisons (a null compares false) and its other parts."""
        names = [f"k{i}" for i in range(len(self.key_schema))]
        a, b = join_pairs(_rows_at(left.select(names), left_at), _rows_at(right.select(names), right_at), names)
        a, b = left_at[a], right_at[b]
        if self.comparisons and len(a):
            taken = (left.take(pa.array(a)), right.take(pa.array(b)))
            meets = np.ones(len(a), bool)
            for op, *terms in self.comparisons:
                x, y = (pc.add(taken[side].column(f"v{index}"), offset) for side, index, offset in terms)
                compare = {"<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}[op]
                meets &= pc.fill_null(compare(x, y), False).to_numpy(zero_copy_only=False).astype(bool)
            a, b = a[meets], b[meets]
        if self.pair_conditions and len(a):
            # the condition's other parts, pair by pair as the row path evaluates them (only
            # the pairs the keys and time comparisons leave)
            pairs = zip(self._state_rows(left, a, 0), self._state_rows(right, b, 1))
            meets = np.fromiter((all(evaluate(c, pair) is True for c in self.pair_conditions) for pair in pairs),
                                bool, len(a))
            a, b = a[meets], b[meets]
        return a, b

    def _state_rows(self, table: pa.Table, rows: np.ndarray, side: int) -> list[tuple]:
        """The rows ``rows`` of a side's table as the row path's tuples (state values)."""
        taken = table.take(pa.array(rows))
        columns = [state_values(taken.column(f"v{j}"), f.type) for j, f in enumerate(self.row_schemas[side])]
        return list(zip(*columns)) if columns else [()] * len(rows)

    def _matched_held(self, stores: dict, side: int, held: pa.Table, rows: np.ndarray) -> None:
        """Mark the held rows ``rows`` of a side matched (as Spark's join does a row's
        first match)."""
        flag = f"v{len(self.row_schemas[side])}"
        rows = np.unique(rows)
        if len(rows) == 0:
            return
        was = held.column(flag).take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(bool)
        rows = rows[~was]
        if len(rows):
            changed = held.take(pa.array(rows))
            changed = changed.set_column(changed.schema.get_field_index(flag), flag,
                                         pa.array(np.ones(len(rows), bool)))
            stores[f"{SIDES[side]}-keyWithIndexToValue"].put_rows(changed)

    def _join_tables(self, stores: dict, table: pa.Table, partition: int, pieces: list) -> tuple[int, int]:
        """``_store_and_join`` of both sides, on tables; the late and stored rows' counts."""
        if self.how == "semi":
            return self._semi_join_tables(stores, table, partition, pieces)
        (left, left_late, left_passes), (right, right_late, right_passes) = (
            self._side_table(table, side, partition) for side in (0, 1))
        left_outer, right_outer = self.how in ("left", "full"), self.how in ("right", "full")
        # the left rows: joined with the right rows held for their keys
        left_at = np.flatnonzero(left_passes)
        held_right = self._held(stores, 1, left)
        a, b = self._pairs(left, held_right, left_at, np.arange(held_right.num_rows))
        pieces.append((left.take(pa.array(a)), held_right.take(pa.array(b))))
        left_matched = np.zeros(left.num_rows, bool)
        left_matched[a] = True
        self._matched_held(stores, 1, held_right, b)
        if left_outer and len(left_at) < left.num_rows:   # (failing the pre-join filter: out now)
            pieces.append((left.filter(pa.array(~left_passes)), None))
        # the right rows: joined with the left rows held for their keys, and this batch's
        held_left = self._held(stores, 0, right)
        row_columns = [f"k{i}" for i in range(len(self.key_schema))] + [
            f"v{j}" for j in range(len(self.row_schemas[0]))]
        stored_left = _rows_at(left, left_at)
        candidates = pa.concat_tables([held_left.select(row_columns).cast(self._batch_schema(0)), stored_left])
        right_at = np.flatnonzero(right_passes)
        c, r = self._pairs(candidates, right, np.arange(candidates.num_rows), right_at)
        pieces.append((candidates.take(pa.array(c)), right.take(pa.array(r))))
        right_matched = np.zeros(right.num_rows, bool)
        right_matched[r] = True
        self._matched_held(stores, 0, held_left, c[c < held_left.num_rows])
        left_matched[left_at[c[c >= held_left.num_rows] - held_left.num_rows]] = True
        if right_outer and len(right_at) < right.num_rows:
            pieces.append((None, right.filter(pa.array(~right_passes))))
        # a right row behind the watermark met this batch's left rows already: not stored,
        # unless it is an outer side's and matched nothing
        kept = right_passes.copy()
        behind = self._behind_watermark_rows(right, 1)
        if behind is not None:
            kept &= ~(behind & (right_matched | (not right_outer)))
        stored = 0
        kept_at = np.flatnonzero(kept)
        for side, rows, matched in ((0, stored_left, left_matched[left_at]),
                                    (1, _rows_at(right, kept_at), right_matched[kept_at])):
            stored += self._store_rows(stores, side, rows, matched)
        return left_late + right_late, stored

    def _semi_join_tables(self, stores: dict, table: pa.Table, partition: int, pieces: list) -> tuple[int, int]:
        """A left semi join on tables, in the row path's order (Spark 4.2's: the right rows
        first; before, the left rows first): a left row comes out once, at its first
        match. A batch's left row that matches comes out at once and is not stored; a held
        one comes out when a right row matches it, and is marked matched."""
        sides = {side: self._side_table(table, side, partition) for side in (0, 1)}
        stored = 0
        for side in ((1, 0) if self.semi_evicts_matched else (0, 1)):
            rows, _, passes = sides[side]
            at = np.flatnonzero(passes)
            if side == 0:   # the left rows against every right row held
                held = self._held(stores, 1, rows)
                a, b = self._pairs(rows, held, at, np.arange(held.num_rows))
                self._matched_held(stores, 1, held, b)
                matched = np.zeros(rows.num_rows, bool)
                matched[a] = True
                if matched.any():
                    pieces.append((rows.filter(pa.array(matched)), None))
                kept_at = np.flatnonzero(passes & ~matched)
                stored += self._store_rows(stores, 0, _rows_at(rows, kept_at), np.zeros(len(kept_at), bool))
                continue
            # the right rows against the left rows held that have not matched yet
            held = self._held(stores, 0, rows)
            flag = held.column(f"v{len(self.row_schemas[0])}").to_numpy(zero_copy_only=False).astype(bool)
            c, r = self._pairs(held, rows, np.flatnonzero(~flag), at)
            firsts = np.unique(c)
            if len(firsts):
                pieces.append((held.take(pa.array(firsts)), None))
            self._matched_held(stores, 0, held, firsts)
            matched = np.zeros(rows.num_rows, bool)
            matched[r] = True
            kept = passes.copy()
            behind = self._behind_watermark_rows(rows, 1)
            if behind is not None:   # (it met this batch's left rows already)
                kept &= ~behind
            kept_at = np.flatnonzero(kept)
            stored += self._store_rows(stores, 1, _rows_at(rows, kept_at), matched[kept_at])
        return sides[0][1] + sides[1][1], stored

    def _behind_watermark_rows(self, rows: pa.Table, side: int) -> np.ndarray | None:
        """``_behind_watermark`` of each row (``k..``, ``v..``), or None: no watermark."""
        bound = self.value_evict_us[side]
        if bound is not None and self.event_times[side] is not None:
            column, limit = rows.column(f"v{self.event_times[side]}"), bound
        elif self.watermark_key is not None and self.evict_us is not None:
            column, limit = rows.column(f"k{self.watermark_key}"), self.evict_us
        else:
            return None
        return pc.fill_null(pc.less_equal(_times(column), limit), False).to_numpy(zero_copy_only=False).astype(bool)

    def _store_rows(self, stores: dict, side: int, rows: pa.Table, matched: np.ndarray) -> int:
        """Add a side's rows to its state: each at its key's next index, in their order."""
        if rows.num_rows == 0:
            return 0
        counts, values = stores[f"{SIDES[side]}-keyToNumValues"], stores[f"{SIDES[side]}-keyWithIndexToValue"]
        key_names = [f"k{i}" for i in range(len(self.key_schema))]
        keys = rows.select(key_names)
        held = counts.matching_rows(keys)
        at = row_of_key(keys, held, key_names)
        start = np.where(at >= 0, held.column("v0").to_numpy(zero_copy_only=False)[np.maximum(at, 0)]
                         if held.num_rows else 0, 0)
        groups = key_groups(keys, key_names)
        index = start + ranks_within(groups)
        new = _indexed(keys, index)
        for j in range(len(self.row_schemas[side])):
            new = new.append_column(f"v{j}", rows.column(f"v{j}"))
        new = new.append_column(f"v{len(self.row_schemas[side])}", pa.array(matched.astype(bool)))
        values.put_rows(new)
        # each key's count: its highest index + 1 (the rows of a key are numbered in order)
        last = np.zeros(groups.max() + 1, np.int64)
        np.maximum.at(last, groups, index + 1)
        firsts = np.unique(groups, return_index=True)[1]
        count_rows = keys.take(pa.array(firsts)).append_column("v0", pa.array(last[groups[firsts]]))
        counts.put_rows(count_rows)
        return rows.num_rows

    def _evict_tables(self, stores: dict, side: str, pieces: list) -> int:
        """``_evict`` on tables: the rows behind the watermark taken out by a filter (on
        the outer side(s) of an outer join, those that never matched come out with nulls);
        where that took some of a key's rows (a value watermark; a semi join's matched
        left rows), the rest renumbered 0..n-1."""
        index_of_side = SIDES.index(side)
        counts, values = stores[f"{side}-keyToNumValues"], stores[f"{side}-keyWithIndexToValue"]
        width = len(self.row_schemas[index_of_side])
        key_names = [f"k{i}" for i in range(len(self.key_schema))]
        matched_out = self.how == "semi" and side == "left" and self.semi_evicts_matched   # a matched row is done
        time_index = self.event_times[index_of_side]
        by_value = self.value_evict_us[index_of_side] is not None and time_index is not None
        by_key = not by_value and self.watermark_key is not None and self.evict_us is not None
        if by_key and not matched_out:   # whole keys: their counts go with them, nothing renumbered
            window = pa.types.is_struct(self.key_schema[self.watermark_key].type)
            gone = values.take_rows_at_or_below(self.evict_us, key_field=self.watermark_key,
                                                struct_field=1 if window else None)
            counts.take_rows_at_or_below(self.evict_us, key_field=self.watermark_key,
                                         struct_field=1 if window else None)
        elif by_value or by_key or matched_out:
            def due(rows: pa.Table) -> pa.Array:
                behind = pc.fill_null(pc.less_equal(_times(rows.column(f"v{time_index}")),
                                                    self.value_evict_us[index_of_side]), False) if by_value \
                    else pc.fill_null(pc.less_equal(_times(rows.column(f"k{self.watermark_key}")),
                                                    self.evict_us), False) if by_key \
                    else pa.array(np.zeros(rows.num_rows, bool))
                return pc.or_(behind, pc.fill_null(rows.column(f"v{width}"), False)) if matched_out else behind
            gone = values.take_rows_where(due)
            if gone.num_rows:
                self._renumbered(counts, values, gone.select(key_names), key_names)
        else:
            return 0
        if gone.num_rows and (self.how == "full" or self.how == side):
            unmatched = gone.filter(pc.invert(gone.column(f"v{width}")))
            if unmatched.num_rows:
                rows = unmatched.select(key_names + [f"v{j}" for j in range(width)])
                pieces.append((rows, None) if side == "left" else (None, rows))
        return gone.num_rows

    def _renumbered(self, counts, values, keys: pa.Table, key_names: list[str]) -> None:
        """The rows left for ``keys`` renumbered 0..n-1 in their order, and their counts."""
        old_counts = counts.matching_rows(keys)
        left = _rows_counted(values, old_counts, key_names)
        m = len(key_names)
        left = left.take(pc.sort_indices(left, sort_keys=[(f"k{m}", "ascending")]))
        groups = key_groups(left.select(key_names), key_names)
        new_index = ranks_within(groups)
        old_index = left.column(f"k{m}").to_numpy(zero_copy_only=False)
        moved = np.flatnonzero(new_index != old_index)
        if len(moved):
            values.remove_rows(left.take(pa.array(moved)).select(key_names + [f"k{m}"]))
            renumbered = left.take(pa.array(moved))
            renumbered = renumbered.set_column(m, f"k{m}", pa.array(new_index[moved]))
            values.put_rows(renumbered)
        if left.num_rows:   # each key's rows left: its count
            firsts = np.unique(groups, return_index=True)[1]
            sizes = np.bincount(groups)
            counts.put_rows(left.select(key_names).take(pa.array(firsts))
                            .append_column("v0", pa.array(sizes[groups[firsts]], pa.int64())))
        emptied = anti_join(old_counts.select(key_names), left.select(key_names), key_names)
        if emptied.num_rows:
            counts.remove_rows(emptied)

    def _output_table(self, left: pa.Table | None, right: pa.Table | None) -> pa.RecordBatch | None:
        """Joined pairs (a side None: nulls) as the task's output columns."""
        n = (left if left is not None else right).num_rows
        if n == 0:
            return None
        columns, names = [], []
        for side, (rows, prefix) in enumerate(((left, "__l"), (right, "__r"))):
            for j, target in enumerate(self.output_types[side]):
                columns.append(pa.nulls(n, target) if rows is None
                               else rows.column(f"v{j}").combine_chunks().cast(target))
                names.append(f"{prefix}{j}")
        return pa.RecordBatch.from_arrays(columns, names=names)

    def _store_and_join(self, stores, side: int, keys: list, rows: list, output: list,
                        passes: list | None = None) -> int:
        """Join a side's rows with the other side's state and add them to their own."""
        this, other = SIDES[side], SIDES[1 - side]
        counts, values = stores[f"{this}-keyToNumValues"], stores[f"{this}-keyWithIndexToValue"]
        other_counts, other_values = stores[f"{other}-keyToNumValues"], stores[f"{other}-keyWithIndexToValue"]
        semi = self.how == "semi"
        outer = self.how == "full" or self.how == this
        added = 0
        for n, (key, row) in enumerate(zip(keys, rows)):
            if passes is not None and passes[n] is not True:
                # (Spark's pre-join filter: the row can match nothing; an outer side's comes out now)
                if outer:
                    output.append((row, None) if side == 0 else (None, row))
                continue
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
                if self.pair_conditions and not all(evaluate(c, pair) is True for c in self.pair_conditions):
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
        matched_out = self.how == "semi" and side == "left" and self.semi_evicts_matched   # a matched row is done
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


def evaluate(tree: tuple, pair: tuple) -> Any:
    """A part of a join's condition (``spark_internals.join_condition_parts``' tree) on a
    pair of rows (left, right), as Spark evaluates it: SQL's three-valued logic (None for
    null), NaN equal to itself and above every other number, integer overflow an error
    (ANSI)."""
    kind = tree[0]
    if kind == "col":
        return pair[tree[1]][tree[2]]
    if kind == "lit":
        return tree[1]
    if kind in ("and", "or"):
        a, b = evaluate(tree[1], pair), evaluate(tree[2], pair)
        decided = kind == "or"   # (true decides an OR, false an AND)
        if a is decided or b is decided:
            return decided
        return None if a is None or b is None else not decided
    if kind == "not":
        a = evaluate(tree[1], pair)
        return None if a is None else not a
    if kind in ("isnull", "isnotnull"):
        return (evaluate(tree[1], pair) is None) == (kind == "isnull")
    if kind == "cmp":
        return _compare(tree[1], evaluate(tree[2], pair), evaluate(tree[3], pair))
    if kind == "in":
        value = evaluate(tree[1], pair)
        if value is None:
            return None
        found = [_compare("=", value, evaluate(item, pair)) for item in tree[2]]
        return True if True in found else None if None in found else False
    value = [evaluate(t, pair) for t in tree[1:3]]
    if any(v is None for v in value):
        return None
    if kind == "float":
        return float(value[0])
    if kind == "decimal":
        return decimal.Decimal(value[0])
    a, b = value
    result = a + b if kind == "+" else a - b if kind == "-" else a * b
    bits = tree[3] if len(tree) > 3 else None
    if bits and not -(1 << (bits - 1)) <= result < (1 << (bits - 1)):
        raise ArithmeticError(f"[ARITHMETIC_OVERFLOW] {a} {kind} {b} overflows in a join condition.")
    return result


def _compare(op: str, a: Any, b: Any) -> bool | None:
    """``a op b`` as Spark compares: null gives null (``<=>``: equal when both null), NaN
    equal to NaN and greater than any other number."""
    if op == "<=>":
        if a is None or b is None:
            return a is None and b is None
        op = "="
    elif a is None or b is None:
        return None
    if isinstance(a, float) or isinstance(b, float):
        a = (1, 0.0) if a != a else (0, a)
        b = (1, 0.0) if b != b else (0, b)
    if op == "=":
        return a == b
    return a < b if op == "<" else a <= b if op == "<=" else a > b if op == ">" else a >= b


def _columns_read(tree: Any) -> Iterator[tuple[int, int]]:
    """The (side, index) of each column a condition part's tree reads."""
    if isinstance(tree, list):
        for item in tree:
            yield from _columns_read(item)
    elif isinstance(tree, tuple) and tree:
        if tree[0] == "col":
            yield tree[1], tree[2]
        elif tree[0] != "lit":
            for item in tree[1:] if isinstance(tree[0], str) else tree:
                yield from _columns_read(item)


def _columns_renumbered(tree: Any, side: int, at: dict[int, int]) -> Any:
    """A condition part's tree with ``side``'s column ``i`` read at ``at[i]``."""
    if isinstance(tree, list):
        return [_columns_renumbered(item, side, at) for item in tree]
    if not isinstance(tree, tuple) or not tree:
        return tree
    if tree[0] == "col":
        return ("col", tree[1], at[tree[2]]) + tuple(tree[3:]) if tree[1] == side else tree
    if tree[0] == "lit":
        return tree
    if isinstance(tree[0], str):
        return (tree[0],) + tuple(_columns_renumbered(item, side, at) for item in tree[1:])
    return tuple(_columns_renumbered(item, side, at) for item in tree)


def _times(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """An event-time column as µs: a timestamp's, or a time window's end."""
    return pc.struct_field(column, [1]) if pa.types.is_struct(column.type) else column


def _rows_at(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """The rows ``rows`` (ascending) of ``table``: the table itself when they are all."""
    return table if len(rows) == table.num_rows else table.take(pa.array(rows))


def _rows_counted(values, counts: pa.Table, key_names: list[str]) -> pa.Table:
    """The rows a side's ``keyWithIndexToValue`` store holds for the keys of ``counts``
    (its ``keyToNumValues`` rows: indexes 0..count-1 of each key)."""
    n = counts.column("v0").to_numpy(zero_copy_only=False).astype(np.int64)
    at = np.repeat(np.arange(len(n)), n)
    index = np.arange(n.sum(), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return values.matching_rows(_indexed(counts.select(key_names).take(pa.array(at)), index))


def _indexed(keys: pa.Table, index: np.ndarray) -> pa.Table:
    """Keys (``k..``) with an index column after them: a row store's keys."""
    return keys.append_column(f"k{keys.num_columns}", pa.array(index, pa.int64()))


def _time_us(value: Any) -> int | None:
    """An event time in µs: a timestamp, or a time window (Spark compares a window's end
    with the watermark), which the state encoding gives as a tuple or a dict."""
    if isinstance(value, tuple):
        return value[1]
    if isinstance(value, dict):
        return value.get("end")
    return value


# -- the step --------------------------------------------------------------------------------
def join_statistics_column(node: Watermark, schema: StructType) -> int | None:
    """The index of a join side's watermarked timestamp column in the side's row, whose
    event-time statistics the task can report for the watermark; None (a window's end:
    left to an ``Observation``)."""
    names = [n.lower() for n in schema.fieldNames()]
    if node.event_time.lower() not in names:
        return None
    index = names.index(node.event_time.lower())
    return index if isinstance(schema.fields[index].dataType, (TimestampType, TimestampNTZType)) else None


class JoinStep(StatefulStep):
    """Both sides' rows, tagged by side and hash-partitioned by the join keys into the
    state partitions (as Spark distributes each side of its join), then the join's task
    per partition, then the join's columns by name. The columns and schemas are made once
    per run (``_shape``); a batch binds its rows and watermarks."""

    name = "symmetricHashJoin"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        node = self.node
        #: per side, the columns its state rows leave out, as Spark's (``StreamJoin.pruned``);
        #: none for state an earlier microbatch wrote with them (``stored_schema_check``),
        #: nor on a side where the condition reads one (Spark's optimizer and microbatch
        #: would disagree: nothing is pruned there then)
        pruned = []
        for side in (0, 1):
            gone = frozenset(n.lower() for n in node.pruned[side])
            names = [n.lower() for n in node.side_columns[side]]
            read = {a.index for _, *terms in node.comparisons for a in terms if a.side == side}
            read |= {index for tree in node.pair_conditions for s, index in _columns_read(tree) if s == side}
            read_names = {k.lower() for k in (node.keys, node.right_keys or node.keys)[side]}
            if any(i is None or i >= len(names) or names[i] in gone for i in read) or gone & read_names:
                gone = frozenset()
            pruned.append(gone)
        self.pruned: tuple[frozenset, frozenset] = tuple(pruned)
        self._unpruned: tuple[StructType, StructType] | None = None

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        node = self.node
        left, right = inputs
        shape = self.cached("shape", lambda: _join_shape(node, left, right, self.pruned))
        # (test-only: a planted bug, microbatch.planted_bugs, that never evicts join state)
        eviction_ms = 0 if self.cached("no-evict", lambda: planted(left.sparkSession, "join-no-evict")) \
            else batch.eviction_ms
        times = shape["times"]
        watermarked = any(t is not None for t in times)
        reports = []
        for side in (0, 1):
            # the side's rows all reach the task, which reports their event-time statistics
            column, below = shape["stats_columns"][side], batch.statistics_of.get(side)
            if below is not None and column is not None:
                batch.reported[below] = JOIN_SIDE_TAGS[side]
                reports.append(column)
            else:
                reports.append(None)
        value_watermarks = tuple(None if times[side] is None or node.watermark_key() is not None
                                 else node.value_watermark_ms(side, eviction_ms)
                                 for side in (0, 1))
        task = JoinTask(
            self.state_root, self.operator_id, batch.batch_id, batch.store_conf, batch.metrics,
            key_schema=shape["key_schema"], row_schemas=shape["row_schemas"],
            output_types=shape["output_types"], event_times=times,
            watermark_key=node.watermark_key(), how=node.exec_how or node.how, comparisons=shape["comparisons"],
            value_evict_us=tuple(None if v is None else v * 1000 for v in value_watermarks),
            late_us=batch.late_ms * 1000 if watermarked else None,
            evict_us=eviction_ms * 1000 if watermarked else None,
            event_time_stats=tuple(reports), counts_outer_removals=spark_internals.running_version().at_least(4, 3),
            semi_evicts_matched=spark_internals.running_version().at_least(4, 2),
            pre_filtered=tuple(bool(c) for c in node.side_conditions), pair_conditions=node.pair_conditions)
        partitions = self.num_partitions

        def build(inputs: list[DataFrame], task: JoinTask):
            sides = [df if names is None else df.toDF(*names) for df, names in zip(inputs, shape["apart"])]
            both = sides[0].select(*shape["tagged"][0]).union(sides[1].select(*shape["tagged"][1]))
            mapped = both.repartition(partitions, *shape["partition"]).mapInArrow(task, shape["out"])
            return mapped.select(*shape["result"]), spark_internals.map_in_arrow_function(mapped, shape["out"])

        return self.bind([left, right], task, build)

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        left, right = (StructType([StructField(n, f.dataType, f.nullable, f.metadata)
                                   for n, f in zip(_names_apart(schema.fieldNames()), schema.fields)])
                       for schema in input_schemas)
        by_name = {f.name.lower(): f for f in left.fields}
        key = StructType([by_name[k.lower()] for k in self.node.keys])
        self._unpruned = (left, right)
        return key, self._value_schema(self.pruned)

    def _value_schema(self, pruned: tuple[frozenset, frozenset]) -> StructType:
        kept = [StructType([f for f in schema.fields if f.name.lower() not in gone])
                for schema, gone in zip(self._unpruned, pruned)]
        return StructType([StructField("left", kept[0]), StructField("right", kept[1])])

    def stored_schema_check(self, stored: dict, key: StructType, value: StructType,
                            conf: Any) -> tuple[str | None, str | None]:
        """State written before microbatch pruned a join's sides (every column kept), or
        before it pruned any but a left semi join's right side, is read and written as it
        was."""
        if any(self.pruned) and self._unpruned is not None and self.schema_difference(stored, key, value):
            for earlier in ((frozenset(), self.pruned[1]), (frozenset(), frozenset())):
                whole = self._value_schema(earlier)
                if earlier != self.pruned and not self.schema_difference(stored, key, whole):
                    self.pruned = earlier
                    self._cache.pop("shape", None)
                    value = whole
                    break
        return super().stored_schema_check(stored, key, value, conf)

    def _document_extras(self) -> dict:
        return {"joinType": self.node.how}

    def _meaning_difference(self, doc: dict) -> list[str]:
        if doc.get("joinType", "inner") != self.node.how:
            return [f"the join was {doc.get('joinType', 'inner')} and is now {self.node.how}"]
        return []


def _names_apart(names: list[str]) -> list[str]:
    """A join side's column names with each carried hidden column (``CARRIED_METADATA``: a
    cascaded join's left side has its inner sides', each after that side's columns) named
    apart, so the join reads each by name."""
    if names.count(spark_internals.CARRIED_METADATA) < 2:
        return names
    return [f"{n}_{k}" if n == spark_internals.CARRIED_METADATA else n for k, n in enumerate(names)]


def _statistics_columns(node: Any, whole: tuple[StructType, StructType], kept: tuple[StructType, StructType]
                        ) -> tuple[list[str | None], list[tuple[int, StructField]]]:
    """Per side, the input column the task reports the side's watermark's statistics from:
    its event time among the state row's columns (``kept``), else, pruned from the state
    rows (nothing above reads it), beside them as ``__e<side>``, which the task reads and
    stores not; with the columns to add so (side, its field in the side's ``whole`` row)."""
    columns: list[str | None] = []
    extra: list[tuple[int, StructField]] = []
    for side, prefix in ((0, "__l"), (1, "__r")):
        watermark = node.side_watermark(side)
        index = None if watermark is None else join_statistics_column(watermark, kept[side])
        whole_index = None if watermark is None else join_statistics_column(watermark, whole[side])
        if index is not None:
            columns.append(f"{prefix}{index}")
        elif whole_index is not None:
            columns.append(f"__e{side}")
            extra.append((side, whole[side].fields[whole_index]))
        else:
            columns.append(None)
    return columns, extra


def _join_shape(node: Any, left: DataFrame, right: DataFrame,
                pruned: tuple[frozenset, frozenset] = (frozenset(), frozenset())) -> dict:
    """What a stream-stream join's batches share: each side's tagging columns (``__side``,
    the keys ``__k..``, the left row ``__l..``, the right row ``__r..``: a side's columns
    not in ``pruned``), the task's schemas, the partitioning columns and the output
    columns (Spark's USING or condition output; a pruned column null: nothing reads it)."""
    names_written = (left.schema.fieldNames(), right.schema.fieldNames())
    #: per side, its columns' names apart where it carries two hidden columns (None: as they are),
    #: which every batch's side takes before it is tagged
    apart = tuple(None if _names_apart(names) == names else _names_apart(names) for names in names_written)
    left, right = (df if names is None else df.toDF(*names) for df, names in zip((left, right), apart))
    whole = (left.schema, right.schema)
    kept = [[j for j, f in enumerate(schema.fields) if f.name.lower() not in gone]
            for schema, gone in zip(whole, pruned)]
    at = [{j: p for p, j in enumerate(indexes)} for indexes in kept]
    for side in (0, 1):
        if len(kept[side]) < len(whole[side].fields):   # (its condition reads none of the others)
            node = dataclasses.replace(
                node, comparisons=tuple((op, *(t if t.side != side else dataclasses.replace(t, index=at[side][t.index])
                                                for t in terms)) for op, *terms in node.comparisons),
                pair_conditions=tuple(_columns_renumbered(tree, side, at[side]) for tree in node.pair_conditions))
    sides = (left, right)
    schemas = tuple(StructType([whole[side].fields[j] for j in kept[side]]) for side in (0, 1))
    keys = list(node.keys)
    side_keys = (list(node.keys), list(node.right_keys))
    stats_columns, extra = _statistics_columns(node, whole, schemas)
    tagged = []
    for side in (0, 1):
        columns = [F.lit(side).alias("__side")] + [F.col(quoted(k)).alias(f"__k{i}")
                                                   for i, k in enumerate(side_keys[side])]
        for s, (prefix, schema) in enumerate((("__l", schemas[0]), ("__r", schemas[1]))):
            columns += [(F.col(quoted(f.name)) if s == side else F.lit(None).cast(f.dataType)).alias(f"{prefix}{j}")
                        for j, f in enumerate(schema.fields)]
        columns += [(F.col(quoted(f.name)) if s == side else F.lit(None).cast(f.dataType)).alias(f"__e{s}")
                    for s, f in extra]
        if any(node.side_conditions):   # (the side's pre-join filter, as Spark's join exec checks it)
            parts = node.side_conditions[side]
            columns.append((F.expr(" AND ".join(f"({p})" for p in parts)) if parts else F.lit(True)).alias("__f"))
        tagged.append(columns)
    both = sides[0].select(*tagged[0]).union(sides[1].select(*tagged[1]))   # the keys' common types
    key_fields = [both.schema[f"__k{i}"] for i in range(len(keys))]
    arrow = [[spark_internals.arrow_type(f.dataType) for f in schema.fields] for schema in schemas]

    def event_time(side: int, schema: StructType) -> int | None:
        column = node.exec_event_time(side)
        names = [n.lower() for n in schema.fieldNames()]
        return names.index(column.lower()) if column and column.lower() in names else None

    left_names, right_names = names_written
    #: per side, each column's index among the side's columns as the query wrote them (its
    #: qualifier's), None for a carried hidden column (a cascaded join's inner side's, within)
    written = [[None if n == spark_internals.CARRIED_METADATA else k - sum(m == spark_internals.CARRIED_METADATA
                                                                          for m in names[:k])
                for k, n in enumerate(names)] for names in names_written]

    def column(side: int, index: int):
        """A side's column ``index`` (of the side's whole row) from the task's output."""
        if index not in at[side]:   # (pruned: nothing above reads it)
            return F.lit(None).cast(whole[side].fields[index].dataType)
        return F.col(f"{('__l', '__r')[side]}{at[side][index]}")

    def named(column, name: str, side: int, index: int):
        """A side's column under its name, with its qualifier and its metadata (a time
        window's mark, which ``window_time`` above reads; the event time's watermark)."""
        qualifiers, at_written = node.side_qualifiers[side], written[side][index]
        qualifier = qualifiers[at_written] if at_written is not None and at_written < len(qualifiers) else ()
        metadata = whole[side].fields[index].metadata or None
        if qualifier:
            return spark_internals.qualified_alias(column, name, qualifier, metadata)
        return column.alias(name, metadata=metadata) if metadata else column.alias(name)

    if not node.using:   # a condition: every column of the left, then of the right
        # (each keeps its side's qualifier, so a query above may name both sides' ``id``)
        result = [named(column(0, j), n, 0, j) for j, n in enumerate(left_names)]
        if node.how != "semi":
            result += [named(column(1, j), n, 1, j) for j, n in enumerate(right_names)]
    else:
        # Spark's USING join output: the keys (the left's; the right's in a right outer join;
        # the one that is there in a full outer join), then the other columns of each side
        lowered = [k.lower() for k in keys]
        left_key = {n.lower(): j for j, n in enumerate(left_names)}
        right_key = {n.lower(): j for j, n in enumerate(right_names)}

        def key_column(k: str):
            if node.how == "right":
                return column(1, right_key[k.lower()])
            if node.how == "full":
                return F.coalesce(column(0, left_key[k.lower()]), column(1, right_key[k.lower()]))
            return column(0, left_key[k.lower()])
        def key_metadata(k: str) -> dict:   # (a full outer join's coalesce has none, as in Spark)
            if node.how == "full":
                return {}
            return (whole[1].fields[right_key[k.lower()]] if node.how == "right"
                    else whole[0].fields[left_key[k.lower()]]).metadata
        result = [key_column(k).alias(k, metadata=key_metadata(k)) if key_metadata(k) else key_column(k).alias(k)
                  for k in keys]
        result += [named(column(0, j), n, 0, j) for j, n in enumerate(left_names) if n.lower() not in lowered]
        if node.how != "semi":   # a left semi join gives the left side's columns only
            result += [named(column(1, j), n, 1, j) for j, n in enumerate(right_names)
                       if n.lower() not in lowered]
    return {
        "tagged": tagged,
        "apart": apart,
        "stats_columns": tuple(stats_columns),
        "key_schema": pa.schema([pa.field(f.name, storage_type(spark_internals.arrow_type(f.dataType)))
                                 for f in key_fields]),
        "row_schemas": tuple(pa.schema([pa.field(f.name, storage_type(t)) for f, t in zip(schema.fields, types)])
                             for schema, types in zip(schemas, arrow)),
        "output_types": tuple(tuple(types) for types in arrow),
        "times": (event_time(0, schemas[0]), event_time(1, schemas[1])),
        "comparisons": tuple((op, (a.side, a.index, a.offset_us), (b.side, b.index, b.offset_us))
                             for op, a, b in node.comparisons),
        "out": StructType([StructField(f"{prefix}{j}", f.dataType, True)
                           for prefix, schema in (("__l", schemas[0]), ("__r", schemas[1]))
                           for j, f in enumerate(schema.fields)]),
        "partition": [F.col(f"__k{i}") for i in range(len(keys))],
        "result": result,
    }
