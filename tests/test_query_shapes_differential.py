"""Query shapes the other differential tests never composed, each found by trying Nexmark's
queries and public jobs as a new user writes them (issue 57), on microbatch next to Spark's
own engine, batch by batch: rows, progress (state rows of every operator included) and
watermarks.

- One stream branched into two stateful paths that join again (Nexmark q5): the same
  aggregation appears twice in the plan, and Spark runs it twice, each with its own state,
  and scans the source twice (``numInputRows`` counts each scan).
- An aggregation joined back to its own input (Nexmark q7): the aggregation's state tasks
  run in the same Spark stage as the other side's scan, whose partitions come first.
- A watermarked column renamed or aliased before a stream-stream join (Nexmark q3, q8):
  Spark keeps the event-time mark on the column through projections, so the join evicts.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, confs, json_stream
from microbatch.testing.fuzz import FuzzRunningCount   # (importable by Spark's Python workers)
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "id INT, ts TIMESTAMP, price INT"

#: (id, second of the minute, price) per file: out of order, a late row, an empty file
EVENTS = [
    [(1, 1, 10), (2, 3, 20), (1, 4, 30)],
    [(2, 12, 5), (3, 11, 40), (1, 2, 7)],
    [],
    [(1, 25, 30), (3, 23, 10), (2, 27, 50)],
    [(2, 41, 60), (1, 44, 60), (3, 5, 99)],
    [(3, 58, 1)],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})


def q5_hot_items(bids):
    """Nexmark q5: bids per auction in a sliding window; the windows' largest count, a
    second aggregation over the first, joined back to the counts."""
    counts = (bids.withWatermark("ts", "5 seconds")
              .groupBy(F.window("ts", "10 seconds", "5 seconds"), "id").count())
    maxes = (counts.groupBy("window").agg(F.max("count").alias("maxn"))
             .withColumnRenamed("window", "mwindow"))
    return counts.join(maxes, F.expr("window = mwindow AND count = maxn")).select("window", "id", "count")


def q7_highest_bid(bids):
    """Nexmark q7: the highest price per tumbling window, joined back to the bids."""
    bids = bids.withWatermark("ts", "5 seconds")
    maxes = (bids.groupBy(F.window("ts", "10 seconds")).agg(F.max("price").alias("maxprice"))
             .select(F.window_time("window").alias("wtime"), "maxprice"))
    return bids.join(maxes, F.expr("price = maxprice AND ts > wtime - interval 10 seconds AND ts <= wtime")) \
        .select("id", "price", "ts")


def q3_renamed_times(bids):
    """The event time aliased on each side (Nexmark q3's ``p_time``), then a time-range join."""
    left = bids.withWatermark("ts", "5 seconds").select(F.col("id"), F.col("ts").alias("l_time"))
    right = bids.withWatermark("ts", "5 seconds").select(F.col("id").alias("rid"), F.col("ts").alias("r_time"),
                                                         "price")
    return left.join(right, F.expr("id = rid AND r_time BETWEEN l_time AND l_time + interval 3 seconds"))


def q8_renamed_windows(bids):
    """Two windowed counts, their windows renamed (Nexmark q8's ``pwindow``), joined on the windows."""
    stream = bids.withWatermark("ts", "5 seconds")
    people = stream.groupBy(F.window("ts", "10 seconds"), "id").count().withColumnRenamed("window", "pwindow")
    auctions = (stream.groupBy(F.window("ts", "10 seconds"), F.col("id").alias("aid")).agg(F.sum("price").alias("p"))
                .withColumnRenamed("window", "awindow"))
    return people.join(auctions, F.expr("pwindow = awindow AND id = aid")).select("pwindow", "id", "count", "p")


SHAPES = {"q5 branched aggregations joined": q5_hot_items, "q7 aggregation joined to its input": q7_highest_bid,
          "q3 aliased event times joined": q3_renamed_times, "q8 renamed windows joined": q8_renamed_windows}


@pytest.mark.parametrize("shape", ci_share(list(SHAPES)))   # half in CI's run (helpers.ci_share)
def test_shape_matches_spark_batch_by_batch(spark, ss, events, tmp_path, shape):
    query = SHAPES[shape]
    theirs, their_progress = collect_batches(query(json_stream(spark, events, SCHEMA)), tmp_path / "spark", "append")
    ours, our_progress = collect_batches(query(json_stream(ss, events, SCHEMA)), tmp_path / "microbatch", "append")
    assert ours == theirs
    assert sum(len(rows) for _, rows in ours) > 0
    # (q5: Spark's engine counts the source's rows twice in a batch with rows, not because a
    # shared exchange adds to the scan's rows but because its plan scans the source in each
    # branch: MicroBatchExecution puts the file source's batch under a projection aliasing
    # the relation's columns to the stream's (id#73 AS id#3), the same in both branches;
    # Spark's optimizer (RemoveRedundantAliases) drops the left branch's aliases, so the left
    # side outputs id#73, and must keep that alias in the right branch (a join's sides may
    # not share an attribute). The branches differ, the first one's exchange is not reused
    # in the second, and Spark's progress sums the two scans. microbatch counts as many:
    # runtime/engine_scans.py)
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


@pytest.mark.parametrize("how", ["sql", "select"])
def test_global_count_of_a_stream_view_in_complete_mode_matches_spark(spark, ss, events, tmp_path, how):
    """``select count(*) from updates`` over a stream's view (as Spark's programming guide
    writes it): Spark's analysis makes the projection an aggregation of the whole stream."""
    def query(session, name):
        frame = json_stream(session, events, SCHEMA)
        if how == "select":
            return frame.select(F.count("*").alias("n"), F.max("price"))
        frame.createOrReplaceTempView(name)
        return session.sql(f"select count(*), max(price) from {name}")

    theirs, their_progress = collect_batches(query(spark, "spark_updates"), tmp_path / "spark", "complete")
    ours, our_progress = collect_batches(query(ss, "updates"), tmp_path / "microbatch", "complete")
    assert ours == theirs and ours[-1][1] == [(13, 99)]
    assert comparable(our_progress) == comparable(their_progress)


def guide_windowed_counts(words):
    """The programming guide's windowed count as printed: the window is over ``words.ts``,
    the column of the frame *before* ``withWatermark``, which carries no watermark, so Spark
    drops no late rows and evicts nothing (and refuses append mode)."""
    return (words.withWatermark("ts", "5 seconds")
            .groupBy(F.window(words.ts, "10 seconds", "5 seconds"), words.id).count())


def test_a_column_of_the_frame_before_the_watermark_carries_none(spark, ss, events, tmp_path):
    theirs, their_progress = collect_batches(guide_windowed_counts(json_stream(spark, events, SCHEMA)),
                                             tmp_path / "spark", "update")
    ours, our_progress = collect_batches(guide_windowed_counts(json_stream(ss, events, SCHEMA)),
                                         tmp_path / "microbatch", "update")
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert all(p["stateOperators"][0]["numRowsRemoved"] == 0 for p in our_progress)   # nothing evicted
    with pytest.raises(Exception) as spark_refusal:
        collect_batches(guide_windowed_counts(json_stream(spark, events, SCHEMA)), tmp_path / "spark-append", "append")
    with pytest.raises(Exception) as our_refusal:
        collect_batches(guide_windowed_counts(json_stream(ss, events, SCHEMA)), tmp_path / "mb-append", "append")
    assert our_refusal.value.getCondition() == spark_refusal.value.getCondition()
    assert "STREAMING_OUTPUT_MODE" in str(our_refusal.value.getCondition())


def joined_then_one_side_dropped(left, right):
    """A join of two streams with a column of the same name on each side, then the left
    side's dropped through its frame (``drop(left.id)``), as public jobs write it."""
    left = left.withWatermark("ts", "5 seconds")
    right = right.withWatermark("ts", "5 seconds").select("id", F.col("ts").alias("rts"), "price")
    joined = left.join(right, (left.id == right.id) & (right.rts >= left.ts)
                       & (right.rts <= left.ts + F.expr("interval 5 seconds")))
    return joined.drop(left.id).drop(left.price)


def test_a_column_dropped_through_one_side_of_a_join(spark, ss, events, tmp_path):
    def query(session):
        return joined_then_one_side_dropped(json_stream(session, events, SCHEMA), json_stream(session, events, SCHEMA))

    theirs, their_progress = collect_batches(query(spark), tmp_path / "spark", "append")
    ours, our_progress = collect_batches(query(ss), tmp_path / "microbatch", "append")
    assert query(ss).columns == query(spark).columns == ["ts", "id", "rts", "price"]
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)


def _refusal(session, events, tmp_path, mode, query) -> str:
    """The error Spark's engine or microbatch gives ``query``, at start or when its run
    fails (its text)."""
    try:
        collect_batches(query(session, json_stream(session, events, SCHEMA)), tmp_path, mode)
    except Exception as e:   # noqa: BLE001 - the refusal is what is compared
        return str(e)
    raise AssertionError("the query ran")


#: shapes Spark's engine refuses (found by the fuzzer), with the words both must say
REFUSED = {
    "inner stream-stream join in complete mode": (
        "complete", "Inner join between two streaming DataFrames/Datasets is not supported in Complete output mode",
        lambda session, s: s.withWatermark("ts", "5 seconds").join(
            s.withWatermark("ts", "5 seconds").select(F.col("id").alias("rid"), F.col("ts").alias("rts")),
            F.expr("id = rid AND rts = ts")).groupBy("id").count()),
    "a watermark over a watermark": (
        "append", "Redefining watermark is disallowed",
        lambda session, s: s.withWatermark("ts", "5 seconds").withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "10 seconds")).count()),
    "a session window without other keys": (
        "complete", "Global aggregation with session window in streaming query is not supported",
        lambda session, s: s.withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "5 seconds")).count()),
    "a stream right outer joined with a static DataFrame": (
        "append", "RightOuter join with a streaming DataFrame/Dataset on the left and a static DataFrame/DataSet",
        lambda session, s: s.join((session.spark if hasattr(session, "spark") else session).range(3)
                                  .withColumnRenamed("id", "key"), F.expr("id = key"), "right_outer")),
}


@pytest.mark.parametrize("shape", list(REFUSED))
def test_refused_as_spark_refuses_it(spark, ss, events, tmp_path, shape):
    mode, words, query = REFUSED[shape]
    assert words in _refusal(spark, events, tmp_path / "spark", mode, query)
    assert words in _refusal(ss, events, tmp_path / "microbatch", mode, query)


#: shapes whose runs differed from Spark's (found by the fuzzer)
RUNS = {
    # the event time computed anew carries no watermark: the deduplication never evicts
    "dedup on an event time computed anew": (
        "append", lambda s: s.withWatermark("ts", "5 seconds").selectExpr("ts + INTERVAL 1 SECOND AS ts", "id")
        .dropDuplicates(["id", "ts"])),
    # Spark runs a batch without data when the watermark moves, in every time mode but processing time
    "transformWithState without time mode after a watermark": (
        "update", lambda s: s.withWatermark("ts", "5 seconds").groupBy("id").transformWithStateInPandas(
            FuzzRunningCount("id"), "id INT, n LONG", "update", "None")),
}


@pytest.mark.parametrize("shape", list(RUNS))
def test_runs_as_spark_runs_it(spark, ss, events, tmp_path, shape):
    mode, query = RUNS[shape]
    rocksdb = {}
    if "transformWithState" in shape:   # (Spark's runs only on its RocksDB store; microbatch's on its own)
        rocksdb = {"spark.sql.streaming.stateStore.providerClass":
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}
    with confs(spark, rocksdb):
        theirs, their_progress = collect_batches(query(json_stream(spark, events, SCHEMA)), tmp_path / "spark", mode)
        ours, our_progress = collect_batches(query(json_stream(ss, events, SCHEMA)), tmp_path / "microbatch", mode)
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)


def one_source_on_both_sides(left, right):
    """One source read on both sides of a join (Spark's analysis gives one side's columns new
    attribute ids then), a column dropped through the right side's frame, and a column of the
    frame before withWatermark used after it (found by the fuzzer, seeds 118 and 53)."""
    before = left
    left = left.withWatermark("ts", "5 seconds").withColumn("price", F.coalesce(before.price, F.lit(0)))
    left = left.select(F.col("ts").alias("lts"), F.col("id").alias("lid"), "price")
    right = right.withWatermark("ts", "5 seconds")
    joined = left.join(right, (left.lid == right.id) & (right.ts >= left.lts) & (right.ts <= left.lts + F.expr("interval 5 seconds")))
    return joined.drop(right.price)


def test_a_source_on_both_sides_of_a_join_and_a_column_dropped_through_one(spark, ss, events, tmp_path):
    def query(session):
        stream = json_stream(session, events, SCHEMA)
        return one_source_on_both_sides(stream, stream)

    assert query(ss).columns == query(spark).columns == ["lts", "lid", "price", "id", "ts"]
    theirs, their_progress = collect_batches(query(spark), tmp_path / "spark", "append")
    ours, our_progress = collect_batches(query(ss), tmp_path / "microbatch", "append")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)


#: (id, second of the minute, price) per file, with null ids and prices: what a filter Spark
#: pushes into the scan (or the not-null filter it infers for a join key) drops
EVENTS_WITH_NULLS = [
    [(1, 1, 10), (None, 3, 20), (1, 4, None), (2, 2, 30)],
    [(2, 12, 5), (None, 11, 40), (1, 2, 7), (3, 13, None)],
    [(1, 25, 30), (3, 23, 10), (None, 27, 50)],
    [(2, 41, 60), (1, 44, 60), (3, 5, 99), (None, 45, 1)],
]


def filter_after_a_renamed_watermark(session, s):
    """A SQL filter over a renamed column after ``withWatermark`` (fuzzer seed 56)."""
    s.withWatermark("ts", "5 seconds").withColumnRenamed("price", "p").createOrReplaceTempView(
        f"pushed_{type(session).__name__}")
    return session.sql(f"SELECT ts, p FROM pushed_{type(session).__name__} WHERE p > 20")


def filter_over_a_union_of_watermarks(session, s):
    """A filter over a union of two watermarked reads, then a count (fuzzer seed 146)."""
    both = s.withWatermark("ts", "10 seconds").unionByName(s.withWatermark("ts", "3 seconds"))
    return both.where("price IS NOT NULL AND price % 3 != 0").groupBy("id").count()


def self_join_on_a_key_with_nulls(session, s):
    """A stream joined to itself on a key with nulls (fuzzer seed 35): Spark infers the
    key's not-null filter for both reads, below the watermark."""
    s = s.withWatermark("ts", "10 seconds")
    other = s.select(F.col("ts").alias("ot"), F.col("id").alias("oid"))
    return s.join(other, F.expr("id = oid AND ot BETWEEN ts - INTERVAL 3 SECONDS AND ts"))


#: shapes whose scans Spark's optimizer gives filters microbatch's batch plan would not
#: (found by the fuzzer: microbatch's numInputRows was larger), with how often they read the source
PUSHED_INTO_THE_SCAN = {"filter after a renamed watermark": (filter_after_a_renamed_watermark, 1),
                        "filter over a union of watermarks": (filter_over_a_union_of_watermarks, 2),
                        "self-join on a key with nulls": (self_join_on_a_key_with_nulls, 2)}


@pytest.mark.parametrize("shape", list(PUSHED_INTO_THE_SCAN))
def test_input_rows_are_counted_after_the_filters_spark_pushes_into_the_scan(spark, ss, tmp_path, shape):
    """Spark's engine counts a JSON source's rows after the filters its optimizer pushes into
    the scan (``spark.sql.json.filterPushdown.enabled``), and its watermark sees only the rows
    that pass them: microbatch's scans get the same filters."""
    files = write_event_files(tmp_path / "events", EVENTS_WITH_NULLS, lambda i, s, p: {
        "id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})
    query, reads = PUSHED_INTO_THE_SCAN[shape]
    theirs, their_progress = collect_batches(query(spark, json_stream(spark, files, SCHEMA)), tmp_path / "spark",
                                             "update")
    ours, our_progress = collect_batches(query(ss, json_stream(ss, files, SCHEMA)), tmp_path / "microbatch", "update")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    # (Spark's scans drop rows: each read of the source counts fewer than all of them)
    assert 0 < sum(p["numInputRows"] for p in their_progress) < reads * sum(map(len, EVENTS_WITH_NULLS))
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


# -- shapes the long fuzz run found (seeds 201, 234, 264, 283, 307) ----------------------------
#: the latest event has no price: the join's inferred ``price IS NOT NULL`` runs below one
#: branch's copy of the watermark, which then never sees it
NULL_PRICE_LAST = [
    [(1, 1, 10), (2, 3, 20)],
    [(2, 12, 5), (3, 11, 40)],
    [(1, 25, 30), (3, 23, None)],
    [(2, 41, 60), (1, 44, None), (3, 5, 99)],
    [(1, 52, 7), (2, 58, None)],
]


def window_time_of_a_joined_window(stream):
    """``window_time`` of a window that came through a stream-stream join (seed 283): the
    join's output keeps the window's mark."""
    left = stream().withWatermark("ts", "5 seconds").select(F.window("ts", "10 seconds").alias("lw"), "id", "price")
    right = stream().withWatermark("ts", "5 seconds").select(F.window("ts", "10 seconds").alias("rw"),
                                                              F.col("id").alias("rid"))
    return (left.join(right, F.expr("id = rid AND lw = rw"), "left_semi")
            .groupBy(F.window(F.window_time("lw"), "5 seconds"), "id").count())


def one_watermark_read_by_two_branches(stream):
    """One ``withWatermark`` under an aggregation and under a join's other side (seeds 264,
    307): Spark 4 keeps one watermark for the node both branches read, moved by the larger
    of their event times, though a filter runs below the watermark in one branch only."""
    bids = stream().withWatermark("ts", "5 seconds")
    maxes = bids.groupBy(F.window("ts", "10 seconds").alias("aw")).agg(F.max("price").alias("mp"))
    priced = bids.select(F.window("ts", "10 seconds").alias("bw"), "id", F.col("price").alias("bp"))
    return priced.join(maxes, F.expr("bw = aw AND bp = mp"))


def outer_join_watermarked_on_the_nullable_side_only(stream):
    """A left outer join whose right (nullable) side alone has a watermark, with a range
    condition (seeds 201, 275): Spark's checker asks only that the right side's watermark
    bounds the left side's state, not that the left side has a watermark."""
    left = stream().select(F.col("id").alias("lid"), F.col("ts").alias("lts"))
    right = stream().withWatermark("ts", "5 seconds").select(F.col("id").alias("rid"), F.col("ts").alias("rts"))
    return left.join(right, F.expr("lid = rid AND lts >= rts AND lts <= rts + interval 5 seconds"), "left_outer")


FOUND_BY_THE_FUZZER = {"window_time of a joined window": window_time_of_a_joined_window,
                       "one watermark read by two branches": one_watermark_read_by_two_branches,
                       "an outer join watermarked on the nullable side only":
                           outer_join_watermarked_on_the_nullable_side_only}


@pytest.mark.parametrize("shape", list(FOUND_BY_THE_FUZZER))
def test_fuzzer_found_shapes_match_spark(spark, ss, tmp_path, shape):
    events = write_event_files(tmp_path / "events", NULL_PRICE_LAST,
                               lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})
    query = FOUND_BY_THE_FUZZER[shape]
    theirs, their_progress = collect_batches(query(lambda: json_stream(spark, events, SCHEMA)),
                                             tmp_path / "spark", "append")
    ours, our_progress = collect_batches(query(lambda: json_stream(ss, events, SCHEMA)),
                                         tmp_path / "microbatch", "append")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


def test_a_session_windows_state_reads_as_sparks_a_row_per_session(spark, ss, events, tmp_path):
    """The state reader shows a session window aggregation's state as Spark's does: a row
    per session, keyed by the other grouping keys and the session's start (seed 234)."""
    def query(session):
        return (json_stream(session, events, SCHEMA).withWatermark("ts", "3 seconds")
                .groupBy(F.session_window("ts", "3 seconds"), "id").count())
    collect_batches(query(spark), tmp_path / "spark", "complete")
    collect_batches(query(ss), tmp_path / "microbatch", "complete")
    theirs = spark.read.format("statestore").load(str(tmp_path / "spark"))
    ours = ss.read.format("statestore").load(str(tmp_path / "microbatch"))
    assert ours.schema.simpleString() == theirs.schema.simpleString()
    rows = sorted(map(tuple, ours.collect()), key=repr)
    assert rows == sorted(map(tuple, theirs.collect()), key=repr)
    assert len(rows) > len({r[0][0] for r in rows})   # (some key has several sessions)
