"""A filter right over a streaming aggregation by an aggregate function the aggregation does
not output (issue 57, the gap left by seed 2712's fix), on microbatch next to Spark's own
engine, batch by batch.

Spark's analysis (ResolveAggregateFunctions) adds such an aggregate to the aggregation as a
hidden column, filters by it and drops it with a projection above:
``groupBy("k").count().where("sum(v) > 30")`` is ``Project [k, count] (Filter (sum(v) > 30)
(Aggregate [k], [k, count(1) AS count, sum(v) AS sum(v)]))``, SQL's ``GROUP BY k HAVING
sum(v) > 30`` alike; its engine keeps the hidden aggregate's buffer in the aggregation's
state. microbatch refused it when the query was defined; it now makes the aggregation again
with those columns (``StreamFrame._having_hidden_aggregates``), so the rows, the state (its
buffers too), ``numInputRows`` and the watermark are Spark's in every output mode.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, json_stream
from stream_events import comparable, watermarks, write_event_files

from microbatch.ops.spark_conversion import convert_to_spark

SCHEMA = "k INT, ts TIMESTAMP, v INT"

#: (k, second of the minute, v) per file: out of order, late rows, a key's rows in many batches
EVENTS = [
    [(1, 1, 10), (2, 3, 20), (1, 4, 30)],
    [(2, 12, 5), (3, 11, 40), (1, 2, 7)],
    [(1, 25, 30), (3, 23, 10), (2, 27, 50)],
    [(2, 41, 60), (1, 44, 3), (3, 5, 99)],
    [(3, 58, 1)],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda k, s, v: {"k": k, "ts": f"2026-01-01 00:00:{s:02d}", "v": v})


def count_where_sum(session, path):
    """A count per key, kept where the key's sum, which it does not output, is above 30."""
    return json_stream(session, path, SCHEMA).groupBy("k").count().where("sum(v) > 30")


def several_aggregates(session, path):
    """An agg of two aggregates under a filter by two it does not output and one it does."""
    return (json_stream(session, path, SCHEMA).groupBy("k").agg(F.count("*"), F.sum("v").alias("s"))
            .where("max(v) < 60 AND s > 10 AND min(v) > 2"))


def sql_having(session, path):
    """SQL's HAVING by an aggregate the select list does not name."""
    json_stream(session, path, SCHEMA).createOrReplaceTempView("hidden_having_v")
    return session.sql("SELECT k, count(*) FROM hidden_having_v GROUP BY k HAVING sum(v) > 30 AND k > 1")


def sql_having_rollup(session, path):
    """SQL's HAVING over a ROLLUP, by an aggregate the select list names and one it does not."""
    json_stream(session, path, SCHEMA).createOrReplaceTempView("hidden_having_r")
    return session.sql("SELECT k, count(*) AS c FROM hidden_having_r GROUP BY ROLLUP(k) "
                       "HAVING count(*) > 1 AND max(v) >= 30")


def sql_having_global(session, path):
    """SQL's HAVING over an aggregation of the whole stream, by an average it does not output."""
    json_stream(session, path, SCHEMA).createOrReplaceTempView("hidden_having_g")
    return session.sql("SELECT count(*) AS n, max(v) FROM hidden_having_g HAVING avg(v) > 20")


def windowed(session, path):
    """A count per window under a watermark, kept where the window's max v is under 55."""
    return (json_stream(session, path, SCHEMA).withWatermark("ts", "10 seconds")
            .groupBy(F.window("ts", "10 seconds")).agg(F.count("*"))
            .filter(F.expr("max(v) < 55")))


def aggregation_of_having(session, path):
    """A second aggregation over the filtered first one (chained aggregations, append mode)."""
    return (json_stream(session, path, SCHEMA).withWatermark("ts", "10 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k").count().where("max(v) > 5")
            .groupBy("window").agg(F.sum("count").alias("n")))


def state(reader, ckpt, operators: int) -> list:
    """Every operator's state rows (key and value fields, not their names), sorted."""
    found = []
    for op in range(operators):
        rows = reader.format("statestore").option("operatorId", op).load(str(ckpt)).select("key", "value").collect()
        found.extend((op, tuple(r.key), tuple(r.value)) for r in rows)
    return sorted(found, key=repr)


@pytest.mark.parametrize("query, mode, operators", ci_share([   # half in CI's run (helpers.ci_share)
    (count_where_sum, "update", 1), (count_where_sum, "complete", 1),
    (several_aggregates, "update", 1), (several_aggregates, "complete", 1),
    (sql_having, "update", 1), (sql_having, "complete", 1), (sql_having_rollup, "complete", 1), (sql_having_global, "complete", 1),
    (windowed, "append", 1), (windowed, "update", 1), (aggregation_of_having, "append", 2),
]))
def test_a_filter_by_a_hidden_aggregate_matches_spark(spark, ss, events, tmp_path, query, mode, operators):
    theirs, their_progress = collect_batches(query(spark, events), tmp_path / "spark", mode)
    ours, our_progress = collect_batches(query(ss, events), tmp_path / "microbatch", mode)
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    # (the hidden aggregates' buffers are in the state, as in Spark's)
    assert state(ss.read, tmp_path / "microbatch", operators) == state(spark.read, tmp_path / "spark", operators)


def test_the_hidden_aggregate_is_not_an_output_column(ss, events):
    frame = count_where_sum(ss, events)
    assert frame.columns == ["k", "count"]
    assert "sum(v)" in frame._plan.tree_string()   # (the aggregation computes it)


def arrive(events, live, names) -> None:
    for name in names:
        os.rename(os.path.join(events, name), live / name)


def progress(batches) -> list:
    return comparable([json.loads(p.json) for p in batches])


def two_batches_copied(session, events, tmp_path):
    """The first two files run on ``session``'s engine into ``moved``, copied to ``stayed``."""
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:2])
    collect_batches(several_aggregates(session, live), moved, "update")
    shutil.copytree(moved, stayed)
    return live, moved, stayed, names


@pytest.mark.porting
def test_microbatch_continues_the_state_spark_kept_with_its_hidden_aggregate(spark, ss, events, tmp_path):
    """Spark's engine runs two batches; microbatch adopts its state (the hidden sum's
    buffer in each key's value) and goes on as Spark's engine goes on from a copy."""
    live, moved, stayed, names = two_batches_copied(spark, events, tmp_path)
    arrive(events, live, names[2:])
    theirs, their_progress = collect_batches(several_aggregates(spark, live), stayed, "update")
    ours, our_progress = collect_batches(several_aggregates(ss, live), moved, "update")
    assert ours == theirs and any(rows for _, rows in ours)
    assert progress(our_progress) == progress(their_progress)
    assert watermarks(moved) == watermarks(stayed)


@pytest.mark.porting
def test_spark_continues_the_state_microbatch_kept_with_its_hidden_aggregate(spark, ss, events, tmp_path):
    """microbatch runs two batches; its checkpoint, converted, goes on on Spark's engine
    as microbatch goes on from a copy (the conversion adds a batch)."""
    live, moved, stayed, names = two_batches_copied(ss, events, tmp_path)
    convert_to_spark(spark, str(moved))
    assert state(spark.read, moved, 1) == state(ss.read, stayed, 1)
    arrive(events, live, names[2:])
    theirs, their_progress = collect_batches(several_aggregates(spark, live), moved, "update")
    ours, our_progress = collect_batches(several_aggregates(ss, live), stayed, "update")
    assert [rows for _, rows in theirs] == [rows for _, rows in ours] and any(rows for _, rows in ours)
    assert [p[1:] for p in progress(their_progress)] == [p[1:] for p in progress(our_progress)]
