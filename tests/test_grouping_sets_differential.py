"""Aggregations Spark runs through an expansion or a per-row rule, on microbatch next to
Spark's own engine, batch by batch: rollup, cube and grouping sets (with ``grouping()`` and
``grouping_id()``, and over a window in append mode), and session windows whose gap is an
expression of the row (a gap that is not positive drops the row, as Spark's rule does). A
filter above a grouping sets' aggregation on its keys (the user's, or the ``isnotnull`` of a
time window over its window) runs between the expansion and the aggregation, as Spark's
optimizer pushes it: the rows it rejects never reach the state."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import ci_share
from test_chained_differential import restarts_with_the_same_answer, same_as_spark


def parity(frame):
    return frame.withColumn("k", F.col("id") % 2)


def gap():
    return F.when(F.col("id") == 1, "5 seconds").when(F.col("id") == 2, "0 seconds").otherwise("12 seconds")


CASES = {
    "rollup (complete)": ("complete", lambda f: parity(f).rollup("k", "id").count()),
    "cube with grouping() and grouping_id() (update)": (
        "update", lambda f: parity(f).cube("k", "id").agg(
            F.count("*").alias("n"), F.grouping_id().alias("g"), F.grouping("k").alias("gk"))),
    "grouping sets (update)": (
        "update", lambda f: parity(f).groupingSets([["k"], ["k", "id"], []], "k", "id").agg(F.sum("id").alias("s"))),
    "rollup over a window (append)": (
        "append", lambda f: f.withWatermark("ts", "10 seconds").rollup(F.window("ts", "10 seconds"), "id").count()),
    "a filter on a cube's keys (update)": (
        "update", lambda f: f.withWatermark("ts", "10 seconds").cube(F.window("ts", "5 seconds"), "id")
        .agg(F.count("*").alias("n"), F.grouping_id().alias("g")).where("id >= 2 AND g < 2")),
    "session window with a computed gap (append)": (
        "append", lambda f: f.withWatermark("ts", "10 seconds").groupBy("id", F.session_window("ts", gap())).count()),
    "session window with a computed gap (complete)": (
        "complete", lambda f: f.withWatermark("ts", "10 seconds").groupBy("id", F.session_window("ts", gap())).count()),
}


@pytest.mark.parametrize("case", ci_share(list(CASES)))   # half in CI's run (helpers.ci_share)
def test_matches_spark_batch_by_batch(spark, ss, events, tmp_path, case):
    same_as_spark(spark, ss, events, tmp_path, case, CASES[case])


def test_a_rollup_restarts_in_the_middle_with_the_same_answer(ss, events, tmp_path):
    restarts_with_the_same_answer(ss, events, tmp_path, "rollup over a window (append)", CASES["rollup over a window (append)"])


def cube_of_windows_rolled_up(f):
    """Rows per 5-second window and id, cubed; then rolled up over 10-second windows (sliding
    by 5) of the cube's windows' ``window_time``. The rollup's window drops the cube's rows
    without a window (its ``isnotnull``), and Spark's optimizer pushes that filter below the
    cube's aggregation: those grouping sets never reach the cube's state (fuzzer, seed 1)."""
    cubed = f.withWatermark("ts", "10 seconds").cube(F.window("ts", "5 seconds"), "id").count()
    return cubed.rollup(F.window(F.window_time("window"), "10 seconds", "5 seconds"), "id").count()


def state_keys(session, checkpoint, operator: int) -> list[str]:
    rows = (session.read.format("statestore").option("operatorId", operator).load(str(checkpoint))
            .select("key", "partition_id").collect())
    return sorted(map(str, rows))


def test_a_cube_feeding_a_rollup_keeps_the_state_spark_keeps(spark, ss, events, tmp_path):
    same_as_spark(spark, ss, events, tmp_path, "cube of windows, rolled up (append)",
                  ("append", cube_of_windows_rolled_up))
    for operator in (0, 1):
        assert state_keys(ss, tmp_path / "microbatch", operator) == state_keys(spark, tmp_path / "spark", operator)
