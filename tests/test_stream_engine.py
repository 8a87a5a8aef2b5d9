"""The engine through the StreamTest DSL: batches, restarts, triggers, failures."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from pyspark.sql import functions as F

from microbatch import ManualClock, MemoryStream, Trigger
from microbatch.sinks.memory import MemorySink
from microbatch.testing import (AddData, AdvanceManualClock, AssertOnQuery, CheckAnswer,
                                CheckLastBatch, CheckNewAnswer, ExpectFailure,
                                StartStream, StopStream, test_stream)


def test_stateless_query_with_stop_and_restart_mid_stream(ss):
    ms = MemoryStream(ss, "value INT")
    frame = ms.toDF().filter("value % 2 = 1").withColumn("double", F.col("value") * 2)
    result = test_stream(frame, "append", [
        StartStream(),
        AddData(ms, 1, 2, 3),
        CheckAnswer((1, 2), (3, 6)),
        AddData(ms, 5),
        CheckNewAnswer((5, 10)),
        StopStream(),
        AddData(ms, 7, 8),
        AddData(ms, 9),
        StartStream(),
        CheckNewAnswer((7, 14), (9, 18)),
        CheckAnswer((1, 2), (3, 6), (5, 10), (7, 14), (9, 18)),
        # (PySpark 4 keeps an offset as its JSON text, 3.5's dict as the JSON value)
        AssertOnQuery(lambda q: str(q.lastProgress["sources"][0]["endOffset"]) == "3", "end offset 3"),
    ])
    # committed batches are never re-run: batch ids continue across the restart
    assert result.sink.batch_ids() == [0, 1, 2]
    assert len({q.id for q in result.queries}) == 1
    assert len({q.runId for q in result.queries}) == 2


def test_processing_time_trigger_follows_the_manual_clock(ss):
    ms = MemoryStream(ss, "value INT")
    clock = ManualClock()
    waiting = lambda q: clock.wait_for_waiter(30)  # noqa: E731 - the stream blocks on the clock
    test_stream(ms.toDF(), "append", [
        StartStream(trigger="10 seconds", clock=clock),
        AssertOnQuery(waiting, "first trigger at t=0 found no data; next one is at 10 s"),
        AddData(ms, 1),
        AssertOnQuery(lambda q: waiting(q) and q.lastProgress is None, "nothing ran yet"),
        AdvanceManualClock(10_000),
        CheckAnswer(1),
        AddData(ms, 2),
        # the next trigger is due at 20 s: nothing runs until the clock gets there
        AssertOnQuery(lambda q: waiting(q) and q.lastProgress["batchId"] == 0, "still on batch 0"),
        AdvanceManualClock(10_000),
        CheckNewAnswer(2),
        AssertOnQuery(lambda q: [p["timestamp"] for p in q.recentProgress] ==
                      ["1970-01-01T00:00:10.000Z", "1970-01-01T00:00:20.000Z"]),
    ])


def test_union_of_streams_and_join_with_static_dataframe(ss, spark):
    left = MemoryStream(ss, "id INT, v STRING")
    right = MemoryStream(ss, "id INT, v STRING")
    names = spark.createDataFrame([(1, "one"), (2, "two")], "id INT, name STRING")
    frame = left.toDF().union(right.toDF()).join(names, "id", "left")
    test_stream(frame, "append", [
        StartStream(),
        AddData(left, (1, "a")),
        AddData(right, (2, "b"), (3, "c")),
        CheckAnswer((1, "a", "one"), (2, "b", "two"), (3, "c", None)),
        AddData(right, (1, "d")),
        CheckLastBatch((1, "d", "one")),
    ])


def test_update_mode_is_accepted_for_stateless_queries(ss):
    ms = MemoryStream(ss, "value INT")
    test_stream(ms.toDF().selectExpr("value + 1 AS v"), "update",
                [StartStream(), AddData(ms, 1), CheckAnswer(2)])


def test_once_and_available_now_stop_by_themselves(ss):
    ms = MemoryStream(ss, "value INT")
    ms.add_data([1, 2])
    ms.add_data([3])
    for trigger, batches in ((Trigger.Once(), [0]), (Trigger.AvailableNow(), [0])):
        sink = MemorySink(ss.spark, ms.schema, "append")
        writer = ms.toDF().writeStream.sink(sink)
        writer._trigger = trigger
        query = writer.start()
        assert query.awaitTermination(60)
        assert sorted(r.value for r in sink.all_data()) == [1, 2, 3]
        assert sink.batch_ids() == batches
        assert not query.isActive and query.exception() is None


def test_failing_batch_is_retried_with_same_id_rows_and_timestamp(ss, tmp_path):
    """A sink failure leaves offsets/N without commits/N; the restart re-runs N exactly."""
    ms = MemoryStream(ss, "value INT")
    frame = ms.toDF().withColumn("at", F.current_timestamp())
    seen: list[tuple[int, list]] = []
    fail = threading.Event()
    fail.set()

    def write(df, batch_id):
        rows = sorted(tuple(r) for r in df.collect())
        seen.append((batch_id, rows))
        if batch_id == 1 and fail.is_set():
            fail.clear()
            raise RuntimeError("sink is down")

    def start():
        return (frame.writeStream.foreachBatch(write)
                .option("checkpointLocation", str(tmp_path)).start())

    query = start()
    ms.add_data([1])
    query.processAllAvailable()
    ms.add_data([2, 3])
    with pytest.raises(Exception, match="sink is down"):
        query.awaitTermination(60)
    assert os.path.exists(tmp_path / "offsets" / "1")
    assert not os.path.exists(tmp_path / "commits" / "1")
    query = start()
    query.processAllAvailable()
    query.stop()
    assert [b for b, _ in seen] == [0, 1, 1]
    assert seen[1] == seen[2]  # same rows, same batch timestamp in current_timestamp()
    assert os.path.exists(tmp_path / "commits" / "1")


def test_current_timestamp_is_the_batch_timestamp(ss):
    ms = MemoryStream(ss, "value INT")
    clock = ManualClock(1_234_567)
    frame = ms.toDF().select("value", F.current_timestamp().alias("ts"),
                             F.expr("unix_millis(now())").alias("ms"))
    sink = MemorySink(ss.spark, frame.schema, "append")
    query = frame.writeStream.sink(sink).clock(clock).start()
    ms.add_data([2])
    query.processAllAvailable()
    query.stop()
    assert {r.ms for r in sink.all_data()} == {1_234_567}
    assert {r.ts.timestamp() for r in sink.all_data()} == {1234.567}


def test_query_failure_is_reported_with_its_cause(ss):
    ms = MemoryStream(ss, "value INT")
    frame = ms.toDF().select(F.expr("assert_true(value < 10, 'value too large')").alias("ok"))
    test_stream(frame, "append", [
        StartStream(),
        AddData(ms, 1),
        CheckAnswer((None,)),
        AddData(ms, 11),
        ExpectFailure(Exception, "value too large"),
        AssertOnQuery(lambda q: not q.isActive and q.exception() is not None),
    ])


def test_stop_cancels_the_running_batch_and_leaves_it_uncommitted(ss, tmp_path):
    ms = MemoryStream(ss, "value INT")
    # The batch's task connects to this socket when it starts and then blocks reading it:
    # the test waits for the connection (no polling), and stop() must cancel the task.
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    port = listener.getsockname()[1]

    def blocked_until_cancelled(batches):
        import socket as worker_socket
        for batch in batches:   # (a task of an empty partition gets none, and never connects)
            with worker_socket.create_connection(("127.0.0.1", port)) as conn:
                conn.recv(1)   # returns only if the test closes its end (the cancel failed)
            yield batch

    frame = ms.toDF().mapInPandas(blocked_until_cancelled, "value INT")
    query = (frame.writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path)).start())
    try:
        ms.add_data([1])
        task, _ = listener.accept()   # the batch's Spark task is running
        assert query.status["isTriggerActive"] and "Processing" in query.status["message"]
        # If stop() fails to cancel the task, this lets the batch end and commit after 30 s,
        # and the asserts below fail instead of the test hanging.
        release = threading.Timer(30, lambda: (task.close(), listener.close()))
        release.start()
        started = time.monotonic()
        query.stop()
        assert time.monotonic() - started < 30
        release.cancel()
        task.close()
    finally:
        listener.close()
        query.stop()
    assert not query.isActive and query.exception() is None
    assert os.path.exists(tmp_path / "offsets" / "0")
    assert not os.path.exists(tmp_path / "commits" / "0")
