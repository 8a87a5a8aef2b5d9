"""applyInPandasWithState on microbatch next to Spark's own engine, batch by batch: the
function's rows, PySpark's own GroupState, event-time timeouts fired at the batch Spark
fires them, late rows, the operator's progress, a restart, and Spark's refusals."""
from __future__ import annotations

import sys

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

import test_chained_differential as chained
from stream_events import comparable, first_batches
from test_chained_differential import restarts_with_the_same_answer, run, same_as_spark

# the functions below run in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

OUTPUT = "id INT, n LONG, timedout BOOLEAN"


def count_until_quiet(key, frames, state):
    """Rows per id; an id without rows for 15 s of event time is reported and forgotten."""
    assert isinstance(state, GroupState)
    if state.hasTimedOut:
        (n,) = state.get
        state.remove()
        yield pd.DataFrame({"id": [key[0]], "n": [n], "timedout": [True]})
        return
    n = state.get[0] if state.exists else 0
    for frame in frames:
        n += len(frame)
    state.update((n,))
    state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 15000)
    yield pd.DataFrame({"id": [key[0]], "n": [n], "timedout": [False]})


def first_rows(key, frames, state):
    """Each id's rows until it has seen three, one output row per input row (append)."""
    seen = state.get[0] if state.exists else 0
    out = []
    for frame in frames:
        for _ts in frame["ts"]:
            if seen < 3:
                seen += 1
                out.append((key[0], seen, False))
    if seen >= 3:
        state.remove()
    else:
        state.update((seen,))
    yield pd.DataFrame(out, columns=["id", "n", "timedout"])


def sessions(key, frames, state):
    """A sessionization: each id's session (first and last event time, events) closes,
    and comes out, 5 s of event time after its last event."""
    if state.hasTimedOut:
        start, end, events = state.get
        state.remove()
        yield pd.DataFrame({"id": [key[0]], "start": [start], "end": [end], "events": [events]})
        return
    start, end, events = state.get if state.exists else (None, None, 0)
    for frame in frames:
        low, high = frame["ts"].min().to_pydatetime(), frame["ts"].max().to_pydatetime()
        start = low if start is None else min(start, low)
        end = high if end is None else max(end, high)
        events += len(frame)
    state.update((start, end, events))
    state.setTimeoutTimestamp(max(int(pd.Timestamp(end).timestamp() * 1000) + 5000,
                                  state.getCurrentWatermarkMs() + 1))
    yield from ()


CASES = {
    "a sessionization with timestamps in its state (append)": (
        "append", lambda f: f.withWatermark("ts", "10 seconds").groupBy("id").applyInPandasWithState(
            sessions, "id INT, start TIMESTAMP, end TIMESTAMP, events LONG",
            "start TIMESTAMP, end TIMESTAMP, events LONG", "append", GroupStateTimeout.EventTimeTimeout)),
    "event-time timeout (update)": ("update", lambda f: f.withWatermark("ts", "10 seconds").groupBy("id")
                                    .applyInPandasWithState(count_until_quiet, OUTPUT, "n LONG", "update",
                                                            GroupStateTimeout.EventTimeTimeout)),
    "no timeout (append)": ("append", lambda f: f.groupBy("id").applyInPandasWithState(
        first_rows, OUTPUT, "seen INT", "append", GroupStateTimeout.NoTimeout)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_spark_batch_by_batch(spark, ss, events, tmp_path, case):
    ours, our_progress = same_as_spark(spark, ss, events, tmp_path, case, CASES[case])
    assert sum(len(rows) for _, rows in ours) >= 3
    assert our_progress[0]["stateOperators"][0]["operatorName"] == "applyInPandasWithState"


SESSIONS_OUT = "id INT, start TIMESTAMP, end TIMESTAMP, events LONG"
SESSIONS_STATE = "start TIMESTAMP, end TIMESTAMP, events LONG"

#: (Observations of the watermark in each batch, mode, query): steps between a watermark
#: and the stateful operator above it
PROJECTED_CASES = {
    "a projection between the watermark and applyInPandasWithState": (
        0, "append", lambda f: f.withWatermark("ts", "10 seconds").withColumn("id", (F.col("id") % 3).cast("int"))
        .groupBy("id").applyInPandasWithState(sessions, SESSIONS_OUT, SESSIONS_STATE, "append",
                                              GroupStateTimeout.EventTimeTimeout)),
    "renames and a drop between the watermark and a window count": (
        0, "append", lambda f: f.withWatermark("ts", "10 seconds").withColumnRenamed("id", "key")
        .withColumn("k", F.col("key") % 2).drop("key").groupBy(F.window("ts", "10 seconds"), "k").count()),
    "the event time recomputed between the watermark and applyInPandasWithState": (
        1, "append", lambda f: f.withWatermark("ts", "10 seconds").withColumn("ts", F.col("ts") + F.expr("INTERVAL 1 SECOND"))
        .groupBy("id").applyInPandasWithState(first_rows, OUTPUT, "seen INT", "append", GroupStateTimeout.NoTimeout)),
}


@pytest.mark.parametrize("case", list(PROJECTED_CASES))
def test_the_operator_computes_the_watermarks_statistics_through_projections_that_keep_its_column(
        spark, ss, events, tmp_path, monkeypatch, case):
    """Between a watermark and the stateful operator above it, steps that only project the
    rows and keep the event-time column as it is leave every row and its event time to the
    operator, whose tasks compute the watermark's statistics: the batch has no Observation
    of the watermark (a node that stops code generation and costs the driver 15-20 ms a
    batch). A step that recomputes the event time keeps the Observation. Rows, progress
    (eventTime) and watermarks match Spark's in each case."""
    import microbatch.runtime.watermarks as stateful
    made: list[str] = []

    class CountingObservation(stateful.Observation):
        def __init__(self, name=None):
            made.append(name)
            super().__init__(name)

    monkeypatch.setattr(stateful, "Observation", CountingObservation)
    observations, mode, transform = PROJECTED_CASES[case]
    ours, our_progress = same_as_spark(spark, ss, events, tmp_path, case, (mode, transform))
    assert sum(1 for p in our_progress if p["eventTime"].get("max")) >= 3
    of_the_watermark = [name for name in made if name.startswith("microbatch_event_time_")]
    assert len(of_the_watermark) == observations * len(our_progress), made


def test_timeouts_fire_in_the_batch_spark_fires_them_and_the_state_reads_as_sparks(spark, ss, events, tmp_path):
    case = "event-time timeout (update)"
    chained.CASES[case] = CASES[case]
    ours, _ = run(ss, events, tmp_path / "microbatch", case)
    timed_out = [(batch, row[0]) for batch, rows in ours for row in rows if row[2]]
    assert (1, 2) in timed_out and len(timed_out) >= 5
    run(spark, events, tmp_path / "spark", case)
    for batch in (2, 3):   # Spark's reader on Spark's checkpoint, microbatch's on microbatch's
        theirs = spark.read.format("statestore").option("batchId", batch).load(str(tmp_path / "spark"))
        mine = ss.read.format("statestore").option("batchId", batch).load(str(tmp_path / "microbatch"))
        assert mine.schema.simpleString() == theirs.schema.simpleString()
        assert sorted(map(str, mine.collect())) == sorted(map(str, theirs.collect())) != []


def test_a_restart_in_the_middle_gives_the_same_answer(ss, events, tmp_path):
    restarts_with_the_same_answer(ss, events, tmp_path, "event-time timeout (update)", CASES["event-time timeout (update)"])


REFUSED = {
    "an update function in append mode": ("append", lambda f: f.groupBy("id").applyInPandasWithState(
        count_until_quiet, OUTPUT, "n LONG", "update", GroupStateTimeout.NoTimeout)),
    "an event-time timeout without a watermark": ("update", lambda f: f.groupBy("id").applyInPandasWithState(
        count_until_quiet, OUTPUT, "n LONG", "update", GroupStateTimeout.EventTimeTimeout)),
    "complete mode": ("complete", lambda f: f.groupBy("id").applyInPandasWithState(
        count_until_quiet, OUTPUT, "n LONG", "update", GroupStateTimeout.NoTimeout)),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_spark_refusals_with_sparks_message(spark, ss, events, tmp_path, case):
    chained.CASES[case] = REFUSED[case]
    with pytest.raises(Exception) as theirs:
        run(spark, events, tmp_path / "spark", case)
    with pytest.raises(Exception) as ours:
        run(ss, events, tmp_path / "microbatch", case)
    assert str(ours.value).split(";")[0] in str(theirs.value)
    assert not (tmp_path / "microbatch" / "offsets").exists()


def count_until_idle_for(timeout_ms: int):
    """Rows per id; an id without rows for ``timeout_ms`` of processing time is reported
    and forgotten."""
    def count_until_idle(key, frames, state):
        if state.hasTimedOut:
            yield pd.DataFrame({"id": [key[0]], "n": [state.get[0]], "timedout": [True]})
            state.remove()
            return
        n = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
        state.update((n,))
        state.setTimeoutDuration(timeout_ms)
        yield pd.DataFrame({"id": [key[0]], "n": [n], "timedout": [False]})
    return count_until_idle


count_until_idle = count_until_idle_for(25_000)
#: a 1 ms timeout: an id without rows in the next batch (whose timestamp is later) times out there
count_until_next_batch = count_until_idle_for(1)


def test_processing_time_timeouts_fire_in_no_data_batches(ss):
    from microbatch import ManualClock, MemoryStream
    from microbatch.testing import AddData, AdvanceManualClock, CheckNewAnswer, StartStream, test_stream
    ms = MemoryStream(ss, "id INT")
    frame = ms.toDF().groupBy("id").applyInPandasWithState(
        count_until_idle, OUTPUT, "n LONG", "update", GroupStateTimeout.ProcessingTimeTimeout)
    clock = ManualClock(0)
    test_stream(frame, "update", [
        StartStream(trigger="10 seconds", clock=clock),
        AddData(ms, 1, 1, 2),
        AdvanceManualClock(10_000),             # t=10 s: timeouts at 35 s
        CheckNewAnswer((1, 2, False), (2, 1, False)),
        AddData(ms, 1),
        AdvanceManualClock(10_000),             # t=20 s: id 1's timeout moves to 45 s
        CheckNewAnswer((1, 3, False)),
        AdvanceManualClock(10_000),             # t=30 s: a batch without data, nothing due
        CheckNewAnswer(),
        AdvanceManualClock(10_000),             # t=40 s: id 2 is due
        CheckNewAnswer((2, 1, True)),
        AdvanceManualClock(10_000),             # t=50 s: id 1 is due
        CheckNewAnswer((1, 3, True)),
    ])


def count_until_next_batch_per_id(frame):
    return frame.where("id IS NOT NULL").groupBy("id").applyInPandasWithState(
        count_until_next_batch, OUTPUT, "n LONG", "update", GroupStateTimeout.ProcessingTimeTimeout)


def test_a_running_count_with_a_processing_time_timeout_matches_spark(spark, ss, events, tmp_path):
    """A processing-time timeout makes every trigger run a batch (Spark's rule), so
    ``availableNow`` never ends: the first five batches."""
    theirs, their_progress = first_batches(spark, events, tmp_path / "spark", 5, count_until_next_batch_per_id)
    ours, our_progress = first_batches(ss, events, tmp_path / "microbatch", 5, count_until_next_batch_per_id)
    assert ours == theirs
    assert (2, 1, True) in ours[1][1]   # id 2 had no rows in batch 1: its timeout fired there
    assert comparable(our_progress) == comparable(their_progress)


def fails_on_id_3(key, frames, state):
    if key[0] == 3:
        raise ValueError("no id 3 here")
    yield from first_rows(key, frames, state)


def wrong_columns(key, frames, state):
    yield pd.DataFrame({"id": [key[0]], "count": [1], "timedout": [False]})


def too_few_columns(key, frames, state):
    yield pd.DataFrame({"id": [key[0]]})


def start_failing(session, events, ckpt, func, state="seen INT"):
    """The query over ``func``; the error it ends with."""
    frame = session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
    query = (frame.groupBy("id").applyInPandasWithState(func, OUTPUT, state, "append",
                                                        GroupStateTimeout.NoTimeout)
             .writeStream.format("noop").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as raised:
        query.awaitTermination(300)
    return raised.value


def test_a_failing_function_commits_nothing_and_a_fixed_one_resumes(spark, ss, events, tmp_path):
    chained.CASES["fixed"] = ("append", lambda f: f.groupBy("id").applyInPandasWithState(
        first_rows, OUTPUT, "seen INT", "append", GroupStateTimeout.NoTimeout))
    assert "no id 3 here" in str(start_failing(ss, events, tmp_path / "microbatch", fails_on_id_3))
    done = sorted(p.name for p in (tmp_path / "microbatch" / "commits").iterdir())
    assert done == ["0"]   # batch 1 (the first with id 3) did not commit
    resumed, _ = run(ss, events, tmp_path / "microbatch", "fixed")
    whole, _ = run(ss, events, tmp_path / "one-run", "fixed")
    assert [b for b, _ in resumed][0] == 1 and resumed == whole[1:]
    # a column name the output schema does not have: PySpark gives nulls for the missing
    # column; microbatch stops and names the columns (documented in pyspark-compatibility)
    ours = start_failing(ss, events, tmp_path / "microbatch-wrong", wrong_columns)
    assert "RESULT_COLUMN_NAMES_MISMATCH" in str(ours)
    assert "Missing: n." in str(ours) and "Unexpected: count." in str(ours)
    assert not (tmp_path / "microbatch-wrong" / "commits" / "0").exists()
    # a wrong number of columns: PySpark's error, on both engines
    theirs = start_failing(spark, events, tmp_path / "spark-short", too_few_columns)
    ours = start_failing(ss, events, tmp_path / "microbatch-short", too_few_columns)
    for raised in (theirs, ours):
        assert "RESULT_COLUMN_SCHEMA_MISMATCH" in str(raised)


def sets_a_timeout_without_a_conf(key, frames, state):
    state.setTimeoutDuration(1000)
    yield pd.DataFrame({"id": [key[0]], "n": [1], "timedout": [False]})


def test_a_changed_state_schema_is_refused_and_a_timeout_needs_its_conf(ss, events, tmp_path):
    chained.CASES["fixed"] = ("append", lambda f: f.groupBy("id").applyInPandasWithState(
        first_rows, OUTPUT, "seen INT", "append", GroupStateTimeout.NoTimeout))
    run(ss, events, tmp_path / "ckpt", "fixed")
    before = sorted(p.name for p in (tmp_path / "ckpt" / "offsets").iterdir())
    raised = start_failing(ss, events, tmp_path / "ckpt", first_rows, state="seen LONG")
    assert "stateful operator 0 (applyInPandasWithState)" in str(raised)
    assert "the value schema was struct<groupState:struct<seen:int>,timeoutTimestamp:bigint>" in str(raised)
    assert sorted(p.name for p in (tmp_path / "ckpt" / "offsets").iterdir()) == before
    raised = start_failing(ss, events, tmp_path / "no-conf", sets_a_timeout_without_a_conf)
    assert "CANNOT_WITHOUT" in str(raised) and "enabling processing time timeout" in str(raised)
    assert not (tmp_path / "no-conf" / "commits" / "0").exists()
