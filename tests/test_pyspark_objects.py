"""Users get PySpark's own objects, as PySpark 4.3 gives them: each case runs the same code
on Spark's own engine (``spark.readStream``) and on microbatch (``ss.readStream``) and
compares what a ported job or its tooling would see."""
from __future__ import annotations

import json
import threading
import uuid

import pytest
from pyspark.errors import IllegalArgumentException, StreamingQueryException
from pyspark.errors.exceptions.captured import PythonException, UnknownException
from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (QueryIdleEvent, QueryProgressEvent, QueryStartedEvent,
                                            QueryTerminatedEvent, SinkProgress, SourceProgress,
                                            StateOperatorProgress, StreamingQueryProgress)
from pyspark.sql.types import LongType

from file_inputs import write_json_files
from helpers import confs, wait_for

SCHEMA = "id INT, name STRING"


@pytest.fixture
def engines(spark, ss):
    """The two engines under the same session: Spark's own and microbatch."""
    yield [("spark", spark), ("microbatch", ss)]
    for session in (spark, ss):
        for query in session.streams.active:
            query.stop()


def json_files(tmp_path, count: int) -> str:
    src = tmp_path / "in"
    write_json_files(src, 0, count)
    return str(src)


def files_stream(session, src: str):
    return session.readStream.format("json").schema(SCHEMA).option("maxFilesPerTrigger", 1).load(src)


def run(frame, ckpt, name: str, mode: str = "append"):
    query = (frame.writeStream.format("noop").queryName(name).outputMode(mode)
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    return query


def key_shape(progress: StreamingQueryProgress) -> dict:
    """The JSON field names a tool reading the progress sees, level by level."""
    data = json.loads(progress.json)
    return {"top": list(data), "sources": [list(s) for s in data["sources"]],
            "sink": list(data["sink"]), "stateOperators": [list(op) for op in data["stateOperators"]],
            "eventTime": sorted(data.get("eventTime", {})), "durationMs": sorted(data["durationMs"])}


def test_progress_is_pysparks_object_with_sparks_fields(engines, tmp_path):
    src = json_files(tmp_path, 2)
    seen = {}
    for name, session in engines:
        frame = files_stream(session, src).observe("counts", F.count(F.lit(1)).alias("rows"),
                                                   F.max("id").alias("max_id"))
        query = run(frame, tmp_path / name / "plain", f"plain_{name}")
        windowed = (files_stream(session, src).withColumn("ts", F.timestamp_seconds("id"))
                    .withWatermark("ts", "10 seconds").groupBy(F.window("ts", "5 seconds")).count())
        stateful = run(windowed, tmp_path / name / "windowed", f"windowed_{name}")
        seen[name] = (query, stateful)

    for name, (query, stateful) in seen.items():
        progress = query.lastProgress
        assert type(progress) is StreamingQueryProgress, name
        assert [type(p) for p in query.recentProgress] == [StreamingQueryProgress] * 2
        assert progress.batchId == progress["batchId"] == 1
        assert progress.id == uuid.UUID(query.id) and progress["id"] == query.id
        assert progress.runId == uuid.UUID(query.runId) and progress["runId"] == query.runId
        assert progress.name == f"plain_{name}"
        assert progress.eventTime == {} and progress.stateOperators == []
        assert type(progress.sources[0]) is SourceProgress and type(progress.sink) is SinkProgress
        assert progress.sources[0].startOffset == '{"logOffset": 0}'
        assert progress.sources[0].endOffset == '{"logOffset": 1}'
        assert progress.numInputRows == progress.sources[0].numInputRows == 3
        assert json.loads(progress.prettyJson) == json.loads(progress.json) and str(progress) == progress.prettyJson
        assert list(progress.observedMetrics) == ["counts"]
        assert progress.observedMetrics["counts"].asDict() == {"rows": 3, "max_id": 102}
        windowed = stateful.recentProgress[1]
        assert type(windowed.stateOperators[0]) is StateOperatorProgress
        assert set(windowed.eventTime) == {"avg", "max", "min", "watermark"}

    for i in (0, 1):   # what tools reading the JSON see is Spark's shape
        theirs, ours = seen["spark"][i], seen["microbatch"][i]
        assert key_shape(ours.lastProgress) == key_shape(theirs.lastProgress)
        assert ([p.numInputRows for p in ours.recentProgress]
                == [p.numInputRows for p in theirs.recentProgress])
        assert ([p.observedMetrics for p in ours.recentProgress]
                == [p.observedMetrics for p in theirs.recentProgress])
        assert ours.status.keys() == theirs.status.keys()


def test_observe_with_an_observation_object_is_refused_as_spark_refuses_it(engines):
    for name, session in engines:
        stream = session.readStream.format("rate").load()
        with pytest.raises(IllegalArgumentException, match="Observation does not support streaming"):
            stream.observe(Observation(f"o_{name}"), F.count(F.lit(1)))


class Recorder(StreamingQueryListener):
    """A listener written for Spark 3.4 (no onQueryIdle): PySpark's V1 interface."""

    def __init__(self):
        self.events = []
        self.lock = threading.Lock()

    def onQueryStarted(self, event):
        with self.lock:
            self.events.append(event)

    def onQueryProgress(self, event):
        with self.lock:
            self.events.append(event)

    def onQueryTerminated(self, event):
        with self.lock:
            self.events.append(event)

    def of(self, query) -> list:
        with self.lock:
            return [e for e in self.events
                    if getattr(e, "id", None) == uuid.UUID(query.id)
                    or (isinstance(e, QueryProgressEvent) and e.progress.id == uuid.UUID(query.id))]


class IdleRecorder(Recorder):
    """The V2 interface: with onQueryIdle."""

    def onQueryIdle(self, event):
        with self.lock:
            self.events.append(event)


def test_listener_events_are_pysparks_with_sparks_fields(engines, spark, tmp_path):
    src = json_files(tmp_path, 1)
    seen = {}
    with confs(spark, {"spark.sql.streaming.noDataProgressEventInterval": "100ms"}):
        for name, session in engines:
            v1, v2 = Recorder(), IdleRecorder()
            session.streams.addListener(v1)
            session.streams.addListener(v2)
            query = (files_stream(session, src).writeStream.format("noop").queryName(f"events_{name}")
                     .option("checkpointLocation", str(tmp_path / name)).trigger(processingTime="50 milliseconds")
                     .start())
            # onQueryStarted ran before start() returned, on both engines
            assert [type(e) for e in v2.of(query)][:1] == [QueryStartedEvent], name
            wait_for(lambda v2=v2, query=query: any(isinstance(e, QueryIdleEvent) for e in v2.of(query)))
            query.stop()
            wait_for(lambda v2=v2, query=query: any(isinstance(e, QueryTerminatedEvent) for e in v2.of(query)))
            session.streams.removeListener(v1)
            session.streams.removeListener(v2)
            seen[name] = (query, v1.of(query), v2.of(query))

    for name, (query, v1_events, v2_events) in seen.items():
        kinds = [type(e) for e in v2_events]
        assert kinds[0] is QueryStartedEvent and kinds[-1] is QueryTerminatedEvent, name
        assert QueryProgressEvent in kinds and QueryIdleEvent in kinds
        assert [type(e) for e in v1_events] == [k for k in kinds if k is not QueryIdleEvent]
        started, terminated = v2_events[0], v2_events[-1]
        assert (started.id, started.runId) == (uuid.UUID(query.id), uuid.UUID(query.runId))
        assert started.name == f"events_{name}" and started.jobTags == set()
        assert started.timestamp.endswith("Z")
        idle = next(e for e in v2_events if isinstance(e, QueryIdleEvent))
        assert (idle.id, idle.runId) == (started.id, started.runId) and idle.timestamp.endswith("Z")
        progress = next(e for e in v2_events if isinstance(e, QueryProgressEvent)).progress
        assert type(progress) is StreamingQueryProgress and progress.batchId == 0
        assert (terminated.id, terminated.runId) == (started.id, started.runId)
        assert (terminated.exception, terminated.errorClassOnException) == (None, None)


def test_started_event_carries_the_starting_threads_job_tags(ss, spark, tmp_path):
    """Spark's query thread inherits the job tags of the thread that starts it. (PySpark
    4.3's own listener wrapper cannot deliver such an event: it calls ``toString()`` on
    the tags py4j already turned into Python strings, and the callback fails.)"""
    listener = Recorder()
    ss.streams.addListener(listener)
    spark.sparkContext.addJobTag("fidelity-tag")
    try:
        query = run(files_stream(ss, json_files(tmp_path, 1)), tmp_path / "ckpt", "tagged")
    finally:
        spark.sparkContext.removeJobTag("fidelity-tag")
        ss.streams.removeListener(listener)
    started = listener.of(query)[0]
    assert isinstance(started, QueryStartedEvent) and started.jobTags == {"fidelity-tag"}


def test_add_and_remove_listener_as_pyspark(engines, tmp_path):
    src = json_files(tmp_path, 2)
    counts = {}
    for name, session in engines:
        twice, once = Recorder(), Recorder()
        session.streams.addListener(twice)
        session.streams.addListener(twice)
        session.streams.addListener(once)
        session.streams.removeListener(once)
        session.streams.addListener(once)
        session.streams.removeListener(Recorder())   # not registered: nothing happens
        query = run(files_stream(session, src), tmp_path / name, f"listeners_{name}")
        wait_for(lambda once=once, query=query: any(isinstance(e, QueryTerminatedEvent) for e in once.of(query)))
        wait_for(lambda twice=twice, query=query: sum(isinstance(e, QueryTerminatedEvent) for e in twice.of(query)) == 2)
        session.streams.removeListener(twice)
        session.streams.removeListener(twice)
        session.streams.removeListener(once)
        counts[name] = ([type(e).__name__ for e in twice.of(query)], [type(e).__name__ for e in once.of(query)])
    assert counts["microbatch"] == counts["spark"]
    assert counts["spark"][0].count("QueryProgressEvent") == 4    # two batches, delivered twice


class Failing(StreamingQueryListener):
    def onQueryStarted(self, event):
        raise RuntimeError("listener bug")

    def onQueryProgress(self, event):
        raise RuntimeError("listener bug")

    def onQueryTerminated(self, event):
        raise RuntimeError("listener bug")


def test_a_failing_listener_does_not_fail_the_query(ss, tmp_path):
    failing = Failing()
    ss.streams.addListener(failing)
    try:
        query = run(files_stream(ss, json_files(tmp_path, 2)), tmp_path / "ckpt", "failing_listener")
    finally:
        ss.streams.removeListener(failing)
    assert query.exception() is None and query.lastProgress.batchId == 1


def test_add_listener_needs_a_streaming_query_listener(ss):
    with pytest.raises(AttributeError, match="should be StreamingQueryListener"):
        ss.streams.addListener(object())


# -- a failed query --------------------------------------------------------------------
def failing_batch(df, batch_id):
    raise ValueError("boom in batch")


@F.udf(LongType())
def failing_udf(value):
    raise RuntimeError("udf failed")


def fail(session, kind: str, ckpt):
    class FailingWriter:   # local: pickled by value for the Python workers
        def process(self, row):
            raise ValueError("writer failed")

    stream = session.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
    if kind == "foreachBatch":
        writer = stream.writeStream.foreachBatch(failing_batch)
    elif kind == "foreach":
        writer = stream.writeStream.foreach(FailingWriter())
    else:
        writer = stream.select(failing_udf("value")).writeStream.format("noop")
    listener = IdleRecorder()
    session.streams.addListener(listener)
    query = writer.option("checkpointLocation", str(ckpt)).start()
    with pytest.raises(StreamingQueryException) as raised:
        query.awaitTermination(120)
    wait_for(lambda: any(isinstance(e, QueryTerminatedEvent) for e in listener.of(query)))
    session.streams.removeListener(listener)
    terminated = [e for e in listener.of(query) if isinstance(e, QueryTerminatedEvent)][0]
    return query, raised.value, terminated


PYTHON_WORKER_ERROR = ("org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception "
                       "was thrown from the Python worker")


@pytest.mark.parametrize("kind, error_class, cause_type, cause_text, user_text", [
    ("foreachBatch", "FOREACH_BATCH_USER_FUNCTION_ERROR", UnknownException,
     "py4j.Py4JException: An exception was raised by the Python Proxy. Return Message: Traceback",
     "ValueError: boom in batch"),
    ("udf", "PYTHON_EXCEPTION", PythonException, PYTHON_WORKER_ERROR, "RuntimeError: udf failed"),
    ("foreach", "PYTHON_EXCEPTION", PythonException, PYTHON_WORKER_ERROR, "ValueError: writer failed"),
])
def test_a_failed_query_raises_pysparks_streaming_query_exception(engines, tmp_path, kind, error_class,
                                                                  cause_type, cause_text, user_text):
    seen = {}
    for name, session in engines:
        seen[name] = fail(session, kind, tmp_path / name)
    for name, (query, raised, terminated) in seen.items():
        for exception in (raised, query.exception()):
            assert type(exception).__module__ == "pyspark.errors.exceptions.captured", name
            assert isinstance(exception, StreamingQueryException)
        prefix = f"[STREAM_FAILED] Query [id = {query.id}, runId = {query.runId}] terminated with exception: "
        assert str(raised).startswith(prefix + f"[{error_class}] "), (name, str(raised)[:300])
        assert user_text in str(raised)
        assert raised.getCondition() == "STREAM_FAILED" and raised.getSqlState() == "XXKST"
        with pytest.warns(FutureWarning):
            assert raised.getErrorClass() == "STREAM_FAILED"
        parameters = raised.getMessageParameters()
        assert (parameters["id"], parameters["runId"]) == (query.id, query.runId)
        assert parameters["message"].startswith(f"[{error_class}] ")
        assert type(raised._cause) is cause_type
        assert "=== Streaming Query ===" in raised._desc
        assert query.exception().getCondition() is None    # PySpark's exception() keeps no origin
        assert terminated.errorClassOnException == error_class
        assert terminated.exception.startswith(cause_text), (name, terminated.exception[:200])
        assert not query.isActive and query.status["message"].startswith("Terminated with exception: ")
    theirs, ours = seen["spark"][1], seen["microbatch"][1]
    assert type(ours._cause) is type(theirs._cause)
    if kind == "foreachBatch":   # and, for Python tracebacks, the user's own error behind it
        assert isinstance(ours.__cause__, ValueError) and str(ours.__cause__) == "boom in batch"
    assert str(ours.getMessageParameters().keys()) == str(theirs.getMessageParameters().keys())


# -- a ported job ----------------------------------------------------------------------
def ported_job(spark, src: str, table: str, ckpt: str):
    """A job as written for PySpark 4.3, taking its session as an argument: no microbatch
    in it. It runs unchanged with a SparkSession and with a StreamingSession."""
    seen = []

    class Monitor(StreamingQueryListener):
        def onQueryStarted(self, event):
            seen.append(("started", event.name))

        def onQueryProgress(self, event):
            seen.append(("progress", event.progress.batchId, event.progress.numInputRows,
                         event.progress.observedMetrics["stats"]["rows"]))

        def onQueryTerminated(self, event):
            seen.append(("terminated", event.exception))

    monitor = Monitor()
    spark.streams.addListener(monitor)
    try:
        events = (spark.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
                  .observe("stats", F.count(F.lit(1)).alias("rows"), F.max("id").alias("max_id"))
                  .where(F.col("id") % 2 == 0).withColumn("doubled", F.col("id") * 2))
        query = (events.writeStream.queryName("ported_job").option("checkpointLocation", ckpt)
                 .trigger(availableNow=True).toTable(table))
        query.awaitTermination()
        assert query.exception() is None and not query.isActive
        progress = [(p.batchId, p.numInputRows, p.observedMetrics["stats"].max_id,
                     json.loads(p.json)["sources"][0]["endOffset"]) for p in query.recentProgress]
        spark.catalog.refreshTable(table)
        rows = sorted(tuple(r) for r in spark.table(table).collect())
        wait_for(lambda: any(s[0] == "terminated" for s in seen), 30, "the listener's terminated event")
    finally:
        spark.streams.removeListener(monitor)
    return progress, rows, seen


def test_a_ported_job_runs_unchanged(spark, ss, tmp_path):
    src = json_files(tmp_path, 3)
    theirs = ported_job(spark, src, "ported_spark", str(tmp_path / "spark"))
    ours = ported_job(ss, src, "ported_microbatch", str(tmp_path / "microbatch"))
    assert ours == theirs
    assert [p[0] for p in ours[0]] == [0, 1, 2] and len(ours[1]) == 6


def test_a_failure_is_still_reported_when_the_jvm_exception_cannot_be_built(ss, tmp_path, monkeypatch):
    """E.g. the SparkContext stopped under the query: the query still ends with PySpark's
    StreamingQueryException (without the JVM parts), and the listeners hear of it."""
    from microbatch import spark_internals

    def unavailable(*args, **kwargs):
        raise RuntimeError("no JVM")
    monkeypatch.setattr(spark_internals, "streaming_query_exception", unavailable)
    listener = Recorder()
    ss.streams.addListener(listener)
    try:
        query = (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
                 .writeStream.foreachBatch(failing_batch).option("checkpointLocation", str(tmp_path)).start())
        with pytest.raises(StreamingQueryException) as raised:
            query.awaitTermination(60)
        wait_for(lambda: any(isinstance(e, QueryTerminatedEvent) for e in listener.of(query)))
    finally:
        ss.streams.removeListener(listener)
    assert raised.value.getCondition() == "STREAM_FAILED"
    assert str(raised.value).startswith(f"[STREAM_FAILED] Query [id = {query.id}, runId = {query.runId}]")
    assert isinstance(query.exception(), StreamingQueryException)
    terminated = [e for e in listener.of(query) if isinstance(e, QueryTerminatedEvent)][0]
    assert "boom in batch" in terminated.exception
