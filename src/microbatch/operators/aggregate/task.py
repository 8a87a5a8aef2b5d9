"""The state task of a streaming aggregation: one Spark task per state partition.

The task gets the batch's buffers per key (``spec``, step 1), merges
each key's buffers into the store at version N, commits N+1 and emits what the
output mode asks for (Spark's ``StateStoreSaveExec``):

- complete: every key in the store, after the batch's updates; nothing is evicted
  and no row is late;
- update: the keys this batch changed; then keys behind the watermark are evicted;
- append: nothing for changed keys; keys behind the watermark are evicted and
  emitted, final.

With a watermark on a grouping key (the event-time column, or a window over it;
a window is behind the watermark when its end is), a key at or before the
previous batch's watermark is late in update and append mode: dropped and counted
as ``numRowsDroppedByWatermark``. Eviction uses this batch's watermark.

Two ways through the store, the same results:

- in Arrow (``_in_tables``), where every merge is one ``table_form.group_rows`` does
  alike (sums of numbers; min and max of numbers, strings, dates, structs of them) and
  the store keeps tables: the batch's
  rows and the rows held for their keys are folded by one group-by; eviction is a
  filter. Columns keep their storage types (timestamps as int64 microseconds).
- value by value otherwise: values cross the store as plain Python values
  (timestamps as int64 microseconds, structs such as a window as tuples).
"""
from __future__ import annotations

import decimal
import math
import time
from bisect import bisect_left
from functools import cmp_to_key
from itertools import accumulate
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from microbatch.operators.aggregate import histogram, quantiles
from microbatch.operators.aggregate.hll import estimate as hll_estimate
from microbatch.state.files import from_state_values, hashable, state_values, storage_type
from microbatch.state.table_form import (OVERFLOW, anti_join, flat_keys, foldable, group_rows, key_groups,
                                         semi_join, table_key)
from microbatch.operators.base import StateTask, task_partition
from microbatch.operators.event_time_stats import EventTimeStats


def buffer_columns(values: list[tuple], merges, value_storage, fields) -> list[pa.Array]:
    """The output columns of merged buffers (one tuple per row): each buffer as its
    Arrow type, an HLL++ buffer as its estimate."""
    columns = []
    for kind, start, count, options in merges:
        if kind == "hll":
            p, threshold, raw, bias = options
            estimates = [hll_estimate(dict(_merge_hll(v[start], ())), p, threshold, list(raw), list(bias))
                         for v in values]
            columns.append(pa.array(estimates, type=pa.int64()))
            continue
        if kind == "counts":
            results = [collected_result(_counts(v[start]), options) for v in values]
            if options[0] == "mode":
                columns.append(from_state_values(results, value_storage[start].value_type.field("v").type,
                                                 fields[start].type))
            else:
                columns.append(pa.array(results, type=fields[start].type))
            continue
        if kind == "quantiles":   # the percentiles, then the summary's other two columns as nulls
            eps, percentages, is_array = options
            results = [quantiles.query(v[start:start + 3], percentages, eps) for v in values]
            if not is_array:
                results = [None if r is None else r[0] for r in results]
            columns.append(pa.array(results, type=fields[start].type))
            columns += [pa.nulls(len(values), fields[j].type) for j in (start + 1, start + 2)]
            continue
        for j in range(start, start + count):
            columns.append(from_state_values([v[j] for v in values], value_storage[j], fields[j].type))
    return columns


def _compare(a: Any, b: Any) -> int:
    """Spark's order for min/max (-1, 0, 1): NaN is larger than any other number, a null
    field sorts first, structs (dicts, in field order) and arrays compare element by element."""
    if a is None or b is None:
        return (a is not None) - (b is not None)
    if isinstance(a, dict):
        for key in a:
            found = _compare(a[key], b[key])
            if found:
                return found
        return 0
    if isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            found = _compare(x, y)
            if found:
                return found
        return (len(a) > len(b)) - (len(a) < len(b))
    if isinstance(a, float) and isinstance(b, float) and (a != a or b != b):
        return (a != a) - (b != b)
    return (a > b) - (a < b)


def _less(a: Any, b: Any) -> bool:
    return _compare(a, b) < 0


def _merge_hll(old, new) -> list:
    registers: dict[int, int] = {}
    for pairs in (old, new):
        for pair in pairs or ():
            i, r = (pair["i"], pair["r"]) if isinstance(pair, dict) else pair
            if r > registers.get(i, 0):
                registers[i] = r
    return sorted(registers.items())


def _moments(old: list, new: list) -> list:
    """Spark's CentralMomentAgg merge: n, mean and the central moments m2 (to m4)."""
    n1, mean1, *m1 = old
    n2, mean2, *m2 = new
    if not n1:
        return list(new)
    if not n2:
        return list(old)
    m1 = [x or 0.0 for x in m1]
    m2 = [x or 0.0 for x in m2]
    n = n1 + n2
    delta = mean2 - mean1
    delta_n = delta / n
    merged = [n, mean1 + delta_n * n2, m1[0] + m2[0] + delta * delta_n * n1 * n2]
    if len(m1) >= 2:
        merged.append(m1[1] + m2[1] + delta_n * delta_n * delta * n1 * n2 * (n1 - n2)
                      + 3.0 * delta_n * (n1 * m2[0] - n2 * m1[0]))
    if len(m1) >= 3:
        merged.append(m1[2] + m2[2]
                      + delta_n * delta_n * delta_n * delta * n1 * n2 * (n1 * n1 - n1 * n2 + n2 * n2)
                      + 6.0 * delta_n * delta_n * (n1 * n1 * m2[0] + n2 * n2 * m1[0])
                      + 4.0 * delta_n * (n1 * m2[1] - n2 * m1[1]))
    return merged


def _comoments(old: list, new: list) -> list:
    """Spark's Covariance merge (n, x's mean, y's mean, ck) and PearsonCorrelation's (with
    x's and y's m2)."""
    n1, x1, y1, ck1, *mk1 = old
    n2, x2, y2, ck2, *mk2 = new
    if not n1:
        return list(new)
    if not n2:
        return list(old)
    n = n1 + n2
    dx, dy = x2 - x1, y2 - y1
    dx_n, dy_n = dx / n, dy / n
    merged = [n, x1 + dx_n * n2, y1 + dy_n * n2, ck1 + ck2 + dx * dy_n * n1 * n2]
    if mk1:
        merged += [mk1[0] + mk2[0] + dx * dx_n * n1 * n2, mk1[1] + mk2[1] + dy * dy_n * n1 * n2]
    return merged


def _extremum_by(kind: str, old: list, new: list) -> list:
    """max_by/min_by: (value, ordering); the state's value is kept only where its ordering is
    strictly greater (less), as Spark's merge keeps its left buffer (the state's)."""
    if old[1] is None:
        return list(new) if new[1] is not None else [None, None]
    if new[1] is None:
        return list(old)
    found = _compare(old[1], new[1])
    return list(old) if (found > 0 if kind == "max_by" else found < 0) else list(new)


def _try_add(old, new, bound: int):
    """A sum (try_sum's, try_avg's) that is None once it overflowed: a bigint's outside
    [-bound, bound), a decimal's at or past ``bound`` in absolute value."""
    if old is None or new is None:
        return None
    total = old + new
    if isinstance(total, decimal.Decimal):
        return None if abs(total) >= bound else total
    return None if not -bound <= total < bound else total


def _bits(kind: str, old: list, new: list, options: tuple) -> list:
    a, b = old[0], new[0]
    if a is None or b is None:
        return [b if a is None else a]
    return [a & b if kind == "bit_and" else a | b if kind == "bit_or" else a ^ b]


def _try_sum(kind: str, old: list, new: list, options: tuple) -> list:
    """try_sum's (sum, non-empty) and try_avg's (sum, count): a non-empty buffer's null sum
    overflowed, and stays null."""
    (sum1, n1), (sum2, n2) = old, new
    if not n1 or not n2:
        return list(new) if n2 else list(old)
    return [_try_add(sum1, sum2, options[0]), True if kind == "try_sum" else n1 + n2]


def _counts(values) -> list:
    """(value, count) pairs as a list of (value, count) sorted by value (Spark's order)."""
    pairs = [(p["v"], p["n"]) if isinstance(p, dict) else tuple(p) for p in values or ()]
    return sorted(pairs, key=cmp_to_key(lambda x, y: _compare(x[0], y[0])))


def _merge_counts(old, new) -> list:
    """Two lists of (value, count) -> one, each value once, counts added, sorted by value."""
    counts: dict = {}
    for value, n in _counts(old) + _counts(new):
        found = hashable(value)
        counts[found] = (value, counts[found][1] + n) if found in counts else (value, n)
    return _counts(counts.values())


def _percentile(pairs: list, percentages, is_array: bool, reverse: bool, discrete: bool,
                endpoint_delta: bool = True):
    """Spark's Percentile over the counts of each value (sorted): each percentage's position
    among the values, interpolated between its neighbours (not for percentile_disc): as
    Spark 4.3 does, the lower one plus the fraction of the difference (``endpoint_delta``),
    or as Spark before it, the two weighted by the fraction (the last bit can differ)."""
    if not pairs:
        return None
    if reverse:
        pairs = pairs[::-1]
    accumulated = list(accumulate(n for _, n in pairs))
    last = accumulated[-1] - 1
    results = []
    for percentage in percentages:
        position = last * percentage
        lower, higher = math.floor(position), math.ceil(position)
        lower_key = pairs[bisect_left(accumulated, lower + 1)][0]
        higher_key = pairs[bisect_left(accumulated, higher + 1)][0]
        if higher == lower or higher_key == lower_key or discrete:
            results.append(float(lower_key))
        elif endpoint_delta:
            results.append(float(lower_key) + (position - lower) * (float(higher_key) - float(lower_key)))
        else:
            results.append((higher - position) * float(lower_key) + (position - lower) * float(higher_key))
    return results if is_array else results[0]


def _mode(pairs: list, reverse: bool):
    """Spark's Mode with a tie-break: the most frequent value, of those as frequent the
    smallest (``reverse``) or the largest."""
    if not pairs:
        return None
    top = max(n for _, n in pairs)
    found = [v for v, n in pairs if n == top]
    return found[0] if reverse else found[-1]


def collected_result(pairs, options: tuple):
    """What percentile or mode returns over a list of (value, count)."""
    if options[0] == "mode":
        return _mode(pairs, options[1])
    return _percentile(pairs, *options[1:])


#: The merges beyond the first ones, by kind: (kind, old, new, options) -> merged.
_MERGES = {
    "max_by": lambda kind, old, new, options: _extremum_by(kind, old, new),
    "min_by": lambda kind, old, new, options: _extremum_by(kind, old, new),
    "bit_and": _bits, "bit_or": _bits, "bit_xor": _bits, "try_sum": _try_sum, "try_avg": _try_sum,
    "comoments": lambda kind, old, new, options: _comoments(old, new),
    "regression": lambda kind, old, new, options: _comoments(old[:4], new[:4]) + _moments(old[4:], new[4:]),
    "counts": lambda kind, old, new, options: [_merge_counts(old[0], new[0])],
    "quantiles": lambda kind, old, new, options: list(
        quantiles.merge(tuple(old), _summary(new, options), options[0])),
    "histogram": lambda kind, old, new, options: [histogram.merge(old[0], new[0], options[0])],
}


def _summary(buffers: list, options: tuple) -> tuple:
    """A percentile_approx buffer as a summary: a batch's values (g null: not inserted yet)
    become the summary Spark's partial aggregation makes of them."""
    values, gs, deltas = buffers
    if gs is None:
        return quantiles.summary(values or [], options[0])
    return values, gs, deltas

#: The merges whose buffers a new key's first batch brings in another form than the state's
#: (HLL++ registers as a set, counts in any order and a value more than once, a
#: percentile_approx's values not yet in a summary): (buffers, options) -> buffers
_NORMALISED = {"hll": lambda part, options: [_merge_hll((), part[0])],
               "counts": lambda part, options: [_merge_counts((), part[0])],
               "quantiles": lambda part, options: list(_summary(part, options))}


def merge_buffers(kind: str, old: list, new: list, options: tuple = ()) -> list:
    """Two buffers of one function (lists of its buffer columns' values) -> one."""
    if kind == "sum":   # element-wise (avg keeps a sum and a count)
        return [b if a is None else a if b is None else a + b for a, b in zip(old, new)]
    if kind == "sum_checked":   # a bigint sum in ANSI mode: an overflow fails the batch
        a, b = old[0], new[0]
        total = b if a is None else a if b is None else a + b
        if total is not None and not -2 ** 63 <= total < 2 ** 63:
            raise ArithmeticError(OVERFLOW)
        return [total]
    if kind in ("min", "max"):
        a, b = old[0], new[0]
        if a is None or b is None:
            return [b if a is None else a]
        return [(b if _less(b, a) else a) if kind == "min" else (b if _less(a, b) else a)]
    if kind == "first":
        return list(old) if old[1] else list(new)
    if kind == "last":
        return list(new) if new[1] else list(old)
    if kind == "concat":
        return [(old[0] or []) + (new[0] or [])]
    if kind == "union":
        merged = list(old[0] or [])
        try:
            seen = set(map(hashable, merged))
            for x in new[0] or []:
                if hashable(x) not in seen:
                    seen.add(hashable(x))
                    merged.append(x)
        except TypeError:
            merged += [x for x in new[0] or [] if x not in merged]
        return [merged]
    if kind == "moments":
        return _moments(old, new)
    if kind == "hll":
        return [_merge_hll(old[0], new[0])]
    more = _MERGES.get(kind)
    if more is not None:
        return more(kind, old, new, options)
    raise ValueError(f"unknown merge {kind}")


def event_time_statistics(batches, partition: int, metrics):
    """Pass ``batches`` on without their last four columns (per group: max, min, sum and
    count of the event time in ms); at the end, report the partition's totals."""
    stats = EventTimeStats()
    for batch in batches:
        width = batch.num_columns - 4
        if batch.num_rows:
            group_max, group_min, group_sum, group_count = (batch.column(width + i) for i in range(4))
            stats.add_ms(pc.max(group_max).as_py(), pc.min(group_min).as_py(),
                         pc.sum(group_sum).as_py() or 0.0, pc.sum(group_count).as_py() or 0)
        yield pa.RecordBatch.from_arrays(batch.columns[:width], schema=pa.schema(list(batch.schema)[:width]))
    stats.report(metrics, partition)


def rows_kept(batches):
    """Pass ``batches`` on without their last column, a boolean: only the rows where it is
    true (the keys a filter Spark runs before the aggregation lets through, whose rows'
    event-time statistics were read first)."""
    for batch in batches:
        width = batch.num_columns - 1
        rows = pa.RecordBatch.from_arrays(batch.columns[:width], schema=pa.schema(list(batch.schema)[:width]))
        yield rows.filter(batch.column(width))


@dataclass(frozen=True)
class AggregateTask(StateTask):
    """The per-partition function of a streaming aggregation (shipped by cloudpickle)."""

    key_fields: tuple = ()                   # the batch's key columns (Arrow fields)
    buffer_fields: tuple = ()                # the batch's buffer columns
    merges: tuple = ()                       # (kind, first buffer, count, options) per call
    output_schema: pa.Schema = None          # keys + merged buffers (an HLL buffer -> its estimate)
    mode: str = "append"                     # append / update / complete
    watermark_key: int | None = None         # the grouping key with event time
    watermark_is_window: bool = False
    late_us: int | None = None
    evict_us: int | None = None
    #: whether each row ends with the event-time statistics of its group (max, min,
    #: sum, count in ms; ``event_time_stats.EVENT_TIME_STATS``), to report and strip
    event_time_stats: bool = False
    #: whether each row ends (before its statistics) with whether its key passes the
    #: aggregation's key filter (``Aggregate.key_filter``): a row that does not is dropped
    key_filtered: bool = False

    def _event_times(self, keys: list[tuple]) -> list:
        """Each key's event time (a window's: its end), None where it has none."""
        values = list(map(itemgetter(self.watermark_key), keys))
        if self.watermark_is_window:
            if None in values:
                return [None if w is None else w[1] for w in values]
            return list(map(itemgetter(1), values))
        return values

    def __call__(self, batches):
        partition = task_partition()
        if self.event_time_stats:
            batches = event_time_statistics(batches, partition, self.metrics)
        if self.key_filtered:
            batches = rows_kept(batches)
        key_storage = [storage_type(f.type) for f in self.key_fields]
        value_storage = [storage_type(f.type) for f in self.buffer_fields]
        store = self.store(partition, pa.schema([pa.field(f.name, t) for f, t in zip(self.key_fields, key_storage)]),
                           pa.schema([pa.field(f.name, t) for f, t in zip(self.buffer_fields, value_storage)]))
        num_keys = len(self.key_fields)
        check_late = self.mode != "complete" and self.watermark_key is not None and self.late_us is not None
        folds = self._arrow_folds(value_storage)
        if (folds is not None or self._merged_in_tables()) and key_storage and all(map(table_key, key_storage)) \
                and store.in_tables():
            yield from self._in_tables(batches, store, partition, key_storage, value_storage, folds, check_late)
            return
        emitted: list[tuple[tuple, tuple]] = []
        updated = late = 0
        started = time.monotonic()
        with decimal.localcontext() as ctx:
            ctx.prec = 76       # exact sums of decimal(38) buffers
            for batch in batches:
                keys = [state_values(batch.column(i), key_storage[i], as_key=True) for i in range(num_keys)]
                buffers = [state_values(batch.column(num_keys + j), value_storage[j])
                           for j in range(len(value_storage))]
                rows = list(zip(*keys)) if keys else [()] * batch.num_rows
                news = list(zip(*buffers)) if buffers else [()] * batch.num_rows
                if check_late:
                    bound = self.late_us
                    on_time = [t is None or t > bound for t in self._event_times(rows)]
                    dropped = on_time.count(False)
                    if dropped:
                        late += dropped
                        rows, news = list(compress(rows, on_time)), list(compress(news, on_time))
                values = self._merge_into(store, rows, news)
                updated += len(rows)
                if self.mode == "update":
                    emitted.extend(zip(rows, values))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.mode == "complete":
            emitted = list(store.iterator())
        elif self.watermark_key is not None and self.evict_us is not None:
            held = store.keys()
            read = len(held)
            bound = self.evict_us
            due = [t is not None and t <= bound for t in self._event_times(held)]
            expired = list(compress(held, due))
            removed = len(expired)
            if self.mode == "append" and expired:
                emitted.extend(zip(expired, store.get_many(expired)))
            store.remove_many(expired)
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        m = store.metrics()
        if emitted:
            yield self._output(emitted, key_storage, value_storage)
        self.finish(partition, m, numRowsUpdated=updated, numRowsRemoved=removed,
                    allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
                    numRowsDroppedByWatermark=late, numRowsReadDuringEviction=read)

    def _arrow_folds(self, value_storage: list[pa.DataType]) -> list[str] | None:
        return arrow_folds(self.merges, value_storage)

    def _merged_in_tables(self) -> bool:
        """Whether the state can stay in Arrow tables with the merges in Python: every
        merge keeps a new key's buffers as the batch brings them and emits its buffers as
        they are (not an HLL++, a percentile's counts or a percentile_approx sketch)."""
        return not any(kind in _NORMALISED for kind, *_ in self.merges) and \
            sum(count for _, _, count, _ in self.merges) == len(self.buffer_fields)

    def _in_tables(self, batches, store, partition: int, key_storage, value_storage, folds: list[str] | None,
                   check_late: bool):
        """The same step with the state as Arrow tables: the batch's rows are folded
        with the rows held for their keys by one group-by, eviction is a filter, and no
        Python value is made per key (``state.table_form``). Where a merge is not a fold
        (``folds`` None: max_by, histogram_numeric, collect_list...), a key's first batch
        still goes in as Arrow and only the keys held already are merged in Python."""
        keys = [f"k{i}" for i in range(len(key_storage))]
        values = [f"v{j}" for j in range(len(value_storage))]
        schema = pa.schema([pa.field(n, t) for n, t in zip(keys + values, key_storage + value_storage)])
        window_end = 1 if self.watermark_is_window else None
        late = 0
        received = []
        started = time.monotonic()
        for batch in batches:
            table = pa.Table.from_arrays([batch.column(i).cast(t) for i, t in enumerate(schema.types)],
                                         schema=schema)
            if check_late and table.num_rows:
                times = table.column(keys[self.watermark_key])
                if window_end is not None:
                    times = pc.struct_field(times, [window_end])
                on_time = pc.or_kleene(pc.is_null(times), pc.greater(times, self.late_us))
                kept = table.filter(on_time)
                late += table.num_rows - kept.num_rows
                table = kept
            received.append(table)
        incoming = pa.concat_tables(received) if received else schema.empty_table()
        emitted = []
        if incoming.num_rows:
            held = store.matching_rows(incoming.select(keys))
            if folds is not None:
                both = pa.concat_tables([held, incoming]) if held.num_rows else incoming
                merged = group_rows(both, keys, list(zip(values, folds)))
            else:
                with decimal.localcontext() as ctx:
                    ctx.prec = 76       # exact sums of decimal(38) buffers
                    merged = self._merged_with_held(incoming, held, keys, key_storage, value_storage)
            store.put_rows(merged)
            if self.mode == "update":
                emitted.append(merged)
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.mode == "complete":
            emitted = [store.rows()]
        elif self.watermark_key is not None and self.evict_us is not None:
            read = store.num_keys()
            expired = store.take_rows_at_or_below(self.evict_us, key_field=self.watermark_key,
                                                  struct_field=window_end)
            removed = expired.num_rows
            if self.mode == "append" and removed:
                emitted.append(expired)
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        m = store.metrics()
        out = self.output_schema
        for table in emitted:
            if table.num_rows:
                columns = [table.column(i).cast(field.type) for i, field in enumerate(out)]
                yield from pa.Table.from_arrays(columns, schema=out).combine_chunks().to_batches()
        self.finish(partition, m, numRowsUpdated=incoming.num_rows, numRowsRemoved=removed,
                    allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
                    numRowsDroppedByWatermark=late, numRowsReadDuringEviction=read)

    def _merged_with_held(self, incoming: pa.Table, held: pa.Table, keys: list[str], key_storage,
                          value_storage) -> pa.Table:
        """The batch's rows (columns k.., v..) merged with the rows held for their keys, a row
        per key: a key not held as the batch brings it, a held one through ``merge_buffers``
        (the held value on the left, as Spark's engine merges its state with the batch). A
        key the batch holds twice is merged row by row, in the batch's order."""
        num_keys = len(keys)

        def python_rows(table: pa.Table) -> list[tuple[tuple, tuple]]:
            key_values = [state_values(table.column(i), key_storage[i], as_key=True) for i in range(num_keys)]
            buffers = [state_values(table.column(num_keys + j), value_storage[j]) for j in range(len(value_storage))]
            return list(zip(zip(*key_values) if key_values else [()] * table.num_rows,
                            zip(*buffers) if buffers else [()] * table.num_rows))

        def as_table(rows: list[tuple[tuple, tuple]]) -> pa.Table:
            columns = [from_state_values([k[i] for k, _ in rows], key_storage[i], key_storage[i])
                       for i in range(num_keys)]
            columns += [from_state_values([v[j] for _, v in rows], value_storage[j], value_storage[j])
                        for j in range(len(value_storage))]
            return pa.Table.from_arrays(columns, schema=incoming.schema)

        distinct = incoming.select(keys)
        flat, flat_names = flat_keys(distinct, keys, frozenset(keys))
        repeated = flat.group_by(flat_names).aggregate([]).num_rows < incoming.num_rows
        if repeated:     # (Spark aggregated the batch per key: not seen, but merged right if so)
            rows = {_matched(key): (key, value) for key, value in python_rows(held)}
            for key, new in python_rows(incoming):
                found = rows.get(_matched(key))
                rows[_matched(key)] = (key, new if found is None else self._merged(found[1], new))
            return as_table(list(rows.values()))
        if not held.num_rows:
            return incoming
        fresh = anti_join(incoming, held, keys)
        known = python_rows(semi_join(incoming, held, keys))
        old = {_matched(key): value for key, value in python_rows(held)}
        merged = as_table([(key, self._merged(old[_matched(key)], new)) for key, new in known])
        return pa.concat_tables([fresh, merged]) if fresh.num_rows else merged

    def _merge_into(self, store, keys: list[tuple], news: list[tuple]) -> list[tuple]:
        """Merge each key's new buffers into the store's; the merged values, in order. A
        batch holds each key once (Spark aggregated it per key before the state step),
        so the store is read and written a batch at a time; a key repeated falls back to
        one key at a time, each row seeing the rows before it."""
        # whether a new key's value is its buffers as they came
        as_they_came = not any(kind in _NORMALISED for kind, *_ in self.merges) and \
            sum(count for _, _, count, _ in self.merges) == len(self.buffer_fields)
        if len(set(keys)) != len(keys):
            values = []
            for key, new in zip(keys, news):
                value = self._merged(store.get(key), new)
                store.put(key, value)
                values.append(value)
            return values
        merged = self._merged
        if as_they_came:
            values = [new if old is None else merged(old, new) for old, new in zip(store.get_many(keys), news)]
        else:
            values = [merged(old, new) for old, new in zip(store.get_many(keys), news)]
        store.put_many(keys, values)
        return values

    def _merged(self, old: tuple | None, new: tuple) -> tuple:
        merged: list = []
        for kind, start, count, options in self.merges:
            part = list(new[start:start + count])
            if old is not None:
                merged += merge_buffers(kind, list(old[start:start + count]), part, options)
            else:
                merged += _NORMALISED[kind](part, options) if kind in _NORMALISED else part
        return tuple(merged)

    def _output(self, rows: list[tuple[tuple, tuple]], key_storage, value_storage) -> pa.RecordBatch:
        columns = []
        out = self.output_schema
        for i, storage in enumerate(key_storage):
            columns.append(from_state_values([k[i] for k, _ in rows], storage, out.field(i).type))
        columns += buffer_columns([v for _, v in rows], self.merges, value_storage,
                                  list(out)[len(key_storage):])
        return pa.RecordBatch.from_arrays(columns, schema=out)


def _matched(key: tuple) -> tuple:
    """A key as a dict matches it as Spark groups it: a NaN equal to a NaN (Python's NaNs
    are unequal to each other), at any depth of a struct."""
    return tuple(_matched(k) if isinstance(k, tuple) else "NaN" if isinstance(k, float) and k != k else k
                 for k in key)


def _sessions_flat(rows: pa.Table, keys: list[str], schema: pa.Schema) -> pa.Table:
    """A session store's rows (columns k.., v0: the key's sessions) as a row per session
    (``schema``: k.., start, end, v..), in the rows' order."""
    if rows.num_rows == 0:
        return schema.empty_table()
    lists = rows.column("v0").combine_chunks()
    owners = pc.list_parent_indices(lists)
    sessions = pc.list_flatten(lists)
    columns = [rows.column(k).take(owners) for k in keys] + sessions.flatten()
    return pa.Table.from_arrays(columns, schema=schema)


def _sessions_listed(sessions: pa.Table, keys: list[str], groups: np.ndarray, session_type: pa.DataType) -> pa.Table:
    """Sessions (columns k.., start, end, v..; each key's together, ``groups`` their key's
    number, ascending from 0) as a session store's rows: a row per key, its sessions."""
    counts = np.bincount(groups)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int32)
    fields = [sessions.column(i).combine_chunks() for i in range(len(keys), sessions.num_columns)]
    struct = pa.StructArray.from_arrays([f.cast(t.type) for f, t in zip(fields, session_type)],
                                        fields=list(session_type))
    listed = pa.ListArray.from_arrays(pa.array(offsets), struct, type=pa.list_(session_type))
    firsts = pa.array(offsets[:-1].astype(np.int64))
    return pa.Table.from_arrays([sessions.column(k).take(firsts) for k in keys] + [listed], names=keys + ["v0"])


def _one_session_lists(sessions: pa.Table, session_type: pa.DataType) -> pa.Array:
    """Each session (columns k.., start, end, v.. after the keys) as a list of one session,
    the change feed's value."""
    width = sessions.num_columns - len(session_type)
    struct = pa.StructArray.from_arrays([sessions.column(width + i).combine_chunks().cast(f.type)
                                         for i, f in enumerate(session_type)], fields=list(session_type))
    return pa.ListArray.from_arrays(pa.array(np.arange(len(struct) + 1, dtype=np.int32)), struct,
                                    type=pa.list_(session_type))


def arrow_folds(merges: tuple, value_storage: list[pa.DataType]) -> list[str] | None:
    """Each buffer's fold in ``group_rows``, when every merge is one it does exactly as
    ``merge_buffers`` does (sums of numbers; min and max of numbers, strings, dates and
    structs of them). Otherwise None."""
    folds = []
    for kind, start, count, _ in merges:
        for j in range(start, start + count):
            if not foldable(kind, value_storage[j]):
                return None
            folds.append(kind)
    return folds if len(folds) == len(value_storage) else None


def _session(value) -> tuple:
    return tuple(value.values()) if isinstance(value, dict) else tuple(value)


def sessions_schema(buffer_fields: list[pa.Field]) -> pa.Schema:
    """The value of a session window aggregation's store: the key's sessions, each its
    start, end (µs) and buffers (storage types)."""
    session = pa.struct([pa.field("start", pa.int64()), pa.field("end", pa.int64())]
                        + [pa.field(f.name, f.type) for f in buffer_fields])
    return pa.schema([pa.field("sessions", pa.list_(session))])


@dataclass(frozen=True)
class SessionAggregateTask(StateTask):
    """The state step of a ``session_window`` aggregation (Spark's
    ``SessionWindowStateStoreSaveExec``), one task per state partition.

    The store keeps, per grouping key without the session, the list of its sessions
    ``(start, end, buffers...)``. The batch brings its own sessions per key (Spark
    merged the batch's rows already); a key's stored and new sessions are merged where
    they overlap or touch (``next.start <= end``). Every session of a key the batch
    touched counts as updated; a stored session whose start is gone counts as
    removed. Append mode then evicts and emits the sessions that end at or before
    the watermark; complete mode emits them all. Where the store keeps its memory as
    Arrow tables and every merge folds there, a batch runs in Arrow (``_in_tables``);
    otherwise a key at a time.
    """

    key_fields: tuple = ()                   # all grouping keys, the session among them
    session_index: int = 0                   # where the session is among the keys
    buffer_fields: tuple = ()
    merges: tuple = ()
    output_schema: pa.Schema = None
    mode: str = "append"                     # append / complete
    evict_us: int | None = None

    def __call__(self, batches):
        partition = task_partition()
        key_storage = [storage_type(f.type) for f in self.key_fields]
        value_storage = [storage_type(f.type) for f in self.buffer_fields]
        group_fields = [pa.field(f.name, t) for i, (f, t) in enumerate(zip(self.key_fields, key_storage))
                        if i != self.session_index]
        schemas = (pa.schema(group_fields),
                   sessions_schema([pa.field(f.name, t) for f, t in zip(self.buffer_fields, value_storage)]))
        store = self.store(partition, *schemas)
        num_keys = len(self.key_fields)
        s = self.session_index
        folds = arrow_folds(self.merges, value_storage)
        if folds is not None and num_keys > 1 and store.in_tables() and all(map(table_key, key_storage)):
            yield from self._in_tables(batches, store, partition, schemas, key_storage, value_storage, folds)
            return
        incoming: dict[tuple, list[tuple]] = {}
        started = time.monotonic()
        with decimal.localcontext() as ctx:
            ctx.prec = 76
            for batch in batches:
                keys = [state_values(batch.column(i), key_storage[i], as_key=True) for i in range(num_keys)]
                buffers = [state_values(batch.column(num_keys + j), value_storage[j])
                           for j in range(len(value_storage))]
                for r in range(batch.num_rows):
                    window = keys[s][r]
                    group = tuple(keys[i][r] for i in range(num_keys) if i != s)
                    incoming.setdefault(group, []).append(
                        (window[0], window[1], *self._normal([column[r] for column in buffers])))
            updated = removed = 0
            # Spark's store's changes (for the change feed): a key with input has each of its
            # sessions put, changed or not, and those merged away removed; then evictions
            changes: list[tuple[str, tuple, tuple]] = []
            for group, new in incoming.items():
                saved = [_session(x) for x in (store.get(group) or ((),))[0]]
                merged = self._merge(sorted(saved + new, key=lambda x: x[0]))
                updated += len(merged)
                starts = {x[0] for x in merged}
                gone = [x for x in saved if x[0] not in starts]
                removed += len(gone)
                changes += [("delete", group, ([x],)) for x in gone] + [("update", group, ([x],)) for x in merged]
                store.put(group, (merged,))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        emitted: list[tuple[tuple, tuple]] = []
        total = 0
        for group, value in list(store.iterator()):
            sessions = [_session(x) for x in value[0]]
            if self.mode == "append" and self.evict_us is not None:
                kept = [x for x in sessions if x[1] > self.evict_us]
                for x in sessions:
                    if x[1] <= self.evict_us:
                        emitted.append((group, x))
                        changes.append(("delete", group, ([x],)))
                removed += len(sessions) - len(kept)
                if not kept:
                    store.remove(group)
                elif len(kept) != len(sessions):
                    store.put(group, (kept,))
                sessions = kept
            elif self.mode == "complete":
                emitted.extend((group, x) for x in sessions)
            total += len(sessions)
        removals_ms = (time.monotonic() - started) * 1000
        self.log_changes(partition, *schemas, changes)
        store.commit()
        m = store.metrics()
        if emitted:
            yield self._output(emitted, key_storage, value_storage)
        self.finish(partition, m, numRowsTotal=total, numRowsUpdated=updated, numRowsRemoved=removed,
                    allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
                    # Spark 4.3 reports no state store instances for this operator in complete mode.
                    numStateStoreInstances=0 if self.mode == "complete" else 1)

    def _in_tables(self, batches, store, partition: int, schemas: tuple[pa.Schema, pa.Schema], key_storage,
                   value_storage, folds: list[str]):
        """The same step with the state as Arrow tables (``state.table_form``): the batch's
        sessions and the held sessions of their keys are sorted by key and start, a session
        starts a new run where it starts after every earlier session of its key ends, and
        each run is folded into one session by a group-by; eviction is a filter. The counts,
        the change feed and the output are the row path's, row for row."""
        s = self.session_index
        num_keys = len(self.key_fields)
        groups = [i for i in range(num_keys) if i != s]
        keys = [f"k{j}" for j in range(len(groups))]
        values = [f"v{j}" for j in range(len(value_storage))]
        bounds = ["start", "end"]
        session_type = schemas[1].field(0).type.value_type
        started = time.monotonic()
        parts = []
        for batch in batches:
            window = batch.column(s).cast(key_storage[s])
            parts.append(pa.Table.from_arrays(
                [batch.column(i).cast(key_storage[i]) for i in groups]
                + [pc.struct_field(window, [0]), pc.struct_field(window, [1])]
                + [batch.column(num_keys + j).cast(t) for j, t in enumerate(value_storage)],
                names=keys + bounds + values))
        flat_schema = pa.schema([pa.field(n, t) for n, t in zip(keys, [key_storage[i] for i in groups])]
                                + [pa.field(n, pa.int64()) for n in bounds]
                                + [pa.field(n, t) for n, t in zip(values, value_storage)])
        incoming = pa.concat_tables(parts).cast(flat_schema) if parts else flat_schema.empty_table()
        updated = removed = 0
        changes: list[tuple[pa.Array, pa.Table]] = []     # (kinds, rows k.. start end v..)
        if incoming.num_rows:
            held = _sessions_flat(store.matching_rows(incoming.select(keys)), keys, flat_schema)
            merged, gone, groups_of = self._merged_runs(incoming, held, keys, values, folds)
            updated, removed = merged.num_rows, gone.num_rows
            # (as the row path: per key with input, in the batch's order, its sessions
            # merged away deleted, then each of its sessions put)
            kinds = pa.array(["delete"] * gone.num_rows + ["update"] * merged.num_rows, pa.string())
            both = pa.concat_tables([gone, merged])
            order = np.lexsort((np.r_[np.zeros(gone.num_rows, np.int64), np.ones(merged.num_rows, np.int64)],
                                np.r_[groups_of[0], groups_of[1]]))
            changes.append((kinds.take(pa.array(order)), both.take(pa.array(order))))
            store.put_rows(_sessions_listed(merged, keys, groups_of[1], session_type))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        emitted = flat_schema.empty_table()
        if self.mode == "append" and self.evict_us is not None:
            bound = self.evict_us

            def due(table: pa.Table) -> pa.Array:
                lists = table.column("v0").combine_chunks()
                ended = pc.fill_null(pc.less_equal(pc.struct_field(pc.list_flatten(lists), [1]), bound), False)
                owners = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
                return pa.array(np.bincount(owners[ended.to_numpy(zero_copy_only=False)],
                                            minlength=len(table)) > 0)
            taken = _sessions_flat(store.take_rows_where(due), keys, flat_schema)
            if taken.num_rows:
                ended = pc.fill_null(pc.less_equal(taken.column("end"), bound), False)
                emitted = taken.filter(ended)
                kept = taken.filter(pc.invert(ended))
                removed += emitted.num_rows
                changes.append((pa.array(["delete"] * emitted.num_rows, pa.string()), emitted))
                if kept.num_rows:
                    store.put_rows(_sessions_listed(kept, keys, key_groups(kept, keys), session_type))
        held_now = store.rows().column("v0")
        total = pc.sum(pc.list_value_length(held_now)).as_py() or 0 if len(held_now) else 0
        if self.mode == "complete":
            emitted = _sessions_flat(store.rows(), keys, flat_schema)
        removals_ms = (time.monotonic() - started) * 1000
        if changes:
            kinds = pa.concat_arrays([k for k, _ in changes])
            rows = pa.concat_tables([t for _, t in changes])
            self.log_change_table(partition, *schemas, kinds, rows.select(keys),
                                  pa.table({"sessions": _one_session_lists(rows, session_type)}))
        store.commit()
        m = store.metrics()
        if emitted.num_rows:
            yield from self._output_table(emitted, keys, key_storage).to_batches()
        self.finish(partition, m, numRowsTotal=total, numRowsUpdated=updated, numRowsRemoved=removed,
                    allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
                    numStateStoreInstances=0 if self.mode == "complete" else 1)

    def _merged_runs(self, incoming: pa.Table, held: pa.Table, keys: list[str], values: list[str],
                     folds: list[str]) -> tuple[pa.Table, pa.Table, tuple[np.ndarray, np.ndarray]]:
        """The batch's sessions merged with the held ones of their keys (columns k.., start,
        end, v..): the merged sessions, sorted by key (in the batch's order of keys) and
        start; the held sessions merged away (whose start no merged session of their key
        has); and each one's key number."""
        both = pa.concat_tables([incoming, held]) if held.num_rows else incoming
        n = both.num_rows
        group = key_groups(both, keys)                       # (numbered in the batch's order)
        is_held = np.r_[np.zeros(incoming.num_rows, np.int64), np.ones(held.num_rows, np.int64)]
        start = both.column("start").to_numpy(zero_copy_only=False)
        end = both.column("end").to_numpy(zero_copy_only=False)
        # by key, start, the held session before the batch's (the row path's stable sort of
        # held + new), the batch's in its order
        order = np.lexsort((np.arange(n), 1 - is_held, start, group))
        g, st, en = group[order], start[order], end[order]
        first_of_key = np.r_[True, g[1:] != g[:-1]]
        reach = pd.Series(en).groupby(g, sort=False).cummax().to_numpy()
        new_run = first_of_key | np.r_[True, st[1:] > reach[:-1]]
        run = np.cumsum(new_run) - 1
        ordered = both.take(pa.array(order)).append_column("__run", pa.array(run))
        merged = group_rows(ordered, ["__run"], [("start", "min"), ("end", "max")] + list(zip(values, folds)))
        firsts = np.flatnonzero(new_run)
        merged = merged.sort_by("__run")
        merged_rows = ordered.select(keys).take(pa.array(firsts))
        merged = pa.Table.from_arrays([*merged_rows.columns, merged.column("start"), merged.column("end"),
                                       *[merged.column(v) for v in values]], schema=incoming.schema)
        was_held = is_held[order] == 1
        run_start = st[firsts][run]
        lost = np.flatnonzero(was_held & (st != run_start))
        gone = ordered.select(incoming.schema.names).take(pa.array(lost))
        return merged, gone, (g[lost], g[firsts])

    def _output_table(self, sessions: pa.Table, keys: list[str], key_storage) -> pa.Table:
        """The output rows of sessions (columns k.., start, end, v..): the grouping keys with
        the session among them, then the buffers, in the output's types."""
        out = self.output_schema
        s = self.session_index
        window = pa.StructArray.from_arrays([sessions.column("start").combine_chunks(),
                                             sessions.column("end").combine_chunks()],
                                            fields=list(key_storage[s]))
        columns, g = [], 0
        for i in range(len(key_storage)):
            if i == s:
                columns.append(window.cast(out.field(i).type))
            else:
                columns.append(sessions.column(keys[g]).cast(out.field(i).type))
                g += 1
        width = len(keys) + 2
        columns += [sessions.column(width + j).cast(field.type)
                    for j, field in enumerate(list(out)[len(key_storage):])]
        return pa.Table.from_arrays(columns, schema=out).combine_chunks()

    def _normal(self, buffers: list) -> list:
        for kind, start, count, options in self.merges:
            if kind in _NORMALISED:
                buffers[start:start + count] = _NORMALISED[kind](buffers[start:start + count], options)
        return buffers

    def _merge(self, sessions: list[tuple]) -> list[tuple]:
        """Sessions sorted by start -> the merged sessions (overlapping or touching)."""
        merged: list[tuple] = []
        for session in sessions:
            if merged and session[0] <= merged[-1][1]:
                last = merged[-1]
                buffers: list = []
                for kind, start, count, options in self.merges:
                    buffers += merge_buffers(kind, list(last[2 + start:2 + start + count]),
                                             list(session[2 + start:2 + start + count]), options)
                merged[-1] = (last[0], max(last[1], session[1]), *buffers)
            else:
                merged.append(session)
        return merged

    def _output(self, rows: list[tuple[tuple, tuple]], key_storage, value_storage) -> pa.RecordBatch:
        out = self.output_schema
        columns = []
        for i, storage in enumerate(key_storage):
            if i == self.session_index:
                values = [(x[0], x[1]) for _, x in rows]
            else:
                g = i if i < self.session_index else i - 1
                values = [group[g] for group, _ in rows]
            columns.append(from_state_values(values, storage, out.field(i).type))
        columns += buffer_columns([x[2:] for _, x in rows], self.merges, value_storage,
                                  list(out)[len(key_storage):])
        return pa.RecordBatch.from_arrays(columns, schema=out)
