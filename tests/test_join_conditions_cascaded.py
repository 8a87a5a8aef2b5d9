"""Stream-stream joins on conditions beyond equal keys and time ranges (``a.num >= b.maxn``,
parts reading one side only), next to Spark's own engine, batch by batch: rows, watermarks,
the join's state rows; over generated inputs with late rows."""
from __future__ import annotations

import json
import os
import random
import time

import pytest
from pyspark.sql import functions as F

from stream_events import comparable, watermarks
from helpers import ci_share, collect_batches, json_stream, sorted_rows
from microbatch.errors import UnsupportedOperationError

T0 = 1_767_225_600   # 2026-01-01 00:00:00 UTC


def generated(seed: int, batches: int = 5, rows: int = 6, value: str = "num") -> list[list[dict]]:
    """Rows of one side per batch: ids 0..3 (a null now and then), event times moving on
    by 20 s a batch with some rows 40-90 s behind (late once the watermark passed them),
    a number 0..9 or null."""
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        found = []
        for _ in range(rows):
            ts = T0 + 20 * b + rng.randint(0, 15)
            if rng.random() < 0.2:
                ts -= rng.randint(40, 90)
            found.append({"id": None if rng.random() < 0.08 else rng.randint(0, 3),
                          "ts": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)),
                          value: None if rng.random() < 0.1 else rng.randint(0, 9)})
        out.append(found)
    return out


def write(directory, batches) -> str:
    directory.mkdir()
    base = time.time() - 10_000
    for i, rows in enumerate(batches):
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (base + i, base + i))
    return str(directory)


def frames(session, paths):
    left = json_stream(session, paths[0], "id INT, ts TIMESTAMP, num INT")
    right = json_stream(session, paths[1], "id INT, ts TIMESTAMP, maxn INT")
    left = left.withColumnRenamed("ts", "lts").withWatermark("lts", "10 seconds")
    right = right.withColumnRenamed("id", "rid").withColumnRenamed("ts", "rts").withWatermark("rts", "20 seconds")
    return left, right


RANGE = "id = rid AND lts >= rts - interval 10 seconds AND lts <= rts + interval 20 seconds"
KEYED = "id = rid AND lts = rts"   # (the event time a key: both sides evicted by the watermark)

CASES = {
    # a part of both sides beside the keys and the range
    "num >= maxn, inner": (RANGE + " AND num >= maxn", "inner"),
    "num >= maxn, left outer": (RANGE + " AND num >= maxn", "left_outer"),
    "num >= maxn, right outer": (RANGE + " AND num >= maxn", "right_outer"),
    "num >= maxn, left semi": (RANGE + " AND num >= maxn", "left_semi"),
    "num >= maxn, full outer on the event time": (KEYED + " AND num >= maxn", "full_outer"),
    "num >= maxn, left outer on the event time": (KEYED + " AND num >= maxn", "left_outer"),
    # parts of one side: pushed into the side, or (an outer side's) checked on its new rows
    "one side's parts, left outer": (RANGE + " AND num > 2 AND maxn < 8", "left_outer"),
    "one side's parts, right outer": (RANGE + " AND num > 2 AND maxn < 8", "right_outer"),
    "one side's parts, inner": (RANGE + " AND num > 2 AND maxn < 8", "inner"),
    "one side's parts, full outer": (KEYED + " AND num > 2 AND maxn < 8", "full_outer"),
    # OR, arithmetic, a null-safe comparison, IN, a cast to double
    "an OR of both sides with arithmetic, left outer": (
        RANGE + " AND (num + 1 > maxn * 2 OR num <=> maxn) AND NOT (maxn IN (3, 5))", "left_outer"),
    "a comparison with a double, inner": (RANGE + " AND num * 1.5D < maxn + 4", "inner"),
}


def run(session, paths, ckpt, condition, how):
    left, right = frames(session, paths)
    joined = left.join(right, F.expr(condition), how)
    batches, progress = collect_batches(joined, ckpt, rows=lambda df: (df.columns, sorted_rows(df)))
    return batches, progress


#: one generated input per case, the two inputs taking turns (each case on both was the
#: same comparison again: the differential fuzzer generates inputs at large, issue 58); a
#: third of the cases in CI's run, the rest in make test-extended
@pytest.mark.parametrize("case, seed", ci_share([(case, 1 + i % 2) for i, case in enumerate(CASES)], every=3))
def test_a_join_on_more_than_keys_and_time_matches_spark(spark, ss, tmp_path, case, seed):
    condition, how = CASES[case]
    paths = (write(tmp_path / "left", generated(seed)), write(tmp_path / "right", generated(seed + 100, value="maxn")))
    theirs, their_progress = run(spark, paths, tmp_path / "spark", condition, how)
    ours, our_progress = run(ss, paths, tmp_path / "microbatch", condition, how)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    assert any(rows for _, (_, rows) in ours)


def test_a_condition_part_the_join_cannot_evaluate_is_refused_by_name(ss, tmp_path):
    paths = (write(tmp_path / "left", generated(1)), write(tmp_path / "right", generated(2, value="maxn")))
    left, right = frames(ss, paths)
    with pytest.raises(UnsupportedOperationError, match="concat"):
        left.join(right, F.expr(RANGE + " AND concat(num, maxn) = '12'"))

