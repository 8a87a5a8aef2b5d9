"""Streaming aggregation: Spark's rules per output mode, restarts, and larger inputs."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
from pyspark.errors import AnalysisException as PySparkAnalysisException
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from pyspark.errors import AnalysisException

from microbatch.errors import UnsupportedOperationError
from helpers import plain as _plain
from test_aggregation_differential import SCHEMA, events  # noqa: F401 - the events fixture


def stream(ss, events, files_per_batch=1):
    return ss.readStream.schema(SCHEMA).option("maxFilesPerTrigger", files_per_batch).json(events)


def start(frame, mode, ckpt, fmt="memory", name="agg"):
    return (frame.writeStream.format(fmt).queryName(name).outputMode(mode)
            .option("checkpointLocation", str(ckpt)).start())


def test_output_mode_rules_with_sparks_wording(ss, events, tmp_path):
    keyed = stream(ss, events).groupBy("k").count()
    with pytest.raises(AnalysisException, match=r"STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION\] Invalid "
                       r"streaming output mode: append\. .*streaming aggregations without watermark"):
        start(keyed, "append", tmp_path / "a")
    # A watermark that is not on a grouping key does not make rows final either.
    on_other = stream(ss, events).withWatermark("ts", "5 seconds").groupBy("k").count()
    with pytest.raises(AnalysisException, match="aggregations without watermark"):
        start(on_other, "append", tmp_path / "b")
    with pytest.raises(AnalysisException, match="Sorting is not supported .* Complete output mode"):
        start(keyed.orderBy("k"), "update", tmp_path / "c")
    with pytest.raises(AnalysisException, match="Sorting is not supported"):
        stream(ss, events).orderBy("k")
    with pytest.raises(AnalysisException, match=r"Distinct aggregations are not supported .* "
                                                r"approx_count_distinct\(\) instead"):
        stream(ss, events).groupBy("k").agg(F.countDistinct("v"))
    with pytest.raises(UnsupportedOperationError, match="count_min_sketch.* not supported"):
        stream(ss, events).groupBy("k").agg(F.expr("count_min_sketch(v, 0.1D, 0.9D, 1)"))
    with pytest.raises(AnalysisException, match="possible 'correctness' issue due to global watermark"):
        start(stream(ss, events).groupBy("k").count().groupBy("count").count(), "complete", tmp_path / "c")
    with pytest.raises(PySparkAnalysisException):
        stream(ss, events).groupBy("k").agg(F.sum("no_such_column"))
    sessions = stream(ss, events).withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "6 seconds"))
    with pytest.raises(AnalysisException, match=r"output mode: update\. This output mode is not supported "
                                                r"for session window streaming aggregations"):
        start(sessions.count(), "update", tmp_path / "e")
    # What Spark allows: complete mode with a sort, update mode without watermark.
    query = start(keyed.orderBy(F.desc("count"), "k"), "complete", tmp_path / "d", name="sorted")
    query.processAllAvailable()
    rows = [tuple(r) for r in ss.spark.table("sorted").collect()]
    assert rows == [("a", 6), ("b", 6), ("c", 3)]
    query.stop()
    # A session window with no other key: Spark's planner refuses it when the run starts
    # (planStreamingAggregationForSession), and so does microbatch's.
    one_batch = stream(ss, events, 100).withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "6 seconds"))
    query = start(one_batch.count(), "complete", tmp_path / "f", name="sessions")
    with pytest.raises(StreamingQueryException, match="Global aggregation with session window in streaming query "
                                                      "is not supported"):
        query.processAllAvailable()


def test_restart_in_the_middle_gives_the_same_answer(ss, events, tmp_path):
    def transform(frame):
        return (frame.withWatermark("ts", "5 seconds")
                .groupBy(F.window("ts", "10 seconds", "5 seconds"), "k")
                .agg(F.count("*").alias("n"), F.sum("v"), F.collect_list("v")))

    def run(ckpt, sink, limit=None):
        frame = stream(ss, events, 1)
        query = (transform(frame).writeStream.outputMode("append").foreachBatch(sink)
                 .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        return query

    whole: dict[int, list] = {}
    run(tmp_path / "one", lambda df, i: whole.__setitem__(i, sorted(map(_plain, df.collect()), key=repr)))

    parts: dict[int, list] = {}
    attempts: list[int] = []

    def failing_sink(df, batch_id):
        rows = sorted(map(_plain, df.collect()), key=repr)  # batch 3's state is committed here...
        attempts.append(batch_id)
        if batch_id == 3 and attempts.count(3) == 1:
            raise RuntimeError("the sink fails in batch 3")  # ...then the batch fails
        parts[batch_id] = rows

    with pytest.raises(Exception, match="the sink fails in batch 3"):
        run(tmp_path / "two", failing_sink)
    run(tmp_path / "two", failing_sink)  # a new run resumes at batch 3
    assert attempts == [0, 1, 2, 3, 3, 4, 5]
    assert parts == whole
    assert sum(len(rows) for rows in whole.values()) > 0

    # Stopped by stop() after batch 2, started again: the same batches, the same answer.
    stopped: dict[int, list] = {}
    reached_batch_2 = threading.Event()

    def record(df, batch_id):
        stopped[batch_id] = sorted(map(_plain, df.collect()), key=repr)
        if batch_id == 2:
            reached_batch_2.set()

    query = (transform(stream(ss, events, 1)).writeStream.outputMode("append").foreachBatch(record)
             .option("checkpointLocation", str(tmp_path / "three"))
             .trigger(processingTime="200 milliseconds").start())
    assert reached_batch_2.wait(120)
    query.stop()
    assert max(stopped) < 5, "stopped in the middle"
    run(tmp_path / "three", record)
    assert stopped == whole


def test_approx_count_distinct_matches_spark_beyond_linear_counting(spark, ss, tmp_path):
    """Distinct counts large enough for HLL++'s bias correction and raw estimate."""
    directory = tmp_path / "many"
    directory.mkdir()
    base = time.time() - 10_000
    sizes = {"a": 1800, "b": 9000, "c": 300}
    for i in range(3):
        path = directory / f"f{i}.json"
        with path.open("w") as out:
            for key, n in sizes.items():
                for x in range(i, n, 3):
                    out.write(json.dumps({"k": key, "x": x * 7919, "s": f"s{x}"}) + "\n")
        os.utime(path, (base + i, base + i))
    frame = ss.readStream.schema("k STRING, x LONG, s STRING").option("maxFilesPerTrigger", 1).json(str(directory))
    aggs = [F.approx_count_distinct("x").alias("x"), F.approx_count_distinct("s", 0.02).alias("s"),
            F.approx_count_distinct("x", 0.2).alias("coarse")]
    query = start(frame.groupBy("k").agg(*aggs), "complete", tmp_path / "ckpt", name="hll")
    query.processAllAvailable()
    ours = sorted(tuple(r) for r in ss.spark.table("hll").collect())
    query.stop()
    theirs = sorted(tuple(r) for r in spark.read.schema("k STRING, x LONG, s STRING").json(str(directory))
                    .groupBy("k").agg(*aggs).collect())
    assert ours == theirs
    assert ours[1][1] != 9000  # an estimate, not an exact count: the HLL++ path is exercised


def test_changed_state_schema_or_damaged_state_file_is_refused(ss, events, tmp_path):
    ckpt = tmp_path / "ckpt"

    def run(transform, location=ckpt):
        frame = stream(ss, events, 1)
        query = (transform(frame).writeStream.outputMode("update").format("noop")
                 .option("checkpointLocation", str(location)).trigger(availableNow=True).start())
        query.awaitTermination(120)

    run(lambda f: f.groupBy("k").agg(F.sum("v")))
    schema = json.loads((ckpt / "state" / "0" / "_metadata" / "schema").read_text())
    assert schema["operatorName"] == "stateStoreSave" and schema["keySchema"]["fields"][0]["name"] == "k"
    commits = sorted(os.listdir(ckpt / "commits"))
    with pytest.raises(Exception, match=r"operator 0 \(stateStoreSave\) .* the value schema was "
                                        r"struct<.*bigint> and is now struct<.*double,.*bigint>"):
        run(lambda f: f.groupBy("k").agg(F.avg("v")))
    with pytest.raises(Exception, match=r"the key schema was struct<k:string> and is now struct<v:int>"):
        run(lambda f: f.groupBy("v").agg(F.sum("v")))
    assert sorted(os.listdir(ckpt / "commits")) == commits

    # A damaged delta file: a clear error naming it, and the file left as it was.
    copy = tmp_path / "copy"   # a new location: no executor has this state cached
    import shutil
    shutil.copytree(ckpt, copy)
    (copy / "offsets" / "4").unlink()
    (copy / "commits" / "4").unlink()
    delta = next(p for p in sorted((copy / "state" / "0").glob("*/4.delta.arrow")))
    delta.write_bytes(b"not arrow")
    with pytest.raises(Exception, match=r"Error reading state file .*4\.delta\.arrow.* damaged"):
        run(lambda f: f.groupBy("k").agg(F.sum("v")), copy)
    assert delta.read_bytes() == b"not arrow"


def test_state_is_readable_at_any_retained_batch(ss, events, tmp_path):
    ckpt = tmp_path / "ckpt"
    frame = stream(ss, events, 1).withWatermark("ts", "5 seconds")
    query = (frame.groupBy(F.window("ts", "10 seconds"), "k").agg(F.sum("v"), F.avg("v"))
             .writeStream.outputMode("append").format("noop")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    state = ss.read.format("statestore").option("batchId", 1).load(str(ckpt))
    assert state.columns == ["key", "value", "partition_id"]
    rows = {(r.key.window.start.second, r.key.k): tuple(r.value) for r in state.collect()}
    # After files 0 and 1: sum(v) and avg's (sum, count) per window and key.
    assert rows == {(0, "a"): (4, 4.0, 2), (0, "b"): (7, 7.0, 2), (10, "a"): (4, 4.0, 1),
                    (10, "c"): (6, 6.0, 1)}
    latest = ss.read.format("statestore").load(str(ckpt))   # after the last batch: one window is open
    assert [(r.key.window.start.second, r.key.k) for r in latest.collect()] == [(50, "c")]
    with pytest.raises(Exception, match="STDS_COMMITTED_BATCH_UNAVAILABLE"):   # (Spark 4.3's error)
        ss.read.format("statestore").option("batchId", 99).load(str(ckpt))
    with pytest.raises(Exception, match="no state for operator 1"):
        ss.read.format("statestore").option("operatorId", 1).load(str(ckpt))
    # options cannot lead the reader out of the checkpoint it is given
    (tmp_path / "elsewhere").mkdir()
    for name in ("../../../elsewhere", "/etc", "nothing-here"):
        with pytest.raises(Exception, match=f"Invalid value '{name}' for option 'storeName'.*its stores: default"):
            ss.read.format("statestore").option("storeName", name).load(str(ckpt))
    assert ss.read.format("json").schema("k STRING").load(events).count() > 0  # other formats: Spark's


def test_session_state_is_readable(ss, events, tmp_path):
    ckpt = tmp_path / "ckpt"
    query = (stream(ss, events, 1).withWatermark("ts", "5 seconds")
             .groupBy(F.session_window("ts", "6 seconds"), "k").agg(F.sum("v"))
             .writeStream.outputMode("append").format("noop")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    state = ss.read.format("statestore").option("batchId", 2).load(str(ckpt)).collect()
    # (as Spark's reader shows them: a row per session, keyed by k and the session's start)
    sessions = sorted((r.key.k, r.value.session_window.start.second, r.value.session_window.end.second)
                      for r in state)
    assert sessions == [("a", 1, 18), ("a", 26, 32), ("b", 2, 10), ("c", 14, 21)]
    assert sorted((r.key.k, r.key.sessionStartTime.second) for r in state) == [("a", 1), ("a", 26), ("b", 2), ("c", 14)]


def test_event_time_of_a_watermark_under_an_aggregation_comes_from_its_partial_step(ss, events, tmp_path):
    """A watermark right below an aggregation has no Observation in the plan (it would stop
    code generation at the scan): the partial aggregation computes the event-time
    statistics. A sink that runs part of the batch, then all of it, reports the same
    eventTime as one that runs it once (a re-run partition replaces its statistics)."""
    def run(ckpt, sink):
        frame = stream(ss, events, 1).withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds")).count()
        query = (frame.writeStream.outputMode("update").foreachBatch(sink)
                 .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    once = run(tmp_path / "once", lambda df, i: df.collect())
    twice = run(tmp_path / "twice", lambda df, i: (df.limit(1).collect(), df.collect()))
    times = [p["eventTime"] for p in once.recentProgress]
    assert [p["eventTime"] for p in twice.recentProgress] == times
    assert all({"avg", "max", "min", "watermark"} <= set(t) for t in times if t.get("max"))
    assert sum(1 for t in times if "max" in t) >= 3
    plan = once._execution.last_batch_df._jdf.queryExecution().optimizedPlan().toString()
    assert "CollectMetrics" not in plan and "__microbatch_event_time_max" in plan, plan
