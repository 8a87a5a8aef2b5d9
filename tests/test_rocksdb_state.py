"""microbatch's RocksDB state store provider: chosen by Spark's conf value, matching Spark's
own engine on its RocksDB provider batch by batch, the checkpoint in the files every
provider shares, the working copy on the executor's local disk."""
from __future__ import annotations

import datetime
import decimal
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from microbatch.state.rocksdb import RocksDBStateStoreProvider, TupleCodec, database
from microbatch.state.store import (
    EARLIER_ROCKSDB_PROVIDER, ROCKSDB_PROVIDER, RocksDBConfs, StateStoreConf, StateStoreId,
)
from stream_events import comparable, id_and_time, write_event_files
from helpers import collect_batches, confs, json_stream

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
MAP = "microbatch.state.map_provider.MapStateStoreProvider"

EVENTS = [
    [(1, "00:00:10"), (2, "00:00:20"), (1, "00:00:10"), (None, "00:00:12")],
    [(1, "00:00:10"), (3, "00:00:40"), (None, "00:00:12"), (None, "00:00:35")],
    [(2, "00:00:20"), (4, "00:00:05"), (5, "00:00:41"), (3, "00:00:45"), (None, "00:00:42")],
    [(6, "00:01:40"), (3, "00:00:40")],
]

QUERIES = {
    "dedup with watermark": ("append", lambda f: f.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"])),
    "dedup within watermark": ("append", lambda f: f.withWatermark("ts", "10 seconds")
                               .dropDuplicatesWithinWatermark(["id"])),
    "window count": ("append", lambda f: f.withWatermark("ts", "10 seconds")
                     .groupBy(__import__("pyspark.sql.functions", fromlist=["window"]).window("ts", "10 seconds"))
                     .count()),
    "count per id": ("update", lambda f: f.groupBy("id").count()),
}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, id_and_time)


def run(session, events, ckpt, case, provider):
    mode, transform = QUERIES[case]
    with confs(session, {PROVIDER_CONF: provider}):
        return collect_batches(transform(json_stream(session, events, "id INT, ts TIMESTAMP")), ckpt, mode)


@pytest.mark.parametrize("case", list(QUERIES))
def test_sparks_rocksdb_conf_runs_microbatchs_rocksdb_provider_with_sparks_answers(spark, ss, events, tmp_path,
                                                                                   case):
    theirs, their_progress = run(spark, events, tmp_path / "spark", case, SPARK_ROCKSDB)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", case, SPARK_ROCKSDB)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    conf = json.loads((tmp_path / "microbatch" / "offsets" / "0").read_text().split("\n")[1])["conf"]
    assert conf[PROVIDER_CONF] == ROCKSDB_PROVIDER
    metrics = our_progress[-1]["stateOperators"][0]["customMetrics"]
    assert metrics["rocksdbPutCount"] >= 0 and "rocksdbCommitWriteBatchLatency" in metrics
    assert our_progress[0]["stateOperators"][0]["memoryUsedBytes"] > 0


def counts_in_steps(ss, events, ckpt, steps, before_each=lambda provider: None):
    """Count per id over ``events`` in runs (AvailableNow), each with its provider conf
    (None: unset) and its next files; every batch's output rows, and the last progress
    of each run."""
    live, outputs, progress = ckpt.parent / f"{ckpt.name}-input", [], []
    live.mkdir()
    names = sorted(os.listdir(events))
    for provider, files in steps:
        for name in names[files]:      # the next files arrive (a rename keeps their modification times)
            os.rename(os.path.join(events, name), live / name)
        before_each(provider)
        with confs(ss, {PROVIDER_CONF: provider}):
            frame = ss.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(str(live))
            query = (frame.groupBy("id").count().writeStream.outputMode("update")
                     .foreachBatch(lambda df, i: outputs.append((i, sorted(map(tuple, df.collect()), key=repr))))
                     .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
            query.awaitTermination(120)
            assert query.exception() is None
            progress.append(query.lastProgress)
    return outputs, progress


def recorded_providers(ckpt) -> list[str]:
    return [json.loads((ckpt / "offsets" / b).read_text().split("\n")[1])["conf"][PROVIDER_CONF]
            for b in sorted(os.listdir(ckpt / "offsets"), key=int)]


def test_a_checkpoint_moves_between_the_map_and_rocksdb_providers(ss, events, tmp_path):
    """Both providers write the same files: a run on the map provider, a restart on
    RocksDB and one back on the map give the answers of one uninterrupted run."""
    whole, _ = run(ss, events, tmp_path / "whole", "count per id", MAP)
    outputs, _ = counts_in_steps(ss, events, tmp_path / "moving", (
        (MAP, slice(None, 2)), (SPARK_ROCKSDB, slice(2, 3)), (MAP, slice(3, None))))
    assert outputs == whole
    recorded = recorded_providers(tmp_path / "moving")
    assert ROCKSDB_PROVIDER in recorded and recorded[-1] == MAP


def test_a_checkpoint_recording_the_earlier_path_of_the_provider_resumes_on_rocksdb(ss, events, tmp_path):
    """Checkpoints written before the provider became a package (``state/rocksdb/``)
    record ``microbatch.state.rocksdb_provider.RocksDBStateStoreProvider``: they resume on
    the RocksDB provider, and may still move to the map provider."""
    whole, _ = run(ss, events, tmp_path / "whole", "count per id", MAP)
    ckpt = tmp_path / "earlier"

    def as_written_before(provider):
        for entry in (ckpt / "offsets").iterdir() if provider is None else ():
            entry.write_text(entry.read_text().replace(ROCKSDB_PROVIDER, EARLIER_ROCKSDB_PROVIDER))
    outputs, progress = counts_in_steps(ss, events, ckpt, (
        (ROCKSDB_PROVIDER, slice(None, 2)), (None, slice(2, 3)), (MAP, slice(3, None))), as_written_before)
    assert outputs == whole
    assert "rocksdbPutCount" in progress[1].stateOperators[0].customMetrics
    recorded = recorded_providers(ckpt)
    assert EARLIER_ROCKSDB_PROVIDER in recorded and recorded[2] == ROCKSDB_PROVIDER and recorded[-1] == MAP


def test_equal_keys_are_equal_bytes_and_every_type_round_trips():
    schema = pa.schema([("s", pa.string()), ("d", pa.date32()), ("n", pa.decimal128(10, 2)),
                        ("t", pa.time64("us")), ("nested", pa.struct([("day", pa.date32()), ("x", pa.float64())])),
                        ("items", pa.list_(pa.int64()))])
    codec = TupleCodec(schema)
    built = "".join(["wo", "rd"])          # not interned, unlike the literal
    key = ("word", datetime.date(2026, 1, 2), decimal.Decimal("12.50"), datetime.time(1, 2, 3, 4),
           (datetime.date(2020, 5, 6), -0.5), (1, 2))
    same = (built, datetime.date(2026, 1, 2), decimal.Decimal("12.50"), datetime.time(1, 2, 3, 4),
            (datetime.date(2020, 5, 6), -0.5), (1, 2))
    assert codec.encode(key) == codec.encode(same)
    assert codec.decode(codec.encode(key)) == key
    assert codec.decode(codec.encode((None,) * 6)) == (None,) * 6
    plain = TupleCodec(pa.schema([("k", pa.int64()), ("v", pa.string())]))
    assert plain.decode(plain.encode((2 ** 40, built))) == (2 ** 40, "word")


def test_the_working_copy_lives_in_sparks_local_dir_shared_by_the_executors_workers(tmp_path, monkeypatch):
    """One database per store in Spark's local directory. A worker process keeps it open
    after its task; the partition's next task, in another worker process (another
    provider here), asks for it, gets it at its version and never rebuilds it. Undo
    records of a provider are not trusted after another wrote. A provider that cannot
    get the database (another task of the partition holds it) works on a private copy."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'local'},{tmp_path / 'other'}")
    monkeypatch.setattr(database, "SHARED", {})
    key, value = pa.schema([("k", pa.int64())]), pa.schema([("v", pa.int64())])
    # (a hand-over waited for 0.3 s: lockAcquireTimeoutMs)
    conf = StateStoreConf(min_deltas_for_snapshot=1, run_id="run", rocksdb=RocksDBConfs(lock_wait_ms=300))
    store_id = StateStoreId(str(tmp_path / "state"), 0, 0)
    workers = [RocksDBStateStoreProvider(store_id, key, value, conf) for _ in range(2)]

    def add(provider, version):
        store = provider.get_store(version)
        for k in range(100):
            current = store.get((k,))
            store.put((k,), ((current[0] if current else 0) + k,))
        store.commit()
        return store.metrics()

    for version in range(4):
        worker = workers[version % 2]
        metrics = add(worker, version)
        assert metrics.custom["rocksdbLoadedFromMemoryCount"] == 1, version   # never rebuilt
        assert worker.db is not None and workers[1 - version % 2].db is None, version   # kept open, handed over
        assert metrics.custom["rocksdbOpenedCount"] == 1 and metrics.custom["rocksdbPrivateCopyCount"] == 0
        if version == 0:            # nobody held it yet
            assert metrics.custom["rocksdbHandOverWaitMs"] == 0
    # a database opened again keeps its table settings (rocksdict would open the default
    # family with the OPTIONS file's, which have no bloom filter): the newest OPTIONS file
    # is the last open's
    newest = max((f for f in os.listdir(workers[1].shared_path) if f.startswith("OPTIONS-")),
                 key=lambda f: int(f.split("-")[1]))
    table = (Path(workers[1].shared_path) / newest).read_text().split('[TableOptions/BlockBasedTable "default"]')[1]
    assert "filter_policy=bloomfilter" in table
    # level 1 of half a memtable, so a compaction never rewrites a whole large database
    family = (Path(workers[1].shared_path) / newest).read_text().split('[CFOptions "default"]')[1]
    assert f"max_bytes_for_level_base={(conf.rocksdb_write_buffer_mb // 2) << 20}\n" in family
    metrics = add(workers[1], 4)       # the same worker again: the database it kept open
    assert metrics.custom["rocksdbOpenedCount"] == 0 and metrics.custom["rocksdbOpenLatencyMs"] == 0
    shared = workers[0].shared_path
    assert shared.startswith(str(tmp_path / "local" / "microbatch-rocksdb")) and os.path.isdir(shared)
    assert workers[1].path == shared and not os.path.exists(shared + ".release")
    for worker in workers:
        worker._wait_for_maintenance()
    names = sorted(os.listdir(tmp_path / "state" / "0" / "0"))
    assert {"1.delta.arrow", "4.delta.arrow", "5.delta.arrow", "2.snapshot.arrow"} <= set(names), names
    # worker 0 last wrote version 3: its undo records are stale now that workers 1 wrote 4 and 5
    store = workers[0].get_store(3)
    assert store.get((7,)) == (21,)
    # while worker 0's task holds the database, worker 1 reads the same answer from a
    # private copy, after waiting lockAcquireTimeoutMs for a hand-over that does not come
    other = workers[1].get_store(3)
    assert other.get((7,)) == (21,) and workers[1].path != shared
    assert workers[1].opened["privateCopy"] == 1 and workers[1].opened["handOverWaitMs"] >= 250   # about 300
    other.abort()
    assert not os.path.exists(workers[1].path)
    store.abort()
    assert workers[1].get_store(5).get((7,)) == (35,)
    workers[1].close()
    workers[0].close()
    assert not os.path.exists(shared)


def test_a_version_changed_only_by_insert_new_writes_its_delta_from_arrow(tmp_path):
    """Deduplication's versions: the delta comes from the Arrow rows insert_new added
    (no tuples rebuilt), the same rows a key-by-key version would write; a removal in the
    version falls back to the tuples. Both read back the same from the files."""
    import pyarrow.ipc as ipc
    key, value = pa.schema([("id", pa.string()), ("t", pa.int64())]), pa.schema([("expires", pa.int64())])
    store_id = StateStoreId(str(tmp_path / "state"), 0, 0)
    provider = RocksDBStateStoreProvider(store_id, key, value, StateStoreConf())
    store = provider.get_store(0)
    first = store.insert_new(pa.table({"id": ["a", "b", "a"], "t": pa.array([1, 2, 1], pa.int64())}),
                             pa.table({"expires": pa.array([10, 20, 11], pa.int64())}))
    second = store.insert_new(pa.table({"id": ["b", None], "t": pa.array([2, 3], pa.int64())}),
                              pa.table({"expires": pa.array([0, 30], pa.int64())}))
    assert list(first) == [True, True, False] and list(second) == [False, True]
    assert store._inserted_arrays() is not None
    store.commit()
    store = provider.get_store(1)
    store.insert_new(pa.table({"id": ["c"], "t": pa.array([4], pa.int64())}),
                     pa.table({"expires": pa.array([40], pa.int64())}))
    assert store.remove_at_or_below(1, key_field=1) == 1
    assert store._inserted_arrays() is None      # a removal: the delta comes from the tuples
    store.commit()

    def delta(version):
        with open(os.path.join(store_id.path, f"{version}.delta.arrow"), "rb") as f:
            return ipc.open_stream(f).read_all().to_pylist()
    assert delta(1) == [{"key": {"id": "a", "t": 1}, "value": {"expires": 10}},
                        {"key": {"id": "b", "t": 2}, "value": {"expires": 20}},
                        {"key": {"id": None, "t": 3}, "value": {"expires": 30}}]
    assert sorted(map(str, delta(2))) == sorted(map(str, [
        {"key": {"id": "c", "t": 4}, "value": {"expires": 40}}, {"key": {"id": "a", "t": 1}, "value": None}]))
    provider.close()
    fresh = RocksDBStateStoreProvider(store_id, key, value, StateStoreConf())
    assert dict(fresh.get_store(2).iterator()) == {("b", 2): (20,), (None, 3): (30,), ("c", 4): (40,)}


def test_a_snapshot_of_versions_that_only_added_keys_is_the_files_one_after_the_other(tmp_path, monkeypatch):
    """While every delta since the newest snapshot only added keys, a snapshot is made from
    the files (that snapshot, then the deltas), not by decoding the database's rows; once a
    version updates a key, the next snapshot decodes the database. Either way the snapshot
    holds the store's rows, and a new database built from the files answers the same."""
    import pyarrow.ipc as ipc
    from microbatch.state.files import StateFiles
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    monkeypatch.setattr(database, "SHARED", {})
    merged = []
    real_concatenated = StateFiles.write_concatenated

    def counting(self, version, kind, sources):
        merged.append((version, sources))
        return real_concatenated(self, version, kind, sources)

    monkeypatch.setattr(StateFiles, "write_concatenated", counting)
    key, value = pa.schema([("k", pa.int64())]), pa.schema([("v", pa.int64())])
    store_id = StateStoreId(str(tmp_path / "state"), 0, 0)
    conf = StateStoreConf(min_deltas_for_snapshot=1, run_id="run")
    provider = RocksDBStateStoreProvider(store_id, key, value, conf)
    expected = {}
    for version in range(8):
        store = provider.get_store(version)
        if version == 4:                           # version 5 updates a key
            store.put((7,), (-1,))
            expected[7] = -1
        new = pa.table({"k": pa.array(range(version * 100, version * 100 + 100), pa.int64())})
        store.insert_new(new, pa.table({"v": pa.array([version] * 100, pa.int64())}))
        expected.update((k, version) for k in range(version * 100, version * 100 + 100))
        store.commit()
        provider._wait_for_maintenance()

    def snapshot(version):
        with open(os.path.join(store_id.path, f"{version}.snapshot.arrow"), "rb") as f:
            return {row["key"]["k"]: row["value"]["v"] for row in ipc.open_stream(f).read_all().to_pylist()}

    assert merged == [(2, [(1, "delta"), (2, "delta")]),
                      (4, [(2, "snapshot"), (3, "delta"), (4, "delta")])]
    assert snapshot(2) == {k: k // 100 for k in range(200)}
    assert snapshot(4) == {k: k // 100 for k in range(400)}
    assert os.path.exists(os.path.join(store_id.path, "8.snapshot.arrow"))   # decoded: version 5 updated
    assert snapshot(8) == expected and expected[7] == -1
    provider.close()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "elsewhere"))   # a new database, from the files
    monkeypatch.setattr(database, "SHARED", {})
    fresh = RocksDBStateStoreProvider(store_id, key, value, conf)
    store = fresh.get_store(8)
    assert store.num_keys() == len(expected) == 800
    assert store.get((7,)) == (-1,) and store.get((450,)) == (4,) and store.get((799,)) == (7,)
    store.abort()
    fresh.close()


def test_a_version_whose_snapshot_is_empty_loads_and_commits(tmp_path):
    """An empty snapshot (a partition no key ever reached, adopted from Spark's files or
    written by maintenance) is a version like any other: the next commit goes on top of it."""
    from microbatch.state.files import StateFiles
    key, value = pa.schema([("id", pa.int64())]), pa.schema([("n", pa.int64())])
    store_id = StateStoreId(str(tmp_path / "state"), 0, 0)
    os.makedirs(store_id.path)
    StateFiles(store_id, key, value, StateStoreConf()).write_rows(3, "snapshot", [], [])
    provider = RocksDBStateStoreProvider(store_id, key, value, StateStoreConf())
    store = provider.get_store(3)
    assert list(store.iterator()) == []
    store.put((1,), (10,))
    assert store.commit() == 4
    provider.close()
    fresh = RocksDBStateStoreProvider(store_id, key, value, StateStoreConf())
    assert dict(fresh.get_store(4).iterator()) == {(1,): (10,)}
    fresh.close()
