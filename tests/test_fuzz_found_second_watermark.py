"""A second ``withWatermark`` on a derived column, and an event time read through an
earlier frame (issue 57, seeds 5964 and 6234), run on Spark's engine and on microbatch by
the fuzzer's own comparison.

Spark's EventTimeWatermark marks its column and takes the mark off every other column of
its input (``EventTimeWatermark.updateEventTimeColumn``): after
``withWatermark("ts", ..).withColumn("t_1", ..).withWatermark("t_1", ..)`` only ``t_1`` is
the event time. microbatch's template kept the mark on ``ts`` too, and in seed 5964 (a right
outer join ranged on ``t_1``) took ``ts`` as the left side's event time and refused the join
at start, where Spark's checker passes it and its watermark propagation then fails the run
("Redefining watermark is disallowed"). The template now removes the earlier marks, as
Spark does (``spark_internals.event_time_marked``, and ``marked_in_batches`` over it).

Spark's checker refuses an event-time timeout of applyInPandasWithState when no column of
its input carries a mark in the analysed plan. A column read through a frame before the
watermark (``w["t_1"]``) carries none there, though Spark's engine marks it in a batch with
data; microbatch asked the engine's view (the column its late rows are dropped by) and ran
seed 6234. It now asks the analysis, as Spark's checker does (``FlatMapGroupsWithState.
input_marked``).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from microbatch import StreamingSession
from microbatch.testing import fuzz

DELAY = "spark.watermarkDelayMs"


def _case(seed: int, lines: list[str], mode: str = "append", restart_after: int | None = None) -> fuzz.Case:
    generated = fuzz.generate(seed)
    return fuzz.Case(seed, fuzz.Query(lines, mode, restart_after), generated.files1, generated.files2)


@pytest.mark.timeout(600)
def test_seed_5964_both_engines_fail_the_run_on_the_redefined_watermark(spark):
    result = fuzz.run_case(spark, fuzz.generate(5964, composed=False))
    assert result.status == "both-refused", result.report()
    assert "STREAM_FAILED" in result.kind, result.report()    # (in the run, not at start)


@pytest.mark.timeout(600)
def test_seed_6234_both_engines_refuse_the_unmarked_input_at_start(spark):
    result = fuzz.run_case(spark, fuzz.generate(6234))
    assert result.status == "both-refused", result.report()
    assert "_LEGACY_ERROR_TEMP_3102" in result.kind and "STREAM_FAILED" not in result.kind, result.report()


@pytest.mark.timeout(600)
def test_a_window_over_the_first_event_time_is_unmarked_after_the_second(spark):
    """An append-mode aggregation over ``window(ts)`` after the watermark moved to ``t_1``:
    ``ts`` lost its mark, so Spark's checker refuses at start (no watermark on the keys)."""
    case = _case(5964, [
        "df = src",
        'df = df.withWatermark("ts", "10 seconds")',
        'df = df.withColumn("t_1", F.col("ts") + F.expr("INTERVAL 2 SECONDS"))',
        'df = df.withWatermark("t_1", "3 seconds")',
        'df = df.groupBy(F.window("ts", "10 seconds"), "k").count()',
    ])
    result = fuzz.run_case(spark, case)
    assert result.status == "both-refused", result.report()
    assert "STREAM_FAILED" not in result.kind, result.report()


@pytest.mark.timeout(600)
def test_an_event_time_timeout_over_an_earlier_frames_column_is_refused_at_start(spark):
    """One watermark; the input's only event time is read through the frame before it,
    unmarked in Spark's analysis: refused at start, as Spark refuses it."""
    case = _case(6234, [
        "df = src",
        "w = df",
        'df = df.withWatermark("ts", "5 seconds")',
        'df = df.select(w["ts"].alias("t"), "k", "v")',
        'df = df.groupBy("k").applyInPandasWithState(fuzz_until_quiet("k"), "k INT, n LONG, done BOOLEAN", '
        '"n LONG", "update", GroupStateTimeout.EventTimeTimeout)',
    ], mode="update")
    result = fuzz.run_case(spark, case)
    assert result.status == "both-refused", result.report()
    assert "_LEGACY_ERROR_TEMP_3102" in result.kind and "STREAM_FAILED" not in result.kind, result.report()


def test_the_marks_after_a_second_watermark_are_sparks(spark):
    """The schema's marks after a second ``withWatermark``, and after one on the same column
    again, are those of Spark's own streaming DataFrame over the same files."""
    work = Path(tempfile.mkdtemp(prefix="second-watermark-"))
    (work / "a").mkdir()
    (work / "b").mkdir()
    ours = fuzz._namespace(StreamingSession(spark), work / "a", work / "b", None)["src"]
    theirs = fuzz._namespace(spark, work / "a", work / "b", None)["src"]
    assert theirs.isStreaming

    def marks(df):
        return [(f.name, f.metadata.get(DELAY)) for f in df.schema.fields]

    def second(df):
        return (df.withWatermark("ts", "10 seconds").withColumn("t_1", df.ts)
                .withWatermark("t_1", "3 seconds"))

    def again(df):
        return df.withWatermark("ts", "10 seconds").withWatermark("ts", "3 seconds")

    for steps in (second, again):
        assert marks(steps(ours)) == marks(steps(theirs))
    assert marks(second(theirs)) == [("ts", None), ("k", None), ("v", None), ("s", None), ("t_1", 3000)]
