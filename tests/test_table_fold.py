"""The aggregation's Arrow fold (``state.table_form.group_rows``) gives what its
value-by-value merge (``operators.aggregate.task.merge_buffers``) gives, row order
and all: sums, min and max of numbers (NaN the largest), strings and structs (a
null field first), nulls skipped, repeated keys, a struct key with a null."""
from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest

from microbatch.operators.aggregate.task import merge_buffers
from microbatch.state.table_form import _ranges_apart, anti_join, foldable, group_rows, semi_join

WINDOW = pa.struct([("start", pa.int64()), ("end", pa.int64())])
TOP = pa.struct([("time", pa.int64()), ("price", pa.float64()), ("name", pa.string())])
COLUMNS = [  # (name, type, fold)
    ("count", pa.int64(), "sum"), ("total", pa.float64(), "sum"), ("low", pa.int32(), "min"),
    ("high", pa.float64(), "max"), ("first_name", pa.string(), "min"), ("top", TOP, "max"),
    ("bottom", TOP, "min"),
]


def _random_value(rng: random.Random, kind: pa.DataType):
    if rng.random() < 0.15:
        return None
    if kind == TOP:
        return {"time": rng.choice([None, 1, 2, 3]), "price": rng.choice([None, 1.5, -0.5, math.nan, 2.0]),
                "name": rng.choice([None, "a", "b", "ä", "ab"])}
    if pa.types.is_floating(kind):
        return rng.choice([1.5, -2.0, math.nan, 0.25, 7.0])
    if pa.types.is_string(kind):
        return rng.choice(["x", "y", "é", "xy", ""])
    return rng.randint(-5, 5)


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@pytest.mark.parametrize("seed", range(5))
def test_the_arrow_fold_equals_the_value_by_value_merge(seed):
    rng = random.Random(seed)
    n = 400
    windows = [None if rng.random() < 0.05 else {"start": w, "end": w + 10} for w in
               (rng.choice([0, 10, 20]) for _ in range(n))]
    keys = [rng.choice(["a", "b", None]) for _ in range(n)]
    data = {"k0": pa.array(windows, WINDOW), "k1": pa.array(keys, pa.string())}
    for name, kind, _ in COLUMNS:
        data[name] = pa.array([_random_value(rng, kind) for _ in range(n)], kind)
    table = pa.table(data)
    assert all(foldable(fold, kind) for _, kind, fold in COLUMNS)

    folded = group_rows(table, ["k0", "k1"], [(name, fold) for name, _, fold in COLUMNS])

    expected: dict = {}
    rows = table.to_pylist()
    for row in rows:
        key = (None if row["k0"] is None else tuple(row["k0"].values()), row["k1"])
        if key not in expected:
            expected[key] = {name: row[name] for name, _, _ in COLUMNS}
            continue
        held = expected[key]
        for name, _, fold in COLUMNS:
            held[name] = merge_buffers(fold, [held[name]], [row[name]])[0]
    got = {(None if r["k0"] is None else tuple(r["k0"].values()), r["k1"]): r for r in folded.to_pylist()}
    assert got.keys() == expected.keys()
    assert folded.schema == table.schema
    for key, values in expected.items():
        for name, _, _ in COLUMNS:
            assert _same(got[key][name], values[name]), (key, name, got[key][name], values[name])


def test_what_the_fold_does_not_take():
    assert not foldable("sum", pa.decimal128(10, 2))     # Python sums decimals exactly
    assert not foldable("max", pa.struct([("a", pa.list_(pa.int64()))]))
    assert not foldable("first", pa.int64()) and not foldable("hll", pa.int64())


# -- the joins' shortcut: key ranges that cannot meet ------------------------------------------
def _keys(table: pa.Table) -> list:
    return sorted((repr(row["k0"]), repr(row["k1"])) for row in table.to_pylist())


@pytest.mark.parametrize("seed", range(40))
def test_semi_and_anti_joins_equal_a_key_by_key_reference(seed):
    """Window keys (a struct) and int keys with nulls, in ranges that overlap, touch or lie
    apart: the joins (and their shortcut where some field's ranges are disjoint) keep
    exactly the rows a key-by-key comparison keeps, a null equal to a null."""
    rng = random.Random(seed)

    def table(low: int, n: int) -> pa.Table:
        starts = [None if rng.random() < 0.1 else rng.randint(low, low + 4) * 10 for _ in range(n)]
        window = pa.array([None if s is None and rng.random() < 0.5 else
                           {"start": s, "end": None if s is None else s + 10} for s in starts], WINDOW)
        ints = pa.array([None if rng.random() < 0.2 else rng.randint(low, low + 3) for _ in range(n)], pa.int64())
        return pa.table({"k0": window, "k1": ints, "v0": pa.array(range(n), pa.int64())})

    left = table(rng.choice([0, 3, 10]), rng.randint(1, 12))
    right = table(rng.choice([0, 5, 20]), rng.randint(1, 12))
    right_keys = {(repr(r["k0"]), repr(r["k1"])) for r in right.select(["k0", "k1"]).to_pylist()}
    inside = [r for r in left.to_pylist() if (repr(r["k0"]), repr(r["k1"])) in right_keys]
    outside = [r for r in left.to_pylist() if (repr(r["k0"]), repr(r["k1"])) not in right_keys]
    assert _keys(semi_join(left, right, ["k0", "k1"])) == _keys(pa.Table.from_pylist(inside, left.schema))
    assert _keys(anti_join(left, right, ["k0", "k1"])) == _keys(pa.Table.from_pylist(outside, left.schema))


def test_disjoint_windows_skip_the_join_and_null_keys_still_meet():
    old = pa.table({"k0": pa.array([{"start": 0, "end": 10}, {"start": 10, "end": 20}], WINDOW),
                    "k1": pa.array([1, None], pa.int64())})
    new = pa.table({"k0": pa.array([{"start": 20, "end": 30}, {"start": 10, "end": 20}], WINDOW),
                    "k1": pa.array([1, None], pa.int64())})
    assert _ranges_apart(old.slice(0, 1), new.slice(0, 1), ["k0", "k1"])        # windows apart
    assert not _ranges_apart(old, new, ["k0", "k1"])                          # window 10-20 in both
    assert semi_join(old, new, ["k0", "k1"]).to_pylist() == [{"k0": {"start": 10, "end": 20}, "k1": None}]
    nulls = pa.table({"k1": pa.array([None, None], pa.int64())})
    assert not _ranges_apart(nulls, old.select(["k1"]), ["k1"])               # null meets null
    assert _ranges_apart(nulls, new.slice(0, 1).select(["k1"]), ["k1"])       # null never meets 1
    assert anti_join(nulls, new.slice(0, 1).select(["k1"]), ["k1"]).num_rows == 2
