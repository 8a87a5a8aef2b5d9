"""The table form's row operations that a stream-stream join's Arrow path is made of
(``state.table_form``), against the same operations on Python values: the pairs of an
equi-join (a null key equal to a null key, struct keys field by field), each row's key
number and place among its key's rows, and the removal of rows that copies only the
record batches that lose one, as a store's table needs to keep a batch's cost off the
size of its state."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from microbatch.state.table_form import (anti_join, compacted, join_pairs, key_groups, ranks_within, row_of_key,
                                         without_rows)

WINDOW = pa.struct([("start", pa.int64()), ("end", pa.int64())])


def _keys(rng: random.Random, n: int) -> pa.Table:
    ids = [rng.choice([None, 1, 2, 3, 4]) for _ in range(n)]
    windows = [rng.choice([None, {"start": 0, "end": 10}, {"start": 10, "end": 20}]) for _ in range(n)]
    names = [rng.choice([None, "a", "b"]) for _ in range(n)]
    return pa.table({"k0": pa.array(ids, pa.int64()), "k1": pa.array(windows, WINDOW),
                     "k2": pa.array(names, pa.string())})


def _python_keys(table: pa.Table) -> list[tuple]:
    return [tuple(None if v is None else tuple(v.values()) if isinstance(v, dict) else v for v in row.values())
            for row in table.to_pylist()]


def test_join_pairs_are_every_pair_with_equal_keys_nulls_equal():
    rng = random.Random(7)
    for _ in range(20):
        left, right = _keys(rng, rng.randint(0, 40)), _keys(rng, rng.randint(0, 40))
        a, b = join_pairs(left, right, ["k0", "k1", "k2"])
        got = sorted(zip(a.tolist(), b.tolist()))
        lk, rk = _python_keys(left), _python_keys(right)
        expected = sorted((i, j) for i, x in enumerate(lk) for j, y in enumerate(rk) if x == y)
        assert got == expected


def test_key_groups_number_keys_in_first_row_order_and_ranks_count_within_them():
    rng = random.Random(11)
    for _ in range(20):
        table = _keys(rng, rng.randint(1, 60))
        groups = key_groups(table, ["k0", "k1", "k2"])
        keys = _python_keys(table)
        order = list(dict.fromkeys(keys))
        assert groups.tolist() == [order.index(k) for k in keys]
        seen: dict = {}
        expected = []
        for k in keys:
            expected.append(seen.get(k, 0))
            seen[k] = seen.get(k, 0) + 1
        assert ranks_within(groups).tolist() == expected
        held = table.take(pa.array(sorted({keys.index(k) for k in keys})))
        found = row_of_key(table, held, ["k0", "k1", "k2"])
        assert [_python_keys(held)[i] for i in found] == keys


def test_removing_rows_copies_only_the_batches_that_lose_one():
    batches = [pa.record_batch({"k0": pa.array(np.arange(i * 100, (i + 1) * 100, dtype=np.int64))})
               for i in range(5)]
    table = pa.Table.from_batches(batches)
    kept = without_rows(table, np.array([250, 201, 499]))
    assert kept.column("k0").to_pylist() == [v for v in range(500) if v not in (201, 250, 499)]
    after = kept.to_batches()
    assert len(after) == 5
    for i in (0, 1, 3):   # untouched: the same buffers
        assert after[i].column(0).buffers()[1].address == batches[i].column(0).buffers()[1].address
    assert after[2].num_rows == 98
    assert without_rows(table, np.array([], np.int64)) is table
    # an anti join keeps the rows' order and the untouched batches
    gone = anti_join(table, pa.table({"k0": pa.array([5, 305], pa.int64())}), ["k0"])
    assert gone.column("k0").to_pylist() == [v for v in range(500) if v not in (5, 305)]
    assert gone.to_batches()[1].column(0).buffers()[1].address == batches[1].column(0).buffers()[1].address
    assert len(compacted(table, most=4).to_batches()) == 1
    assert compacted(table, most=5) is table
