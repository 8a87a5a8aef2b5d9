"""Spark's RocksDB state files (``microbatch.state.spark_format.rocksdb_files``), with
Spark's engine as the oracle: queries run on Spark's engine with its
RocksDBStateStoreProvider (changelog checkpointing on and off, row checksums and zstd in
one variant), and our reader must load, for every partition and version, exactly what
Spark's ``statestore`` data source reads; then damaged and unsupported stores are
refused with errors that name the file."""
from __future__ import annotations

import io
import json
import os
import shutil
import struct
import zipfile

import pyarrow as pa
import pytest

from helpers import confs
from microbatch.state.spark_format import (
    SparkRocksDBStoreFiles, SparkStateFormatError, offset_log_conf, read_state_schema,
    rocksdb_store_options_from_conf,
)
from microbatch.state.spark_format.compression import compress, decompress
from test_spark_state_format import _statestore_rows, _write_inputs

#: a separate bounded step (make test-porting): moving state between the engines
pytestmark = pytest.mark.porting

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    # a snapshot every 2 versions; with unloadOnCommit the task uploads it at its commit
    # (otherwise the maintenance thread does, every 60 s), so changelog stores get zips too
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.unloadOnCommit": "true",
}
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
VARIANTS = {
    "changelog": ({CHANGELOG: "true"}, ("aggregated", "dedup", "session")),
    "snapshots": ({CHANGELOG: "false"}, ("aggregated", "dedup")),
    "checksum_zstd": ({CHANGELOG: "true", "spark.sql.streaming.stateStore.rowChecksum.enabled": "true",
                       "spark.sql.streaming.stateStore.compression.codec": "zstd"}, ("aggregated",)),
}
CASES = [(variant, name) for variant, (_, names) in VARIANTS.items() for name in names]

INPUT_SCHEMA = "ts TIMESTAMP, key STRING, n INT, amount DECIMAL(12,2), x DOUBLE"
INPUT = [
    [{"ts": "2024-01-01T00:00:01Z", "key": "a", "n": 1, "amount": "1.50", "x": 0.5},
     {"ts": "2024-01-01T00:00:02Z", "key": "b", "n": 2, "amount": "-2.25", "x": None},
     {"ts": "2024-01-01T00:00:03Z", "key": None, "n": None, "amount": None, "x": 1e10},
     {"ts": "2024-01-01T00:00:04Z", "key": "a", "n": 1, "amount": "1.50", "x": -0.0}],
    [{"ts": "2024-01-01T00:00:12Z", "key": "a", "n": 3, "amount": "3", "x": 2.5},
     {"ts": "2024-01-01T00:00:15Z", "key": "c\u00e9 and a longer key", "n": 4, "amount": "0.01", "x": 3.5},
     {"ts": "2024-01-01T00:00:05Z", "key": "b", "n": 2, "amount": "-2.25", "x": None}],
    [{"ts": "2024-01-01T00:00:31Z", "key": "d", "n": 5, "amount": "5", "x": 4.5},
     {"ts": "2024-01-01T00:00:33Z", "key": "a", "n": 1, "amount": "1.50", "x": 0.5},
     {"ts": "2024-01-01T00:00:34Z", "key": "e", "n": 7, "amount": "7", "x": 0.25}],
    [{"ts": "2024-01-01T00:00:52Z", "key": "e", "n": 6, "amount": "-6", "x": 5.5},
     {"ts": "2024-01-01T00:00:53Z", "key": "a", "n": 3, "amount": "3", "x": 2.5}],
    [{"ts": f"2024-01-01T00:01:1{i}Z", "key": key, "n": 8 + i, "amount": "8", "x": 8.5}
     for i, key in enumerate("fghijk")],
]


def _run_queries(spark, directory, names) -> dict:
    """Queries of Spark's own engine to the end of the input (a file a batch, a
    ``foreachBatch`` sink); their checkpoints. Both have watermarks, so later batches
    remove state (changelog deletions)."""
    from pyspark.sql import functions as F
    source = directory / "in"
    _write_inputs(source, INPUT)

    def stream():
        return (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
                .withWatermark("ts", "10 seconds"))

    aggregated = stream().groupBy(F.window("ts", "10 seconds"), "key").agg(
        F.count("*").alias("c"), F.sum("n").alias("total"), F.avg("x").alias("mean"),
        F.sum("amount").alias("amounts"))
    dedup = stream().dropDuplicates(["key", "n", "amount", "ts"])
    # session windows: keys encoded with a prefix (the grouping key) and the rest (the start)
    session = stream().groupBy(F.session_window("ts", "5 seconds"), "key").agg(
        F.count("*").alias("c"), F.sum("amount").alias("amounts"))
    checkpoints = {}
    for name, frame, mode in [("aggregated", aggregated, "update"), ("dedup", dedup, "append"),
                              ("session", session, "append")]:
        if name not in names:
            continue
        checkpoint = str(directory / f"ckpt_{name}")
        query = (frame.writeStream.outputMode(mode).option("checkpointLocation", checkpoint)
                 .foreachBatch(lambda frame, _: frame.write.format("noop").mode("overwrite").save())
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        checkpoints[name] = checkpoint
    return checkpoints


@pytest.fixture(scope="module")
def rocksdb_checkpoints(tmp_path_factory, spark):
    """Spark's RocksDB checkpoints, made once for the module: {(variant, query): checkpoint}."""
    made = {}
    for variant, (conf, names) in VARIANTS.items():
        with confs(spark, {**CONF, **conf}):
            for name, checkpoint in _run_queries(spark, tmp_path_factory.mktemp(variant), names).items():
                made[variant, name] = checkpoint
    return made


def _stores(checkpoint, **overrides) -> list[SparkRocksDBStoreFiles]:
    [schema] = read_state_schema(checkpoint, 0)
    options = {**rocksdb_store_options_from_conf(offset_log_conf(checkpoint)), **overrides}
    return [SparkRocksDBStoreFiles.for_store(checkpoint, 0, partition, schema.key_arrow(), schema.value_arrow(),
                                             **options) for partition in range(2)]


def _our_rows(checkpoint, version, **overrides) -> dict:
    rows = {}
    for partition, store in enumerate(_stores(checkpoint, **overrides)):
        rows.update({(partition, k): v for k, v in store.load(version).items()})
    return rows


def _fullest_version(store) -> int:
    """The version of ``store`` with the most keys (a query's last may have none left)."""
    return max(store.versions(), key=lambda v: len(store.load_records(v)))


def _last_batch(checkpoint) -> int:
    return max(int(n) for n in os.listdir(f"{checkpoint}/commits") if n.isdigit())


@pytest.mark.parametrize("variant,name", CASES)
def test_our_reader_loads_what_spark_reads(spark, rocksdb_checkpoints, variant, name):
    checkpoint = rocksdb_checkpoints[variant, name]
    conf = offset_log_conf(checkpoint)
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB
    assert conf["spark.sql.streaming.stateStore.rocksdb.formatVersion"] == "5"    # Spark 4.3's default
    assert rocksdb_store_options_from_conf(conf) == {
        "codec": "zstd" if variant == "checksum_zstd" else "lz4", "row_checksum": variant == "checksum_zstd"}
    last = _last_batch(checkpoint)
    assert last >= 4
    stores = _stores(checkpoint)
    # session windows' keys have a prefix (the operator metadata's numColsPrefixKey); read
    # as plain keys they are refused, not misread
    assert [store.num_cols_prefix_key for store in stores] == [1 if name == "session" else 0] * 2
    if name == "session":
        store = stores[0]
        with pytest.raises(SparkStateFormatError, match="do not decode with the key schema"):
            _stores(checkpoint, num_cols_prefix_key=0)[0].load(_fullest_version(store))
    kinds = {kind for store in stores for _, kind in store.list_files()}
    assert kinds == ({"zip"} if variant == "snapshots" else {"zip", "changelog"}), kinds
    assert all(store.latest_version() == last + 1 for store in stores)
    for batch in range(last + 1):
        expected = _statestore_rows(spark, checkpoint, batchId=batch)
        assert _our_rows(checkpoint, batch + 1) == expected, batch
    assert expected, "Spark's state is empty: the oracle compares nothing"
    assert _our_rows(checkpoint, None) == _statestore_rows(spark, checkpoint)
    if variant != "snapshots":
        # the watermark removed state: the changelogs hold removals, read as such
        removals = [key for store in stores for v, kind in store.list_files() if kind == "changelog"
                    for key, value in store.read_changelog_records(v) if value is None]
        assert removals


@pytest.mark.parametrize("variant", ["changelog", "checksum_zstd"])
def test_a_snapshot_holds_what_its_changelogs_make(rocksdb_checkpoints, tmp_path, variant):
    checkpoint = str(tmp_path / "copy")
    shutil.copytree(rocksdb_checkpoints[variant, "aggregated"], checkpoint)
    compared = 0
    for store in _stores(checkpoint):
        for version in [v for v, kind in store.list_files() if kind == "zip"]:
            from_snapshot = store.load(version)
            os.rename(store.file_path(version, "zip"), store.file_path(version, "zip") + ".hidden")
            try:
                assert store.newest_snapshot(version) < version
                assert store.load(version) == from_snapshot        # older snapshot + changelogs
            finally:
                os.rename(store.file_path(version, "zip") + ".hidden", store.file_path(version, "zip"))
            compared += 1
    assert compared >= 2


def test_the_framing_of_keys_and_values(rocksdb_checkpoints):
    """One version byte (0) before each UnsafeRow; with row checksums a value is the CRC-32C
    of key and value, then the value's size, little-endian, then the value."""
    from microbatch.state.spark_format import encode_row
    from microbatch.state.spark_format.checksums import crc32c
    for variant in ("snapshots", "checksum_zstd"):
        [schema] = read_state_schema(rocksdb_checkpoints[variant, "aggregated"], 0)
        for store in _stores(rocksdb_checkpoints[variant, "aggregated"]):
            version = _fullest_version(store)
            records = store.load_records(version)
            state = store.load(version)
            assert len(records) == len(state) > 0
            encoded = {b"\x00" + encode_row(k, schema.key_arrow()): b"\x00" + encode_row(v, schema.value_arrow())
                       for k, v in state.items()}
            if variant == "snapshots":
                assert records == encoded
            else:
                assert {k: v[8:] for k, v in records.items()} == encoded
                for key, value in records.items():
                    checksum, size = struct.unpack_from("<iI", value)
                    assert size == len(value) - 8
                    assert checksum & 0xFFFFFFFF == crc32c(key + value[8:])


# -- refusals ----------------------------------------------------------------------------------
@pytest.fixture
def store_copy(rocksdb_checkpoints, tmp_path):
    """A copy of the changelog variant's aggregation checkpoint, and its partition-0 store."""
    checkpoint = str(tmp_path / "copy")
    shutil.copytree(rocksdb_checkpoints["changelog", "aggregated"], checkpoint)
    return checkpoint, _stores(checkpoint)[0]


def _rewrite_zip(path, change):
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    change(entries)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())


def _metadata(entries) -> dict:
    return json.loads(entries["metadata"].decode().split("\n", 1)[1])


def _set_metadata(entries, metadata, version_line="v1"):
    entries["metadata"] = (version_line + "\n" + json.dumps(metadata)).encode()


def _snapshot_version(store) -> int:
    """A snapshot with keys."""
    return max((v for v, kind in store.list_files() if kind == "zip"), key=lambda v: len(store.load_records(v)))


def test_damaged_snapshots_are_refused(store_copy):
    _, store = store_copy
    version = _snapshot_version(store)
    zip_path = store.file_path(version, "zip")
    original = open(zip_path, "rb").read()
    good = store.load(version)

    def refused(match, change):
        _rewrite_zip(zip_path, change)
        try:
            with pytest.raises(SparkStateFormatError, match=match):
                store.load(version)
        finally:
            with open(zip_path, "wb") as f:
                f.write(original)

    refused(r"version 'v2'.*newer Spark", lambda e: _set_metadata(e, _metadata(e), "v2"))
    refused("column families", lambda e: _set_metadata(e, {**_metadata(e), "columnFamilyMapping": {"default": 0}}))
    refused("holds .* keys; its metadata says", lambda e: _set_metadata(e, {**_metadata(e), "numKeys": 1000}))
    refused("no metadata entry", lambda e: e.pop("metadata"))
    refused("no RocksDB CURRENT", lambda e: e.pop("CURRENT"))
    with open(zip_path, "wb") as f:
        f.write(b"not a zip")
    with pytest.raises(SparkStateFormatError, match=f"{version}.zip is not a zip"):
        store.load(version)
    with open(zip_path, "wb") as f:
        f.write(original)
    # an SST file missing, or not the size the metadata says
    sst = store.read_metadata(version)["sstFiles"][0]["dfsSstFileName"]
    sst_path = f"{store.path}/SSTs/{sst}"
    data = open(sst_path, "rb").read()
    with open(sst_path, "wb") as f:
        f.write(data[:-1])
    with pytest.raises(SparkStateFormatError, match=f"{sst} .* has {len(data) - 1} bytes; its metadata says {len(data)}"):
        store.load(version)
    os.remove(sst_path)
    with pytest.raises(SparkStateFormatError, match=f"{sst} that the snapshot .*{version}.zip needs does not exist"):
        store.load(version)
    with open(sst_path, "wb") as f:
        f.write(data)
    assert store.load(version) == good


def test_damaged_and_unsupported_changelogs_are_refused(store_copy):
    _, store = store_copy
    version = max(v for v, kind in store.list_files() if kind == "changelog" and store.newest_snapshot(v) < v
                  and store.load(v))
    path = store.file_path(version, "changelog")
    original = open(path, "rb").read()
    data = decompress(original, store.codec)
    good = store.load(version)

    def refused(match, raw):
        with open(path, "wb") as f:
            f.write(raw)
        try:
            with pytest.raises(SparkStateFormatError, match=match):
                store.load(version)
        finally:
            with open(path, "wb") as f:
                f.write(original)

    refused("ends before its end marker; it is truncated", compress(data[:-4]))
    refused("bytes after its end marker", compress(data + b"\x00"))
    refused("format v2: a store with column families", compress(b"\x00\x02v2" + b"\x00"))
    refused("format v4: a store with column families", compress(b"\x00\x02v4" + b"\x00"))
    refused("format v3: a store with checkpoint ids", compress(b"\x00\x02v3" + b"\x00"))
    refused("format v9; this reader knows v1 to v4", compress(b"\x00\x02v9" + b"\x00"))
    refused(r"LZ4Block|checksum|damaged", original[:40] + bytes([original[40] ^ 0xFF]) + original[41:])
    # a put whose key's version byte is not 0: an unknown encoding
    records = store.read_changelog_records(version)
    first = next(i for i, (_, value) in enumerate(records) if value is not None)
    records[first] = (b"\x01" + records[first][0][1:], records[first][1])
    refused("encoding version byte 1", compress(_changelog_v1(records)))
    assert store.load(version) == good
    # a changelog missing between the snapshot and the version
    os.remove(path)
    with pytest.raises(SparkStateFormatError, match=f"{version}.changelog it needs .* does not exist"):
        store.load(version)


def test_row_checksums_are_checked(rocksdb_checkpoints, tmp_path):
    checkpoint = str(tmp_path / "copy")
    shutil.copytree(rocksdb_checkpoints["checksum_zstd", "aggregated"], checkpoint)
    store = _stores(checkpoint)[0]
    # read without the option: refused with a hint, never rows of garbage
    with pytest.raises(SparkStateFormatError, match="rowChecksum"):
        _stores(checkpoint, row_checksum=False)[0].load(_fullest_version(store))
    # and a store without checksums read with it
    plain = _stores(rocksdb_checkpoints["snapshots", "aggregated"], row_checksum=True)[0]
    with pytest.raises(SparkStateFormatError, match="row_checksum=False|shorter"):
        plain.load(_fullest_version(plain))
    version = max(v for v, kind in store.list_files() if kind == "changelog" and store.newest_snapshot(v) < v
                  and store.read_changelog_records(v) and store.read_changelog_records(v)[0][1] is not None)
    path = store.file_path(version, "changelog")
    data = bytearray(decompress(open(path, "rb").read(), "zstd"))
    key_size = struct.unpack_from(">i", data, 0)[0]
    assert key_size > 0
    data[4 + key_size + 4 + 8 + 1 + 8] ^= 1        # a byte of the first value's row
    with open(path, "wb") as f:
        f.write(compress(bytes(data), "zstd"))
    with pytest.raises(SparkStateFormatError, match=f"Row checksum verification failed .*{version}.changelog"):
        store.load(version)
    assert _stores(checkpoint, verify=False)[0].load(version)      # unchecked, it decodes


def test_other_layouts_and_confs_are_refused(store_copy):
    checkpoint, store = store_copy
    # checkpoint format version 2: versions with checkpoint ids (the ids are in the commit log)
    shutil.copy(store.file_path(1, "changelog"), f"{store.path}/7_0f3e-uuid.changelog")
    with pytest.raises(SparkStateFormatError, match="7_0f3e-uuid.changelog.*checkpointFormatVersion=2"):
        store.load(1)
    os.remove(f"{store.path}/7_0f3e-uuid.changelog")
    assert store.load(0) == {}
    with pytest.raises(ValueError):
        store.load(-1)
    empty = SparkRocksDBStoreFiles(f"{checkpoint}/state/0/9", store.key_schema, store.value_schema)
    assert empty.versions() == [] and empty.load() == {}
    with pytest.raises(SparkStateFormatError, match="1.changelog it needs .* does not exist"):
        empty.load(1)
    conf = offset_log_conf(checkpoint)
    hdfs = {**conf, "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"}
    with pytest.raises(SparkStateFormatError, match="HDFSBackedStateStoreProvider"):
        rocksdb_store_options_from_conf(hdfs)
    with pytest.raises(SparkStateFormatError, match="avro"):
        rocksdb_store_options_from_conf({**conf, "spark.sql.streaming.stateStore.encodingFormat": "avro"})
    # rows shorter than the schema's fixed part: not the operator's schema
    wide = pa.schema([(f"f{i}", pa.int64()) for i in range(20)])
    with pytest.raises(SparkStateFormatError, match="schemas are not the operator's"):
        SparkRocksDBStoreFiles(store.path, wide, store.value_schema).load(_fullest_version(store))


def _changelog_v1(records) -> bytes:
    """A changelog's bytes (before compression) in Spark's v1 format."""
    out = []
    for key, value in records:
        out += [struct.pack(">i", len(key)), key]
        out += [struct.pack(">i", -1)] if value is None else [struct.pack(">i", len(value)), value]
    return b"".join(out + [struct.pack(">i", -1)])


def test_fixed_width_rows_decode_with_numpy_as_row_by_row():
    import datetime
    import decimal

    from microbatch.state.spark_format import encode_row, row_decoder
    from microbatch.state.spark_format.rocksdb_files import _decode_rows
    schema = pa.schema([("a", pa.int64()), ("b", pa.float64()), ("d", pa.date32()), ("m", pa.decimal128(10, 2)),
                        ("ok", pa.bool_()), ("f", pa.float32()), ("z", pa.null()), ("s", pa.int16())])
    rows = [(i, i / 4, datetime.date(2000, 1, 1 + i % 28), decimal.Decimal(i).scaleb(-2), i % 2 == 0, 0.5, None,
             -i) for i in range(300)]
    rows[7] = (None, None, None, None, None, None, None, None)
    rows[100] = (1, None, datetime.date(1970, 1, 1), None, True, None, None, 3)
    for start, prefix in [(1, b"\x00"), (9, b"\x01\x02\x03\x04\x10\x00\x00\x00\x00")]:
        blobs = [prefix + encode_row(r, schema) for r in rows]
        decoder = row_decoder(schema)
        assert _decode_rows(blobs, schema, decoder, start) == [decoder(b, start) for b in blobs] == rows


def test_every_file_is_read_through_the_given_file_system(rocksdb_checkpoints):
    from microbatch.checkpoint.fs import CheckpointFileSystem

    class Recording(CheckpointFileSystem):
        def __init__(self):
            self.read = []

        def read_bytes(self, path):
            self.read.append(path)
            return super().read_bytes(path)

    checkpoint = rocksdb_checkpoints["changelog", "aggregated"]
    plain = _stores(checkpoint)[1]
    version = max(v for v in plain.versions() if 0 < plain.newest_snapshot(v) < v)   # a snapshot and changelogs
    fs = Recording()
    store = _stores(checkpoint, fs=fs)[1]
    assert store.load(version) == plain.load(version)
    names = [p.rsplit("/", 2)[-2:] for p in fs.read]
    snapshot = store.newest_snapshot(version)
    assert [f"{snapshot}.zip"] in [n[-1:] for n in names]
    assert any(n[0] == "SSTs" for n in names)
    assert [n[-1] for n in names if n[-1].endswith(".changelog")] == [
        f"{v}.changelog" for v in range(snapshot + 1, version + 1)]
