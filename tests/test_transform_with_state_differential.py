"""transformWithStateInPandas and transformWithState on microbatch next to Spark's own
engine, batch by batch: a processor with value, list and map state and event-time timers
(rows, late rows, timers fired at the batch Spark fires them, the operator's progress with
Spark's row counts and timer metrics), the Row API, a time mode without timers, and a
restart in the middle."""
from __future__ import annotations

import json

import sys

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ListState, MapState, ValueState

import test_chained_differential as chained
from helpers import ci_share, confs
from stream_events import comparable, first_batches
from test_chained_differential import restarts_with_the_same_answer, run

# the processors below run in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUTPUT = "id INT, n LONG, times LONG, secs LONG, timers LONG, wm LONG, fired LONG"
TIMER_METRICS = ("numRegisteredTimers", "numDeletedTimers", "numValueStateVars", "numListStateVars",
                 "numMapStateVars")


class Tracker(StatefulProcessor):
    """Per id: a count (value state), every event time (list state), hits per second of the
    minute (map state); a timer 15 s of event time after the latest event clears them all."""

    def init(self, handle):
        assert isinstance(handle, StatefulProcessorHandle)
        self.handle = handle
        self.count = handle.getValueState("count", "n LONG")
        self.times = handle.getListState("times", "ts TIMESTAMP")
        self.seen = handle.getMapState("seen", "sec INT", "hits LONG")
        assert isinstance(self.count, ValueState) and isinstance(self.times, ListState) \
            and isinstance(self.seen, MapState)

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        latest = None
        for frame in rows:
            n += len(frame)
            self.times.appendList([(ts.to_pydatetime(),) for ts in frame["ts"]])
            for ts in frame["ts"]:
                old = self.seen.getValue((ts.second,))
                self.seen.updateValue((ts.second,), ((old[0] if old else 0) + 1,))
                latest = ts if latest is None else max(latest, ts)
        self.count.update((n,))
        self.handle.registerTimer(int(latest.timestamp() * 1000) + 15000)
        yield pd.DataFrame({"id": [key[0]], "n": [n], "times": [len(list(self.times.get()))],
                            "secs": [len(list(self.seen.keys()))], "timers": [len(list(self.handle.listTimers()))],
                            "wm": [timerValues.getCurrentWatermarkInMs()], "fired": [-1]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n = self.count.get()[0] if self.count.exists() else -1
        self.count.clear()
        self.times.clear()
        self.seen.clear()
        yield pd.DataFrame({"id": [key[0]], "n": [n], "times": [0], "secs": [0],
                            "timers": [len(list(self.handle.listTimers()))],
                            "wm": [timerValues.getCurrentWatermarkInMs()],
                            "fired": [expiredTimerInfo.getExpiryTimeInMs()]})

    def close(self):
        pass


class RowTracker(StatefulProcessor):
    """The Row API: per id, the rows seen and the latest event time (value state), each map
    entry a second of the minute; a timer 15 s after the latest event reports and clears."""

    def init(self, handle):
        self.handle = handle
        self.state = handle.getValueState("state", "n LONG, latest LONG")
        self.seen = handle.getMapState("seen", "sec INT", "hits LONG")

    def handleInputRows(self, key, rows, timerValues):
        n, latest = self.state.get() if self.state.exists() else (0, None)
        for row in rows:
            assert isinstance(row, Row) and row.ts.tzinfo is not None   # PySpark's Row API: aware, in UTC
            n += 1
            ms = int(row.ts.timestamp() * 1000)
            latest = ms if latest is None else max(latest, ms)
            old = self.seen.getValue((row.ts.second,))
            self.seen.updateValue((row.ts.second,), ((old[0] if old else 0) + 1,))
        self.state.update((n, latest))
        self.handle.registerTimer(latest + 15000)
        yield Row(id=key[0], n=n, latest=latest, secs=len(list(self.seen.keys())), fired=-1)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n, latest = self.state.get() if self.state.exists() else (-1, None)
        self.state.clear()
        self.seen.clear()
        yield Row(id=key[0], n=n, latest=latest, secs=0, fired=expiredTimerInfo.getExpiryTimeInMs())

    def close(self):
        pass


class RunningCount(StatefulProcessor):
    """No time mode: a running count per id, and the ids seen with it in the map."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG")
        self.firsts = handle.getListState("firsts", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        assert (timerValues.getCurrentProcessingTimeInMs(), timerValues.getCurrentWatermarkInMs()) == (-1, -1)
        n = self.count.get()[0] if self.count.exists() else 0
        added = sum(len(frame) for frame in rows)
        if n == 0:
            self.firsts.appendValue((added,))
        if n + added >= 3:
            self.count.clear()
            self.firsts.clear()
        else:
            self.count.update((n + added,))
        yield pd.DataFrame({"id": [key[0]], "n": [n + added]})

    def close(self):
        pass


class FromInitialCounts(StatefulProcessor):
    """A running count per id that starts from the initial state's ``start``."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG")

    def handleInitialState(self, key, initialState, timerValues):
        self.count.update((int(initialState["start"].iloc[0]),))

    def handleInputRows(self, key, rows, timerValues):
        n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(frame) for frame in rows)
        self.count.update((n,))
        yield pd.DataFrame({"id": [key[0]], "n": [n]})

    def close(self):
        pass


class RowsFromInitialCounts(FromInitialCounts):
    def handleInitialState(self, key, initialState, timerValues):
        assert isinstance(initialState, Row) and initialState.id == key[0]
        self.count.update((initialState.start,))

    def handleInputRows(self, key, rows, timerValues):
        n = (self.count.get()[0] if self.count.exists() else 0) + sum(1 for _ in rows)
        self.count.update((n,))
        yield Row(id=key[0], n=n)


class Expiring(StatefulProcessor):
    """State with TTLs (processing time): ``last``, ``hist`` and ``seen`` expire by the next
    batch (1 ms), ``kept`` lives an hour."""

    def init(self, handle):
        self.handle = handle
        self.last = handle.getValueState("last", "n LONG", 1)
        self.kept = handle.getValueState("kept", "n LONG", 3_600_000)
        self.hist = handle.getListState("hist", "n LONG", 1)
        self.seen = handle.getMapState("seen", "k INT", "v LONG", 1)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(frame) for frame in rows)
        kept = self.kept.get()
        out = {"id": [key[0]], "last": [self.last.exists()], "kept": [kept[0] if kept else -1],
               "hist": [len(list(self.hist.get()))], "seen": [len(list(self.seen.keys()))]}
        self.last.update((n,))
        self.kept.update(((kept[0] if kept else 0) + n,))
        self.hist.appendValue((n,))
        self.hist.appendValue((n + 1,))
        self.seen.updateValue((1,), (n,))
        self.seen.updateValue((2,), (n,))
        # a processing-time timer: the next batch's timestamp is later, so it fires then
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield pd.DataFrame({**out, "fired": [False]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        assert expiredTimerInfo.getExpiryTimeInMs() <= timerValues.getCurrentProcessingTimeInMs()
        yield pd.DataFrame({"id": [key[0]], "last": [self.last.exists()], "kept": [-1], "hist": [-1],
                            "seen": [-1], "fired": [True]})

    def close(self):
        pass


def initial_counts():
    from pyspark.sql import SparkSession
    spark = SparkSession.getActiveSession()
    return spark.createDataFrame([(1, 100), (3, 300), (9, 900)], "id INT, start LONG").groupBy("id")


def unordered_maps(row) -> str:
    """A row as text, a map's entries in sorted order (Spark's follow its store's byte order)."""
    values = row.asDict(recursive=True)
    return repr({k: sorted(v.items(), key=repr) if isinstance(v, dict) and k == "map_value" else v
                 for k, v in values.items()})


def known_ids(frame):
    return frame.where("id IS NOT NULL")   # Spark calls a null key twice in a batch (a Spark bug)


CASES = {
    "value, list and map state, event-time timers (pandas)": (
        "append", lambda f: known_ids(f).withWatermark("ts", "10 seconds").groupBy("id")
        .transformWithStateInPandas(Tracker(), OUTPUT, "append", "EventTime")),
    "value and map state, event-time timers (Rows)": (
        "append", lambda f: known_ids(f).withWatermark("ts", "10 seconds").groupBy("id")
        .transformWithState(RowTracker(), "id INT, n LONG, latest LONG, secs LONG, fired LONG",
                            "append", "EventTime")),
    "no time mode, update": (
        "update", lambda f: known_ids(f).groupBy("id").transformWithStateInPandas(
            RunningCount(), "id INT, n LONG", "update", "None")),
    "initial state, update": (
        "update", lambda f: known_ids(f).groupBy("id").transformWithStateInPandas(
            FromInitialCounts(), "id INT, n LONG", "update", "None", initialState=initial_counts())),
    "initial state, Rows, append": (
        "append", lambda f: known_ids(f).groupBy("id").transformWithState(
            RowsFromInitialCounts(), "id INT, n LONG", "append", "None", initialState=initial_counts())),
}
chained.CASES.update(CASES)


def run_on_spark(spark, events, ckpt, case):
    """Spark's transformWithState runs only on its RocksDB state store."""
    with confs(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}):
        return run(spark, events, ckpt, case)


@pytest.mark.parametrize("case", ci_share(list(CASES)))   # half in CI's run (helpers.ci_share)
def test_transform_with_state_matches_spark_batch_by_batch(spark, ss, events, tmp_path, case):
    theirs, their_progress = run_on_spark(spark, events, tmp_path / "spark", case)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", case)
    assert ours == theirs
    assert sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress, TIMER_METRICS) == comparable(their_progress, TIMER_METRICS)
    if "timers" in case:   # a timer fired, after the rows of its batch, in a no-data batch too
        assert any(row[-1] != -1 for _, rows in ours for row in rows)
        assert len(ours) == 5 and ours[-1][1] and our_progress[-1]["numInputRows"] == 0
    if case.startswith("value, list and map"):   # the state reader, with Spark's options and columns
        readings = [{"stateVarName": name, "flattenCollectionTypes": flatten, "batchId": "2"}
                    for name in ("count", "times", "seen") for flatten in ("true", "false")]
        readings.append({"readRegisteredTimers": "true", "batchId": "2"})
        for options in readings:
            theirs = spark.read.format("statestore").options(**options).load(str(tmp_path / "spark"))
            ours = ss.read.format("statestore").options(**options).load(str(tmp_path / "microbatch"))
            assert ours.schema == theirs.schema, options
            assert sorted(map(unordered_maps, ours.collect())) == sorted(map(unordered_maps, theirs.collect())), options


TTL_METRICS = ("numValuesRemovedDueToTTLExpiry", "numValueStateVars", "numValueStateWithTTLVars",
               "numListStateWithTTLVars", "numMapStateWithTTLVars")


def expiring_per_id(frame):
    return known_ids(frame).groupBy("id").transformWithStateInPandas(
        Expiring(), "id INT, last BOOLEAN, kept LONG, hist LONG, seen LONG, fired BOOLEAN", "update",
        "ProcessingTime")


def test_state_ttl_and_processing_time_timers_as_spark_does(spark, ss, events, tmp_path):
    """Values written with a 1 ms TTL are gone by the next batch (its timestamp is later),
    read as absent and then evicted at the end of the batch; Spark's counts of the
    evictions and of the TTL variables. A timer 1 ms after a batch's timestamp fires in
    the next batch. Both engines on their RocksDB providers (the same conf value)."""
    with confs(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}):
        theirs, their_progress = first_batches(spark, events, tmp_path / "spark", 5, expiring_per_id)
        ours, our_progress = first_batches(ss, events, tmp_path / "microbatch", 5, expiring_per_id)
    recorded = json.loads((tmp_path / "microbatch" / "offsets" / "0").read_text().split("\n")[1])["conf"]
    assert recorded["spark.sql.streaming.stateStore.providerClass"] == "microbatch.state.rocksdb.RocksDBStateStoreProvider"
    assert ours == theirs and (1, False, 2, 0, 0, False) in ours[1][1]
    assert (2, False, -1, -1, -1, True) in ours[1][1]   # batch 0's timer fired in batch 1
    assert comparable(our_progress, TTL_METRICS) == comparable(their_progress, TTL_METRICS)
    assert our_progress[4]["stateOperators"][0]["customMetrics"]["numValuesRemovedDueToTTLExpiry"] == 10


def test_a_restart_in_the_middle_gives_the_same_answer(ss, events, tmp_path):
    second = restarts_with_the_same_answer(ss, events, tmp_path, "value, list and map state, event-time timers (pandas)")
    assert any(row[-1] != -1 for _, rows in second for row in rows)


class FailsOnId3(RunningCount):
    def handleInputRows(self, key, rows, timerValues):
        if key[0] == 3:
            raise ValueError("no id 3 here")
        yield from super().handleInputRows(key, rows, timerValues)


class IntCount(RunningCount):
    def init(self, handle):
        self.count = handle.getValueState("count", "n INT")
        self.firsts = handle.getListState("firsts", "n LONG")


class WithTtl(RunningCount):
    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG", ttlDurationMs=60_000)


def test_a_failing_processor_commits_nothing_and_a_fixed_one_resumes(ss, events, tmp_path):
    chained.CASES["fails"] = ("update", lambda f: known_ids(f).groupBy("id").transformWithStateInPandas(
        FailsOnId3(), "id INT, n LONG", "update", "None"))
    frame = ss.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
    query = (chained.CASES["fails"][1](frame).writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as raised:
        query.awaitTermination(300)
    assert "no id 3 here" in str(raised.value)
    assert sorted(p.name for p in (tmp_path / "ckpt" / "commits").iterdir()) == ["0"]
    resumed, _ = run(ss, events, tmp_path / "ckpt", "no time mode, update")
    whole, _ = run(ss, events, tmp_path / "one-run", "no time mode, update")
    assert [b for b, _ in resumed][0] == 1 and resumed == whole[1:]
    # the same checkpoint with a state variable of another type: refused at start, naming both
    changed = (ss.readStream.schema("id INT, ts TIMESTAMP").json(events).groupBy("id")
               .transformWithStateInPandas(IntCount(), "id INT, n LONG", "update", "None"))
    query = (changed.writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as raised:
        query.awaitTermination(120)
    # Spark's refusal (its default unsafe-row encoding lets no value schema evolve), naming both
    assert "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE]" in str(raised.value)
    assert "Existing value_schema=StructType(StructField(n,LongType,true)) and new " \
           "value_schema=StructType(StructField(n,IntegerType,true))" in str(raised.value)


def test_what_spark_refuses_is_refused_when_the_query_is_defined(ss, events):
    from pyspark.errors import AnalysisException

    from microbatch.errors import IllegalArgumentException
    frame = ss.readStream.schema("id INT, ts TIMESTAMP").json(events).groupBy("id")
    with pytest.raises(AnalysisException, match=r"Cannot use TTL for state=count in timeMode=NoTime"):
        frame.transformWithStateInPandas(WithTtl(), "id INT, n LONG", "update", "None")
    with pytest.raises(AnalysisException, match="grouped by 2 column"):
        frame.transformWithStateInPandas(RunningCount(), "id INT, n LONG", "update", "None",
                                         initialState=ss.spark.range(1).groupBy("id", "id"))
    with pytest.raises(IllegalArgumentException, match="Unknown time mode"):
        frame.transformWithStateInPandas(RunningCount(), "id INT, n LONG", "update", "Wallclock")


class ForgetsCounts(RunningCount):
    """RunningCount that drops its ``count`` variable (every key's) when it starts, and asks
    for it again (as in Spark, a deleted variable is unusable until then)."""

    def init(self, handle):
        super().init(handle)
        handle.deleteIfExists("count")
        self.count = handle.getValueState("count", "n LONG")


def test_delete_if_exists_drops_a_state_variable_of_every_key(ss, tmp_path):
    from microbatch import MemoryStream
    ms = MemoryStream(ss, "id INT")

    def start(processor, name):
        frame = ms.toDF().groupBy("id").transformWithStateInPandas(processor, "id INT, n LONG", "update", "None")
        return (frame.writeStream.format("memory").queryName(name).outputMode("update")
                .option("checkpointLocation", str(tmp_path / "ckpt")).start())

    query = start(RunningCount(), "counts")
    ms.addData([1, 2])
    query.processAllAvailable()
    ms.addData([1])
    query.processAllAvailable()
    query.stop()
    assert sorted(map(tuple, ss.spark.table("counts").collect())) == [(1, 1), (1, 2), (2, 1)]
    query = start(ForgetsCounts(), "forgotten")
    ms.addData([2])
    query.processAllAvailable()
    query.stop()
    assert [tuple(r) for r in ss.spark.table("forgotten").collect()] == [(2, 1)]   # counting again from 0
    progress = query.lastProgress["stateOperators"][0]
    assert progress["customMetrics"]["numDeletedStateVars"] == 2   # once per state partition
