"""Plans the differential fuzzer found microbatch made unlike Spark's engine (issue 57), each
as a small hand-written query on microbatch next to Spark's own engine, batch by batch:
rows, progress (state operators and their rows included), watermarks, and the state rows
per operator and partition.

- A rollup over session windows under a second aggregation (seed 590): the filter Spark's
  optimizer pushes from the aggregation above onto the rollup's keys (the ``isnotnull`` of
  the window over the session) runs between the rollup's expansion and its sessions'
  merge, so the rollup's sets without a session never reach it (microbatch's run failed:
  "Grouping Session should not be null").
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream
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

@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})


def state_partitions(reader, ckpt, operators: dict[int, tuple]) -> list:
    """(operator, join side, partition, rows) of the state of each operator (with its join
    sides, or ``(None,)``), as ``reader`` reads it."""
    found = []
    for op, sides in operators.items():
        for side in sides:
            frame = reader.format("statestore").option("operatorId", op)
            if side is not None:
                frame = frame.option("joinSide", side)
            found.extend((op, side, row[0], row[1])
                         for row in frame.load(str(ckpt)).groupBy("partition_id").count().collect())
    return sorted(found, key=repr)


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
