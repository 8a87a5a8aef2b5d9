"""Plans the differential fuzzer found microbatch made unlike Spark's engine (issue 57), each
as a small hand-written query on microbatch next to Spark's own engine, batch by batch:
rows, progress (state operators and their rows included), watermarks, and the state rows
per operator and partition.

- A rollup over session windows under a second aggregation (seed 590): the filter Spark's
  optimizer pushes from the aggregation above onto the rollup's keys (the ``isnotnull`` of
  the window over the session) runs between the rollup's expansion and its sessions'
  merge, so the rollup's sets without a session never reach it (microbatch's run failed:
  "Grouping Session should not be null").
- A left semi join of a union with a stream (seed 461): Spark's optimizer pushes the join
  through the union (PushDownLeftSemiAntiJoin), one stream-stream join per input of the
  union, each with its own state, and reads the other side once (its exchange reused).
- A left semi join whose left event time is renamed above its watermark (seed 461's second
  join): Spark pushes the join below the renaming projection; the event time its condition
  reads is still the join's, which drops late rows and evicts by it.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream, state_rows_per_partition
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "id INT, ts TIMESTAMP, price INT"

#: (id, second of the minute, price) per file: out of order, a late row, sessions that merge
EVENTS = [
    [(1, 1, 10), (2, 3, 20), (1, 4, 30), (3, 2, 1)],
    [(2, 12, 5), (3, 11, 40), (1, 2, 7)],
    [(1, 25, 30), (3, 23, 10), (2, 27, 50)],
    [(2, 41, 60), (1, 44, 60), (3, 5, 99)],
    [(3, 58, 1)],
]

#: the other stream of the semi join: its rows meet some of the first stream's, and its own
OTHER_EVENTS = [
    [(2, 6, 1), (3, 0, 2)],
    [(3, 14, 3), (1, 12, 4)],
    [(2, 24, 5)],
    [(2, 40, 6), (3, 47, 7)],
    [],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})


state_partitions = state_rows_per_partition


def rollup_of_sessions_by_window(stream):
    """Seed 590: a rollup over session windows, counted per window of the
    sessions' time; the sets without a session have a null window, which Spark's filter
    drops before the rollup's sessions merge."""
    sessions = (stream.withWatermark("ts", "0 seconds").filter(F.col("price") > 2)
                .rollup(F.session_window("ts", "3 seconds"), "id").agg(F.sum("price").alias("p")))
    return (sessions.groupBy(F.window(F.window_time("session_window"), "10 seconds"), "id")
            .count().select("window", "id"))


def test_a_rollup_of_session_windows_under_an_aggregation_matches_spark(spark, ss, events, tmp_path):
    theirs, their_progress = collect_batches(rollup_of_sessions_by_window(json_stream(spark, events, SCHEMA)),
                                             tmp_path / "spark", "append")
    ours, our_progress = collect_batches(rollup_of_sessions_by_window(json_stream(ss, events, SCHEMA)),
                                         tmp_path / "microbatch", "append")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)
    assert [op["operatorName"] for op in our_progress[0]["stateOperators"]] == \
        ["stateStoreSave", "sessionWindowStateStoreSaveExec"]
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    operators = {0: (None,), 1: (None,)}
    assert state_partitions(ss.read, tmp_path / "microbatch", operators) == \
        state_partitions(spark.read, tmp_path / "spark", operators)


#: the other stream's columns (its rows written from OTHER_EVENTS)
OTHER_SCHEMA = "oid INT, ots TIMESTAMP, oprice INT"


def semi_join_of_a_union(first, second):
    """Seed 461: one source read by a union (its columns renamed to the other input's) and
    by the other side of a left semi join of the union; Spark runs the join once per input
    of the union (the filter and the projection above the union run on each input, below
    its join), each keeping the other side's rows, which it reads once (its exchange
    reused by the second join)."""
    both = first.withWatermark("ts", "3 seconds").unionByName(
        second.withWatermark("ots", "3 seconds").select(F.col("oprice").alias("price"), F.col("oid").alias("id"),
                                                         F.col("ots").alias("ts")))
    left = both.drop("price").filter(F.col("id") != 1)
    right = second.withWatermark("ots", "0 seconds")
    return left.join(right, F.expr("id = oid AND ots BETWEEN ts - INTERVAL 5 SECONDS AND ts + INTERVAL 5 SECONDS"),
                     "left_semi")


def semi_join_of_a_renamed_time(first, second):
    """A left semi join whose left event time is renamed right above its watermark, and
    read by nothing above the join (seed 461's second join): Spark pushes the join below
    the renaming projection, where its condition reads the event time under its old name;
    the join drops that side's late rows and evicts its state by it."""
    left = first.withWatermark("ts", "3 seconds").select("id", F.col("ts").alias("t"))
    right = second.withWatermark("ots", "0 seconds")
    return left.join(right, F.expr("id = oid AND ots BETWEEN t - INTERVAL 5 SECONDS AND t + INTERVAL 5 SECONDS"),
                     "left_semi").select("id")


SEMI_JOINS = {"of a union": (semi_join_of_a_union, 2), "of a renamed event time": (semi_join_of_a_renamed_time, 1)}


@pytest.mark.parametrize("shape", list(SEMI_JOINS))
def test_a_semi_join_keeps_the_state_spark_keeps(spark, ss, events, tmp_path, shape):
    query, joins = SEMI_JOINS[shape]
    others = write_event_files(tmp_path / "others", OTHER_EVENTS,
                               lambda i, s, p: {"oid": i, "ots": f"2026-01-01 00:00:{s:02d}", "oprice": p})

    def run(session, ckpt):
        frame = query(json_stream(session, events, SCHEMA), json_stream(session, others, OTHER_SCHEMA))
        return collect_batches(frame, tmp_path / ckpt, "append")

    theirs, their_progress = run(spark, "spark")
    ours, our_progress = run(ss, "microbatch")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert [op["operatorName"] for op in their_progress[0]["stateOperators"]] == ["symmetricHashJoin"] * joins
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    operators = {op: ("left", "right") for op in range(joins)}
    assert state_partitions(ss.read, tmp_path / "microbatch", operators) == \
        state_partitions(spark.read, tmp_path / "spark", operators)
