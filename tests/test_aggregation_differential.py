"""Streaming aggregations on microbatch next to Spark's own engine, batch by batch.

One event file per batch (``maxFilesPerTrigger=1``, AvailableNow), with rows late
by the watermark, rows for windows still open and keys seen again later. Each case
must give the same batch ids, the same rows in every batch, the same watermark and
event-time stats in every progress entry, and the same state-operator counts.
"""
from __future__ import annotations


import pytest
from pyspark.sql import functions as F

from stream_events import comparable, watermarks, write_event_files
from helpers import ci_share, collect_batches, confs, json_stream, plain_rows
from microbatch import spark_internals

# (key, event time, value) per file; the watermark delay is 5 seconds.
EVENTS = [
    [("a", "00:00:01", 1), ("b", "00:00:03", 2), ("a", "00:00:07", 3)],
    [("a", "00:00:12", 4), ("b", "00:00:02", 5), ("c", "00:00:14", 6)],      # b: late for no window yet
    [("a", "00:00:26", 7), ("b", "00:00:04", 8), ("c", "00:00:15", 9)],      # b 00:04: late
    [("a", "00:00:31", -1), ("b", "00:00:11", 2), ("b", "00:00:27", 10)],    # b 00:11: late for [5,15)
    [("c", "00:00:50", 3), ("a", "00:00:21", 4), ("b", "00:00:03", 1)],      # b 00:03: late
]
SCHEMA = "k STRING, ts TIMESTAMP, v INT"


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, event_record)


def event_record(k, t, v):
    return {"k": k, "ts": f"2026-01-01 {t}", "v": v}


def run(session, events, ckpt, transform, mode):
    return collect_batches(transform(json_stream(session, events, SCHEMA)), ckpt, mode,
                           rows=plain_rows)


def sliding_count(frame):
    return (frame.withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "10 seconds", "5 seconds")).count())


def tumbling_stats(frame):
    return (frame.withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.sum("v").alias("total"), F.min("v"), F.max("v"), F.avg("v").alias("mean")))


def keyed(frame):
    return frame.groupBy("k").agg(F.count("*").alias("n"), F.sum("v"), (F.max("v") + 1).alias("top"),
                                  F.lit("x").alias("constant"))


def by_an_expression(frame):
    """A key that is an expression, used again in the output (and inside an aggregate)."""
    first = F.substring("k", 1, 1)
    return frame.groupBy(first).agg(F.concat(first, F.lit("!")).alias("shout"), F.count("*").alias("n"),
                                    F.max(F.concat(first, F.col("v").cast("string"))).alias("top"))


def global_count(frame):
    return frame.agg(F.count("*").alias("rows"), F.sum("v"))


def every_function(frame):
    return frame.groupBy("k").agg(
        F.count("v"), F.sum("v"), F.min("ts"), F.max("ts"), F.avg("v"), F.mean(F.col("v") * 1.5),
        F.first("v"), F.last("v"), F.first("v", ignorenulls=True), F.collect_list("v"),
        F.collect_set("v"), F.approx_count_distinct("v"), F.approx_count_distinct("ts", 0.01),
        F.stddev("v"), F.stddev_pop("v"), F.variance("v"), F.var_pop("v"),
        F.sum(F.col("v").cast("decimal(10,2)")), F.avg(F.col("v").cast("decimal(10,2)")))


CASES = [
    ("sliding window count", sliding_count, "append"),
    ("sliding window count", sliding_count, "update"),
    ("sliding window count", sliding_count, "complete"),
    ("tumbling window sum/min/max/avg", tumbling_stats, "append"),
    ("tumbling window sum/min/max/avg", tumbling_stats, "update"),
    ("keyed aggregation", keyed, "update"),
    ("keyed aggregation", keyed, "complete"),
    ("a key that is an expression", by_an_expression, "update"),
    ("global count", global_count, "complete"),
    ("global count", global_count, "update"),
    ("every aggregate function", every_function, "update"),
]


@pytest.mark.parametrize("name,transform,mode", ci_share(CASES),   # half in CI's run (helpers.ci_share)
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_aggregation_matches_spark_batch_by_batch(spark, ss, events, tmp_path, name, transform, mode):
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform, mode)
    assert [b for b, _ in ours] == [b for b, _ in theirs]
    for (batch, our_rows), (_, their_rows) in zip(ours, theirs):
        assert our_rows == their_rows, f"batch {batch}"
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    if "window" in name and mode != "complete":
        dropped = [op["numRowsDroppedByWatermark"] for p in our_progress for op in p["stateOperators"]]
        assert sum(dropped) > 0, "the events include groups late by the watermark"


def sessions(frame):
    return (frame.withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "6 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v"), F.collect_list("v"), F.max("ts")))


def folded_sessions(frame):
    """Sessions whose every aggregate folds in Arrow (sums, min and max): the session
    task's Arrow path (``SessionAggregateTask._in_tables``); ``sessions``' collect_list
    takes its row path."""
    return (frame.withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "6 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v"), F.min("v"), F.max("k")))


@pytest.mark.parametrize("mode, aggregated", [("append", sessions), ("complete", sessions),
                                              ("append", folded_sessions), ("complete", folded_sessions)],
                         ids=["append", "complete", "append, folded in Arrow", "complete, folded in Arrow"])
def test_session_window_matches_spark_batch_by_batch(spark, ss, events, tmp_path, mode, aggregated):
    theirs, their_progress = run(spark, events, tmp_path / "spark", aggregated, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", aggregated, mode)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    assert any(op["numRowsDroppedByWatermark"] for p in our_progress for op in p["stateOperators"])


def test_the_row_path_of_the_rocksdb_store_gives_what_the_arrow_path_gives_for_sessions(ss, events, tmp_path):
    """The session task has two paths: Arrow tables where the store keeps its memory as
    tables and every aggregate folds there (the default provider), a key at a time
    otherwise (the RocksDB provider). Each is compared with Spark's engine where it runs
    by default; here the row path against the Arrow path: rows and state counts, batch by
    batch, and the change feed each logs."""
    arrow = run(ss, events, tmp_path / "arrow", folded_sessions, "append")
    with confs(ss, {"spark.sql.streaming.stateStore.providerClass":
                    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}):
        rows = run(ss, events, tmp_path / "rows", folded_sessions, "append")
    assert rows[0] == arrow[0] and any(r for _, r in arrow[0])
    assert comparable(rows[1]) == comparable(arrow[1])

    def feed(ckpt):
        changes = ss.read.format("statestore").option("readChangeFeed", True).option("changeStartBatchId", 0) \
            .load(str(ckpt)).collect()
        return sorted(map(repr, changes))
    assert feed(tmp_path / "rows") == feed(tmp_path / "arrow") and feed(tmp_path / "arrow")


def _schema(df):
    df.count()   # (Spark 4.3 fails a batch whose state stores did not all commit)
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields]


@pytest.mark.parametrize("name,transform,mode", [
    ("sliding window count", sliding_count, "append"), ("keyed aggregation", keyed, "update"),
    ("global count", global_count, "complete")])
def test_an_aggregations_output_columns_are_as_nullable_as_sparks(spark, ss, events, tmp_path, name, transform, mode):
    """Spark 4.3 makes a stateful operator's output nullable (the checkpoint fixes it:
    statefulOperator.alwaysNullableOutput); earlier lines keep the aggregate's own."""
    stream = lambda session: transform(json_stream(session, events, SCHEMA))  # noqa: E731
    theirs, _ = collect_batches(stream(spark), tmp_path / "spark", mode, rows=_schema)
    ours, _ = collect_batches(stream(ss), tmp_path / "ours", mode, rows=_schema)
    assert ours == theirs and ours
    if spark_internals.running_version().at_least(4, 3):
        assert all(nullable for _, columns in ours for _, _, nullable in columns)
    else:
        assert not all(nullable for _, columns in ours for _, _, nullable in columns)
