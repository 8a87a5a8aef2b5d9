"""Streaming SQL (``StreamingSession.sql``) next to Spark's own engine running the same SQL
over its own streaming views: one file a batch, late rows; every batch's rows, watermark
and state counts equal; a restart in the middle."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, json_stream, sorted_rows
from stream_events import comparable, watermarks, write_event_files
from test_stream_join_differential import LEFT, RIGHT, write

from microbatch.api.frame import StreamFrame

cloudpickle.register_pickle_by_value(sys.modules[__name__])   # (the UDF, on Spark's workers)

SCHEMA = "id INT, ts TIMESTAMP, v DOUBLE"
EVENTS = [
    [(1, "00:00:10", 1.0), (2, "00:00:20", 2.0), (1, "00:00:12", 3.0), (None, "00:00:12", 4.0)],
    [(1, "00:00:31", 5.0), (3, "00:00:40", 6.0), (2, "00:00:05", 0.5)],          # a late row
    [(2, "00:00:44", 7.0), (4, "00:00:05", 8.0), (5, "00:01:10", 9.0), (3, "00:00:45", 1.5)],
    [(6, "00:01:40", 2.5), (3, "00:00:41", 3.5), (7, "00:02:20", 4.5)],
    [(8, "00:03:10", 5.5), (6, "00:01:41", 6.5)],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda k, t, v: {"id": k, "ts": f"2026-01-01 {t}", "v": v})


@pytest.fixture
def users(spark):
    frame = spark.createDataFrame([(1, "ann", "eu"), (2, "bob", "us"), (3, "cy", "eu"), (5, "dee", "us")],
                                  "uid INT, name STRING, region STRING")
    frame.createOrReplaceTempView("users")
    yield frame
    spark.catalog.dropTempView("users")


#: name -> (SQL over the watermarked view ``events``, output mode)
CASES = {
    "a windowed count": (
        "SELECT window(ts, '20 seconds') AS w, count(*) AS n, sum(v) AS total FROM events "
        "GROUP BY window(ts, '20 seconds')", "append"),
    "a window and a key, in update mode": (
        "SELECT id, window.start AS start, count(*) AS n FROM events WHERE id IS NOT NULL "
        "GROUP BY window(ts, '30 seconds'), id", "update"),
    "a session window": (
        "SELECT session_window(ts, '15 seconds') AS s, id, count(*) AS n FROM events "
        "GROUP BY session_window(ts, '15 seconds'), id", "append"),
    "a stream-static join": (
        "SELECT e.id, e.ts, u.name, e.v * 2 AS doubled FROM events e JOIN users u ON e.id = u.uid "
        "WHERE u.region = 'eu'", "append"),
    "a static table joined with a stream on its right": (
        "SELECT u.name, e.v, e.ts FROM users u JOIN events e ON u.uid = e.id", "append"),
    "a CTE with a UDF": (
        "WITH scaled AS (SELECT id, ts, plus_one(v) AS w FROM events WHERE v > 1) "
        "SELECT id, w, ts FROM scaled WHERE id IS NOT NULL", "append"),
    "grouping sets": (
        "SELECT id, window(ts, '30 seconds') AS w, count(*) AS n FROM events "
        "GROUP BY GROUPING SETS ((id, window(ts, '30 seconds')), (window(ts, '30 seconds')))", "append"),
    "window_time: windows of windows": (
        "WITH per AS (SELECT window(ts, '20 seconds') AS w, count(*) AS n FROM events "
        "GROUP BY window(ts, '20 seconds')) "
        "SELECT window(window_time(w), '1 minute') AS big, sum(n) AS total FROM per "
        "GROUP BY window(window_time(w), '1 minute')", "append"),
    "a window and a ROLLUP": (
        "SELECT id, window(ts, '30 seconds') AS w, count(*) AS n, max(v) AS top FROM events "
        "GROUP BY window(ts, '30 seconds'), ROLLUP(id)", "append"),
    "a window and two grouping-sets clauses": (
        "SELECT id, v > 3 AS big, window(ts, '30 seconds') AS w, count(*) AS n FROM events "
        "GROUP BY window(ts, '30 seconds'), GROUPING SETS ((id), ()), CUBE(v > 3)", "append"),
    "a global count with HAVING": (
        "SELECT id, count(*) AS n, max(v) AS top FROM events GROUP BY id HAVING n > 1", "update"),
    "UNION ALL of two streams, and a LIMIT": (
        "SELECT id, v FROM events WHERE v < 3 UNION ALL SELECT id, v FROM raw WHERE v > 8 LIMIT 5", "append"),
    "DISTINCT with a watermark": (
        "SELECT DISTINCT id, ts FROM events", "append"),
    "LATERAL VIEW, and LATERAL VIEW OUTER": (
        "SELECT id, x, y FROM events LATERAL VIEW explode(array(id, id * 10)) t AS x "
        "LATERAL VIEW OUTER explode(filter(array(v), a -> a > 5)) AS y WHERE x > 1", "append"),
    "subqueries over static data": (
        "SELECT id, v FROM events WHERE id IN (SELECT uid FROM users WHERE region = 'eu') "
        "AND v > (SELECT count(*) FROM users) - 3", "append"),
    "the file source's _metadata.file_name": (
        "SELECT id, _metadata.file_name AS file, _metadata.file_size AS size FROM files WHERE v > 2",
        "append"),
    "a count per file, by _metadata": (
        "SELECT _metadata.file_name AS file, count(*) AS n FROM files GROUP BY _metadata.file_name", "update"),
}


def register(session, events_dir) -> None:
    frame = json_stream(session, events_dir, SCHEMA).withWatermark("ts", "10 seconds")
    frame.createOrReplaceTempView("events")
    json_stream(session, events_dir, SCHEMA).createOrReplaceTempView("raw")     # (no watermark)
    # (a view hides a relation's hidden columns, in Spark's SQL: the view selects _metadata)
    json_stream(session, events_dir, SCHEMA).select("*", "_metadata").createOrReplaceTempView("files")


def plus_one(v):
    return None if v is None else v + 1.0


def run(session, events_dir, ckpt, text, mode, **kwargs):
    register(session, events_dir)
    frame = session.sql(text)
    assert frame.isStreaming
    return collect_batches(frame, ckpt, mode, rows=lambda df: (df.columns, sorted_rows(df)), **kwargs)


@pytest.mark.parametrize("case", ci_share(list(CASES)))   # half in CI's run (helpers.ci_share)
def test_sql_over_a_stream_matches_spark(spark, ss, events, users, tmp_path, case):
    text, mode = CASES[case]
    spark.udf.register("plus_one", plus_one, "double")
    same_as_spark(spark, ss, events, tmp_path, text, mode)


def same_as_spark(spark, ss, events, tmp_path, text, mode) -> None:
    """``text`` on both engines: the same batches (some rows), progress and watermarks."""
    theirs, their_progress = run(spark, events, tmp_path / "spark", text, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", text, mode)
    assert ours == theirs and any(rows for _, (_, rows) in ours)
    assert comparable([json.loads(p.json) for p in our_progress]) == \
        comparable([json.loads(p.json) for p in their_progress])
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


@pytest.mark.parametrize("text, mode", [
    ("SELECT id FROM events GROUP BY id", "update"),
    ("SELECT window(ts, '20 seconds') AS w, id FROM events GROUP BY window(ts, '20 seconds'), id", "append"),
])
def test_a_group_by_with_no_aggregate_function_matches_spark(spark, ss, events, tmp_path, text, mode):
    """Keys alone: Spark's Aggregate with no aggregate function (its state holds the keys);
    microbatch failed in PySpark's agg() ("exprs should not be empty")."""
    same_as_spark(spark, ss, events, tmp_path, text, mode)


#: name -> (SQL over two watermarked streams, output mode)
JOINS = {
    "a time range": (
        "SELECT l.id, l.lts, r.b FROM lefts l JOIN rights r ON l.id = r.rid "
        "AND l.lts >= r.rts AND l.lts <= r.rts + INTERVAL 20 SECONDS", "append"),
    "both sides' columns of one name": (
        "SELECT l.id AS left_id, r.id AS right_id, l.ts, r.ts AS rts, r.b FROM both_l l JOIN both_r r "
        "ON l.id = r.id AND l.ts BETWEEN r.ts - INTERVAL 10 SECONDS AND r.ts + INTERVAL 10 SECONDS "
        "WHERE r.b > 10", "append"),
    "a count per key above the join": (
        "SELECT l.id, count(*) AS n FROM both_l l JOIN both_r r ON l.id = r.id AND l.ts = r.ts "
        "GROUP BY l.id", "update"),
}


@pytest.mark.parametrize("case", list(JOINS))
def test_a_stream_stream_join_in_sql(spark, ss, tmp_path, case):
    text, mode = JOINS[case]
    sides = write(tmp_path / "left", LEFT, "a"), write(tmp_path / "right", RIGHT, "b")

    def run_join(session, ckpt):
        left = json_stream(session, sides[0], "id INT, ts TIMESTAMP, a STRING")
        right = json_stream(session, sides[1], "id INT, ts TIMESTAMP, b INT")
        left.withColumnRenamed("ts", "lts").withWatermark("lts", "10 seconds").createOrReplaceTempView("lefts")
        right.selectExpr("id AS rid", "ts AS rts", "b").withWatermark("rts", "10 seconds") \
            .createOrReplaceTempView("rights")
        left.withWatermark("ts", "10 seconds").createOrReplaceTempView("both_l")
        right.withWatermark("ts", "10 seconds").createOrReplaceTempView("both_r")
        return collect_batches(session.sql(text), ckpt, mode, rows=lambda df: (df.columns, sorted_rows(df)))

    theirs, their_progress = run_join(spark, tmp_path / "spark")
    ours, our_progress = run_join(ss, tmp_path / "microbatch")
    assert ours == theirs and any(rows for _, (_, rows) in ours)
    assert comparable([json.loads(p.json) for p in our_progress]) == \
        comparable([json.loads(p.json) for p in their_progress])


def test_a_restart_in_the_middle_gives_the_same_answer(spark, ss, events, tmp_path):
    """Both engines stopped after two files and started again on the rest: the same batches."""
    text, mode = CASES["a windowed count"]
    names = sorted(os.listdir(events))
    found = []
    for session, name in ((spark, "spark"), (ss, "microbatch")):
        live = tmp_path / f"live-{name}"
        live.mkdir()
        for file in names[:2]:
            shutil.copy2(os.path.join(events, file), live / file)
        first, _ = run(session, str(live), tmp_path / name, text, mode)
        for file in names[2:]:
            shutil.copy2(os.path.join(events, file), live / file)
        second, _ = run(session, str(live), tmp_path / name, text, mode)
        assert first and second
        found.append(first + second)
    assert found[0] == found[1]


def test_sql_without_a_stream_is_sparks_own(ss, users):
    frame = ss.sql("SELECT name FROM users WHERE region = 'eu' ORDER BY name")
    assert isinstance(frame, DataFrame) and not frame.isStreaming
    assert [r.name for r in frame.collect()] == ["ann", "cy"]
    assert [r.n for r in ss.sql("SELECT count(*) AS n FROM users WHERE uid > :low", {"low": 1}).collect()] == [3]


def test_bad_sql_over_a_stream_gets_sparks_errors(ss, events):
    register(ss, events)
    assert isinstance(ss.sql("SELECT id FROM events"), StreamFrame)
    with pytest.raises(AnalysisException) as missing_view:
        ss.sql("SELECT id FROM events JOIN no_such_view USING (id)")
    assert missing_view.value.getCondition() == "TABLE_OR_VIEW_NOT_FOUND"
    with pytest.raises(AnalysisException) as missing_column:
        ss.sql("SELECT no_such_column FROM events")
    assert missing_column.value.getCondition() == "UNRESOLVED_COLUMN.WITH_SUGGESTION"
    with pytest.raises(AnalysisException, match="Sorting is not supported on streaming"):
        ss.sql("SELECT id FROM events ORDER BY id")


#: SQL that Spark's engine refuses on streams -> (the output mode, the words of Spark's refusal)
REFUSED = {
    "SELECT id FROM events ORDER BY id": (
        "append", "Sorting is not supported on streaming DataFrames/Datasets"),
    "SELECT id, row_number() OVER (PARTITION BY id ORDER BY ts) AS r FROM events": (
        "append", "[NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING] Window function is not supported in ROW_NUMBER() "
        "(as column `r`) on streaming DataFrames/Datasets"),
    "SELECT id, count(DISTINCT v) AS n FROM events GROUP BY id": (
        "update", "Distinct aggregations are not supported on streaming DataFrames/Datasets"),
    "SELECT u.name, e.v FROM users u LEFT JOIN events e ON u.uid = e.id": (
        "append", "LeftOuter join with a streaming DataFrame/Dataset on the right and a static "
        "DataFrame/Dataset on the left"),
    "SELECT DISTINCT id FROM raw": (   # (no watermark)
        "append", "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: append. This "
        "output mode is not supported for streaming aggregations without watermark"),
}


def refusal(session, events_dir, ckpt, text, mode) -> str:
    """What the engine says of ``text``, where it says it: defining the query, or starting
    it and running its first batch."""
    register(session, events_dir)
    try:
        query = session.sql(text).writeStream.format("noop").outputMode(mode) \
            .option("checkpointLocation", str(ckpt)).start()
        query.processAllAvailable()
        query.stop()
    except Exception as e:   # noqa: BLE001 - the refusal is what is compared
        return str(e)
    return ""


@pytest.mark.parametrize("text", list(REFUSED))
def test_sql_spark_refuses_on_streams_is_refused_alike(spark, ss, events, users, tmp_path, text):
    mode, words = REFUSED[text]
    theirs = refusal(spark, events, tmp_path / "spark", text, mode)
    ours = refusal(ss, events, tmp_path / "microbatch", text, mode)
    assert words in theirs and words in ours, (theirs, ours)


#: name -> (SQL, args, keyword arguments: a callable of the session giving them)
PARAMETERS = {
    "named markers": ("SELECT id, v * :scale AS scaled FROM events WHERE v > :low AND id IS NOT NULL",
                      {"scale": 10, "low": 2.5}, None),
    "positional markers": ("SELECT id, v * ? AS scaled FROM events WHERE v > ? AND id IS NOT NULL",
                           [10, 2.5], None),
    "a LIMIT given as a marker": ("SELECT id, v FROM raw WHERE v > :low LIMIT :n", {"low": 1, "n": 4}, None),
    "a stream given as {frame}, a column as {col}": (
        "SELECT {col}, v + :add AS w FROM {frame} WHERE {col} IS NOT NULL", {"add": 1},
        lambda session, events: {"frame": json_stream(session, events, SCHEMA), "col": F.col("id")}),
}


@pytest.mark.parametrize("case", list(PARAMETERS))
def test_parameters_and_formatting_as_pyspark_has_them(spark, ss, events, tmp_path, case):
    text, args, keywords = PARAMETERS[case]

    def run_with(session, ckpt):
        register(session, events)
        frame = session.sql(text, args, **(keywords(session, events) if keywords else {}))
        return collect_batches(frame, ckpt, rows=lambda df: (df.columns, sorted_rows(df)))
    theirs, _ = run_with(spark, tmp_path / "spark")
    ours, _ = run_with(ss, tmp_path / "microbatch")
    assert ours == theirs and any(rows for _, (_, rows) in ours)
    assert not [n for n in ss._stream_views if n.startswith("_pyspark_")]   # (the {frame} view is gone)


def test_a_negative_limit_marker_gets_sparks_error(spark, ss, events):
    errors = []
    for session in (spark, ss):
        register(session, events)
        with pytest.raises(AnalysisException) as negative:
            session.sql("SELECT id FROM raw LIMIT ?", [-1])
        errors.append((negative.value.getCondition(), negative.value.getMessageParameters()))
    assert errors[0] == errors[1] and errors[0][0] == "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE"



def test_a_global_temporary_view_of_a_stream(ss, events, tmp_path):
    json_stream(ss, events, SCHEMA).createOrReplaceGlobalTempView("all_events")
    frame = ss.sql("SELECT id, v FROM global_temp.all_events WHERE v > 5")
    assert isinstance(frame, StreamFrame)
    batches, _ = collect_batches(frame, tmp_path / "ckpt")
    assert sorted(r for _, rows in batches for r in rows) == sorted(
        (i, v) for batch in EVENTS for i, _, v in batch if v is not None and v > 5)
    with pytest.raises(AnalysisException) as exists:
        json_stream(ss, events, SCHEMA).createGlobalTempView("all_events")
    assert exists.value.getCondition() == "TEMP_TABLE_OR_VIEW_ALREADY_EXISTS"
