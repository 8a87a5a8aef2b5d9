"""A query Spark's engine ran moves to microbatch with its state (runtime/spark_state.py),
from either of Spark's providers (HDFS-backed; RocksDB, with and without changelogs):
some batches run on Spark's engine; the checkpoint is copied; the copy continues on
Spark's engine and the original on microbatch, over the same new files. Every later
batch's rows, progress (watermark, state rows) and the logs' watermarks are equal."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from pyspark.sql import functions as F

from pyspark.sql.streaming.state import GroupStateTimeout

from helpers import collect_batches, confs, json_stream
from stream_events import comparable, watermarks, write_event_files
from test_group_state_differential import OUTPUT as GROUP_STATE_OUTPUT, count_until_quiet, first_rows

#: a separate bounded step (make test-porting): moving state between the engines
pytestmark = pytest.mark.porting

SCHEMA = "id INT, ts TIMESTAMP, v DOUBLE"
EVENTS = [
    [(1, "00:00:10", 1.0), (2, "00:00:20", 2.0), (1, "00:00:10", 3.0), (None, "00:00:12", 4.0)],
    [(1, "00:00:11", 5.0), (3, "00:00:40", 6.0), (None, "00:00:12", None)],
    [(2, "00:00:20", 7.0), (4, "00:00:05", 8.0), (5, "00:00:41", 9.0), (3, "00:00:45", 1.5)],
    [(6, "00:01:40", 2.5), (3, "00:00:40", 3.5), (7, "00:01:20", 4.5)],
    [(8, "00:02:10", 5.5), (6, "00:01:41", 6.5), (1, "00:00:10", 7.5)],
    [(9, "00:03:00", 8.5), (8, "00:02:15", 9.5)],
]
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SPARK_HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
#: batches run on Spark's engine before the move
BEFORE = 3

CASES = {
    "a window count in append mode": (
        lambda f: f.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count(), "append"),
    "sums, averages and maxima per key in update mode": (
        lambda f: f.groupBy("id").agg(F.count("*").alias("n"), F.sum("v").alias("total"), F.avg("v").alias("mean"),
                                      F.max("ts").alias("last")), "update"),
    "dropDuplicates with a watermark": (
        lambda f: f.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"]), "append"),
    "dropDuplicatesWithinWatermark": (
        lambda f: f.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["id"]), "append"),
    # 11 rows before the move: the limit lets 2 more through, then none
    "a limit": (lambda f: f.limit(13), "append"),
    # a row per session on Spark's engine, a row per key with its sessions on microbatch
    "session windows in append mode": (
        lambda f: f.withWatermark("ts", "10 seconds").groupBy(F.session_window("ts", "5 seconds"), "id")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total")), "append"),
    "session windows after the key": (
        lambda f: f.withWatermark("ts", "10 seconds").groupBy("id", F.session_window("ts", "5 seconds")).count(),
        "append"),
    "applyInPandasWithState with an event-time timeout": (
        lambda f: f.withWatermark("ts", "10 seconds").groupBy("id").applyInPandasWithState(
            count_until_quiet, GROUP_STATE_OUTPUT, "n LONG", "update", GroupStateTimeout.EventTimeTimeout), "update"),
    # (Spark keeps no timeout timestamp without a timeout)
    "applyInPandasWithState without a timeout": (
        lambda f: f.groupBy("id").applyInPandasWithState(
            first_rows, GROUP_STATE_OUTPUT, "n LONG", "append", GroupStateTimeout.NoTimeout), "append"),
}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda k, t, v: {"id": k, "ts": f"2026-01-01 {t}", "v": v})


def arrive(events, live, names) -> None:
    """The next event files appear in ``live`` (a rename keeps their modification times)."""
    for name in names:
        os.rename(os.path.join(events, name), live / name)


def recorded_provider(ckpt) -> str:
    last = max(int(b) for b in os.listdir(ckpt / "offsets") if b.isdigit())
    return json.loads((ckpt / "offsets" / str(last)).read_text().split("\n")[1])["conf"][
        "spark.sql.streaming.stateStore.providerClass"]


SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark's two providers, by the confs a Spark job runs them with
PROVIDERS = {
    "hdfs": {},
    "rocksdb": {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB},
    "rocksdb, changelogs": {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB,
                            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
                            "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2"},
}


#: the cases run on each of RocksDB's two file forms beside Spark's default provider: each
#: case on one of them, each form under an aggregation, a deduplication, a session window
#: and applyInPandasWithState (the rest would be the same layout read again: issue 58)
ON_ROCKSDB_SNAPSHOTS = ("a window count in append mode", "dropDuplicatesWithinWatermark", "a limit",
                        "session windows in append mode", "applyInPandasWithState with an event-time timeout")
ON_ROCKSDB_CHANGELOGS = tuple(case for case in CASES if case not in ON_ROCKSDB_SNAPSHOTS)


@pytest.mark.parametrize("case, provider", [(case, "hdfs") for case in CASES]
                         + [(case, "rocksdb") for case in ON_ROCKSDB_SNAPSHOTS]
                         + [(case, "rocksdb, changelogs") for case in ON_ROCKSDB_CHANGELOGS])
def test_microbatch_continues_a_checkpoint_spark_wrote_as_spark_would(spark, ss, events, tmp_path, case, provider):
    transform, mode = CASES[case]
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:BEFORE])
    with confs(spark, PROVIDERS[provider]):
        first, _ = collect_batches(transform(json_stream(spark, live, SCHEMA)), moved, mode)
    assert len(first) >= BEFORE and \
        recorded_provider(moved) == PROVIDERS[provider].get(PROVIDER_CONF, SPARK_HDFS)
    spark_files = {p: p.read_bytes() for p in (moved / "state").rglob("*") if p.is_file()}
    shutil.copytree(moved, stayed)
    arrive(events, live, names[BEFORE:])
    with confs(spark, PROVIDERS[provider]):
        theirs, their_progress = collect_batches(transform(json_stream(spark, live, SCHEMA)), stayed, mode)
    ours, our_progress = collect_batches(transform(json_stream(ss, live, SCHEMA)), moved, mode)
    assert ours == theirs and any(rows for _, rows in ours)
    assert comparable([json.loads(p.json) for p in our_progress]) == \
        comparable([json.loads(p.json) for p in their_progress])
    assert watermarks(moved) == watermarks(stayed)
    # Spark's files are read, never changed; microbatch's provider takes over from here
    assert all(path.read_bytes() == data for path, data in spark_files.items())
    assert recorded_provider(moved) == ("microbatch.state.map_provider.MapStateStoreProvider" if provider == "hdfs"
                                        else "microbatch.state.rocksdb.RocksDBStateStoreProvider")


def checkpoint_files(ckpt) -> dict:
    """The state and the logs (a run's lease is written at its start, before any check)."""
    return {str(p): p.read_bytes() for d in ("state", "offsets", "commits", "sources")
            for p in (ckpt / d).rglob("*") if p.is_file()}


def test_state_microbatch_cannot_adopt_is_refused_before_anything_is_written(spark, ss, events, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    arrive(events, live, sorted(os.listdir(events))[:2])

    # an aggregation state format before Spark 2.3's
    with confs(spark, {"spark.sql.streaming.aggregation.stateFormatVersion": "1"}):
        collect_batches(json_stream(spark, live, SCHEMA).groupBy("id").count(), tmp_path / "v1", "update")
    before = checkpoint_files(tmp_path / "v1")
    batches, _ = collect_batches(json_stream(ss, live, SCHEMA).groupBy("id").count(), tmp_path / "v1", "update",
                                 fail_on_error=False, queries=(queries := []))
    error = str(queries[0].exception())
    assert "was written by Spark's engine" in error and "format version 1" in error and "Nothing was written" in error
    assert batches == [] and checkpoint_files(tmp_path / "v1") == before
    # a session asking for a provider of its own: microbatch's files are not its
    collect_batches(json_stream(spark, live, SCHEMA).groupBy("id").count(), tmp_path / "custom", "update")
    before = checkpoint_files(tmp_path / "custom")
    with confs(spark, {PROVIDER_CONF: "my_company.state.CustomProvider"}):
        collect_batches(json_stream(ss, live, SCHEMA).groupBy("id").count(), tmp_path / "custom", "update",
                        fail_on_error=False, queries=(queries := []))
    error = str(queries[0].exception())
    assert "adopts it into the files of its own providers" in error and "my_company.state.CustomProvider" in error
    assert checkpoint_files(tmp_path / "custom") == before

    # transformWithState's state in Spark's Avro encoding (only its UnsafeRow encoding is read)
    from test_transform_with_state_differential import RunningCount, known_ids

    def counts(f):
        return known_ids(f).groupBy("id").transformWithStateInPandas(RunningCount(), "id INT, n LONG", "update",
                                                                     "None")
    with confs(spark, {**PROVIDERS["rocksdb"], "spark.sql.streaming.stateStore.encodingFormat": "avro"}):
        collect_batches(counts(json_stream(spark, live, SCHEMA)), tmp_path / "tws", "update")
    before = checkpoint_files(tmp_path / "tws")
    queries = []
    collect_batches(counts(json_stream(ss, live, SCHEMA)), tmp_path / "tws", "update",
                    fail_on_error=False, queries=queries)
    error = str(queries[0].exception())
    assert "RocksDBStateStoreProvider), and microbatch cannot adopt it" in error and "avro" in error
    assert checkpoint_files(tmp_path / "tws") == before


def test_a_state_file_of_a_newer_spark_is_refused_with_what_to_do(spark, ss, events, tmp_path):
    """A snapshot whose format a newer Spark wrote (here: the RocksDB snapshot's metadata
    version) is refused at the start; Spark's files stay as they were, no batch runs."""
    import zipfile
    live, ckpt = tmp_path / "live", tmp_path / "newer"
    live.mkdir()
    arrive(events, live, sorted(os.listdir(events))[:2])
    with confs(spark, PROVIDERS["rocksdb"]):
        collect_batches(json_stream(spark, live, SCHEMA).groupBy("id").count(), ckpt, "update")
    newest = max((ckpt / "state" / "0" / "0").glob("*.zip"), key=lambda p: int(p.stem))
    with zipfile.ZipFile(newest) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    entries["metadata"] = b"v9" + entries["metadata"][2:]
    with zipfile.ZipFile(newest, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    before = {p: p.read_bytes() for p in (ckpt / "state").rglob("*") if p.is_file() and ".arrow" not in p.name}
    batches, _ = collect_batches(json_stream(ss, live, SCHEMA).groupBy("id").count(), ckpt, "update",
                                 fail_on_error=False, queries=(queries := []))
    error = str(queries[0].exception())
    assert "cannot adopt it" in error and "'v9'" in error and "newer Spark" in error
    assert "Keep running this query on Spark's engine" in error and batches == []
    assert all(path.read_bytes() == data for path, data in before.items())


def transform_with_state_cases() -> dict:
    from test_transform_with_state_differential import OUTPUT, RowTracker, RunningCount, Tracker, known_ids
    return {
        "value, list and map state with event-time timers": (
            lambda f: known_ids(f).withWatermark("ts", "10 seconds").groupBy("id")
            .transformWithStateInPandas(Tracker(), OUTPUT, "append", "EventTime"), "append"),
        "value and map state, the Row API": (
            lambda f: known_ids(f).withWatermark("ts", "10 seconds").groupBy("id")
            .transformWithState(RowTracker(), "id INT, n LONG, latest LONG, secs LONG, fired LONG", "append",
                                "EventTime"), "append"),
        "value and list state, no time mode": (
            lambda f: known_ids(f).groupBy("id").transformWithStateInPandas(
                RunningCount(), "id INT, n LONG", "update", "None"), "update"),
    }


@pytest.mark.parametrize("changelogs", [False, True])
@pytest.mark.parametrize("case", ["value, list and map state with event-time timers", "value and map state, the Row API",
                                  "value and list state, no time mode"])
def test_microbatch_continues_a_transform_with_state_spark_ran(spark, ss, events, tmp_path, case, changelogs):
    """transformWithState's column families (Spark runs it only on its RocksDB provider)
    become microbatch's store per state variable and its timers'."""
    transform, mode = transform_with_state_cases()[case]
    provider_confs = PROVIDERS["rocksdb, changelogs" if changelogs else "rocksdb"]
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:BEFORE])
    with confs(spark, provider_confs):
        first, _ = collect_batches(transform(json_stream(spark, live, SCHEMA)), moved, mode)
    assert len(first) >= BEFORE
    shutil.copytree(moved, stayed)
    arrive(events, live, names[BEFORE:])
    with confs(spark, provider_confs):
        theirs, their_progress = collect_batches(transform(json_stream(spark, live, SCHEMA)), stayed, mode)
    ours, our_progress = collect_batches(transform(json_stream(ss, live, SCHEMA)), moved, mode)
    assert ours == theirs and any(rows for _, rows in ours)
    assert comparable([json.loads(p.json) for p in our_progress]) == \
        comparable([json.loads(p.json) for p in their_progress])
    assert watermarks(moved) == watermarks(stayed)
