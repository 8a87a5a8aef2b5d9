"""Progress with Spark's field names; listener events; status; query ids. (Side by side with
Spark's own engine: tests/test_pyspark_objects.py.)"""
from __future__ import annotations

import json

from helpers import EventRecorder
from microbatch import MemoryStream
from microbatch.cli.main import main as cli_main

PROGRESS_FIELDS = ["id", "runId", "name", "timestamp", "batchId", "batchDuration", "numInputRows",
                   "inputRowsPerSecond", "processedRowsPerSecond", "durationMs", "stateOperators",
                   "sources", "sink"]
PHASES = {"latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets",
          "triggerExecution"}


def test_progress_has_sparks_fields_and_listener_gets_every_event(ss, tmp_path):
    recorder = EventRecorder()
    ss.streams.addListener(recorder)
    try:
        ms = MemoryStream(ss, "v INT")
        query = (ms.toDF().writeStream.format("memory").queryName("progress_test")
                 .option("checkpointLocation", str(tmp_path)).start())
        assert query.status["message"] in ("Waiting for data to arrive", "Waiting for next trigger",
                                           "Getting offsets from MemoryStream[v]", "Initializing sources")
        ms.add_data([1, 2, 3])
        query.processAllAvailable()
        ms.add_data([4])
        query.processAllAvailable()
        assert sorted(r.v for r in ss.spark.sql("select * from progress_test").collect()) == [1, 2, 3, 4]
        query.stop()
        ss.streams._wait_for_listeners()
    finally:
        ss.streams.removeListener(recorder)

    progress = query.recentProgress
    assert [p["batchId"] for p in progress] == [0, 1]
    last = query.lastProgress
    assert list(json.loads(last.json)) == PROGRESS_FIELDS   # Spark's JSON, field by field
    assert set(last["durationMs"]) == PHASES
    assert last["numInputRows"] == 1 and progress[0]["numInputRows"] == 3
    source = last["sources"][0]
    assert source["description"] == "MemoryStream[v]"
    assert (source["startOffset"], source["endOffset"], source["latestOffset"]) == ("0", "1", "1")
    assert json.loads(last.json)["sink"] == {"description": "MemorySink", "numOutputRows": 1}

    kinds = [k for k, _ in recorder.events]
    assert kinds[0] == "started" and kinds[-1] == "terminated"
    assert [e.progress["batchId"] for k, e in recorder.events if k == "progress"] == [0, 1]
    started, terminated = recorder.events[0][1], recorder.events[-1][1]
    assert (str(started.id), str(started.runId), started.name) == (query.id, query.runId, "progress_test")
    assert (str(terminated.id), str(terminated.runId), terminated.exception) == (query.id, query.runId, None)
    assert not query.isActive and query.status["isTriggerActive"] is False


def test_idle_event_when_no_data(ss, tmp_path):
    recorder = EventRecorder()
    ss.streams.addListener(recorder)
    try:
        ms = MemoryStream(ss, "v INT")
        query = ms.toDF().writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
        query.processAllAvailable()
        query.stop()
        ss.streams._wait_for_listeners()
    finally:
        ss.streams.removeListener(recorder)
    idle = [e for k, e in recorder.events if k == "idle"]
    assert idle and str(idle[0].id) == query.id and idle[0].timestamp.endswith("Z")
    assert query.recentProgress == []  # no batch ran


def test_query_manager_active_get_and_await_any_termination(ss, tmp_path):
    ms = MemoryStream(ss, "v INT")
    query = ms.toDF().writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
    assert ss.streams.get(query.id) is query and query in ss.streams.active
    assert ss.streams.awaitAnyTermination(0.1) is False
    query.stop()
    assert ss.streams.awaitAnyTermination(10) is True
    assert ss.streams.get(query.id) is None
    ss.streams.resetTerminated()
    assert ss.streams.awaitAnyTermination(0.1) is False


def test_checkpoint_show_cli(ss, tmp_path, capsys):
    ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 3).load() \
        .writeStream.format("noop").option("checkpointLocation", str(tmp_path)).trigger(once=True) \
        .start().awaitTermination()
    (tmp_path / "commits" / "0").unlink()
    assert cli_main(["checkpoint", "show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "batch 0: NOT committed (re-run on restart)" in out
    assert "source 0: {'offset': 3, 'timestamp': 1000}" in out


class UncountedMemoryStream(MemoryStream):
    """A source whose offsets do not tell its row count (like a file source)."""

    def num_rows(self, start, end):
        return None


def test_input_rows_are_counted_when_the_source_cannot_tell(ss, tmp_path):
    ms = UncountedMemoryStream(ss, "v INT")
    query = ms.toDF().filter("v > 1").writeStream.format("noop") \
        .option("checkpointLocation", str(tmp_path)).start()
    ms.add_data([1, 2, 3, 4])
    query.processAllAvailable()
    query.stop()
    assert query.lastProgress["numInputRows"] == 4
    assert query.lastProgress["sources"][0]["numInputRows"] == 4
