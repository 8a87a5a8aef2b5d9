"""State rows the differential fuzzer found microbatch kept unlike Spark's engine (issue 57,
seeds 573, 616, 868; two fields of one name in a session window's state, from the tenth long
run), each as a small hand-written query on microbatch next to Spark's own
engine, batch by batch: rows, progress (state operators and their ``numRowsTotal``
included), watermarks, and the state rows per operator and partition.

- A cube over a ``dropDuplicatesWithinWatermark`` with a filter on the cube's keys above
  (seed 573): Spark's optimizer runs the filter between the cube's expansion and its
  aggregation, so the sets it rejects never reach the state. microbatch read that filter
  from the query built as a batch, where ``dropDuplicatesWithinWatermark`` does not build
  (Spark refuses it on a batch): no filter, one state row more per rejected set.
- A rollup over a sliding window under a second aggregation by a sliding window of it
  (seed 616): the ``isnotnull`` of the outer window runs under the rollup, dropping its
  grand total set; microbatch took the outer window's Expand (one row per window) for a
  second expansion into grouping sets, and so read no filter.
- A stream-stream join whose left side's event time nothing above the join reads (seed
  868): Spark's optimizer prunes the column from the join's input, so its join exec sees
  no event time on that side and drops none of its late rows (nor evicts its state by it);
  microbatch dropped them.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, json_stream, state_rows_per_partition
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "id INT, ts TIMESTAMP, price INT"

#: (id, second of the minute, price) per file: out of order, late rows, a repeated id
EVENTS = [
    [(1, 4, 10), (2, 3, 20)],
    [(2, 14, 5), (3, 11, 40), (1, 2, 7)],
    [(1, 25, 30), (3, 23, 10), (2, 27, 50)],
    [(2, 41, 60), (1, 44, 60), (3, 5, 99), (2, 30, 3)],
    [(3, 58, 1)],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})


def state_partitions(reader, ckpt, operators: int, join: bool = False) -> list:
    """(operator, join side, partition, rows) of every operator's state, as ``reader`` reads it."""
    return state_rows_per_partition(reader, ckpt, {op: ("left", "right") if join else (None,)
                                                   for op in range(operators)})


def cube_over_dedup_within_watermark(session, events):
    """Seed 573: the filter on the cube's key drops its grand total set before its state."""
    stream = json_stream(session, events, SCHEMA).withWatermark("ts", "10 seconds")
    return (stream.dropDuplicatesWithinWatermark(["id"])
            .cube("id").agg(F.sum("price").alias("p"))
            .where("id IS NOT NULL"))


def rollup_of_sliding_windows_by_window(session, events):
    """Seed 616: the outer sliding window's ``isnotnull`` drops the rollup's grand total set
    (a null window) before its state."""
    stream = json_stream(session, events, SCHEMA).withWatermark("ts", "3 seconds")
    maxes = (stream.rollup(F.window("ts", "10 seconds", "5 seconds").alias("w"), "id")
             .agg(F.max("price").alias("m")))
    return (maxes.groupBy(F.window(F.window_time("w"), "10 seconds", "5 seconds"), "id")
            .agg(F.sum("m").alias("s")))


def join_of_a_side_whose_event_time_is_pruned(session, events):
    """Seed 868: the left side's ``ts`` is neither in the join's condition nor above it, so
    Spark's join exec sees none on that side: its late rows join and stay in state."""
    left = (json_stream(session, events, SCHEMA).withWatermark("ts", "0 seconds")
            .withColumn("t1", F.col("ts") - F.expr("INTERVAL 1 SECOND")))
    right = json_stream(session, events, SCHEMA).select(F.col("id").alias("rid"), F.col("ts").alias("rt"),
                                                        F.col("price").alias("rp"))
    joined = left.join(right, (left.id == right.rid) & (right.rt >= left.t1)
                       & (right.rt <= left.t1 + F.expr("INTERVAL 10 SECONDS")))
    return joined.select("id", "rt", "rp")


def session_windows_with_two_counts(session, events):
    """The tenth long run (four seeds): two ``count``s make two buffer fields of one name in
    a session window's state row, which Spark's Arrow conversion refuses; microbatch's
    reader failed where Spark's reads them."""
    stream = json_stream(session, events, SCHEMA).withWatermark("ts", "5 seconds")
    return (stream.groupBy(F.session_window("ts", "5 seconds"), "id")
            .agg(F.count("*").alias("n"), F.count("price").alias("priced")))


#: name -> (query, output mode, its stateful operators, whether they are a join)
QUERIES = {
    "seed 573 cube over dropDuplicatesWithinWatermark, filtered": (cube_over_dedup_within_watermark, "update", 2, False),
    "seed 616 rollup of sliding windows by a sliding window": (rollup_of_sliding_windows_by_window, "append", 2, False),
    "seed 868 join, a side's event time pruned": (join_of_a_side_whose_event_time_is_pruned, "update", 1, True),
    "session windows with two counts": (session_windows_with_two_counts, "append", 1, False),
}


@pytest.mark.parametrize("name", ci_share(list(QUERIES)))   # half in CI's run (helpers.ci_share)
def test_state_rows_match_spark_batch_by_batch(spark, ss, events, tmp_path, name):
    query, mode, operators, join = QUERIES[name]
    theirs, their_progress = collect_batches(query(spark, events), tmp_path / "spark", mode)
    ours, our_progress = collect_batches(query(ss, events), tmp_path / "microbatch", mode)
    assert ours == theirs
    assert sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    assert state_partitions(ss.read, tmp_path / "microbatch", operators, join) == \
        state_partitions(spark.read, tmp_path / "spark", operators, join)


def test_a_state_row_with_two_fields_of_one_name_reads_as_sparks(spark, ss, events, tmp_path):
    """The session window state of two ``count``s, read whole: microbatch's reader of its
    own checkpoint gives the rows, fields and names Spark's reader gives of Spark's."""
    read = {}
    for name, session in (("spark", spark), ("microbatch", ss)):
        collect_batches(session_windows_with_two_counts(session, events), tmp_path / name, "append")
        frame = session.read.format("statestore").load(str(tmp_path / name))
        read[name] = (frame.schema.simpleString(), sorted(tuple(r) for r in frame.collect()))
    assert read["microbatch"] == read["spark"]
    assert "count:bigint,count:bigint" in read["spark"][0], read["spark"][0]
    assert read["spark"][1]
