"""The session task's Arrow merge (``SessionAggregateTask._merged_runs``) against its
key-by-key merge (``_merge``) on random sessions: touching sessions (a start equal to an
end) and sessions inside others merge as Spark's session merge does, held sessions come
before the batch's at an equal start, and the held sessions merged away are those whose
start no merged session of their key has. No Spark: the task's functions on Arrow tables."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from microbatch.operators.aggregate.task import SessionAggregateTask

SCHEMA = pa.schema([pa.field("k0", pa.string()), pa.field("start", pa.int64()), pa.field("end", pa.int64()),
                    pa.field("v0", pa.int64()), pa.field("v1", pa.int64())])


def sessions(rng: random.Random, keys: list, count: int, disjoint: bool) -> list[tuple]:
    rows, ends = [], {}
    for _ in range(count):
        k = rng.choice(keys)
        if disjoint:   # (a key's held sessions never overlap: the store holds them merged)
            start = ends.get(k, 0) + rng.randint(1, 5)
        else:
            start = rng.randint(0, 40)
        end = start + rng.choice([0, 1, 3, 5, 10])
        ends[k] = end
        rows.append((k, start, end, rng.randint(1, 3), rng.randint(-9, 9)))
    return rows


def the_task() -> SessionAggregateTask:
    """A task with a sum and a max (its state and metrics unused: no store is opened)."""
    return SessionAggregateTask(None, 0, 0, None, None, merges=(("sum", 0, 1, None), ("max", 1, 1, None)))


def table(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)


@pytest.mark.parametrize("seed", range(20))
def test_the_arrow_merge_of_sessions_is_the_key_by_key_merge(seed):
    rng = random.Random(seed)
    keys = ["a", "b", None, "c"]
    held, new = sessions(rng, keys, 12, disjoint=True), sessions(rng, keys, 15, disjoint=False)
    new_keys = {r[0] for r in new}
    held = [r for r in held if r[0] in new_keys]      # (the store's rows of the batch's keys)
    task = the_task()
    merged, gone, _ = task._merged_runs(table(new), table(held), ["k0"], ["v0", "v1"], ["sum", "max"])

    expected, expected_gone = [], []
    for k in dict.fromkeys(r[0] for r in new):        # (the batch's order of keys)
        saved = sorted((r[1:] for r in held if r[0] == k), key=lambda x: x[0])
        runs = task._merge(sorted(saved + [r[1:] for r in new if r[0] == k], key=lambda x: x[0]))
        expected += [(k, *x) for x in runs]
        starts = {x[0] for x in runs}
        expected_gone += [(k, *x) for x in saved if x[0] not in starts]
    assert [tuple(r.values()) for r in merged.to_pylist()] == expected
    assert [tuple(r.values()) for r in gone.to_pylist()] == expected_gone


def test_touching_and_inner_sessions_merge():
    task = the_task()
    held = [("a", 0, 10, 1, 1)]
    new = [("a", 10, 12, 1, 2), ("a", 2, 3, 1, 7), ("a", 13, 14, 1, 0)]
    merged, gone, _ = task._merged_runs(table(new), table(held), ["k0"], ["v0", "v1"], ["sum", "max"])
    assert [tuple(r.values()) for r in merged.to_pylist()] == [("a", 0, 12, 3, 7), ("a", 13, 14, 1, 0)]
    assert gone.num_rows == 0
