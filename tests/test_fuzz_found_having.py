"""A filter by an aggregate function right over a streaming aggregation, found by the
differential fuzzer (issue 57, seed 2712), on microbatch next to Spark's own engine.

Spark's analysis (ResolveAggregateFunctions) makes such a filter a HAVING: ``count(1)`` in
``where("count(1) IS NOT NULL")`` over ``SELECT count(*) FROM v`` (or over
``groupBy("k").count()``, where it is the ``count`` column) is the aggregation's output
column, and Spark's engine filters its aggregation's rows by it. microbatch replayed the
filter as written over its aggregation's output, where ``count(1)`` is an aggregate call
again, and its run failed (INVALID_WHERE_CONDITION). It now filters by the condition as
Spark's analysis resolved it, bound to the aggregation's output.

An aggregate function the aggregation does not output (``groupBy("k").count()
.where("sum(v) > 2")``) Spark's analysis adds to the aggregation as a hidden column, which a
projection drops above the filter; Spark's engine runs it, and so does microbatch
(tests/test_fuzz_found_hidden_having.py).
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "k INT, ts TIMESTAMP, v INT"
OTHER_SCHEMA = "k2 INT, ts2 TIMESTAMP, v2 INT"

EVENTS = [
    [(1, 1, 10), (2, 3, 20), (1, 4, 30)],
    [(2, 12, 5), (3, 11, 40)],
    [(1, 25, 30)],
]
OTHER_EVENTS = [
    [(4, 2, 1)],
    [(4, 14, 3), (1, 12, 4)],
    [],
]


@pytest.fixture
def events(tmp_path):
    return (write_event_files(tmp_path / "events", EVENTS,
                              lambda k, s, v: {"k": k, "ts": f"2026-01-01 00:00:{s:02d}", "v": v}),
            write_event_files(tmp_path / "other", OTHER_EVENTS,
                              lambda k, s, v: {"k2": k, "ts2": f"2026-01-01 00:00:{s:02d}", "v2": v}))


def seed_2712(session, paths):
    """Seed 2712: a SQL count over a view of a union of two streams, filtered by the count."""
    src, src2 = json_stream(session, paths[0], SCHEMA), json_stream(session, paths[1], OTHER_SCHEMA)
    df = src.withWatermark("ts", "10 seconds").unionByName(src2.withWatermark("ts2", "5 seconds").select(
        F.col("ts2").alias("ts"), F.col("k2").alias("k"), F.col("v2").alias("v")))
    df = df.withColumnRenamed("ts", "t_2")
    df.createOrReplaceTempView("fuzz_having_v")
    return session.sql("SELECT count(*) FROM fuzz_having_v").where("count(1) IS NOT NULL")


def grouped_count(session, paths):
    """The count per key, kept where the count (as ``count(1)``) is above 1."""
    return json_stream(session, paths[0], SCHEMA).groupBy("k").count().where("count(1) > 1")


def grouped_agg(session, paths):
    """An agg's ``count(1)`` column, and a filter by it as a Column."""
    return (json_stream(session, paths[0], SCHEMA).groupBy("k").agg(F.count("*"), F.sum("v").alias("s"))
            .where(F.expr("count(1)") >= 1).where("s > 10"))


@pytest.mark.parametrize("query", [seed_2712, grouped_count, grouped_agg])
def test_a_filter_by_an_aggregate_over_an_aggregation_matches_spark(spark, ss, events, tmp_path, query):
    theirs, their_progress = collect_batches(query(spark, events), tmp_path / "spark", "complete")
    ours, our_progress = collect_batches(query(ss, events), tmp_path / "microbatch", "complete")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")

