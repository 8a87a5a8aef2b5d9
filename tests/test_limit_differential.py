"""limit(n) on a stream, on microbatch next to Spark's own engine, batch by batch."""
from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F

from stream_events import comparable, write_event_files
from helpers import collect_batches, json_stream

# One file per batch: the limit of 5 is reached in the middle of the second file.
EVENTS = [
    [(1, "a"), (2, "b"), (3, "a")],
    [(4, "c"), (5, "b"), (6, "a"), (7, "c")],
    [(8, "a"), (9, "d")],
    [(10, "d")],
]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, lambda i, k: {"id": i, "k": k})


def run(session, events, ckpt, transform, mode="append", files=None):
    return collect_batches(transform(json_stream(session, events, "id INT, k STRING")), ckpt, mode,
                           rows=lambda df: [tuple(r) for r in df.collect()])


def test_a_limit_of_appends_keeps_its_count_as_state(spark, ss, events, tmp_path):
    def transform(frame):
        return frame.where("id != 6").select("id", F.upper("k").alias("k")).limit(5)
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform)
    assert ours == theirs
    assert [len(rows) for _, rows in ours] == [3, 2, 0, 0]
    assert comparable(our_progress) == comparable(their_progress)
    state = sorted(tuple(r) for r in ss.read.format("statestore").load(str(tmp_path / "microbatch")).collect())
    assert state == [((None,), (5,), 0)]
    schema = json.loads((tmp_path / "microbatch" / "state" / "0" / "_metadata" / "schema").read_text())
    assert (schema["operatorName"], schema["keySchema"]["fields"][0]["type"],
            schema["valueSchema"]["fields"][0]["type"]) == ("globalLimit", "void", "long")


def test_the_limits_count_survives_a_restart(ss, events, tmp_path):
    def transform(frame):
        return frame.limit(4)
    whole, _ = run(ss, events, tmp_path / "one-run", transform)
    source = tmp_path / "events"
    later = {}
    for name in ("f2.json", "f3.json"):   # the first run sees two files
        later[name] = (source / name).read_text(), (source / name).stat().st_mtime
        (source / name).unlink()
    first, _ = run(ss, events, tmp_path / "two-runs", transform)
    for name, (text, mtime) in later.items():
        (source / name).write_text(text)
        import os
        os.utime(source / name, (mtime, mtime))
    second, _ = run(ss, events, tmp_path / "two-runs", transform)
    assert first + second == whole
    assert sum(len(rows) for _, rows in whole) == 4


def test_a_limit_of_a_complete_aggregation_limits_each_result(spark, ss, events, tmp_path):
    def transform(frame):
        return frame.groupBy("k").count().orderBy(F.desc("count"), "k").limit(2)
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform, mode="complete")
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform, mode="complete")
    assert ours == theirs and all(len(rows) <= 2 for _, rows in ours)
    assert comparable(our_progress) == comparable(their_progress)


def test_limits_spark_refuses_or_microbatch_does_not_run_yet(spark, ss, events, tmp_path):
    def start(session, transform, mode):
        frame = session.readStream.schema("id INT, k STRING").json(events)
        query = transform(frame).writeStream.outputMode(mode).format("noop") \
            .option("checkpointLocation", str(tmp_path / f"ck-{id(session)}-{mode}")).start()
        query.awaitTermination(60)
        return query

    update = (lambda frame: frame.limit(2)), "update"
    with pytest.raises(Exception) as theirs:
        start(spark, *update)
    with pytest.raises(Exception) as ours:
        start(ss, *update)
    assert "Limits are not supported on streaming DataFrames/Datasets in Update output mode" in str(theirs.value)
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value).split(";")[0] in str(theirs.value)


def timed(frame):
    return frame.withColumn("ts", F.timestamp_seconds(F.col("id") * 10)).withWatermark("ts", "5 seconds")


CHAINED = {
    # Spark numbers them top down: the limit is operator 0 here
    "a limit of a deduplication": ("append", lambda f: f.dropDuplicates(["k"]).limit(3)),
    "a limit of a windowed count (append)": (
        "append", lambda f: timed(f).groupBy(F.window("ts", "20 seconds")).count().limit(2)),
    # and operator 1 here
    "a count of a limit (complete)": ("complete", lambda f: f.limit(5).groupBy("k").count()),
    "a deduplication of a limit": ("append", lambda f: f.limit(5).dropDuplicates(["k"])),
}


@pytest.mark.parametrize("case", list(CHAINED))
def test_a_limit_chained_with_another_stateful_operator_matches_spark(spark, ss, events, tmp_path, case):
    mode, transform = CHAINED[case]
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform, mode)
    assert [(b, sorted(rows, key=repr)) for b, rows in ours] == [(b, sorted(rows, key=repr)) for b, rows in theirs]
    assert any(rows for _, rows in ours)
    assert comparable(our_progress) == comparable(their_progress)
    assert "globalLimit" in [op["operatorName"] for op in our_progress[0]["stateOperators"]]
