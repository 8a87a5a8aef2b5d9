"""The shapes PySpark's own arbitrary-state tests use (``pyspark_suites/``), on microbatch
next to Spark's own engine: applyInPandasWithState grouped by a Column or an expression,
transformWithState with ``eventTimeColumnName`` and an operator chained after it, state
schema evolution (and its refusals), ``deleteIfExists``, map state with struct keys and
nested values, the pandas timestamps and timer values of an event-time processor, the
Arrow chunks a key's rows come in, and every sink's ``numOutputRows``."""
from __future__ import annotations

import os
import sys
import time

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

import test_chained_differential as chained
from helpers import confs
from stream_events import comparable, id_and_time, write_event_files
from test_chained_differential import run, same_as_spark

# the functions below run in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TWS_METRICS = ("numValueStateVars", "numMapStateVars", "numDeletedStateVars", "numRegisteredTimers")


def known_ids(frame):
    return frame.where("id IS NOT NULL")   # Spark calls a null key twice in a batch (a Spark bug)


def on_spark(spark, settings, call):
    """``call()`` with Spark's session set to ``settings`` (its transformWithState runs only
    on its RocksDB state store)."""
    with confs(spark, settings):
        return call()


# -- applyInPandasWithState grouped by what PySpark accepts ---------------------------------
def rows_and_columns(key, frames, state):
    """Per key: the rows seen so far, and the columns the function's DataFrames have."""
    n = state.get[0] if state.exists else 0
    columns = ""
    for frame in frames:
        n += len(frame)
        columns = ",".join(frame.columns)
    state.update((n,))
    yield pd.DataFrame({"key": [str(key[0])], "n": [n], "columns": [columns]})


GROUPINGS = {
    "a Column of the stream": lambda f: f.groupBy(f["id"]),
    "a column name in another case": lambda f: f.groupBy("ID"),
}


def grouped_count(group):
    return lambda f: group(known_ids(f)).applyInPandasWithState(
        rows_and_columns, "key STRING, n LONG, columns STRING", "n LONG", "update", GroupStateTimeout.NoTimeout)


@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_apply_in_pandas_with_state_grouped_by_what_pyspark_accepts(spark, ss, events, tmp_path, grouping):
    case = f"applyInPandasWithState grouped by {grouping}"
    ours, _ = same_as_spark(spark, ss, events, tmp_path, case, ("update", grouped_count(GROUPINGS[grouping])))
    assert {row[2] for _, rows in ours for row in rows} == {"id,ts"}


def test_grouping_by_an_expression_is_refused_as_spark_refuses_it(spark, ss, events):
    """Spark 4.3 cannot resolve an expression key of applyInPandasWithState or
    transformWithState (on its own engine and in batch): the same error here."""
    by_expression = grouped_count(lambda f: f.groupBy(F.col("id") % 2))
    messages = []
    for session in (spark, ss):
        frame = session.readStream.schema("id INT, ts TIMESTAMP").json(events)
        with pytest.raises(Exception, match=r"UNRESOLVED_COLUMN") as raised:
            by_expression(frame)
        messages.append(str(raised.value).split("SQLSTATE")[0])
        with pytest.raises(Exception, match=r"UNRESOLVED_COLUMN"):
            frame.groupBy(F.col("id") % 2).transformWithStateInPandas(CountAndName(), "id INT, before STRING",
                                                                      "update", "None")
    assert messages[0] == messages[1]


# -- transformWithState with eventTimeColumnName --------------------------------------------
class LatestPerBatch(StatefulProcessor):
    """Per id and batch, the latest event time of its rows, as the output's event time."""

    def init(self, handle):
        self.seen = handle.getValueState("seen", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        latest, n = None, self.seen.get()[0] if self.seen.exists() else 0
        for frame in rows:
            n += len(frame)
            latest = frame["ts"].max() if latest is None else max(latest, frame["ts"].max())
        self.seen.update((n,))
        yield pd.DataFrame({"id": [key[0]], "latest": [latest], "n": [n]})

    def close(self):
        pass


class OneOldRow(LatestPerBatch):
    """Emits a row of 1970 once the watermark moved: older than the watermark for late rows."""

    def handleInputRows(self, key, rows, timerValues):
        for row in super().handleInputRows(key, rows, timerValues):
            if timerValues.getCurrentWatermarkInMs() > 0:
                row["latest"] = pd.Timestamp("1970-01-01 00:00:01")
            yield row


def latest_per_batch(frame, processor=None, watermark=True):
    frame = known_ids(frame)
    if watermark:
        frame = frame.withWatermark("ts", "10 seconds")
    return frame.groupBy("id").transformWithStateInPandas(
        processor or LatestPerBatch(), "id INT, latest TIMESTAMP, n LONG", "append", "EventTime",
        eventTimeColumnName="latest")


def test_an_aggregation_over_transform_with_states_event_time_matches_spark(spark, ss, events, tmp_path):
    """The output's event-time column carries the watermark on: a windowed count in append
    mode above it gets the processor's watermarks (late rows, eviction), as in Spark."""
    case = "a window count over transformWithState's event time"
    chained.CASES[case] = ("append", lambda f: latest_per_batch(f).groupBy(F.window("latest", "20 seconds")).count())
    theirs, their_progress = on_spark(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB},
                                      lambda: run(spark, events, tmp_path / "spark", case))
    ours, our_progress = run(ss, events, tmp_path / "microbatch", case)
    assert ours == theirs and any(rows for _, rows in ours)
    assert comparable(our_progress) == comparable(their_progress)
    assert [op["operatorName"] for op in our_progress[0]["stateOperators"]] == \
        ["stateStoreSave", "transformWithStateInPandasExec"]
    template = latest_per_batch(ss.readStream.schema("id INT, ts TIMESTAMP").json(events))
    assert template.schema["latest"].metadata == {"spark.watermarkDelayMs": 10000}


def test_transform_with_states_event_time_refusals_are_sparks(spark, ss, events, tmp_path):
    """No watermark below: refused when defined. A row older than the watermark for late
    rows: the query fails, naming the row's event time and the watermark."""
    for session in (spark, ss):
        frame = session.readStream.schema("id INT, ts TIMESTAMP").json(events)
        with pytest.raises(Exception, match=r"CANNOT_ASSIGN_EVENT_TIME_COLUMN_WITHOUT_WATERMARK"):
            latest_per_batch(frame, watermark=False)
    errors = []
    for session, name in ((spark, "spark"), (ss, "microbatch")):
        frame = session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
        query = (latest_per_batch(frame, OneOldRow()).writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True))
        started = on_spark(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}, query.start) \
            if session is spark else query.start()
        with pytest.raises(Exception) as raised:
            started.awaitTermination(120)
        errors.append(str(raised.value))
    for error in errors:
        assert "EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED" in error
        assert "Previous node emitted a row with eventTime=1000000 which is older than " \
               "current_watermark_value=1767225610000" in error


# -- state schema evolution -------------------------------------------------------------------
class CountAndName(StatefulProcessor):
    """A value state of (n INT, name STRING); the output is what it read and wrote."""

    schema = "n INT, name STRING"

    def init(self, handle):
        self.state = handle.getValueState("state", self.schema)

    def handleInputRows(self, key, rows, timerValues):
        before = self.state.get()
        n = sum(len(frame) for frame in rows)
        self.state.update(self.written(key, before, n))
        yield pd.DataFrame({"id": [key[0]], "before": [repr(tuple(before)) if before else ""]})

    def written(self, key, before, n):
        return ((before[0] if before else 0) + n, f"id-{key[0]}")

    def close(self):
        pass


class ReorderedWidenedAdded(CountAndName):
    """The same state with its fields reordered, ``n`` widened to LONG and a field added."""

    schema = "name STRING, score DOUBLE, n LONG"

    def written(self, key, before, n):
        name, score, count = before if before else (None, None, 0)
        return (f"{name}+", (score or 0.0) + 0.5, count + n)


class Narrowed(CountAndName):
    """``n`` back to INT: Avro cannot read a LONG as INT."""

    schema = "n INT, name STRING"


def evolve(session, spark, directory, ckpt, processor, files, encoding):
    """Runs ``processor`` over the first ``files`` event files (adding what is missing to
    ``directory``) on ``session``'s engine (``spark``: the SparkSession its confs are set
    on; Spark's own engine on its RocksDB store); its batches."""
    import json

    from stream_events import EVENTS
    for i in range(files):
        path = directory / f"f{i}.json"
        if not path.exists():
            path.write_text("".join(json.dumps({"id": k, "ts": f"2026-01-01 {t}"}) + "\n" for k, t in EVENTS[i]))
            os.utime(path, (time.time() - 10_000 + i,) * 2)
    batches = []
    frame = known_ids(session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
                      .json(str(directory)))
    query = (frame.groupBy("id").transformWithStateInPandas(processor, "id INT, before STRING", "update", "None")
             .writeStream.outputMode("update")
             .foreachBatch(lambda df, i: batches.append((i, sorted(map(tuple, df.collect())))))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True))
    settings = {"spark.sql.streaming.stateStore.encodingFormat": encoding}
    if session is spark:
        settings["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB
    on_spark(spark, settings, query.start).awaitTermination(180)
    return batches


def test_state_schema_evolution_with_avro_matches_spark(spark, ss, tmp_path):
    """With Avro encoding a value state's fields may be reordered, widened and added across
    restarts (each read by name, the added one null); narrowing one back is refused with
    Spark's error, on either engine."""
    results = {}
    for session, name in ((spark, "spark"), (ss, "microbatch")):
        directory, ckpt = tmp_path / f"events-{name}", tmp_path / f"ckpt-{name}"
        directory.mkdir()
        first = evolve(session, spark, directory, ckpt, CountAndName(), 2, "avro")
        second = evolve(session, spark, directory, ckpt, ReorderedWidenedAdded(), 3, "avro")
        with pytest.raises(Exception) as refused:   # (Spark checks when a batch runs: one more file)
            evolve(session, spark, directory, ckpt, Narrowed(), 4, "avro")
        results[name] = (first, second, str(refused.value))
    assert results["microbatch"][:2] == results["spark"][:2]
    assert ("3", "('id-3', None, 1)") in [(str(i), b) for _, rows in results["microbatch"][1] for i, b in rows]
    for name in results:
        assert "[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION] Schema evolution is not possible" in results[name][2]


def test_a_changed_state_schema_without_avro_is_refused_as_spark_refuses_it(spark, ss, tmp_path):
    """Spark's default encoding has no evolution: another value schema is refused, naming both."""
    for session, name in ((spark, "spark"), (ss, "microbatch")):
        directory, ckpt = tmp_path / f"events-{name}", tmp_path / f"ckpt-{name}"
        directory.mkdir()
        evolve(session, spark, directory, ckpt, CountAndName(), 1, "unsaferow")
        with pytest.raises(Exception) as refused:
            evolve(session, spark, directory, ckpt, ReorderedWidenedAdded(), 2, "unsaferow")
        assert "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema does not match existing " \
               "state value schema." in str(refused.value), name
        assert "StructField(score,DoubleType,true)" in str(refused.value)


# -- deleteIfExists, nested values and struct map keys ---------------------------------------------
class DeletesAndNests(StatefulProcessor):
    """A ``tmp`` value state deleted in init (using it fails as PySpark fails), a map state
    with struct keys (given as a plain string, as PySpark's tests do) and nested values."""

    def init(self, handle):
        self.tmp = handle.getValueState("tmp", "n LONG")
        handle.deleteIfExists("tmp")
        self.nested = handle.getValueState(
            "nested", "ids ARRAY<INT>, tags MAP<STRING, ARRAY<INT>>, where ARRAY<STRUCT<road: INT, city: STRING>>")
        self.map = handle.getMapState("map", "name STRING", "seen LONG, at ARRAY<TIMESTAMP>")

    def handleInputRows(self, key, rows, timerValues):
        try:
            self.tmp.exists()
            failure = ""
        except PySparkRuntimeError as e:
            failure = str(e).split(":")[0]
        times = [t.to_pydatetime() for frame in rows for t in frame["ts"]]
        if self.nested.exists():
            ids, tags, where = self.nested.get()
            assert all(isinstance(w, Row) for w in where)
        else:
            ids, tags, where = [], {}, []
        ids = ids + [len(times)]
        tags = {**tags, f"b{len(ids)}": ids}
        where = where + [(len(ids), f"city-{key[0]}")]
        self.nested.update((ids, tags, where))
        name = str(key[0])[0]   # one character: PySpark takes the string as the struct's fields
        old = self.map.getValue(name)
        self.map.updateValue(name, ((old.seen if old else 0) + len(times), sorted((old.at if old else []) + times)))
        entries = sorted((k, v[0], len(v[1])) for k, v in self.map.iterator())
        yield pd.DataFrame({"id": [key[0]], "failure": [failure], "ids": [repr(ids)],
                            "tags": [repr(sorted(tags.items()))], "where": [repr(where[-1])],
                            "entries": [repr(entries)]})

    def close(self):
        pass


def test_deleted_state_nested_values_and_struct_map_keys_match_spark(spark, ss, events, tmp_path):
    case = "deleteIfExists, nested values, struct map keys"
    chained.CASES[case] = ("update", lambda f: known_ids(f).groupBy("id").transformWithStateInPandas(
        DeletesAndNests(), "id INT, failure STRING, ids STRING, tags STRING, where STRING, entries STRING",
        "update", "None"))
    theirs, their_progress = on_spark(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB},
                                      lambda: run(spark, events, tmp_path / "spark", case))
    ours, our_progress = run(ss, events, tmp_path / "microbatch", case)
    assert ours == theirs
    assert {row[1] for _, rows in ours for row in rows} == {"Error checking value state exists"}
    assert comparable(our_progress, TWS_METRICS) == comparable(their_progress, TWS_METRICS)
    assert our_progress[0]["stateOperators"][0]["customMetrics"]["numDeletedStateVars"] > 0


# -- what a pandas processor gets: timestamps, timer values, chunks -------------------------------
class Chunks(StatefulProcessor):
    """Per key: the sizes of the DataFrames its rows came in, their event times as pandas
    gives them (int64 of a datetime64), and the timer values."""

    def init(self, handle):
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        sizes, stamps = [], []
        for frame in rows:
            sizes.append(len(frame))
            stamps += (frame["ts"].astype("int64") // 10**9).tolist()
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs() + 1)
        yield pd.DataFrame({"id": [key[0]], "sizes": [repr(sizes)], "stamps": [repr(sorted(stamps))],
                            "wm": [timerValues.getCurrentWatermarkInMs()], "fired": [-1]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"id": [key[0]], "sizes": [""], "stamps": [""],
                            "wm": [timerValues.getCurrentWatermarkInMs()],
                            "fired": [expiredTimerInfo.getExpiryTimeInMs()]})

    def close(self):
        pass


@pytest.mark.parametrize("limit", [{"spark.sql.execution.arrow.maxRecordsPerBatch": "2"},
                                   {"spark.sql.execution.arrow.maxBytesPerBatch": "30"}])
def test_a_keys_chunks_timestamps_and_timer_values_match_spark(spark, ss, tmp_path, limit):
    many = [[(i % 2, f"00:00:{10 + j:02d}") for j in range(5) for i in range(2)],
            [(0, "00:00:30"), (1, "00:00:31"), (0, "00:00:32")], [(1, "00:00:50")]]
    events_dir = write_event_files(tmp_path / "many", many, id_and_time)
    case = f"chunks {limit}"
    chained.CASES[case] = ("update", lambda f: known_ids(f).withWatermark("ts", "5 seconds").groupBy("id")
                           .transformWithStateInPandas(Chunks(), "id INT, sizes STRING, stamps STRING, wm LONG, "
                                                       "fired LONG", "update", "EventTime"))
    theirs, _ = on_spark(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB, **limit},
                         lambda: run(spark, events_dir, tmp_path / "spark", case))
    with confs(ss.spark, limit):
        ours, _ = run(ss, events_dir, tmp_path / "microbatch", case)
    assert ours == theirs
    assert any(row[1].count(",") >= 1 for _, rows in ours for row in rows)   # a key's rows came in chunks
    assert any(row[4] != -1 for _, rows in ours for row in rows)             # and a timer fired


# -- numOutputRows of every sink ---------------------------------------------------------------
SINKS = {
    "noop": lambda w, d: w.format("noop"),
    "console": lambda w, d: w.format("console").option("numRows", 2),
    "memory": lambda w, d: w.format("memory").queryName(f"rows_{os.path.basename(d)}"),
    "foreachBatch": lambda w, d: w.foreachBatch(lambda df, i: df.count()),
    "foreach": lambda w, d: w.foreach(lambda row: None),
    "parquet": lambda w, d: w.format("parquet").option("path", f"{d}/out"),
}


@pytest.mark.parametrize("sink", list(SINKS))
def test_each_sinks_num_output_rows_is_sparks(spark, ss, events, tmp_path, sink):
    reported = {}
    for session, name in ((spark, "spark"), (ss, "microbatch")):
        frame = session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
        writer = frame.writeStream.option("checkpointLocation", str(tmp_path / name / "ckpt")) \
            .trigger(availableNow=True)
        query = SINKS[sink](writer, str(tmp_path / name)).start()
        query.awaitTermination(120)
        reported[name] = [(p["numInputRows"], p["sink"]["numOutputRows"]) for p in query.recentProgress]
    assert reported["microbatch"] == reported["spark"]
    assert any(rows for rows, _ in reported["microbatch"])
