"""Stream-stream inner joins on microbatch next to Spark's own engine, batch by batch."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from pyspark.sql import functions as F

from stream_events import comparable, watermarks
from helpers import ci_share, collect_batches, confs, json_stream, sorted_rows
from microbatch.errors import UnsupportedOperationError
from microbatch.spark_internals import running_version

T = "2026-01-01 00:"
# One file per batch on each side: matches within a batch and across batches, a key
# matched twice, a late row on each side, a row whose key is already evictable, and null
# ids (never in an inner side's state; an outer side keeps them; a late null-id row must
# not move the watermark of a side where Spark filters it out below the watermark).
LEFT = [
    [(1, "00:10", "x"), (2, "00:20", "y"), (None, "00:20", "n")],
    [(3, "00:40", "z"), (1, "00:10", "x2"), (None, "00:55", "m")],
    [(1, "01:40", "w"), (2, "00:05", "late")],
    [(4, "02:00", "v")],
]
RIGHT = [
    [(1, "00:10", 10), (None, "00:20", 5)],
    [(2, "00:20", 20), (1, "00:10", 11)],
    [(3, "00:40", 30), (9, "00:01", 99)],
    [(1, "01:40", 12), (4, "02:00", 40)],
]


def write(directory, batches, column):
    directory.mkdir()
    base = time.time() - 10_000
    for i, rows in enumerate(batches):
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps({"id": k, "ts": T + t, column: v}) + "\n" for k, t, v in rows))
        os.utime(path, (base + i, base + i))
    return str(directory)


@pytest.fixture
def sides(tmp_path):
    return write(tmp_path / "left", LEFT, "a"), write(tmp_path / "right", RIGHT, "b")


def run(session, sides, ckpt, transform, queries=None):
    """The batches and progress of ``transform`` of the two sides; the query is added to
    ``queries`` when given."""
    left = json_stream(session, sides[0], "id INT, ts TIMESTAMP, a STRING")
    right = json_stream(session, sides[1], "id INT, ts TIMESTAMP, b INT")
    batches, progress = collect_batches(transform(left, right), ckpt, queries=queries,
                                        rows=lambda df: (df.columns, sorted_rows(df)))
    return [(i, columns, rows) for i, (columns, rows) in batches], progress


def ranged(left, right, how, condition="id = rid AND lts >= rts AND lts <= rts + interval 20 seconds",
           left_filter=None):
    left = left.withColumnRenamed("ts", "lts").withWatermark("lts", "10 seconds")
    if left_filter is not None:
        left = left.where(left_filter)
    right = right.withColumnRenamed("id", "rid").withColumnRenamed("ts", "rts").withWatermark("rts", "20 seconds")
    return left.join(right, F.expr(condition), how)


def windowed(side):
    return side.withWatermark("ts", "10 seconds").select("id", F.window("ts", "30 seconds").alias("w"),
                                                         *[c for c in side.columns if c not in ("id", "ts")])


CASES = {
    # the event time is a join key: state behind the watermark is evicted, late rows dropped
    "on id and event time, watermarks on both sides": lambda l, r: (
        l.withWatermark("ts", "10 seconds").join(r.withWatermark("ts", "20 seconds"), ["id", "ts"])),
    "on event time and id, a watermark on the left only": lambda l, r: (
        l.withWatermark("ts", "10 seconds").join(r, ["ts", "id"])),
    # outer joins: unmatched rows come out with nulls once the watermark evicts them
    "left outer": lambda l, r: (
        l.withWatermark("ts", "10 seconds").join(r.withWatermark("ts", "20 seconds"), ["id", "ts"], "left_outer")),
    "right outer": lambda l, r: (
        l.withWatermark("ts", "10 seconds").join(r.withWatermark("ts", "20 seconds"), ["id", "ts"], "right")),
    "full outer": lambda l, r: (
        l.withWatermark("ts", "10 seconds").join(r.withWatermark("ts", "20 seconds"), ["id", "ts"], "full_outer")),
    "left semi": lambda l, r: (
        l.withWatermark("ts", "10 seconds").join(r.withWatermark("ts", "20 seconds"), ["id", "ts"], "left_semi")),
    # a condition with a time range: state evicted by each side's state value watermark
    "time range, inner": lambda l, r: ranged(l, r, "inner"),
    "time range, left outer": lambda l, r: ranged(l, r, "left_outer"),
    "time range, right outer": lambda l, r: ranged(l, r, "right_outer"),
    "time range with BETWEEN and a strict bound, inner": lambda l, r: ranged(
        l, r, "inner", "rid = id AND lts BETWEEN rts - interval 5 seconds AND rts + interval 30 seconds "
                       "AND rts < lts + interval 1 minute"),
    # a condition with a part beside the keys and time range that reads both sides
    "time range and a comparison of both sides' columns, left outer": lambda l, r: ranged(
        l, r, "left_outer", "id = rid AND lts >= rts AND lts <= rts + interval 20 seconds AND id * 10 < b"),
    # window equality: the window over the event time is the watermarked key (its end is
    # compared with the watermark); the id filter moves below the watermark through the select
    "on id and a time window, inner": lambda l, r: windowed(l).join(windowed(r), ["id", "w"]),
    "on id and a time window, left outer": lambda l, r: windowed(l).join(windowed(r), ["id", "w"], "left"),
    # a join of an aggregation's result: its window is the side's watermarked column
    "a window count joined with the other side's windows": lambda l, r: (
        l.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "30 seconds").alias("w")).count()
        .join(windowed(r), ["w"])),
    # a join of a deduplicated side (the join is operator 0, the deduplication 1)
    "a deduplicated side": lambda l, r: (
        l.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"])
        .join(r.withWatermark("ts", "20 seconds"), ["id", "ts"])),
    # no watermark: every row stays in state and matches later rows of its key
    "on id, no watermark": lambda l, r: l.join(r.withColumnRenamed("ts", "rts"), "id").select("id", "a", "b", "rts"),
}


@pytest.mark.parametrize("case", ci_share(list(CASES)))   # half in CI's run (helpers.ci_share)
def test_join_matches_spark_batch_by_batch(spark, ss, sides, tmp_path, case):
    theirs, their_progress = run(spark, sides, tmp_path / "spark", CASES[case])
    ours, our_progress = run(ss, sides, tmp_path / "microbatch", CASES[case])
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert our_progress[0]["stateOperators"][0]["operatorName"] == "symmetricHashJoin"
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


#: cases whose joins take the join task's branches: keys and values evicted, outer and semi
#: joins, a condition's other parts
BOTH_PATHS = ("full outer", "left semi", "time range and a comparison of both sides' columns, left outer")


def test_the_row_path_of_the_rocksdb_stores_gives_what_the_arrow_path_gives(ss, sides, tmp_path):
    """The join task has two paths: Arrow tables where the stores keep their memory as
    tables (the default provider), a row at a time where they do not (the RocksDB
    provider). Each is compared with Spark's engine where it runs by default; here the
    row path against the Arrow path: the same rows and state counts, batch by batch."""
    for n, case in enumerate(BOTH_PATHS):
        arrow = run(ss, sides, tmp_path / f"arrow-{n}", CASES[case])
        with confs(ss, {"spark.sql.streaming.stateStore.providerClass":
                        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}):
            rows = run(ss, sides, tmp_path / f"rows-{n}", CASES[case])
        assert rows[0] == arrow[0], case
        assert comparable(rows[1]) == comparable(arrow[1]), case


def test_a_restart_in_the_middle_gives_the_same_answer(ss, sides, tmp_path):
    transform = CASES["on id and event time, watermarks on both sides"]
    whole, _ = run(ss, sides, tmp_path / "one-run", transform)
    ckpt = tmp_path / "two-runs"
    attempts, outputs = [], {}

    def sink(df, batch_id):
        rows = sorted(map(tuple, df.collect()), key=repr)   # the join's state of batch 1 commits here
        attempts.append(batch_id)
        if batch_id == 1 and attempts.count(1) == 1:
            raise RuntimeError("the sink fails after reading batch 1")
        outputs[batch_id] = rows

    def start():
        left = ss.readStream.schema("id INT, ts TIMESTAMP, a STRING").option("maxFilesPerTrigger", 1).json(sides[0])
        right = ss.readStream.schema("id INT, ts TIMESTAMP, b INT").option("maxFilesPerTrigger", 1).json(sides[1])
        return (transform(left, right).writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True).start())

    with pytest.raises(Exception, match="the sink fails after reading batch 1"):
        start().awaitTermination(120)
    start().awaitTermination(120)
    assert attempts[:3] == [0, 1, 1]
    assert sorted(outputs.items()) == [(i, rows) for i, _, rows in whole]


def test_joins_spark_refuses_or_microbatch_does_not_run_yet(spark, ss, sides, tmp_path):
    def frames(session):
        left = session.readStream.schema("id INT, ts TIMESTAMP, a STRING").json(sides[0])
        right = session.readStream.schema("id INT, ts TIMESTAMP, b INT").json(sides[1])
        return left, right

    def start(session):
        left, right = frames(session)
        query = left.join(right, "id").writeStream.outputMode("complete").format("noop") \
            .option("checkpointLocation", str(tmp_path / f"ck-{id(session)}")).start()
        query.awaitTermination(60)

    with pytest.raises(Exception) as theirs:
        start(spark)
    with pytest.raises(Exception) as ours:
        start(ss)
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value).split(";")[0] in str(theirs.value)
    # an outer or semi join needs a watermark on a join key (or a range condition): Spark's error
    for how, name in (("left_outer", "LeftOuter"), ("left_semi", "LeftSemi")):
        for session in (spark, ss):
            left, right = frames(session)
            with pytest.raises(Exception) as raised:
                left.withWatermark("ts", "1 second").join(right, "id", how).writeStream.format("noop") \
                    .option("checkpointLocation", str(tmp_path / f"{how}-{id(session)}")).start().awaitTermination(60)
            if session is spark:
                theirs = raised.value
        assert str(raised.value).split(";")[0] in str(theirs) and f"{name} join" in str(theirs)
    # outer joins only in append mode (a left semi or inner join runs in update mode too)
    for how, name in (("left_outer", "LeftOuter"), ("full_outer", "FullOuter")):
        for session in (spark, ss):
            left, right = frames(session)
            with pytest.raises(Exception) as raised:
                left.withWatermark("ts", "1 second").join(right.withWatermark("ts", "1 second"), ["id", "ts"], how) \
                    .writeStream.outputMode("update").format("noop") \
                    .option("checkpointLocation", str(tmp_path / f"update-{how}-{id(session)}")).start() \
                    .awaitTermination(60)
            if session is spark:
                theirs = raised.value
        assert str(raised.value).split(";")[0] in str(theirs)
        named = f"{name} join" if running_version().at_least(4, 2) else "Join"      # (Spark 4.2 names the type)
        assert f"{named} between two streaming DataFrames/Datasets is not supported in Update" in str(theirs)
    left, right = frames(ss)
    with pytest.raises(Exception, match="LeftAnti joins with a streaming DataFrame/Dataset on the right"):
        left.join(right, "id", "left_anti").writeStream.format("noop").start()   # (at start, as Spark's checker)
    # (a condition without an equality of the two sides' columns: Spark's checker refuses it)
    with pytest.raises(Exception, match="without equality predicate"):
        left.join(right.withColumnRenamed("id", "rid"), F.expr("id = rid OR a = 'x'"))


def test_the_state_reader_reads_each_side_as_sparks_does(spark, ss, sides, tmp_path):
    transform = CASES["on event time and id, a watermark on the left only"]
    run(spark, sides, tmp_path / "spark", transform)
    run(ss, sides, tmp_path / "microbatch", transform)
    if not running_version().at_least_4:   # Spark 3.5 has no state data source
        with pytest.raises(UnsupportedOperationError, match="the state data source .* needs Spark 4.0"):
            ss.read.format("statestore")
        return
    for side in ("left", "right"):
        theirs = spark.read.format("statestore").option("joinSide", side).load(str(tmp_path / "spark"))
        ours = ss.read.format("statestore").option("joinSide", side).load(str(tmp_path / "microbatch"))
        assert ours.schema.simpleString() == theirs.schema.simpleString()
        assert sorted(map(str, ours.collect())) == sorted(map(str, theirs.collect())) != []
    with pytest.raises(Exception, match="STDS_INVALID_OPTION_VALUE.*'joinSide': Valid values are left,right,none"):
        ss.read.format("statestore").option("joinSide", "middle").load(str(tmp_path / "microbatch"))


AGGREGATED = {
    "a window count after a join on a watermarked key": lambda l, r: CASES[
        "on id and event time, watermarks on both sides"](l, r).groupBy(F.window("ts", "30 seconds")).count(),
    # the count sees the join's output watermark, below the query's by the time range
    "a window count after a time-range join": lambda l, r: ranged(l, r, "inner").groupBy(
        F.window("lts", "10 seconds")).count(),
}


@pytest.mark.parametrize("case", list(AGGREGATED))
def test_an_aggregation_after_a_join_matches_spark(spark, ss, sides, tmp_path, case):
    theirs, their_progress = run(spark, sides, tmp_path / "spark", AGGREGATED[case])
    ours, our_progress = run(ss, sides, tmp_path / "microbatch", AGGREGATED[case])
    assert ours == theirs and any(rows for _, _, rows in ours)
    assert comparable(our_progress) == comparable(their_progress)
    assert [op["operatorName"] for op in our_progress[0]["stateOperators"]] == ["stateStoreSave", "symmetricHashJoin"]
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


def test_the_max_watermark_policy_matches_spark(spark, ss, sides, tmp_path):
    """spark.sql.streaming.multipleWatermarkPolicy=max: the join evicts by the larger of
    its sides' watermarks, on both engines alike."""
    transform = CASES["on id and event time, watermarks on both sides"]
    with confs(spark, {"spark.sql.streaming.multipleWatermarkPolicy": "max"}):
        theirs, their_progress = run(spark, sides, tmp_path / "spark", transform)
        ours, our_progress = run(ss, sides, tmp_path / "microbatch", transform)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    min_policy = run(ss, sides, tmp_path / "min", transform)[1]
    assert [p["eventTime"]["watermark"] for p in our_progress] != [p["eventTime"]["watermark"] for p in min_policy]
    # the policy is one of the checkpoint's confs: a restart keeps it whatever the session says
    def in_two_runs(name, second_policy):
        partial = [tmp_path / name / "input" / side for side in ("left", "right")]
        for source, target in zip(sides, partial):
            target.mkdir(parents=True)
            for file in sorted(os.listdir(source))[:2]:
                shutil.copy2(os.path.join(source, file), target / file)
        for policy, files in (("max", slice(None, 2)), (second_policy, slice(2, None))):
            for source, target in zip(sides, partial):
                for file in sorted(os.listdir(source))[files]:
                    shutil.copy2(os.path.join(source, file), target / file)
            with confs(spark, {"spark.sql.streaming.multipleWatermarkPolicy": policy}):
                run(ss, partial, tmp_path / name / "checkpoint", transform)
        return watermarks(tmp_path / name / "checkpoint")

    assert in_two_runs("restarted-with-min", "min") == in_two_runs("restarted-with-max", "max")


def test_a_restart_with_another_join_type_or_keys_is_refused(ss, sides, tmp_path):
    ckpt = tmp_path / "ckpt"
    run(ss, sides, ckpt, CASES["on id and event time, watermarks on both sides"])
    before = sorted(p.name for p in (ckpt / "offsets").iterdir())
    changed = {
        "the join was inner and is now left": CASES["left outer"],
        "the key schema was": lambda l, r: l.withWatermark("ts", "10 seconds").join(
            r.withWatermark("ts", "20 seconds"), ["ts"]),
    }
    for message, transform in changed.items():
        with pytest.raises(Exception, match=r"operator 0 \(symmetricHashJoin\).*" + message):
            run(ss, sides, ckpt, transform)
    assert sorted(p.name for p in (ckpt / "offsets").iterdir()) == before


def test_explain_shows_each_stateful_operator_with_its_id(ss, sides, tmp_path, capsys):
    left = ss.readStream.schema("id INT, ts TIMESTAMP, a STRING").option("maxFilesPerTrigger", 1).json(sides[0])
    right = ss.readStream.schema("id INT, ts TIMESTAMP, b INT").option("maxFilesPerTrigger", 1).json(sides[1])
    query = (AGGREGATED["a window count after a join on a watermarked key"](left, right).writeStream
             .format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    query.explain()
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if "state info" in line]
    assert len(lines) == 2
    assert lines[0].startswith("Aggregate") and "opId = 0, ver = " in lines[0] and "numPartitions = 2]" in lines[0]
    assert "StreamingSymmetricHashJoin inner, [id, ts]" in lines[1] and "opId = 1" in lines[1]
    assert f"checkpoint = {tmp_path / 'ckpt'}/state, runId = {query.runId}" in lines[1]


def test_each_sides_event_times_come_from_the_join_unless_a_filter_on_them_is_between(spark, ss, sides, tmp_path):
    """A side's watermark right below the join (through the join's own null filter on the
    event time) has no Observation in the batch's plan: the join's tasks compute its
    event-time statistics. A filter on the event time between a watermark and the join
    drops rows the watermark saw, so that side keeps its Observation (and the join's null
    filter on the id moves through it, below the watermark, as Spark's optimizer moves it).
    Rows, progress (eventTime) and watermarks match Spark's in both. The filtered case is a
    time-range join: on an equal event time Spark would also infer the filter for the other
    side (InferFiltersFromConstraints), which microbatch does not do (state counts differ)."""
    filtered = lambda l, r: ranged(l, r, "inner", left_filter=F.col("lts") > F.lit(T + "00:15").cast("timestamp"))  # noqa: E731
    for name, transform, observations in (("both sides", CASES["on id and event time, watermarks on both sides"], 0),
                                          ("filtered left", filtered, 1)):
        queries = []
        theirs, their_progress = run(spark, sides, tmp_path / name / "spark", transform)
        ours, our_progress = run(ss, sides, tmp_path / name / "microbatch", transform, queries)
        assert ours == theirs, name
        assert comparable(our_progress) == comparable(their_progress), name
        assert watermarks(tmp_path / name / "microbatch") == watermarks(tmp_path / name / "spark"), name
        assert sum(1 for p in our_progress if p["eventTime"].get("max")) >= 3, name
        plan = queries[0]._execution.last_batch_df._jdf.queryExecution().optimizedPlan().toString()
        assert plan.count("CollectMetrics") == observations, (name, plan)
