"""Two stateful operators in one query (a deduplication, then an aggregation), on
microbatch next to Spark's own engine, batch by batch: rows, watermarks, and both
operators' progress (Spark numbers them top down: the aggregation is operator 0)."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from stream_events import comparable, watermarks, write_event_files
from test_dedup_differential import EVENTS

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


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, lambda k, t: {"id": k, "ts": f"2026-01-01 {t}"})


def run(session, events, ckpt, case, fail_after_batch=None):
    mode, transform = CASES[case]
    batches = []

    def sink(df, batch_id):
        rows = sorted(map(tuple, df.collect()), key=repr)
        if batch_id == fail_after_batch and not any(b == batch_id for b, _ in batches):
            batches.append((batch_id, None))
            raise RuntimeError(f"the sink fails after reading batch {batch_id}")
        batches.append((batch_id, rows))

    frame = session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
    query = (transform(frame).writeStream.outputMode(mode).foreachBatch(sink)
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(300)
    except Exception:   # noqa: BLE001 - the injected sink failure ends the first run
        assert fail_after_batch is not None
    return [(b, rows) for b, rows in batches if rows is not None], query.recentProgress


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
    case = "dedup with watermark, then windowed count (append)"
    whole, _ = run(ss, events, tmp_path / "one-run", case)
    first, _ = run(ss, events, tmp_path / "two-runs", case, fail_after_batch=2)
    second, _ = run(ss, events, tmp_path / "two-runs", case)
    assert first + second == whole and [b for b, _ in second][0] == 2
