"""Rows the differential fuzzer found microbatch emitted unlike Spark's engine (issue 57),
each as a small hand-written query on microbatch next to Spark's own engine, batch by
batch: rows, progress (state operators, with the rows they dropped as late), watermarks.

- A keyed-state function in event time over an event time that is not the column
  ``withWatermark`` named (seed 922): Spark's exec drops late rows by the first column of
  its input that carries the watermark's mark. A renamed event time carries it; so does the
  column of the frame *before* ``withWatermark`` (``w["ts"]``), in every batch with data:
  Spark's analysis leaves that one unmarked, but its optimizer rewrites the reference to the
  attribute the watermark gives, marked (as the programming guide reads
  ``groupBy(window(words.timestamp, ...))`` after ``words.withWatermark``). microbatch looked
  the column up by the name given to ``withWatermark``, so it dropped no late row there.
"""
from __future__ import annotations

import pytest
from pyspark.sql.streaming.state import GroupStateTimeout

from helpers import ci_share, collect_batches, confs, json_stream
from microbatch.testing.fuzz import FuzzTimers, fuzz_until_quiet   # (importable by Spark's Python workers)
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "id INT, ts TIMESTAMP, price INT"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: (id, second of the minute, price) per file: the watermark (5 s of delay) passes 15 s in
#: batch 2, so batch 3's row of id 2 at 3 s is late
EVENTS = [
    [(2, 4, 1), (1, 5, 1)],
    [(1, 20, 1)],
    [(1, 30, 1)],
    [(2, 3, 1), (3, 31, 1)],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})


def timers_over_a_renamed_event_time(stream):
    """transformWithStateInPandas in event time, its input's event time renamed."""
    renamed = stream.withWatermark("ts", "5 seconds").withColumnRenamed("ts", "t")
    return renamed.groupBy("id").transformWithStateInPandas(
        FuzzTimers("id", "t"), "id INT, n LONG, fired BOOLEAN", "update", "EventTime")


def timers_over_the_column_before_the_watermark(stream):
    """The same over ``w["ts"]`` of the frame before ``withWatermark``, aliased (seed 922)."""
    w = stream
    selected = stream.withWatermark("ts", "5 seconds").select(w["ts"].alias("t"), "id", "price")
    return selected.groupBy("id").transformWithStateInPandas(
        FuzzTimers("id", "t"), "id INT, n LONG, fired BOOLEAN", "update", "EventTime")


def timeouts_over_a_renamed_event_time(stream):
    """applyInPandasWithState with an event-time timeout, its input's event time renamed."""
    renamed = stream.withWatermark("ts", "5 seconds").withColumnRenamed("ts", "t")
    return renamed.groupBy("id").applyInPandasWithState(
        fuzz_until_quiet("id"), "id INT, n LONG, done BOOLEAN", "n LONG", "update", GroupStateTimeout.EventTimeTimeout)


LATE_ROWS_BY_ANOTHER_COLUMN = {
    "transformWithState, a renamed event time": timers_over_a_renamed_event_time,
    "transformWithState, the column of the frame before the watermark": timers_over_the_column_before_the_watermark,
    "applyInPandasWithState, a renamed event time": timeouts_over_a_renamed_event_time,
}


@pytest.mark.parametrize("shape", ci_share(list(LATE_ROWS_BY_ANOTHER_COLUMN)))   # (helpers.ci_share)
def test_late_rows_are_dropped_by_the_input_column_spark_finds_marked(spark, ss, events, tmp_path, shape):
    query = LATE_ROWS_BY_ANOTHER_COLUMN[shape]
    with confs(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}):   # (Spark's TWS needs it)
        theirs, their_progress = collect_batches(query(json_stream(spark, events, SCHEMA)), tmp_path / "spark",
                                                 "update")
    ours, our_progress = collect_batches(query(json_stream(ss, events, SCHEMA)), tmp_path / "microbatch", "update")
    assert ours == theirs
    # (Spark dropped the late row: the test reads what it is about)
    assert sum(op["numRowsDroppedByWatermark"] for p in their_progress for op in p["stateOperators"]) == 1
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
