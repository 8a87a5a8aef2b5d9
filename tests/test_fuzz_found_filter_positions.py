"""A filter over a projection of a union, naming its column through the frame
(``df["v"]``), moved below the watermark (issue 57, seed 5176), run on Spark's engine and
on microbatch by the fuzzer's own comparison (rows, watermarks, ``numInputRows``, state
rows, batch by batch).

``df = src.union(src2.select(...)).withWatermark("ts", ...); df = df.select("ts", "v");
df = df.filter(df["v"] >= 1)``: Spark's optimizer pushes the filter below the watermark (it
does not read the event time), as microbatch's planner does once per run. ``df["v"]`` is
bound to the projection's output, where ``v`` is the second column; below the projection,
in the union's output (ts, k, v, s), the second column is ``k``. microbatch moved the filter
with its Column still bound to the second place, and filtered by ``k >= 1``: the rows of the
second stream with ``k2 = 0`` were missing (one in batch 0, one in batch 3). A bound Column
now follows its column below a projection (``spark_internals.positions_below_projection``);
a filter by a column the projection computes stays above it.
"""
from __future__ import annotations

import pytest

from microbatch.testing import fuzz


def _files1(*files) -> list[list[dict]]:
    return [[{"ts": fuzz._stamp(t), "k": k, "v": v, "s": s} for t, k, v, s in rows] for rows in files]


def _files2(*files) -> list[list[dict]]:
    return [[{"ts2": fuzz._stamp(t), "k2": k, "v2": v} for t, k, v in rows] for rows in files]


FILES1 = _files1(
    [(0, 2, 7, "a"), (1, 1, 1, "c")],
    [(8, 2, 7, "c")],
    [],
    [(14, 3, 2, "c"), (19, 1, 1, "c"), (21, 1, 1, "c"), (12, 1, 0, "a")],
)
FILES2 = _files2(
    [(11, 3, 7), (1, 0, 7), (1, 3, 6)],
    [(16, 3, 4)],
    [(20, 1, 2)],
    [(29, 1, 8), (20, 0, 8), (5, 2, 5), (30, 3, 8)],
)
UNION = ('df = df.union(src2.select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), '
         'F.col("v2").alias("v"), F.lit("u").alias("s")))')

SEED_5176 = fuzz.Case(5176, fuzz.Query([
    "df = src",
    UNION,
    'df = df.withWatermark("ts", "5 seconds")',
    'df.createOrReplaceTempView("fuzz_v")',
    'df = session.sql("SELECT ts, v FROM fuzz_v WHERE v > 3")',
    'df = df.filter(df["v"] >= 1)',
], "append"), FILES1, FILES2)

#: the same without SQL: a projection reordering the columns, the filter naming two of them
REORDERED = fuzz.Case(5176, fuzz.Query([
    "df = src",
    UNION,
    'df = df.withWatermark("ts", "5 seconds")',
    'df = df.select("s", "v", "ts", "k")',
    'df = df.filter((df["v"] >= 1) & (df["k"] != 3))',
], "append"), FILES1, FILES2)

#: the filter's column computed by the projection: the filter stays above it
COMPUTED = fuzz.Case(5176, fuzz.Query([
    "df = src",
    UNION,
    'df = df.withWatermark("ts", "5 seconds")',
    'df = df.select("ts", (F.col("v") + F.col("k")).alias("vk"), "v")',
    'df = df.filter((df["vk"] >= 4) & (df["v"] >= 1))',
], "append"), FILES1, FILES2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", [SEED_5176, REORDERED, COMPUTED], ids=["seed 5176", "reordered", "computed"])
def test_a_filter_through_a_frame_keeps_its_column_below_the_projection(spark, case):
    result = fuzz.run_case(spark, case)
    assert result.status == "ok", result.report()
