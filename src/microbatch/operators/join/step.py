"""A stream-stream join's step and task (``operators.join`` says what they do)."""
from __future__ import annotations

import dataclasses
import decimal
import time
from dataclasses import dataclass
from typing import Any, Iterator

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
    #: per side: the row column whose event-time statistics the task reports for the
    #: side's watermark (instead of an ``Observation`` of it), or None
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

    def _side_rows(self, table: pa.Table, side: int, partition: int) -> tuple[list, list, int, list | None]:
        """A side's (keys, rows) without its late rows, how many were late, and whether each
        passes the side's pre-join filter (None: it has none); the event-time statistics of
        all its rows reported, when the task reports them."""
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
        if batches:
            table = pa.Table.from_batches(batches)
            for side in ((1, 0) if self.how == "semi" and self.semi_evicts_matched else (0, 1)):
                keys, rows, dropped, passes = self._side_rows(table, side, partition)
                late += dropped
                updated += self._store_and_join(stores, side, keys, rows, output, passes)
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = 0
        for side in SIDES:
            evicted = self._evict(stores, side, output)
            if self.counts_outer_removals or not (self.how == "full" or self.how == side):
                removed += evicted
        removals_ms = (time.monotonic() - started) * 1000
        if output:
            yield self._output(output)
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
            index, below = shape["stats_columns"][side], batch.statistics_of.get(side)
            if below is not None and index is not None:
                batch.reported[below] = JOIN_SIDE_TAGS[side]
                reports.append(index)
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
            both = inputs[0].select(*shape["tagged"][0]).union(inputs[1].select(*shape["tagged"][1]))
            mapped = both.repartition(partitions, *shape["partition"]).mapInArrow(task, shape["out"])
            return mapped.select(*shape["result"]), spark_internals.map_in_arrow_function(mapped, shape["out"])

        return self.bind([left, right], task, build)

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        left, right = input_schemas
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


def _join_shape(node: Any, left: DataFrame, right: DataFrame,
                pruned: tuple[frozenset, frozenset] = (frozenset(), frozenset())) -> dict:
    """What a stream-stream join's batches share: each side's tagging columns (``__side``,
    the keys ``__k..``, the left row ``__l..``, the right row ``__r..``: a side's columns
    not in ``pruned``), the task's schemas, the partitioning columns and the output
    columns (Spark's USING or condition output; a pruned column null: nothing reads it)."""
    from pyspark.sql.types import StructField
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
    tagged = []
    for side in (0, 1):
        columns = [F.lit(side).alias("__side")] + [F.col(quoted(k)).alias(f"__k{i}")
                                                   for i, k in enumerate(side_keys[side])]
        for s, (prefix, schema) in enumerate((("__l", schemas[0]), ("__r", schemas[1]))):
            columns += [(F.col(quoted(f.name)) if s == side else F.lit(None).cast(f.dataType)).alias(f"{prefix}{j}")
                        for j, f in enumerate(schema.fields)]
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

    left_names, right_names = whole[0].fieldNames(), whole[1].fieldNames()

    def column(side: int, index: int):
        """A side's column ``index`` (of the side's whole row) from the task's output."""
        if index not in at[side]:   # (pruned: nothing above reads it)
            return F.lit(None).cast(whole[side].fields[index].dataType)
        return F.col(f"{('__l', '__r')[side]}{at[side][index]}")

    def named(column, name: str, side: int, index: int):
        """A side's column under its name, with its qualifier and its metadata (a time
        window's mark, which ``window_time`` above reads; the event time's watermark)."""
        qualifiers = node.side_qualifiers[side]
        qualifier = qualifiers[index] if index < len(qualifiers) else ()
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
        "stats_columns": tuple(None if (watermark := node.side_watermark(side)) is None
                               else join_statistics_column(watermark, schemas[side]) for side in (0, 1)),
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
