"""Spark's transformWithState state in its RocksDB column families
(``microbatch.state.spark_format.rocksdb_families``), with Spark's engine as the oracle:
transformWithStateInPandas queries run on Spark's engine (its RocksDB provider, which it
requires for them) with value, list and map states, event-time and processing-time timers
and TTLs, changelog checkpointing on and off, row checksums and zstd in one variant; our
reader must give, for every partition and version, the rows Spark's ``statestore`` data
source reads (``stateVarName``, ``flattenCollectionTypes``, ``readRegisteredTimers``).
Then the v3 schema files, and damaged or unsupported stores refused with errors that name
the file."""
from __future__ import annotations

import datetime
import json
import os
import shutil
import struct
import sys
from collections import Counter

import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

from helpers import confs, wait_for
from microbatch.state.files import from_struct_array, storage_type
from microbatch.state.spark_format import (
    SparkRocksDBFamilies, SparkRocksDBStoreFiles, SparkStateFormatError, families_options_from_conf,
    offset_log_conf, read_operator_metadata_v2, read_state_schema_v3, read_state_schemas_v3,
)
from microbatch.state.spark_format.compression import compress, decompress
from microbatch.state.spark_format.rocksdb_families import merge_sst_entries

#: a separate bounded step (make test-porting): moving state between the engines
pytestmark = pytest.mark.porting

# the processors below run in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    # a snapshot every 2 versions, uploaded by the task at its commit (unloadOnCommit)
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.unloadOnCommit": "true",
}
CHECKSUM_ZSTD = {CHANGELOG: "true", "spark.sql.streaming.stateStore.rowChecksum.enabled": "true",
                 "spark.sql.streaming.stateStore.compression.codec": "zstd"}
VARIANTS = {   # name: (processor, conf)
    "changelog": ("everything", {CHANGELOG: "true"}),
    "snapshots": ("everything", {CHANGELOG: "false"}),
    "ttl_checksum_zstd": ("expiring", CHECKSUM_ZSTD),
}
KINDS = {
    "everything": {"count": "value", "info": "value", "times": "list", "notes": "list", "seen": "map",
                   "tags": "map"},
    "expiring": {"last": "value", "kept": "value", "hist": "list", "short": "list", "seen": "map",
                 "gone": "map"},
}


class Everything(StatefulProcessor):
    """Per (key, g): value states (a count; a string, a nullable double and a date), list
    states (event times; strings with nulls, cleared at 5 rows), map states (hits per
    second, one removed; string and int user keys to nullable strings), and event-time
    timers, all replaced at every batch, one 15 s after the latest event clearing some."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n LONG")
        self.info = handle.getValueState("info", "name STRING, total DOUBLE, day DATE")
        self.times = handle.getListState("times", "ts TIMESTAMP")
        self.notes = handle.getListState("notes", "s STRING, k INT")
        self.seen = handle.getMapState("seen", "sec INT", "hits LONG")
        self.tags = handle.getMapState("tags", "tag STRING, k INT", "v STRING, c INT")

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
                self.notes.appendValue((f"\u00e9t\u00e9 {key[0]} {ts.second}" if ts.second % 2 else None, ts.second))
                tag = ("long tag name " * (ts.second % 3)) + str(ts.second % 4)
                self.tags.updateValue((tag, ts.second % 2), (None if ts.second % 5 == 0 else f"v{ts.second}", n))
        if self.seen.containsKey((3,)):
            self.seen.removeKey((3,))
        if n >= 5:
            self.notes.clear()
        self.count.update((n,))
        self.info.update((f"{key[0]}-{n}", None if n % 2 else n / 3.0, datetime.date(2024, 1, n % 28 + 1)))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(int(latest.timestamp() * 1000) + 15000)
        self.handle.registerTimer(int(latest.timestamp() * 1000) + 3600000 + key[1])
        yield pd.DataFrame({"key": [key[0]], "n": [n]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.count.clear()
        self.times.clear()
        self.seen.clear()
        yield pd.DataFrame({"key": [key[0]], "n": [-1]})

    def close(self):
        pass


class Expiring(StatefulProcessor):
    """States with TTLs (processing time): ``last``, ``short`` and ``gone`` expire by the
    next batch (1 ms), the others live an hour; processing-time timers."""

    def init(self, handle):
        self.handle = handle
        self.last = handle.getValueState("last", "n LONG", 1)
        self.kept = handle.getValueState("kept", "n LONG, s STRING", 3_600_000)
        self.hist = handle.getListState("hist", "n LONG", 3_600_000)
        self.short = handle.getListState("short", "n LONG", 1)
        self.seen = handle.getMapState("seen", "k INT", "v LONG", 3_600_000)
        self.gone = handle.getMapState("gone", "k INT", "v LONG", 1)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(frame) for frame in rows)
        kept = self.kept.get()
        self.last.update((n,))
        self.kept.update(((kept[0] if kept else 0) + n, f"s{key[0]}"))
        self.hist.appendValue((n,))
        self.hist.appendValue((n + 1,))
        self.short.appendValue((n,))
        self.seen.updateValue((n % 3,), (n,))
        self.seen.updateValue((7,), (n,))
        self.gone.updateValue((1,), (n,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 3_600_000)
        yield pd.DataFrame({"key": [key[0]], "n": [n]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"key": [key[0]], "n": [-1]})

    def close(self):
        pass


INPUT = [
    [("a", 1, "00:00:01"), ("b", 2, "00:00:02"), ("a", 1, "00:00:04"), ("c\u00e9 long key", 3, "00:00:03")],
    [("a", 1, "00:00:12"), ("d", 4, "00:00:15"), ("b", 2, "00:00:05")],
    [("e", 5, "00:00:31"), ("a", 1, "00:00:33"), ("a", 1, "00:00:35"), ("f", 6, "00:00:30")],
    [("e", 5, "00:00:52"), ("a", 1, "00:00:53")],
    [("g", 7, "00:01:10"), ("h", 8, "00:01:11"), ("b", 2, "00:01:13")],
]


def _run(spark, directory, name, processor, conf) -> str:
    """One query of Spark's engine over INPUT (a file a batch, a ``foreachBatch`` sink);
    its checkpoint. ``Expiring`` (processing time, whose timers make Spark run batches
    without end) is stopped after 6 batches."""
    checkpoint = str(directory / f"ckpt_{name}")
    frame = (spark.readStream.schema("key STRING, g INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
             .json(str(directory / "in")))
    if processor == "everything":
        out = frame.withWatermark("ts", "10 seconds").groupBy("key", "g").transformWithStateInPandas(
            Everything(), "key STRING, n LONG", "append", "EventTime")
        writer = out.writeStream.outputMode("append").trigger(availableNow=True)
    else:
        out = frame.groupBy("key", "g").transformWithStateInPandas(
            Expiring(), "key STRING, n LONG", "update", "ProcessingTime")
        writer = out.writeStream.outputMode("update")
    query = (writer.option("checkpointLocation", checkpoint)
             .foreachBatch(lambda f, _: f.write.format("noop").mode("overwrite").save()).start())
    if processor == "everything":
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        return checkpoint
    def six_committed() -> bool:
        if os.path.exists(f"{checkpoint}/commits/5"):
            return True
        assert query.exception() is None, query.exception()
        return False
    wait_for(six_committed, 300, "Spark's query to commit 6 batches", every=0.1)
    query.stop()
    return checkpoint


@pytest.fixture(scope="module")
def tws_checkpoints(tmp_path_factory, spark):
    """Spark's transformWithState checkpoints, made once for the module: {variant: checkpoint}."""
    directory = tmp_path_factory.mktemp("tws")
    (directory / "in").mkdir()
    for i, rows in enumerate(INPUT):
        (directory / "in" / f"part-{i:03d}.json").write_text(
            "".join(json.dumps({"key": k, "g": g, "ts": f"2024-01-01T{t}Z"}) + "\n" for k, g, t in rows))
    made = {}
    for variant, (processor, conf) in VARIANTS.items():
        with confs(spark, {**CONF, **conf}):
            made[variant] = _run(spark, directory, variant, processor, conf)
    return made


def _stores(checkpoint, **options) -> list[SparkRocksDBFamilies]:
    return [SparkRocksDBFamilies.for_store(checkpoint, 0, partition, **options) for partition in range(2)]


def _batches(checkpoint) -> list[int]:
    return sorted(int(n) for n in os.listdir(f"{checkpoint}/commits") if n.isdigit())


# -- Spark's reader's rows and ours, in one shape ------------------------------------------------
def _column(table, name):
    column = table.column(name).combine_chunks()
    return column.cast(storage_type(column.type))


def spark_view(table, kind, flatten):
    """Spark's statestore rows as {(partition, key): ...} in our reader's shapes."""
    parts = table.column("partition_id").to_pylist()
    keys = from_struct_array(_column(table, "key"), keys=True)
    if kind == "value":
        return {(p, k): v for p, k, v in zip(parts, keys, from_struct_array(_column(table, "value")))}
    if kind == "list" and flatten:
        out = {}
        for p, k, v in zip(parts, keys, from_struct_array(_column(table, "list_element"))):
            out.setdefault((p, k), Counter())[repr(v)] += 1   # a TTL's value is a dict
        return out
    if kind == "list":   # the elements in their order
        lists = _column(table, "list_value")
        return {(p, k): from_struct_array(lists[i].values) for i, (p, k) in enumerate(zip(parts, keys))}
    if kind == "map" and flatten:
        return {(p, k, uk): v for p, k, uk, v in zip(
            parts, keys, from_struct_array(_column(table, "user_map_key"), keys=True),
            from_struct_array(_column(table, "user_map_value")))}
    if kind == "map":
        maps = table.column("map_value").combine_chunks()
        out = {}
        for i, (p, k) in enumerate(zip(parts, keys)):
            entries = maps[i].values
            user_keys = from_struct_array(entries.field("key").cast(storage_type(entries.field("key").type)), keys=True)
            values = from_struct_array(entries.field("value").cast(storage_type(entries.field("value").type)))
            out[(p, k)] = sorted(zip(user_keys, values), key=repr)
        return out
    assert kind == "timers"
    return Counter(zip(parts, keys, table.column("expiration_timestamp_ms").to_pylist()))


def our_view(stores, version, name, kind, flatten):
    """Our reader's rows of ``name`` in ``version`` over the partitions' stores, in
    ``spark_view``'s shapes (a value with a TTL is (value, ttlExpirationMs) in both)."""
    out = Counter() if kind == "timers" else {}
    for p, store in enumerate(stores):
        if version > store.latest_version():
            continue
        records = store.load_records(version)
        families = store.families(version)
        if kind == "timers":
            family = next(f for f in families if f.endswith("Timers_keyToTimestamp"))
            rows = store.load_family(version, family, records=records)
            by_time = store.load_family(version, family.replace("keyToTimestamp", "timestampToKey"), records=records)
            assert sorted((t, k) for k, t in rows) == sorted(by_time), "the two timer indexes differ"
            assert set(rows.values()) <= {(None,)} and set(by_time.values()) <= {(None,)}
            out.update((p, k, t) for k, t in rows)
            continue
        rows = store.load_family(version, name, records=records) if name in families else {}
        for k, v in rows.items():
            if kind in ("value", "list") and not (kind == "list" and flatten):
                out[(p, k)] = v
            elif kind == "list":
                out[(p, k)] = Counter(map(repr, v))
            elif flatten:
                out[(p,) + k] = v
            else:
                out.setdefault((p, k[0]), []).append((k[1], v))
    if kind == "map" and not flatten:
        out = {k: sorted(v, key=repr) for k, v in out.items()}
    return out


def _spark_table(spark, checkpoint, batch, **options):
    reader = spark.read.format("statestore").option("batchId", str(batch))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(checkpoint).toArrow()


# -- the rows, against Spark's reader -------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_state_variable_and_the_timers_are_read_as_spark_reads_them(spark, tws_checkpoints, variant):
    checkpoint = tws_checkpoints[variant]
    processor, _ = VARIANTS[variant]
    stores = _stores(checkpoint)
    seen = Counter()
    for batch in _batches(checkpoint):
        readings = [(name, kind, flatten) for name, kind in KINDS[processor].items()
                    for flatten in ((True, False) if kind != "value" else (True,))]
        readings.append(("timers", "timers", True))
        for name, kind, flatten in readings:
            options = {"readRegisteredTimers": "true"} if kind == "timers" else {
                "stateVarName": name, "flattenCollectionTypes": str(flatten).lower()}
            theirs = spark_view(_spark_table(spark, checkpoint, batch, **options), kind, flatten)
            ours = our_view(stores, batch + 1, name, kind, flatten)
            assert ours == theirs, (variant, batch, name, flatten)
            seen[kind] += bool(theirs)
    # every kind of state was there to compare, in some batch
    assert all(seen[kind] for kind in ("value", "list", "map", "timers")), seen


def test_the_stores_files_families_and_options(tws_checkpoints):
    checkpoint = tws_checkpoints["changelog"]
    conf = offset_log_conf(checkpoint)
    assert families_options_from_conf(conf) == {"codec": "lz4", "row_checksum": False, "merge_operator_version": 2}
    assert families_options_from_conf({})["merge_operator_version"] == 1   # a checkpoint from before the conf
    store = _stores(checkpoint)[0]
    kinds = {name for name in store.families() if not name.startswith("$")}
    assert kinds == {"default", "count", "info", "times", "notes", "seen", "tags"}
    assert {"$rowCounter_times", "$rowCounter_notes", "$eventTimers_keyToTimestamp",
            "$eventTimers_timestampToKey"} <= set(store.families())
    assert store.list_families == {"times", "notes"}
    # changelog checkpointing: changelogs of every version, snapshots every 2
    kinds_of_files = Counter(kind for _, kind in store.files.list_files())
    assert kinds_of_files["changelog"] == len(store.versions()) and kinds_of_files["zip"] >= 2
    # the store as a whole: every family of the schema file
    everything = store.load()
    assert set(everything) == set(store.families()) - {"default"}
    assert everything["count"] and all(isinstance(v, list) for v in everything["times"].values())
    # Spark's reader of stores without column families refuses them, naming the file
    snapshot = max(v for v, kind in store.files.list_files() if kind == "zip")
    plain = SparkRocksDBStoreFiles(store.path, pa.schema([("k", pa.int64())]), pa.schema([("v", pa.int64())]))
    with pytest.raises(SparkStateFormatError, match=f"{snapshot}.zip holds column families"):
        plain.load(snapshot)
    with pytest.raises(SparkStateFormatError, match="format v2: a store with column families"):
        plain.read_changelog_records(snapshot + 1)


def test_the_v3_schema_files_and_operator_metadata(tws_checkpoints):
    checkpoint = tws_checkpoints["ttl_checksum_zstd"]
    schemas = read_state_schema_v3(checkpoint, 0)
    key = pa.schema([("key", pa.string()), ("g", pa.int32())])
    grouping = pa.struct(list(key))
    assert schemas["kept"] == (key, pa.schema([("value", pa.struct([("n", pa.int64()), ("s", pa.string())])),
                                               ("ttlExpirationMs", pa.int64())]))
    assert schemas["seen"][0] == pa.schema([("key", grouping), ("userKey", pa.struct([("k", pa.int32())]))])
    assert schemas["$ttl_kept"][0] == pa.schema([("expirationMs", pa.int64()), ("elementKey", grouping)])
    assert schemas["$procTimers_timestampToKey"][0] == pa.schema([pa.field("expiryTimestampMs", pa.int64(), False),
                                                                  ("key", grouping)])
    assert {"$min_hist", "$count_hist", "$rowCounter_hist", "$ttl_hist", "$ttl_seen"} <= set(schemas)
    specs = read_state_schemas_v3(checkpoint, 0)
    assert specs["seen"].key_encoder_spec == {"keyStateEncoderType": "PrefixKeyScanStateEncoderSpec",
                                              "numColsPrefixKey": 1}
    assert specs["$ttl_kept"].key_encoder_spec == {"keyStateEncoderType": "RangeKeyScanStateEncoderSpec",
                                                   "orderingOrdinals": [0]}
    metadata = read_operator_metadata_v2(checkpoint, 0)
    assert metadata["operatorProperties"]["timeMode"] == "ProcessingTime"
    assert {v["stateName"]: v["ttlEnabled"] for v in metadata["operatorProperties"]["stateVariables"]
            if not v["stateName"].startswith("$")} == dict.fromkeys(KINDS["expiring"], True)
    # TTL rows: the value, then its expiration; the TTL index holds the same times
    store = _stores(checkpoint)[0]
    version = store.latest_version()
    kept = store.load_family(version, "kept")
    index = store.load_family(version, "$ttl_kept")
    assert kept and sorted((t, k) for k, (_, t) in kept.items()) == sorted(index)
    hist = store.load_family(version, "hist")
    counts = store.load_family(version, "$count_hist")
    assert {k: len(v) for k, v in hist.items()} == {k: c for k, (c,) in counts.items()}


# -- refused -------------------------------------------------------------------------------------------
@pytest.fixture
def store_copy(tws_checkpoints, tmp_path):
    """A copy of the changelog variant's checkpoint, to damage."""
    checkpoint = str(tmp_path / "ckpt")
    shutil.copytree(tws_checkpoints["changelog"], checkpoint)
    return checkpoint, _stores(checkpoint)[0]


def test_damaged_and_unsupported_stores_are_refused(store_copy):
    checkpoint, store = store_copy
    files = store.files.list_files()
    snapshot = max(v for v, kind in files if kind == "zip")
    version = max(v for v, kind in files if kind == "changelog" and store.files.newest_snapshot(v) < v)
    good = store.load_family(version, "times")
    assert any(len(elements) > 1 for elements in good.values())
    # the list elements read with the other merge operator's delimiter
    comma = SparkRocksDBFamilies.for_store(checkpoint, 0, 0, merge_operator_version=1)
    with pytest.raises(SparkStateFormatError, match="(?s)times .* do not decode .* delimiter b','"):
        comma.load_family(version, "times")
    # a family the schema file does not have, and one the store does not have
    with pytest.raises(SparkStateFormatError, match="column family nothing of the state store .* is not in its schema file"):
        store.load_family(version, "nothing")
    with pytest.raises(SparkStateFormatError, match="has no column family nothing"):
        store.load_family(version, "nothing", key_schema=pa.schema([("k", pa.int64())]),
                          value_schema=pa.schema([("v", pa.int64())]))
    # a family read with another key encoding
    with pytest.raises(SparkStateFormatError, match="(?s)timestampToKey .* do not decode .*\\(none key encoding\\).*-byte key, where a version byte"):
        store.load_family(version, "$eventTimers_timestampToKey", encoder="none")
    # a key of a family id the snapshot does not name
    path = store.files.file_path(version, "changelog")
    original = open(path, "rb").read()
    data = decompress(original, "lz4")
    header = 2 + struct.unpack_from(">H", data)[0]
    record = b"\x01" + struct.pack(">i", 3) + struct.pack("<h", 99) + b"\x00" \
        + struct.pack(">i", 1) + b"\x00"
    with open(path, "wb") as f:
        f.write(compress(data[:header] + record + data[header:], "lz4"))
    with pytest.raises(SparkStateFormatError, match="column family id 99, which its snapshot's metadata does not name"):
        store.load_family(version, "count")
    with open(path, "wb") as f:
        f.write(original)
    assert store.load_family(version, "times") == good
    # a damaged SST file, named
    zip_path = store.files.file_path(snapshot, "zip")
    sst = next(n for n in sorted(os.listdir(f"{store.path}/SSTs")) if n.endswith(".sst"))
    sst_path = f"{store.path}/SSTs/{sst}"
    raw = open(sst_path, "rb").read()
    for damaged, match in [(raw[:-8] + b"\x00" * 8, "magic number"), (raw[:10] + b"\xff" * 20 + raw[30:], "damaged")]:
        with open(sst_path, "wb") as f:
            f.write(damaged)
        with pytest.raises(SparkStateFormatError, match=rf"SST file .*{sst[:6]}.*{os.path.basename(zip_path)}.*{match}"):
            store.read_snapshot_records(snapshot)
    with open(sst_path, "wb") as f:
        f.write(raw)
    # no snapshot to give the families' ids
    for v, kind in store.files.list_files():
        if kind == "zip":
            os.remove(store.files.file_path(v, "zip"))
    with pytest.raises(SparkStateFormatError, match="has no snapshot .* column families' ids"):
        store.families(version)


def test_sst_entries_are_combined_as_rocksdb_does():
    """Per key the newest entry wins; merge operands are appended, oldest first, to the
    value below them (nothing after a deletion), with the merge operator's delimiter."""
    files = [[(b"a", 1, 1, b"A1"), (b"b", 2, 1, b"B"), (b"c", 3, 2, b"C1")],
             [(b"a", 5, 2, b"A2"), (b"b", 6, 0, b""), (b"c", 7, 2, b"C2"), (b"d", 8, 1, b"D")],
             [(b"a", 9, 2, b"A3"), (b"b", 10, 2, b"B2"), (b"d", 11, 0, b"")]]
    state, merged = merge_sst_entries(files, b",", "here")
    assert state == {b"a": b"A1,A2,A3", b"b": b"B2", b"c": b"C1,C2"}
    assert merged == {b"a", b"b", b"c"}
    with pytest.raises(SparkStateFormatError, match="value type 0x16"):
        merge_sst_entries([[(b"a", 1, 0x16, b"")]], b"", "here")


def _changelog_v2(records) -> bytes:
    """A changelog v2 of (type, key, value or None) records, as Spark writes it."""
    out = b"\x00\x02v2"
    for kind, key, value in records:
        out += bytes([kind]) + struct.pack(">i", len(key)) + key
        out += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    return out + b"\x00"


def test_row_checksums_of_values_and_list_elements_are_verified(tws_checkpoints, tmp_path):
    checkpoint = str(tmp_path / "ckpt")
    shutil.copytree(tws_checkpoints["ttl_checksum_zstd"], checkpoint)
    store = _stores(checkpoint)[0]
    assert store.row_checksum and store.files.codec == "zstd"
    ids = store.family_ids(store.latest_version())
    prefixes = {struct.pack("<h", ids[family]) for family in ("kept", "hist")}

    def puts(v):   # the families of the changelog's puts
        return {key[:2] for _, key, value in store.files.read_changelog(v)[1] if value is not None}

    version = max(v for v, kind in store.files.list_files() if kind == "changelog"
                  and store.files.newest_snapshot(v) < v and prefixes <= puts(v))
    _, records = store.files.read_changelog(version)
    path = store.files.file_path(version, "changelog")
    original = open(path, "rb").read()
    assert _changelog_v2(records) == decompress(original, "zstd")
    for family in ("kept", "hist"):
        prefix = struct.pack("<h", ids[family])
        i = next(i for i, (kind, key, value) in enumerate(records) if value is not None and key[:2] == prefix)
        kind, key, value = records[i]
        damaged = list(records)
        damaged[i] = (kind, key, value[:-1] + bytes([value[-1] ^ 1]))
        with open(path, "wb") as f:
            f.write(compress(_changelog_v2(damaged), "zstd"))
        with pytest.raises(SparkStateFormatError, match=f"Row checksum verification failed for a value in the "
                                                        f"column family {family} of version {version}"):
            store.load_family(version, family)
        assert SparkRocksDBFamilies.for_store(checkpoint, 0, 0, verify=False).load_family(version, family)
    with open(path, "wb") as f:
        f.write(original)
    assert store.load_family(version, "hist")
