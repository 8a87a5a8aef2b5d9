"""Queries the differential fuzzer found failing or refused in microbatch unlike Spark's
engine (issue 57), each as a small hand-written query on microbatch next to Spark's own
engine: the same batches (rows, progress, watermarks) where Spark runs it, the same
refusal (error class, and when: defining the query or starting it) where Spark refuses it.

- A filter on a column of an earlier frame that the frame filtered no longer has (seed
  1851: ``w = df; df = df.withColumn("v", ...).filter(w.v > 2)``): Spark's analysis finds
  ``w.v`` below the projection that replaced it (ResolveMissingReferences) and filters by the
  old column; microbatch's run failed binding it (MISSING_ATTRIBUTES).
- A union of two watermarked streams under a filter that Spark's optimizer knows drops every
  row of one input (seeds 1895, 2100: ``s.isin("a", "b")`` over ``lit("u").alias("s")``): the
  optimizer removes that input's event-time observation from the batch, and Spark completes
  it with an empty row, without a schema; microbatch read its JSON and failed ("JSON
  serialization requires a non-null schema"). Its watermark saw no rows, as in Spark's engine.
- A stream-stream left anti join is refused when the query starts, as Spark's checker
  refuses it, after the aggregations' output-mode rules (seed 1723), and after Spark's
  analysis of the join itself when it is defined (seed 1478): microbatch refused it when
  it was defined, before either.
"""
from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "ts TIMESTAMP, k INT, v INT, s STRING"
OTHER_SCHEMA = "ts2 TIMESTAMP, k2 INT, v2 INT"

#: (second of the minute, k, v, s) per file: values of v on both sides of the filters below
EVENTS = [
    [(0, 0, 4, "b")],
    [(1, 2, 5, "c"), (0, None, 0, "a"), (4, 2, None, "b"), (3, 3, 6, "b")],
    [(5, 0, 2, "a"), (21, 0, 9, "c"), (30, 2, 3, "b"), (7, 2, 1, "b")],
    [(39, 3, 3, "a"), (36, 1, 5, "c"), (15, 1, 8, "b")],
]

#: (second of the minute, k2, v2) per file
OTHER_EVENTS = [
    [(10, 3, 4), (1, 3, 5), (10, None, 2), (0, 0, 6)],
    [(14, 1, 7), (3, 2, 2), (6, 2, 8)],
    [(17, 1, 1), (30, 3, None), (5, 0, 3)],
    [],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda t, k, v, s: {"ts": f"2026-01-01 00:00:{t:02d}", "k": k, "v": v, "s": s})


@pytest.fixture
def others(tmp_path):
    return write_event_files(tmp_path / "others", OTHER_EVENTS,
                             lambda t, k, v: {"ts2": f"2026-01-01 00:00:{t:02d}", "k2": k, "v2": v})


def both_engines(spark, ss, query, tmp_path, mode="append"):
    """The query's batches and progress on Spark's engine and on microbatch, compared."""
    theirs, their_progress = collect_batches(query(spark), tmp_path / "spark", mode)
    ours, our_progress = collect_batches(query(ss), tmp_path / "microbatch", mode)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    return ours


def test_a_filter_on_a_replaced_column_of_an_earlier_frame_filters_as_spark(spark, ss, events, tmp_path):
    def query(session):
        df = json_stream(session, events, SCHEMA)
        earlier = df
        df = df.withWatermark("ts", "10 seconds").withColumnRenamed("k", "k_1")
        df = df.withColumn("v", F.col("v") * 2 + 1)
        return df.filter(earlier.v > 2)      # the source's v, not the one withColumn made

    batches = both_engines(spark, ss, query, tmp_path)
    values = sorted(row[2] for _, rows in batches for row in rows)
    assert values == sorted(v * 2 + 1 for batch in EVENTS for _, _, v, _ in batch if v is not None and v > 2)


def union_with_a_branch_filtered_out(session, events, others, delays=("3 seconds", "5 seconds")):
    """Two watermarked streams in a union under a filter Spark's optimizer knows the second
    drops entirely (its ``s`` is a literal): that input's event-time observation is removed
    from the batch's plan. ``others``: the second stream (a path: read here)."""
    first = json_stream(session, events, SCHEMA).withWatermark("ts", delays[0])
    if isinstance(others, str):
        others = json_stream(session, others, OTHER_SCHEMA)
    second = others.withWatermark("ts2", delays[1]).select(
        F.col("ts2").alias("ts"), F.col("k2").alias("k"), F.col("v2").alias("v"), F.lit("u").alias("s"))
    both = first.unionByName(second)
    return both.where(both["s"].isin("a", "b"))


def test_a_union_input_filtered_out_counts_session_windows_as_spark(spark, ss, events, others, tmp_path):
    def query(session):   # (seed 1895)
        df = union_with_a_branch_filtered_out(session, events, others).withColumnRenamed("ts", "t_1")
        df = df.groupBy(F.session_window("t_1", "3 seconds"), "k", "s").count()
        return df.filter(df["count"] >= 1)

    both_engines(spark, ss, query, tmp_path)


def test_a_union_input_filtered_out_joins_as_spark(spark, ss, events, others, tmp_path):
    def query(session):   # (seed 2100: the second stream read in both places)
        second = json_stream(session, others, OTHER_SCHEMA)
        left = union_with_a_branch_filtered_out(session, events, second, ("10 seconds", "10 seconds"))
        right = second.withWatermark("ts2", "0 seconds").select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), "v2")
        return left.join(right, ["k", "ts"], "left_outer").drop(right.k)

    both_engines(spark, ss, query, tmp_path)


def refusal(session, query, ckpt, mode):
    """Where ``query`` is refused (``define`` or ``start``) and Spark's error condition."""
    try:
        df = query(session)
    except AnalysisException as e:
        return "define", e.getCondition()
    with pytest.raises(AnalysisException) as raised:
        df.writeStream.outputMode(mode).format("noop").option("checkpointLocation", str(ckpt)).start()
    return "start", raised.value.getCondition()


def aggregation_over_an_anti_join(events, others):
    def query(session):   # (seed 1723: no watermark, append mode)
        left = json_stream(session, events, SCHEMA).withColumn("v_1", F.col("v") * 2 + 1)
        right = json_stream(session, others, OTHER_SCHEMA)
        df = left.join(right, left.k == right.k2, "left_anti")
        return df.groupBy(F.window("ts", "5 seconds"), "k").count()
    return query


def anti_join_on_a_window_and_a_timestamp(events, others):
    def query(session):   # (seed 1478: a window struct against a timestamp named window)
        left = json_stream(session, events, SCHEMA).withWatermark("ts", "3 seconds")
        left = left.groupBy(F.window("ts", "5 seconds")).count().withColumn("k", F.lit(1))
        right = json_stream(session, others, OTHER_SCHEMA).select(
            F.col("ts2").alias("window"), F.col("k2").alias("k"), "v2").withWatermark("window", "5 seconds")
        return left.join(right, ["k", "window"], "left_anti").drop(left.window)
    return query


def anti_join(events, others):
    def query(session):
        left = json_stream(session, events, SCHEMA).withWatermark("ts", "3 seconds")
        right = json_stream(session, others, OTHER_SCHEMA).withWatermark("ts2", "3 seconds")
        return left.join(right, (left.k == right.k2) & (left.ts == right.ts2), "left_anti")
    return query


ANTI_JOINS = {
    "under an aggregation without watermark": (aggregation_over_an_anti_join, "append",
                                               ("start", "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION")),
    "on a window against a timestamp": (anti_join_on_a_window_and_a_timestamp, "complete",
                                        ("define", "DATATYPE_MISMATCH.BINARY_OP_DIFF_TYPES")),
    "alone": (anti_join, "append", ("start", "_LEGACY_ERROR_TEMP_3102")),
}


@pytest.mark.parametrize("shape", list(ANTI_JOINS))
def test_a_stream_stream_anti_join_is_refused_where_spark_refuses_it(spark, ss, events, others, tmp_path, shape):
    make, mode, expected = ANTI_JOINS[shape]
    query = make(events, others)
    theirs = refusal(spark, query, tmp_path / "spark", mode)
    ours = refusal(ss, query, tmp_path / "microbatch", mode)
    assert theirs == expected
    assert ours == theirs


def test_an_action_with_a_wrong_argument_is_pythons_type_error_first(ss):
    """Seed 3947: ``df.count(1)`` on a stream is PySpark's TypeError (DataFrame.count takes
    no argument) before any streaming check; ``df.count()`` is the streaming action's
    AnalysisException."""
    from microbatch.errors import AnalysisException
    df = ss.readStream.format("rate").load()
    with pytest.raises(TypeError, match=r"DataFrame\.count\(\)"):
        df.count(1)
    with pytest.raises(TypeError):
        df.show(1, 2, 3, 4, 5)
    with pytest.raises(AnalysisException, match="writeStream.start"):
        df.count()
    with pytest.raises(AnalysisException, match="writeStream.start"):
        df.show(5)
