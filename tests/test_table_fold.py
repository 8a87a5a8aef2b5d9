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
from microbatch.state.table_form import foldable, group_rows

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
