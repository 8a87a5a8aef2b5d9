"""Spark's own state files (``microbatch.state.spark_format``): UnsafeRow round trips, the
LZ4/zstd framing, the store files, and the oracle: Spark's engine writes a checkpoint
(HDFSBackedStateStoreProvider), our reader must load exactly what Spark's ``statestore``
data source reads; our writer writes new versions, and Spark's reader must read exactly
what we wrote."""
from __future__ import annotations

import datetime
import decimal
import json
import math
import os
import shutil
import struct

import pyarrow as pa
import pytest

from helpers import confs
from microbatch.state.files import from_struct_array, storage_type, to_struct_array
from microbatch.state.spark_format import (
    SparkStateFormatError, SparkStateStoreFiles, arrow_schema, arrow_type, decode_row, encode_row,
    hadoop_checksum_file, offset_log_conf, parse_state_schema, read_state_schema, state_schema_v2,
    store_options_from_conf,
)
from microbatch.state.spark_format.checksums import crc32c, xxh32
from microbatch.state.spark_format.compression import compress, decompress, lz4_block_compress

#: a separate bounded step (make test-porting): moving state between the engines
pytestmark = pytest.mark.porting

D = decimal.Decimal

# -- a schema with every supported type -----------------------------------------------------
INNER = pa.struct([pa.field("x", pa.int32()), pa.field("s", pa.string()),
                   pa.field("big", pa.decimal128(30, 4))])
EVERY = pa.schema([
    pa.field("bool", pa.bool_()), pa.field("byte", pa.int8()), pa.field("short", pa.int16()),
    pa.field("int", pa.int32()), pa.field("long", pa.int64()), pa.field("float", pa.float32()),
    pa.field("double", pa.float64()), pa.field("string", pa.string()), pa.field("binary", pa.binary()),
    pa.field("date", pa.date32()), pa.field("ts", pa.int64()), pa.field("ts_arrow", pa.timestamp("us")),
    pa.field("dec_small", pa.decimal128(10, 2)), pa.field("dec_18", pa.decimal128(18, 0)),
    pa.field("dec_big", pa.decimal128(38, 10)), pa.field("nothing", pa.null()),
    pa.field("inner", INNER),
    pa.field("ints", pa.list_(pa.int32())), pa.field("bools", pa.list_(pa.bool_())),
    pa.field("strings", pa.list_(pa.string())), pa.field("decs", pa.list_(pa.decimal128(25, 3))),
    pa.field("small_decs", pa.list_(pa.decimal128(9, 3))), pa.field("dates", pa.list_(pa.date32())),
    pa.field("structs", pa.list_(INNER)), pa.field("nested", pa.list_(pa.list_(pa.int64()))),
    pa.field("map", pa.map_(pa.string(), pa.int64())),
    pa.field("map_nested", pa.map_(pa.int32(), pa.struct([pa.field("a", pa.list_(pa.string()))]))),
])
FULL = (
    True, -5, 30000, -2_000_000_000, 9_000_000_000_000_000_000, 1.5, -2.25e300, "héllo, 世界 🎉",
    b"\x00\x01\xff", datetime.date(2024, 2, 29), 1_700_000_000_123_456, -86_400_000_001,
    D("-12345678.90"), D("999999999999999999"), D("-1234567890123456789012345678.0123456789"), None,
    (7, "in", D("123456789012345678901234.5678")),
    (1, None, -3), (True, None, False), ("a", None, "longer than eight bytes"),
    (D("1234567890123456789012.345"), None, D("-0.001")), (D("1.500"), None),
    (datetime.date(1970, 1, 1), None, datetime.date(1, 1, 1)),
    ((1, "x", D("0.0000")), None, (None, None, None)), ((1, 2), (), None, (None,)),
    (("k", 1), ("n", None)), ((1, (("a", None),)), (2, (None,))),
)


def as_value_form(values: tuple, schema) -> tuple:
    """The value form (dicts and lists) of a key-form tuple, via microbatch's own Arrow path."""
    return from_struct_array(to_struct_array([values], schema))[0]


def test_every_type_round_trips_in_key_and_value_form():
    data = encode_row(FULL, EVERY)
    assert len(data) % 8 == 0
    assert decode_row(data, EVERY, as_key=True) == FULL
    # the forms are microbatch's: what files.from_struct_array makes of the same Arrow column of
    # the storage types (timestamps as int64), except that a key's map values are tuples all
    # the way down (``hashable`` leaves a map entry's struct a dict; Spark groups by no map)
    storage = pa.schema([pa.field(f.name, storage_type(f.type), f.nullable) for f in EVERY])
    arrow_key = from_struct_array(to_struct_array([FULL], storage), keys=True)[0]
    assert decode_row(data, EVERY, as_key=True)[:-1] == arrow_key[:-1]
    assert decode_row(data, EVERY) == as_value_form(FULL, storage)
    # the value form encodes to the same bytes (dict structs, list arrays, pair-list maps)
    assert encode_row(decode_row(data, EVERY), EVERY) == data


def test_nulls_everywhere():
    nulls = (None,) * len(EVERY)
    data = encode_row(nulls, EVERY)
    assert decode_row(data, EVERY) == nulls
    # every field's null bit is set; a big decimal keeps its 16 bytes (size 0), the rest are 0
    assert int.from_bytes(data[:8], "little") == (1 << len(EVERY)) - 1
    words = struct.unpack_from(f"<{len(EVERY)}Q", data, 8)
    big = [f.name for f in EVERY].index("dec_big")
    assert words[big] == (8 + 8 * len(EVERY)) << 32 and len(data) == 8 + 8 * len(EVERY) + 16
    assert all(w == 0 for i, w in enumerate(words) if i != big)


def test_the_exact_bytes_of_small_rows():
    # (1, "ab"): bitset, word 1, word offset 24 << 32 | 2, then "ab" padded to 8
    assert encode_row((1, "ab"), pa.schema([("a", pa.int64()), ("b", pa.string())])) == (
        bytes(8) + struct.pack("<q", 1) + struct.pack("<Q", 24 << 32 | 2) + b"ab" + bytes(6))
    # an int in the low 4 bytes, a boolean in the low byte, nulls zeroed with their bit set
    assert encode_row((None, -1, True), pa.schema([("a", pa.int32()), ("b", pa.int32()), ("c", pa.bool_())])) == (
        struct.pack("<Q", 1) + bytes(8) + b"\xff\xff\xff\xff" + bytes(4) + b"\x01" + bytes(7))
    # a decimal(20, 2): BigInteger.toByteArray of 12345 in a 16-byte slot
    assert encode_row((D("123.45"),), pa.schema([("d", pa.decimal128(20, 2))])) == (
        bytes(8) + struct.pack("<Q", 16 << 32 | 2) + b"\x30\x39" + bytes(14))
    # an array<int> of [1, None]: count, bitset, elements, padding
    arr = bytes(8) + struct.pack("<Q", 16 << 32 | 24) + struct.pack("<q", 2) + struct.pack("<Q", 2) \
        + struct.pack("<ii", 1, 0)
    assert encode_row(([1, None],), pa.schema([("a", pa.list_(pa.int32()))])) == arr
    # a map<string,int> of {"k": 7}: key array size, key array, value array
    keys = struct.pack("<q", 1) + bytes(8) + struct.pack("<Q", 24 << 32 | 1) + b"k" + bytes(7)
    values = struct.pack("<q", 1) + bytes(8) + struct.pack("<i", 7) + bytes(4)
    body = struct.pack("<q", len(keys)) + keys + values
    assert encode_row(({"k": 7},), pa.schema([("m", pa.map_(pa.string(), pa.int32()))])) == (
        bytes(8) + struct.pack("<Q", 16 << 32 | len(body)) + body)


def test_large_decimals_at_the_limits():
    schema = pa.schema([("d", pa.decimal128(38, 0)), ("e", pa.decimal128(38, 38)), ("f", pa.decimal128(19, 1))])
    for row in [(D("9" * 38), D("0." + "9" * 38), D("-999999999999999999.9")),
                (D("-" + "9" * 38), D("-0." + "0" * 37 + "1"), D("0.0")),
                (D(0), D("0E-38"), D("-0.1")), (D(2 ** 63), None, D(-128))]:
        got = decode_row(encode_row(row, schema), schema)
        assert got == row and [str(g) for g in got if g is not None] == [
            str(g) for g in from_struct_array(to_struct_array([row], schema))[0] if g is not None]
    with pytest.raises(SparkStateFormatError, match="does not fit"):
        encode_row((D("1" + "0" * 38), None, None), schema)
    # rounding half up to the scale, as Spark's changePrecision
    assert decode_row(encode_row((None, None, D("1.25")), schema), schema)[2] == D("1.3")


def test_floats_and_many_fields():
    schema = pa.schema([pa.field(f"f{i}", pa.float64() if i % 2 else pa.int64()) for i in range(130)])
    row = tuple(None if i % 7 == 0 else (i + 0.5 if i % 2 else -i) for i in range(130))
    data = encode_row(row, schema)
    assert int.from_bytes(data[:24], "little") == sum(1 << i for i in range(0, 130, 7))   # 3 bitset words
    assert decode_row(data, schema) == row
    nan = decode_row(encode_row((float("nan"), float("-inf")), pa.schema([("a", pa.float32()), ("b", pa.float64())])),
                     pa.schema([("a", pa.float32()), ("b", pa.float64())]))
    assert math.isnan(nan[0]) and nan[1] == float("-inf")
    assert decode_row(b"", pa.schema([])) == ()


def test_timestamps_and_refused_types():
    schema = pa.schema([("t", pa.timestamp("us", tz="UTC"))])
    aware = datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone.utc)
    assert decode_row(encode_row((aware,), schema), schema) == (int(aware.timestamp()) * 1_000_000 + 6,)
    for bad in (pa.uint32(), pa.float16(), pa.timestamp("ns"), pa.duration("us"), pa.month_day_nano_interval()):
        with pytest.raises(SparkStateFormatError):
            encode_row((None,), pa.schema([("x", bad)]))
    with pytest.raises(SparkStateFormatError, match="shorter"):
        decode_row(bytes(8), pa.schema([("a", pa.int64()), ("b", pa.int64())]))


# -- compression -----------------------------------------------------------------------------
def test_lz4_block_framing():
    data = os.urandom(40_000) + b"abc" * 50_000      # a stored block, then LZ4 blocks
    framed = lz4_block_compress(data)
    assert framed[:8] == b"LZ4Block" and framed[8] == 0x10 | 5        # stored, level log2(32K)-10
    assert framed[-21:] == b"LZ4Block" + bytes([0x15]) + bytes(12)    # the end block
    assert framed[21 + 32768 + 8] == 0x25                               # the second block is LZ4
    assert decompress(framed) == data
    assert decompress(framed + framed) == data + data                   # concatenated streams
    # the checksum: xxHash32 (seed 0x9747b28c) of the block, masked to 28 bits
    assert struct.unpack_from("<i", framed, 17)[0] == xxh32(data[:32768], 0x9747B28C) & 0x0FFFFFFF
    damaged = bytearray(framed)
    damaged[30] ^= 1
    with pytest.raises(SparkStateFormatError, match="checksum"):
        decompress(bytes(damaged))
    assert decompress(bytes(damaged), verify=False) != data
    with pytest.raises(SparkStateFormatError, match="LZ4Block"):
        decompress(compress(data, "zstd"), "lz4")
    assert decompress(b"") == b""


def test_zstd_and_refused_codecs():
    data = b"state" * 10_000
    assert decompress(compress(data, "zstd"), "zstd") == data
    assert decompress(compress(data, "org.apache.spark.io.ZStdCompressionCodec"), "zstd") == data
    for codec in ("snappy", "lzf", "com.example.MyCodec"):
        with pytest.raises(SparkStateFormatError, match=f"'{codec}'"):
            compress(data, codec)


def test_checksums():
    assert crc32c(b"123456789") == 0xE3069283
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F
    assert hadoop_checksum_file(b"x" * 1000)[:8] == b"crc\x00" + struct.pack(">i", 512)


# -- the store's files -----------------------------------------------------------------------
KEYS = pa.schema([("name", pa.string()), ("n", pa.int64())])
VALUES = pa.schema([("count", pa.int64()), ("last", pa.decimal128(20, 2))])


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_store_files_load_as_spark_does(tmp_path, codec):
    store = SparkStateStoreFiles(str(tmp_path / "0"), KEYS, VALUES, codec=codec)
    store.write_delta(1, {("a", 1): (1, D("1.00")), ("b", None): (2, None)})
    store.write_delta(2, [(("a", 1), None), (("c", 3), (3, D("-3.50")))])
    store.write_snapshot(2, {("b", None): (2, None), ("c", 3): (3, D("-3.50"))})
    store.write_delta(3, [(("b", None), (20, D("0.01")))])
    assert store.list_files() == [(1, "delta"), (2, "snapshot"), (2, "delta"), (3, "delta")]
    assert store.load(1) == {("a", 1): (1, D("1.00")), ("b", None): (2, None)}
    assert store.load() == store.load(3) == {("b", None): (20, D("0.01")), ("c", 3): (3, D("-3.50"))}
    assert store.read_rows(2, "delta") == ([("a", 1), ("c", 3)], [None, (3, D("-3.50"))])
    assert store.read_records(2, "delta")[0] == (encode_row(("a", 1), KEYS), None)
    # the snapshot wins over the deltas up to it: damage delta 1, load 3 still works
    (tmp_path / "0" / "1.delta").write_bytes(b"garbage")
    assert store.load(3) == {("b", None): (20, D("0.01")), ("c", 3): (3, D("-3.50"))}
    os.remove(tmp_path / "0" / "2.snapshot")
    with pytest.raises(SparkStateFormatError):
        store.load(3)
    os.remove(tmp_path / "0" / "2.delta")
    with pytest.raises(SparkStateFormatError, match="2.delta .*does not exist"):
        store.load(3)
    assert store.load(0) == {}
    # Hadoop's hidden checksum file beside each file, matching its bytes
    raw = (tmp_path / "0" / "3.delta").read_bytes()
    assert (tmp_path / "0" / ".3.delta.crc").read_bytes() == hadoop_checksum_file(raw)


def test_fixed_width_files_decode_with_numpy_as_row_by_row(tmp_path):
    keys = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("d", pa.date32())])
    values = pa.schema([("c", pa.int64()), ("x", pa.decimal128(12, 3)), ("ok", pa.bool_()), ("z", pa.null())])
    state = {(i, -i, datetime.date(2000, 1, 1 + i % 28)): (i * 3, D(i).scaleb(-3), i % 2 == 0, None)
             for i in range(500)}
    state[(None, 1, None)] = (None, None, None, None)
    state[(7, None, datetime.date(1999, 1, 1))] = (1, None, True, None)
    store = SparkStateStoreFiles(str(tmp_path / "s"), keys, values)
    store.write_snapshot(1, state)
    data = store.read_bytes(1, "snapshot")
    fast = store._fixed_stride(data, "x")
    assert fast is not None
    spans = store._spans(data, "x", "snapshot")
    slow = ([decode_row(data[k:k + ks], keys, as_key=True) for k, ks, _, _ in spans],
            [decode_row(data[v:v + vs], values) for _, _, v, vs in spans])
    assert fast == slow
    assert store.load(1) == state


def test_row_checksums(tmp_path):
    store = SparkStateStoreFiles(str(tmp_path / "s"), KEYS, VALUES, row_checksum=True)
    store.write_delta(1, {("a", 1): (1, D("1.00")), ("b", 2): (2, None)})
    store.write_delta(2, [(("a", 1), None)])
    assert store.load(2) == {("b", 2): (2, None)}
    raw = store.read_bytes(1, "delta")
    key = encode_row(("a", 1), KEYS)
    value = encode_row((1, D("1.00")), VALUES)
    assert raw[4 + len(key) + 4:4 + len(key) + 8] == struct.pack("<I", crc32c(key + value))
    removal = store.read_bytes(2, "delta")
    assert removal[4:8] == struct.pack("<I", crc32c(key)) and removal[8 + len(key):12 + len(key)] == b"\xff" * 4
    plain = SparkStateStoreFiles(str(tmp_path / "s"), KEYS, VALUES)
    with pytest.raises(SparkStateFormatError, match="rowChecksum"):
        plain.load(2)
    damaged = bytearray(raw)
    damaged[4 + len(key) + 4 + 8] ^= 1         # a byte of the value row (the count)
    (tmp_path / "s" / "1.delta").write_bytes(compress(bytes(damaged)))
    with pytest.raises(SparkStateFormatError, match="Row checksum"):
        store.load(1)


def test_schema_files_and_spark_types():
    key = {"type": "struct", "fields": [
        {"name": "window", "type": {"type": "struct", "fields": [
            {"name": "start", "type": "timestamp", "nullable": True, "metadata": {}},
            {"name": "end", "type": "timestamp", "nullable": True, "metadata": {}}]}, "nullable": False,
         "metadata": {}},
        {"name": "k\u00e9y\U0001F600", "type": "string", "nullable": True, "metadata": {}}]}
    value = {"type": "struct", "fields": [
        {"name": "a", "type": {"type": "array", "elementType": "decimal(25,3)", "containsNull": True},
         "nullable": True, "metadata": {}},
        {"name": "m", "type": {"type": "map", "keyType": "string", "valueType": "date",
                               "valueContainsNull": False}, "nullable": True, "metadata": {}}]}
    [parsed] = parse_state_schema(state_schema_v2(key, value))
    assert parsed.key_schema == key and parsed.value_schema == value
    assert arrow_schema(key) == pa.schema([
        pa.field("window", pa.struct([("start", pa.int64()), ("end", pa.int64())]), False),
        pa.field("k\u00e9y\U0001F600", pa.string())])
    assert arrow_schema(value).field("m").type == pa.map_(pa.string(), pa.field("value", pa.date32(), False))
    assert arrow_type("string collate UTF8_LCASE") == pa.string()
    with pytest.raises(SparkStateFormatError, match="interval"):
        arrow_type("interval day to second")
    long_name = "x" * 70_000      # two writeUTF chunks
    [parsed] = parse_state_schema(state_schema_v2({"type": "struct", "fields": [
        {"name": long_name, "type": "long", "nullable": True, "metadata": {}}]}, value))
    assert parsed.key_schema["fields"][0]["name"] == long_name


# -- the oracle: Spark's engine and Spark's statestore reader ------------------------------------
ORACLE_CONF = {
    "spark.sql.shuffle.partitions": "2",
    # every commit runs maintenance, so Spark writes snapshots (after 2 deltas) we then read
    "spark.sql.streaming.stateStore.unloadOnCommit": "true",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
}


def _write_inputs(directory, batches):
    directory.mkdir()
    for i, rows in enumerate(batches):
        (directory / f"part-{i:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))


INPUT_SCHEMA = "ts TIMESTAMP, key STRING, n INT, amount DECIMAL(25,5), price DOUBLE, day DATE, flag BOOLEAN"
INPUT = [
    [{"ts": "2024-01-01T00:00:01Z", "key": "a", "n": 1, "amount": "1.5", "price": 0.5, "day": "2024-01-01", "flag": True},
     {"ts": "2024-01-01T00:00:02Z", "key": "b", "n": 2, "amount": "-2.25", "price": None, "day": None, "flag": False},
     {"ts": "2024-01-01T00:00:03Z", "key": None, "n": None, "amount": None, "price": 1e10, "day": "1999-12-31", "flag": None},
     {"ts": "2024-01-01T00:00:04Z", "key": "a", "n": 1, "amount": "12345678901234567890.12345", "price": -0.0, "day": "2024-01-01", "flag": True}],
    [{"ts": "2024-01-01T00:00:12Z", "key": "a", "n": 3, "amount": "3", "price": 2.5, "day": "2024-01-02", "flag": True},
     {"ts": "2024-01-01T00:00:15Z", "key": "c\u00e9", "n": 4, "amount": "0.00001", "price": 3.5, "day": "2024-01-03", "flag": False},
     {"ts": "2024-01-01T00:00:05Z", "key": "b", "n": 2, "amount": "-2.25", "price": None, "day": None, "flag": False}],
    [{"ts": "2024-01-01T00:00:31Z", "key": "d", "n": 5, "amount": "5", "price": 4.5, "day": "2024-01-04", "flag": None},
     {"ts": "2024-01-01T00:00:33Z", "key": "a", "n": 1, "amount": "1.5", "price": 0.5, "day": "2024-01-01", "flag": True}],
    [{"ts": "2024-01-01T00:00:52Z", "key": "e", "n": 6, "amount": "-6", "price": 5.5, "day": "2024-01-05", "flag": True},
     {"ts": "2024-01-01T00:00:53Z", "key": "a", "n": 3, "amount": "3", "price": 2.5, "day": "2024-01-02", "flag": True}],
]


def _run_spark_queries(spark, tmp_path, names):
    """Queries of Spark's own engine (``names`` of windowed, dedup, aggregated), each to the
    end of the input; their checkpoints."""
    from pyspark.sql import functions as F
    source = tmp_path / "in"
    _write_inputs(source, INPUT)

    def stream():
        return spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))

    windowed = (stream().withWatermark("ts", "10 seconds")
                .groupBy(F.window("ts", "10 seconds"), "key").count())
    dedup = (stream().select("key", "n", "amount", "day", "flag", "price",
                             F.array("n", F.lit(None).cast("int")).alias("arr"),
                             F.struct("key", "amount").alias("pair"),
                             F.col("key").cast("binary").alias("raw"))
             .dropDuplicates(["key", "n", "amount", "day", "flag", "price", "arr", "pair", "raw"]))
    aggregated = (stream().groupBy("key").agg(
        F.count("*").alias("c"), F.sum("amount").alias("total"), F.max("price").alias("top"),
        F.min("day").alias("first_day"), F.avg("n").alias("mean"), F.max("key").alias("name")))
    checkpoints = {}
    for name, frame, mode in [("windowed", windowed, "append"), ("dedup", dedup, "append"),
                              ("aggregated", aggregated, "update")]:
        if name not in names:
            continue
        checkpoint = str(tmp_path / f"ckpt_{name}")
        query = (frame.writeStream.format("noop").outputMode(mode).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        checkpoints[name] = checkpoint
    return checkpoints


def _statestore_rows(spark, checkpoint, **options) -> dict:
    """{(partition, key): value} as Spark's statestore data source reads the checkpoint."""
    reader = spark.read.format("statestore")
    for k, v in options.items():
        reader = reader.option(k, str(v))
    table = _distinct_names(reader.load(checkpoint)).toArrow()
    keys = from_struct_array(_storage(table.column("key")), keys=True)
    values = from_struct_array(_storage(table.column("value")))
    return {(p, k): v for p, k, v in zip(table.column("partition_id").to_pylist(), keys, values)}


def _distinct_names(frame):
    """The key and value structs with fields renamed f0, f1, ... (an aggregation's buffer has
    duplicate names, which Arrow conversion refuses); the values stay in place."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType
    columns = []
    for name in frame.columns:
        t = frame.schema[name].dataType
        if name in ("key", "value"):
            renamed = StructType([StructField(f"f{i}", f.dataType, f.nullable) for i, f in enumerate(t.fields)])
            columns.append(F.col(name).cast(renamed).alias(name))
        else:
            columns.append(F.col(name))
    return frame.select(*columns)


def _storage(column):
    """A column in microbatch's state storage types (nested timestamps as int64 µs)."""
    return column.cast(storage_type(column.type))


def _last_batch(checkpoint) -> int:
    return max(int(n) for n in os.listdir(f"{checkpoint}/commits") if n.isdigit())


def _our_rows(checkpoint, version, operator=0) -> dict:
    [schema] = read_state_schema(checkpoint, operator)
    options = store_options_from_conf(offset_log_conf(checkpoint))
    rows = {}
    for partition in range(2):
        store = SparkStateStoreFiles.for_store(checkpoint, operator, partition, schema.key_arrow(),
                                               schema.value_arrow(), **options)
        rows.update({(partition, k): v for k, v in store.load(version).items()})
    return rows


#: The checkpoints the oracle tests read: Spark's defaults for every query, then the two
#: settings that change the files, each for the queries with removals and wide values.
VARIANTS = {
    "default": ({}, ("windowed", "dedup", "aggregated")),
    "zstd": ({"spark.sql.streaming.stateStore.compression.codec": "zstd"}, ("windowed", "aggregated")),
    "row_checksum": ({"spark.sql.streaming.stateStore.rowChecksum.enabled": "true"}, ("windowed", "aggregated")),
}
CASES = [(variant, name) for variant, (_, names) in VARIANTS.items() for name in names]


@pytest.fixture(scope="module")
def spark_checkpoints(tmp_path_factory, spark):
    """Spark's checkpoints, made once for the module: {(variant, query): checkpoint}."""
    made = {}
    for variant, (conf, names) in VARIANTS.items():
        with confs(spark, {**ORACLE_CONF, **conf}):
            for name, checkpoint in _run_spark_queries(spark, tmp_path_factory.mktemp(variant), names).items():
                made[variant, name] = checkpoint
    return made


def _options(checkpoint) -> dict:
    """The store options the checkpoint's offset log records (codec, row checksums)."""
    return store_options_from_conf(offset_log_conf(checkpoint))


@pytest.mark.parametrize("variant,name", CASES)
def test_our_reader_loads_what_spark_reads(spark, spark_checkpoints, variant, name):
    checkpoint = spark_checkpoints[variant, name]
    options = _options(checkpoint)
    assert options == {"codec": "zstd" if variant == "zstd" else "lz4", "row_checksum": variant == "row_checksum"}
    last = _last_batch(checkpoint)
    expected = _statestore_rows(spark, checkpoint)
    assert expected, "Spark's state is empty: the oracle compares nothing"
    assert _our_rows(checkpoint, last + 1) == expected
    # every earlier version too, each file on its own, and Spark's snapshots
    files = []
    [schema] = read_state_schema(checkpoint, 0)
    for partition in range(2):
        store = SparkStateStoreFiles.for_store(checkpoint, 0, partition, schema.key_arrow(), schema.value_arrow(),
                                               **options)
        files += [(store, v, kind) for v, kind in store.list_files()]
        for v, kind in store.list_files():
            raw = open(store.file_path(v, kind), "rb").read()
            # our compression of the file's bytes is Spark's file, byte for byte
            assert compress(decompress(raw, options["codec"]), options["codec"]) == raw
            # our encoding of each decoded key and value is Spark's row, byte for byte (the
            # HDFS provider's map compares keys by their bytes)
            keys, values = store.read_rows(v, kind)
            records = store.read_records(v, kind)
            assert [encode_row(k, schema.key_arrow()) for k in keys] == [k for k, _ in records]
            assert [None if x is None else encode_row(x, schema.value_arrow()) for x in values] == [
                x for _, x in records]
            hidden = os.path.join(store.path, f".{v}.{kind}.crc")
            if os.path.exists(hidden):     # Hadoop's local checksum file: ours is the same
                assert open(hidden, "rb").read() == hadoop_checksum_file(raw)
            if kind == "snapshot":         # a snapshot holds the state its deltas make
                assert store.load(v) == _load_from_deltas(store, v)
    for batch in range(last + 1):
        assert _our_rows(checkpoint, batch + 1) == _statestore_rows(spark, checkpoint, batchId=batch), batch
    kinds = {kind for _, _, kind in files}
    assert "snapshot" in kinds, f"Spark wrote no snapshot to read: {sorted(os.listdir(store.path))}"


def _load_from_deltas(store, version) -> dict:
    state: dict = {}
    for v in range(1, version + 1):
        for key, value in store.iter_rows(v, "delta"):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


@pytest.mark.parametrize("name", ["windowed", "dedup", "aggregated"])
def test_the_state_schema_files_spark_wrote(spark, spark_checkpoints, name):
    checkpoint = spark_checkpoints["default", name]
    raw = open(f"{checkpoint}/state/0/0/_metadata/schema", "rb").read()
    assert raw[:4] == b"\x00\x02v2"
    [schema] = parse_state_schema(raw)
    assert state_schema_v2(schema.key_schema, schema.value_schema) == raw
    frame = spark.read.format("statestore").load(checkpoint)
    for column, ours in [("key", schema.key_arrow()), ("value", schema.value_arrow())]:
        spark_type = json.loads(frame.schema[column].dataType.json())
        assert [(f.name, f.type) for f in arrow_schema(spark_type)] == [(f.name, f.type) for f in ours]
    if name == "windowed":
        assert [(f.name, f.type) for f in schema.key_arrow()] == [
            ("window", pa.struct([("start", pa.int64()), ("end", pa.int64())])), ("key", pa.string())]
        assert [(f.name, f.type) for f in schema.value_arrow()] == [("count", pa.int64())]


@pytest.mark.parametrize("variant,name", CASES)
def test_spark_reads_what_our_writer_wrote(spark, spark_checkpoints, tmp_path, variant, name):
    checkpoint = str(tmp_path / "copy")
    shutil.copytree(spark_checkpoints[variant, name], checkpoint)
    options = _options(checkpoint)
    last = _last_batch(checkpoint)
    version = last + 1
    [schema] = read_state_schema(checkpoint, 0)
    key_schema, value_schema = schema.key_arrow(), schema.value_arrow()
    before = _our_rows(checkpoint, version)
    expected_next, expected_after, updates, removals = {}, {}, set(), set()
    for partition in range(2):
        store = SparkStateStoreFiles.for_store(checkpoint, 0, partition, key_schema, value_schema, **options)
        state = store.load(version)
        items = sorted(state.items(), key=repr)
        changes = {}
        if items:
            removed_key = items[0][0]
            changes[removed_key] = None
            for key, value in items[1:]:
                changes[key] = _modified(value, value_schema)
        new_key = _new_key(key_schema, partition)
        changes[new_key] = _modified(tuple(None for _ in value_schema) if not items else items[-1][1],
                                     value_schema)
        store.write_delta(version + 1, changes)
        updates |= {(partition, k) for k, v in changes.items() if v is not None}
        removals |= {(partition, k) for k, v in changes.items() if v is None}
        after_delta = {k: v for k, v in {**state, **changes}.items() if v is not None}
        assert store.load(version + 1) == after_delta
        # version + 2: a snapshot only (Spark loads it without a delta of its own)
        after_snapshot = {k: _modified(v, value_schema) for k, v in after_delta.items()}
        store.write_snapshot(version + 2, after_snapshot)
        expected_next.update({(partition, k): v for k, v in after_delta.items()})
        expected_after.update({(partition, k): v for k, v in after_snapshot.items()})
    assert expected_next != before
    # the batches exist for Spark's reader: their offsets and commits, copied from the last
    for batch in (last + 1, last + 2):
        shutil.copy(f"{checkpoint}/offsets/{last}", f"{checkpoint}/offsets/{batch}")
        shutil.copy(f"{checkpoint}/commits/{last}", f"{checkpoint}/commits/{batch}")
    assert _statestore_rows(spark, checkpoint, batchId=last) == before
    assert _statestore_rows(spark, checkpoint, batchId=last + 1) == expected_next
    assert _statestore_rows(spark, checkpoint, batchId=last + 2) == expected_after
    assert _statestore_rows(spark, checkpoint) == expected_after
    # Spark's change feed reads our delta's updates and removals
    feed = (spark.read.format("statestore").option("readChangeFeed", "true")
            .option("changeStartBatchId", str(last + 1)).option("changeEndBatchId", str(last + 1))
            .load(checkpoint))
    feed = _distinct_names(feed).toArrow()
    kinds = feed.column("change_type").to_pylist()
    keys = from_struct_array(_storage(feed.column("key")), keys=True)
    changes = {(p, k): (kind, v) for p, k, kind, v in zip(
        feed.column("partition_id").to_pylist(), keys, kinds, from_struct_array(_storage(feed.column("value"))))}
    assert {pk for pk, (kind, _) in changes.items() if kind == "update"} == updates
    assert {pk for pk, (kind, _) in changes.items() if kind == "delete"} == removals
    assert all(v == expected_next[pk] for pk, (kind, v) in changes.items() if kind == "update")


def _modified(value: tuple, schema: pa.Schema) -> tuple:
    """A changed value of the same schema: numbers bumped, strings suffixed, nulls filled."""
    out = []
    for v, f in zip(value, schema):
        t = f.type
        if pa.types.is_integer(t):
            out.append(1000 if v is None else v + 1000)
        elif pa.types.is_floating(t):
            out.append(0.25 if v is None else v * 2 + 1)
        elif pa.types.is_decimal(t):
            out.append(D("1").scaleb(-t.scale) if v is None else v + D("1"))
        elif pa.types.is_string(t):
            out.append("new" if v is None else v + "!")
        elif pa.types.is_date32(t):
            out.append(datetime.date(2020, 1, 1) if v is None else v + datetime.timedelta(days=1))
        elif pa.types.is_boolean(t):
            out.append(True if v is None else not v)
        else:
            out.append(v)
    return tuple(out)


def _new_key(schema: pa.Schema, partition: int) -> tuple:
    """A key no query made (which partition Spark would hash it to does not matter to the reader)."""
    def make(t):
        if pa.types.is_struct(t):
            return tuple(make(f.type) for f in t)
        if pa.types.is_list(t):
            return (partition, None)
        if pa.types.is_integer(t):
            return 4242 + partition
        if pa.types.is_floating(t):
            return 42.5
        if pa.types.is_decimal(t):
            return D("42").scaleb(-t.scale) * 7
        if pa.types.is_string(t):
            return f"written by microbatch {partition}"
        if pa.types.is_binary(t):
            return b"\x00mb"
        if pa.types.is_date32(t):
            return datetime.date(2030, 1, partition + 1)
        if pa.types.is_boolean(t):
            return True
        return None
    return tuple(make(f.type) for f in schema)
