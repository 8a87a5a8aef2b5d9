"""dropDuplicates on microbatch next to Spark's own engine, batch by batch."""
from __future__ import annotations

import json
import os

import pytest

from pyspark.errors import AnalysisException

from microbatch import spark_internals
from stream_events import EVENTS, comparable
from helpers import collect_batches, json_stream

DEDUP = ("numDroppedDuplicateRows",)

# the events: conftest.py's fixture (stream_events.EVENTS)


def run(reader_session, events, ckpt, transform):
    return collect_batches(transform(json_stream(reader_session, events, "id INT, ts TIMESTAMP")), ckpt)


TRANSFORMS = {
    "with watermark": lambda frame: frame.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"]),
    "without watermark": lambda frame: frame.dropDuplicates(["id"]),
    # late rows are dropped, but no key is ever evicted
    "watermark on a non-key column": lambda frame: frame.withWatermark("ts", "10 seconds").dropDuplicates(["id"]),
    "within watermark": lambda frame: frame.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["id"]),
    # a struct key cannot be joined by Arrow: the key-by-key path
    "struct key": lambda frame: (frame.withWatermark("ts", "10 seconds")
                                 .selectExpr("named_struct('id', id) AS s", "ts").dropDuplicates(["s", "ts"])),
}


@pytest.mark.parametrize("case", list(TRANSFORMS))
def test_drop_duplicates_matches_spark_batch_by_batch(spark, ss, events, tmp_path, case):
    transform = TRANSFORMS[case]
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform)
    assert ours == theirs
    assert comparable(our_progress, DEDUP) == comparable(their_progress, DEDUP)
    for name in ("offsets", "commits"):
        for batch in sorted(os.listdir(tmp_path / "spark" / name)):
            if batch.endswith(".crc") or batch.startswith("."):
                continue
            theirs_text = (tmp_path / "spark" / name / batch).read_text().split("\n")
            ours_text = (tmp_path / "microbatch" / name / batch).read_text().split("\n")
            watermark = "batchWatermarkMs" if name == "offsets" else "nextBatchWatermarkMs"
            assert json.loads(ours_text[1])[watermark] == json.loads(theirs_text[1])[watermark], (name, batch)
    if case != "without watermark":
        assert len(ours) == 5, "a no-data batch evicts state after the last file, as in Spark"
        assert any(op["numRowsDroppedByWatermark"] for p in our_progress for op in p["stateOperators"])


def test_restart_in_the_middle_gives_the_same_answer(ss, events, tmp_path):
    def transform(frame):
        return frame.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"])
    whole, _ = run(ss, events, tmp_path / "one-run", transform)
    ckpt = tmp_path / "two-runs"
    outputs: dict[int, list] = {}
    attempts = []

    def sink(df, batch_id):
        rows = sorted(map(tuple, df.collect()), key=repr)  # the state of batch 2 is committed here...
        attempts.append(batch_id)
        if batch_id == 2 and attempts.count(2) == 1:
            raise RuntimeError("the sink fails after reading batch 2")  # ...and the batch fails
        outputs[batch_id] = rows

    def start():
        frame = ss.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
        return (transform(frame).writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True).start())

    query = start()
    with pytest.raises(Exception, match="the sink fails after reading batch 2"):
        query.awaitTermination(120)
    query = start()
    query.awaitTermination(120)
    assert attempts == [0, 1, 2, 2, 3, 4]
    assert sorted(outputs.items()) == whole


def test_within_watermark_needs_a_watermark(spark, ss, events):
    with pytest.raises(Exception) as theirs:
        spark.readStream.schema("id INT, ts TIMESTAMP").json(events).dropDuplicatesWithinWatermark(["id"]) \
            .writeStream.format("noop").start().awaitTermination(60)
    with pytest.raises(AnalysisException) as ours:   # at start, as Spark's checker refuses it
        ss.readStream.schema("id INT, ts TIMESTAMP").json(events).dropDuplicatesWithinWatermark(["id"]) \
            .writeStream.format("noop").start()
    assert str(ours.value).split(";")[0] in str(theirs.value)


def test_dedup_output_modes(spark, ss, events, tmp_path):
    """Complete mode without an aggregation: refused as this version's Spark refuses it
    (4.x: STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION; 3.5: a message without a class)."""
    with pytest.raises(AnalysisException) as theirs:
        spark.readStream.schema("id INT, ts TIMESTAMP").json(events).dropDuplicates(["id"]) \
            .writeStream.format("memory").queryName("d_spark").outputMode("complete").start()
    frame = ss.readStream.schema("id INT, ts TIMESTAMP").json(events).dropDuplicates(["id"])
    with pytest.raises(AnalysisException) as ours:
        frame.writeStream.format("memory").queryName("d").outputMode("complete").start()
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert _condition(ours.value) == _condition(theirs.value)
    assert str(ours.value).split(";")[0] in str(theirs.value)
    assert "Complete output mode not supported" in str(ours.value) or \
        _condition(ours.value) == "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION"
    assert frame.distinct().columns == ["id", "ts"]


def _condition(error):
    """An exception's error class on every PySpark (3.5 has getErrorClass only)."""
    return getattr(error, "getCondition", error.getErrorClass)()


def test_state_provider_recorded_and_foreign_or_missing_state_refused(spark, ss, events, tmp_path):
    def transform(frame):
        return frame.dropDuplicates(["id"])
    ckpt = tmp_path / "ckpt"
    run(ss, events, ckpt, transform)
    if spark_internals.running_version().at_least_4:   # (Spark 3.5 has no state data source)
        state = ss.read.format("statestore").load(str(ckpt)).collect()   # a value with no columns
        assert sorted((r.key.id for r in state), key=repr) == [1, 2, 3, 4, 5, 6, None] and state[0].value == ()
    conf = json.loads((ckpt / "offsets" / "0").read_text().split("\n")[1])["conf"]
    assert conf["spark.sql.streaming.stateStore.providerClass"] == \
        "microbatch.state.map_provider.MapStateStoreProvider"
    # The same checkpoint without the stateful step, or a stateless one with a new step: refused.
    with pytest.raises(Exception, match=r"stateful operators \[none\] do not match .* operators \[0\]"):
        run(ss, events, ckpt, lambda frame: frame)
    stateless = tmp_path / "stateless"
    run(ss, events, stateless, lambda frame: frame)
    with pytest.raises(Exception, match=r"stateful operators \[0 \(dedupe\)\] do not match .* operators none"):
        run(ss, events, stateless, transform)
    # State Spark wrote is adopted (tests/test_spark_state_adoption.py): Spark's files stay
    # as they were, microbatch's snapshot of the version the next batch reads beside them
    run(spark, events, tmp_path / "spark", transform)
    store = tmp_path / "spark" / "state" / "0" / "0"
    before = {name: (store / name).read_bytes() for name in os.listdir(store) if (store / name).is_file()}
    run(ss, events, tmp_path / "spark", transform)
    after = sorted(os.listdir(store))
    assert all((store / name).read_bytes() == data for name, data in before.items())
    assert set(after) - set(before) - {"_metadata"} == {f"{len(EVENTS)}.snapshot.arrow"}
