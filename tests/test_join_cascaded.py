"""A stream-stream join of a stream-stream join (``a.join(b).join(c)``), next to Spark's own
engine, batch by batch: rows, watermarks, each operator's state counts (the upper join is
operator 0, as Spark numbers them top down), the state rows at the end, and a restart on
the same checkpoint. Spark's engine fails such a query in its first batch with
MULTIPLE_EVENT_TIME_COLUMNS while both of the lower join's event times reach the upper
join; with one of them dropped it runs, the upper join evicting its state by the lower
join's output watermark. A left semi join of a join runs where Spark's optimizer puts it
(into the side whose columns its condition reads), and a join of a streaming limit as
Spark's engine runs it (issue 59)."""
from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, json_stream, sorted_rows
from stream_events import comparable, watermarks
from test_join_conditions_cascaded import RANGE, generated, write
from microbatch.errors import UnsupportedOperationError
from microbatch.spark_internals import running_version

UPPER = "id = cid AND lts = cts"
RIGHTS = "rid = cid AND rts = cts"     # (the upper join on the lower join's right side)


@pytest.fixture
def paths(tmp_path):
    return (write(tmp_path / "a", generated(1)), write(tmp_path / "b", generated(2, value="maxn")),
            write(tmp_path / "c", generated(3, value="v")))


def frames(session, paths):
    a = json_stream(session, paths[0], "id INT, ts TIMESTAMP, num INT").withColumnRenamed("ts", "lts") \
        .withWatermark("lts", "10 seconds")
    b = json_stream(session, paths[1], "id INT, ts TIMESTAMP, maxn INT").toDF("rid", "rts", "maxn") \
        .withWatermark("rts", "20 seconds")
    c = json_stream(session, paths[2], "id INT, ts TIMESTAMP, v INT").toDF("cid", "cts", "v") \
        .withWatermark("cts", "10 seconds")
    return a, b, c


def cascaded(lower: str, upper: str, drop: str = "rts"):
    """``a.join(b, lower).drop(drop).join(c, upper)``: a full outer lower join on the
    event time (Spark's checker asks a watermarked key or a range on both sides)."""
    def query(a, b, c):
        condition = "id = rid AND lts = rts" if lower == "full_outer" else RANGE
        return a.join(b, F.expr(condition), lower).drop(drop).join(c, F.expr(UPPER), upper)
    return query


CASES = {
    "inner of inner": cascaded("inner", "inner"),
    "left outer of inner": cascaded("inner", "left_outer"),
    "right outer of inner": cascaded("inner", "right_outer"),
    "full outer of inner": cascaded("inner", "full_outer"),
    "left semi of a stream, the join on its right": lambda a, b, c: c.join(
        a.join(b, F.expr(RANGE)).drop("rts"), F.expr(UPPER), "left_semi"),
    "inner of left outer": cascaded("left_outer", "inner"),
    "inner of full outer": cascaded("full_outer", "inner"),
    # a left semi join of a join: Spark's optimizer moves it into the side of the join whose
    # columns its condition reads (PushLeftSemiLeftAntiThroughJoin), other operators than
    # the query as written; on both sides' columns it stays above
    "left semi of inner, on its left side's columns (moved into that side)": cascaded("inner", "left_semi"),
    "left semi of inner, on its right side's columns (moved into that side)": lambda a, b, c: a.join(
        b, F.expr(RANGE)).drop("lts").join(c, F.expr(RIGHTS), "left_semi"),
    "left semi of inner, on both sides' columns (stays above)": lambda a, b, c: a.join(
        b, F.expr(RANGE)).drop("rts").join(c, F.expr(UPPER + " AND maxn >= v"), "left_semi"),
    "left semi of left outer, on its right side's columns (the join inner then)": lambda a, b, c: a.join(
        b, F.expr(RANGE), "left_outer").drop("lts").join(c, F.expr(RIGHTS), "left_semi"),
    "left semi of right outer, on its left side's columns": cascaded("right_outer", "left_semi"),
    "left semi of inner, through a rename its condition reads": lambda a, b, c: a.join(b, F.expr(RANGE)).drop(
        "rts").withColumnRenamed("id", "k").join(c, F.expr("k = cid AND lts = cts"), "left_semi"),
    "left semi of full outer, on its left side's columns": cascaded("full_outer", "left_semi"),
    # a join of a streaming limit (Spark's StreamingGlobalLimitExec below the join exec)
    "inner of a limit": lambda a, b, c: a.limit(5).join(b, F.expr(RANGE)),
    "inner with a limit on the right": lambda a, b, c: a.join(b.limit(5), F.expr(RANGE)),
}


def run(session, paths, ckpt, query):
    return collect_batches(query(*frames(session, paths)), ckpt, rows=lambda df: (df.columns, sorted_rows(df)))


@pytest.mark.parametrize("case", ci_share(list(CASES)))   # half in CI's run (helpers.ci_share)
def test_a_join_of_a_join_matches_spark(spark, ss, paths, tmp_path, case):
    theirs, their_progress = run(spark, paths, tmp_path / "spark", CASES[case])
    ours, our_progress = run(ss, paths, tmp_path / "microbatch", CASES[case])
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    assert any(rows for _, (_, rows) in ours)
    assert [len(p["stateOperators"]) for p in our_progress] == [2] * len(our_progress)


def _state_rows(session, ckpt, value_fields: list | None = None) -> list:
    """Each operator's and side's state rows; with ``value_fields`` (per operator and side,
    as another checkpoint's rows give them), only those fields of each value."""
    found = []
    for operator in (0, 1):
        for side in ("left", "right"):
            df = session.read.format("statestore").option("operatorId", operator).option("joinSide", side) \
                .load(str(ckpt))
            if value_fields is not None:
                df = df.select("key", F.struct(*(F.col("value")[f] for f in value_fields[len(found)])).alias("value"),
                               "partition_id")
            found.append(sorted(map(str, df.collect())))
    return found


def _value_fields(session, ckpt) -> list:
    return [session.read.format("statestore").option("operatorId", operator).option("joinSide", side)
            .load(str(ckpt)).schema["value"].dataType.fieldNames()
            for operator in (0, 1) for side in ("left", "right")]


@pytest.mark.parametrize("case", ci_share(["left outer of inner",
                                            "left semi of left outer, on its right side's columns (the join inner then)"]))
def test_a_restart_in_the_middle_gives_sparks_answer_and_state(spark, ss, paths, tmp_path, case):
    query = CASES[case]
    theirs, _ = run(spark, paths, tmp_path / "spark", query)
    ckpt = tmp_path / "microbatch"
    attempts, outputs = [], {}

    def sink(df, batch_id):
        rows = (df.columns, sorted_rows(df))
        attempts.append(batch_id)
        if batch_id == 3 and attempts.count(3) == 1:
            raise RuntimeError("the sink fails in batch 3")
        outputs[batch_id] = rows

    def start():
        return (query(*frames(ss, paths)).writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())

    with pytest.raises(Exception, match="the sink fails in batch 3"):
        start().awaitTermination(120)
    start().awaitTermination(120)
    assert attempts[:5] == [0, 1, 2, 3, 3]
    assert sorted(outputs.items()) == theirs
    assert watermarks(ckpt) == watermarks(tmp_path / "spark")
    if running_version().at_least_4:   # (Spark 3.5 has no state data source)
        # (the right side of a left semi join leaves out the columns Spark's optimizer
        # prunes, those its condition does not read, as Spark's state rows do)
        fields = _value_fields(spark, tmp_path / "spark")
        assert _value_fields(ss, ckpt) == fields
        assert _state_rows(ss, ckpt, fields) == _state_rows(spark, tmp_path / "spark", fields)


def _failure(session, paths, ckpt, query) -> Exception:
    started = query(*frames(session, paths)).writeStream.foreachBatch(lambda df, i: None) \
        .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException) as failed:
        started.awaitTermination(120)
    return failed.value


def test_both_event_times_reaching_the_upper_join_fail_as_in_spark(spark, ss, paths, tmp_path):
    query = cascaded("inner", "inner", drop="maxn")     # (lts and rts both reach the upper join)
    theirs = _failure(spark, paths, tmp_path / "spark", query)
    ours = _failure(ss, paths, tmp_path / "microbatch", query)
    for failed in (theirs, ours):
        assert "terminated with exception: [MULTIPLE_EVENT_TIME_COLUMNS] More than one event time columns" in str(failed)
        assert "lts" in str(failed) and "rts" in str(failed)
    assert isinstance(ours.__cause__, AnalysisException)     # (Spark's: an AnalysisException in the JVM)
    if running_version().at_least_4:
        assert ours.__cause__.getCondition() == "MULTIPLE_EVENT_TIME_COLUMNS"


def test_what_does_not_run_yet_is_refused_when_defined(ss, paths):
    a, b, c = frames(ss, paths)
    # (Spark's optimizer moves this left semi join into the join's left side, its condition
    # read back over that side as `id = cid AND lts = cts`; the side's `id` and c's `id`,
    # read back by name, are ambiguous there)
    renamed = a.join(b, F.expr(RANGE)).drop("rts").withColumnRenamed("id", "k")
    with pytest.raises(UnsupportedOperationError, match="A left semi join of a stream-stream join .* read back"):
        renamed.join(c.withColumnRenamed("cid", "id"), F.expr("k = id AND lts = cts"), "left_semi")
