"""Stream-stream join state the differential fuzzer found microbatch kept unlike Spark's
engine (issue 57, seeds 1609, 1951, 1828), each run on Spark's engine and on microbatch by
the fuzzer's own comparison (rows, watermarks, ``numInputRows``, state rows and the state
per partition, batch by batch).

- An inner join on ``["k", "ts"]`` (an equality on the event time itself) whose left side is
  filtered ``ts >= 00:00:04`` above its watermark, the right side's ts2 renamed ts (its
  watermark before the rename, seed 1609; after it, under an aggregation, seed 1951): Spark's
  optimizer infers ``ts >= 00:00:04`` for the right side too, from the join's equality
  (InferFiltersFromConstraints), and pushes it down to the right side's watermark, which it
  does not pass (it reads the event time): the watermark sees the rows it drops, the join's
  state does not keep them. microbatch filtered the left side only: one state row more per
  such right row.
- An inner time-range join whose left side is filtered ``k != 1``, restarted after file 2
  (seed 1828): Spark's optimizer infers ``k2 != 1`` for the right side and pushes it into the
  right side's scan, but only in a batch whose left source has data: Spark's engine reads a
  source without data as an empty relation, and its optimizer makes the filter over it an
  empty relation too (PropagateEmptyRelation) before it infers filters from it. In the
  batch after the restart the left source has no file left: Spark reads (and counts, and
  keeps in state) the right side's ``k2 = 1`` rows. microbatch filtered them in every batch.

The filters are chosen per batch by the sources without data in it (``plan.logical.BatchFilter``
on a join's side, ``ScanFilter.for_batch`` on a scan).
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import ci_share
from microbatch import spark_internals
from microbatch.testing import fuzz


def _files1(*files) -> list[list[dict]]:
    return [[{"ts": fuzz._stamp(t), "k": k, "v": v, "s": s} for t, k, v, s in rows] for rows in files]


def _files2(*files) -> list[list[dict]]:
    return [[{"ts2": fuzz._stamp(t), "k2": k, "v2": v} for t, k, v in rows] for rows in files]


SEED_1609 = fuzz.Case(1609, fuzz.Query([
    "df = src",
    'df = df.withWatermark("ts", "0 seconds")',
    'df = df.drop("s")',
    'df = df.filter(df.ts >= F.lit("2026-01-01 00:00:04").cast("timestamp"))',
    "right = src2",
    'right = right.withWatermark("ts2", "10 seconds")',
    'right = right.select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), "v2")',
    'df = df.join(right, ["k", "ts"], "inner")',
], "update"), _files1(
    [(3, 3, 3, "c"), (13, 1, 9, "a")],
    [],
    [(8, 3, 3, "c"), (9, 1, 6, "b"), (14, 0, 7, "c")],
    [(15, 0, 1, "a"), (16, 2, 5, "b"), (0, 1, 6, "a"), (15, 0, 8, "c"), (0, 2, 6, "b"), (19, 1, 6, "a")],
), _files2(
    [(7, 2, 0), (0, 1, 3)],
    [(12, 2, 0), (14, 3, 2), (14, 2, 0), (15, 3, 3), (17, 3, 2), (16, 2, 9)],
    [(31, 2, 0), (20, 0, 1)],
    [(36, 1, 7), (28, 2, 7), (30, 0, 4), (15, 2, 2)],
))

SEED_1951 = fuzz.Case(1951, fuzz.Query([
    "df = src",
    'df = df.drop("s")',
    'df = df.withWatermark("ts", "3 seconds")',
    'df = df.filter(F.col("ts") >= F.lit("2026-01-01 00:00:04").cast("timestamp"))',
    "right = src2",
    'right = right.select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), "v2")',
    'right = right.withWatermark("ts", "10 seconds")',
    'df = df.join(right, ["k", "ts"], "inner")',
    'df = df.groupBy("k").agg(F.sum(F.col("v")).alias("su_1"), F.avg(df.v).alias("av_2"), '
    'F.max(df["ts"]).alias("la_3"))',
], "update"), _files1(
    [(9, 2, 1, "a"), (7, 2, 0, "c"), (2, 1, 1, "b"), (0, 0, 2, "a"), (11, None, 7, "b"), (10, 3, 3, "c")],
    [(7, 0, 1, "c"), (6, 0, 7, "b"), (8, 0, 8, "a"), (12, 0, 0, "c")],
    [(0, 2, 2, "b"), (18, 1, 6, "b"), (18, 2, 8, "b")],
    [(35, 1, 6, "c"), (8, 1, 5, "a"), (29, 1, 9, "c"), (30, 1, 5, "b"), (2, 1, 6, "a")],
), _files2(
    [(7, 0, 2), (0, 2, 5), (5, 0, 6), (2, 0, 6), (4, 0, 1), (0, 0, 2)],
    [(10, 3, 2), (12, 0, 8), (5, 1, None), (4, 1, None), (12, 1, 5), (0, 2, None)],
    [(12, 0, 4), (12, 1, 7), (13, 0, 7), (0, 2, 8)],
    [(9, 2, 8), (18, 3, 8), (20, 2, 2), (23, 1, 2)],
    [(28, 1, 3), (30, 1, 5), (36, 0, 8), (8, 2, 9)],
))

SEED_1828 = fuzz.Case(1828, fuzz.Query([
    "df = src",
    'df = df.filter(df["k"] != 1)',
    "right = src2",
    "left = df",
    'df = left.join(right, (left.k == right.k2) & (right.ts2 >= left.ts - F.expr("INTERVAL 0 SECONDS")) '
    '& (right.ts2 <= left.ts + F.expr("INTERVAL 10 SECONDS")), "inner")',
    'df = df.filter(df["v"] >= 1)',
], "update", restart_after=2), _files1(
    [(9, 3, 6, "c")],
    [(14, 3, 7, "c"), (13, 2, 3, "b"), (0, 2, 6, "a"), (20, 0, 3, "a")],
    [(29, 0, 9, "b")],
), _files2(
    [(0, 3, None), (0, 3, 9), (0, 0, 9), (0, 2, 7), (1, 0, 6)],
    [],
    [(19, 3, 3), (0, 1, 6), (18, 1, 6), (20, 0, 7), (18, 3, 3)],
    # (the left source has no file left from here: Spark infers no k2 != 1, reads the k2 = 1 rows)
    [(25, 2, 7), (18, 2, 6), (29, 3, 9), (29, None, 5), (24, 3, 2), (19, 1, 5)],
    [(34, 2, 2), (2, 0, 9), (25, None, 1), (24, 0, 5), (25, 3, 9), (26, 3, 8)],
))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ci_share([SEED_1609, SEED_1951, SEED_1828]), ids=lambda c: f"seed {c.seed}")   # (helpers.ci_share)
def test_join_state_as_sparks_engine_keeps_it(spark, case):
    result = fuzz.run_case(spark, case)
    assert result.status == "ok", result.report()
    assert result.state_compared > 0


def test_the_filters_spark_infers_for_a_joins_sides(spark):
    """What ``join_inferred_filters`` reads from Spark: a filter on the left side's key given
    to the right side through the join's equality; none from a side Spark reads as an
    empty relation of a stream's (a source without data), nor through its watermark."""
    left = spark.createDataFrame([], "ts TIMESTAMP, k INT, v INT")
    right = spark.createDataFrame([], "ts2 TIMESTAMP, k2 INT, v2 INT").select(
        F.col("ts2").alias("ts"), F.col("k2").alias("k"), "v2")
    cut = F.lit("2026-01-01 00:00:04").cast("timestamp")

    def inferred(left_side) -> list[str]:
        left_parts, right_parts = spark_internals.join_inferred_filters(left_side.join(right, ["k", "ts"], "inner"))
        assert left_parts == []
        return right_parts

    (ts_part,) = inferred(left.where(F.col("ts") >= cut))
    assert ts_part.startswith("(ts >= ")
    (k_part,) = inferred(left.where(F.col("k") != 1))
    assert "(k = 1)" in k_part
    empty = spark_internals.stream_without_data(left)
    assert inferred(empty.where(F.col("k") != 1)) == []
    # (Spark's EventTimeWatermark over the empty relation stays, and so does the filter above it)
    (k_part,) = inferred(empty.withWatermark("ts", "1 second").where(F.col("k") != 1))
    assert "(k = 1)" in k_part
