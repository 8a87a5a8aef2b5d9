"""Two stateful operators in one query (a deduplication, then an aggregation), on
microbatch next to Spark's own engine, batch by batch: rows, watermarks, and both
operators' progress (Spark numbers them top down: the aggregation is operator 0)."""
from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from helpers import collect_batches, confs, json_stream
from stream_events import comparable, watermarks

CASES = {
    "dedup, then count per key (complete)": (
        "complete", lambda frame: frame.dropDuplicates(["id"]).groupBy("id").count()),
    "dedup with watermark, then windowed count (append)": (
        "append", lambda frame: frame.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"])
        .groupBy(F.window("ts", "20 seconds")).count()),
    "dedup within watermark, then count per key (update)": (
        "update", lambda frame: frame.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["id"])
        .groupBy("id").count()),
}


def run(session, events, ckpt, case, fail_after_batch=None):
    mode, transform = CASES[case]

    def fail(df, batch_id, batches):
        if batch_id == fail_after_batch and not any(b == batch_id for b, _ in batches):
            df.collect()   # the sink reads the batch, then fails
            batches.append((batch_id, None))
            raise RuntimeError(f"the sink fails after reading batch {batch_id}")

    batches, progress = collect_batches(transform(json_stream(session, events, "id INT, ts TIMESTAMP")), ckpt, mode,
                                        on_batch=fail, fail_on_error=fail_after_batch is None)
    return [(b, rows) for b, rows in batches if rows is not None], progress


def same_as_spark(spark, ss, events, tmp_path, case, transform=None):
    """Runs ``case`` (``(mode, transform)``, registered in ``CASES`` under that name) on
    Spark's engine and on microbatch; asserts the same rows, progress and watermarks batch
    by batch, and some output; returns microbatch's batches and progress."""
    if transform is not None:
        CASES[case] = transform
    theirs, their_progress = run(spark, events, tmp_path / "spark", case)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", case)
    assert ours == theirs
    assert sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    return ours, our_progress


def restarts_with_the_same_answer(ss, events, tmp_path, case, transform=None):
    """``case`` run whole, and run again with the sink failing after batch 2 and a restart:
    the two runs' batches together equal the whole run's, the second starting at batch 2.
    Returns the second run's batches."""
    if transform is not None:
        CASES[case] = transform
    whole, _ = run(ss, events, tmp_path / "one-run", case)
    first, _ = run(ss, events, tmp_path / "two-runs", case, fail_after_batch=2)
    second, _ = run(ss, events, tmp_path / "two-runs", case)
    assert first + second == whole and [b for b, _ in second][0] == 2
    return second


@pytest.mark.parametrize("case", list(CASES))
def test_dedup_before_aggregation_matches_spark_batch_by_batch(spark, ss, events, tmp_path, case):
    theirs, their_progress = run(spark, events, tmp_path / "spark", case)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", case)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert [op["operatorName"] for op in our_progress[0]["stateOperators"]] == \
        ["stateStoreSave", "dedupeWithinWatermark" if "within" in case else "dedupe"]
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


def test_a_restart_in_the_middle_gives_the_same_answer(ss, events, tmp_path):
    restarts_with_the_same_answer(ss, events, tmp_path, "dedup with watermark, then windowed count (append)")


def counts_per_window(frame):
    """Rows per id and 10-second window, then the ids and rows of each 30-second window,
    grouped on the first windows' ``window_time`` (Spark 3.4+'s chained aggregation)."""
    first = frame.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds").alias("w"), "id").count()
    return first.groupBy(F.window(F.window_time("w"), "30 seconds")).agg(
        F.sum("count").alias("rows"), F.count("*").alias("ids"))


@pytest.mark.parametrize("mode", ["append", "update", "complete"])
def test_an_aggregation_after_an_aggregation_matches_spark_batch_by_batch(spark, ss, events, tmp_path, mode):
    """Append mode runs; update and complete are refused as Spark refuses them, and run as
    Spark runs them when its correctness check is turned off (the second aggregation then
    counts the first one's updated rows again: the issue Spark's check warns about)."""
    CASES["window of windows"] = (mode, counts_per_window)
    check_off = {}
    if mode != "append":
        with pytest.raises(AnalysisException) as theirs:
            run(spark, events, tmp_path / "spark-refused", "window of windows")
        with pytest.raises(AnalysisException) as ours:
            run(ss, events, tmp_path / "microbatch-refused", "window of windows")
        assert str(ours.value).split(";")[0] == str(theirs.value).split(";")[0]
        assert "possible 'correctness' issue" in str(ours.value)
        # the same condition (_LEGACY_ERROR_TEMP_3102 on 4.x; 3.5's errors carry none here)
        condition = lambda e: getattr(e, "getCondition", getattr(e, "getErrorClass", lambda: None))()  # noqa: E731
        assert condition(ours.value) == condition(theirs.value), (condition(ours.value), condition(theirs.value))
        assert not (tmp_path / "microbatch-refused").exists()
        check_off = {"spark.sql.streaming.statefulOperator.checkCorrectness.enabled": "false"}
    with confs(spark, check_off):
        theirs, their_progress = run(spark, events, tmp_path / "spark", "window of windows")
        ours, our_progress = run(ss, events, tmp_path / "microbatch", "window of windows")
    assert ours == theirs
    assert any(rows for _, rows in ours)
    assert comparable(our_progress) == comparable(their_progress)
    assert [op["operatorName"] for op in our_progress[0]["stateOperators"]] == ["stateStoreSave"] * 2
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


def test_chained_aggregations_restart_in_the_middle_with_the_same_answer(ss, events, tmp_path):
    second = restarts_with_the_same_answer(ss, events, tmp_path, "window of windows", ("append", counts_per_window))
    assert any(rows for _, rows in second)
