"""The files of Spark's ``HDFSBackedStateStoreProvider`` (Spark 4.3), read and written.

One store is ``<checkpoint>/state/<operatorId>/<partitionId>[/<storeName>]/`` (the store
name only when not ``default``: the stream-stream join's four stores). In it:

- ``<v>.delta``: the changes that make version v from v-1;
- ``<v>.snapshot``: every key and value of version v (written by maintenance).

A file is one compressed stream (``compression.py``: lz4 by default, or zstd) of records
written with ``java.io.DataOutputStream``: the key's size (big-endian int), the key's
UnsafeRow bytes, the value's size, the value's UnsafeRow bytes; a removed key (deltas
only) has value size -1 and no value bytes; the file ends with a key size of -1.
Version v is loaded as Spark does: the snapshot of v if there is one, else the newest
snapshot below v (none: the empty map at version 0) plus the deltas after it, in order.
Spark's file listing takes only names ``<number>.delta`` and ``<number>.snapshot``.

Spark 4.x additions, and what is done with them:

- **Row checksums** (``spark.sql.streaming.stateStore.rowChecksum.enabled``, 4.1.0,
  off by default; recorded in the offset log's conf): every value (and a removed key in a
  delta) is prefixed with a 4-byte CRC-32C (of the key's and the value's row bytes; of the
  key's alone for a removal), native (little-endian) order. ``row_checksum=True`` reads
  (and verifies, with ``verify``) and writes them; with it off, such a file fails to
  decode with an error saying so, because the values' sizes are off by four.
- **Checkpoint file checksums** (``spark.sql.streaming.checkpoint.fileChecksum.enabled``,
  on by default since 4.1.0): sidecar ``<file>.crc`` JSON files. Spark's ``StateStoreConf``
  turns them on only with ``spark.sql.streaming.stateStore.checkpointFormatVersion`` >= 2,
  which the HDFS provider refuses, so its stores never have them. A stale sidecar of a
  file this writer replaces is deleted (Spark reads a file without one, with a warning).
- Hadoop's local file system keeps a hidden ``.<file>.crc`` (CRC-32 per 512 bytes) beside
  every file Spark writes locally, and verifies it on read. This writer writes that file
  too on local disk (``hadoop_checksum``), so a replaced file and its checksum agree.
- Column families in the HDFS provider (``<v>.<family>.delta``, ``<v>.metadata``) are
  not in Spark 4.3; a store directory holding them is refused.

Decoding: a file whose records all have one key size and one value size (fixed-width
schemas: numbers, dates, timestamps, small decimals, without removals) is decoded with
numpy, all rows at once; any other file record by record, with the schema's generated
row decoders (``unsafe_row``).
"""
from __future__ import annotations

import json
import re
import struct
import zlib
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from microbatch.state.spark_format import compression
from microbatch.state.spark_format.checksums import crc32c_many
from microbatch.state.spark_format.unsafe_row import (
    SparkStateFormatError, decode_columns, fixed_size, fixed_width_dtype, row_decoder, row_encoder,
)

_FILE = re.compile(r"^(\d+)\.(delta|snapshot)$")
_FAMILY_FILE = re.compile(r"^(\d+)\.(.+)\.(delta|snapshot)$|^(\d+)\.metadata$")
_INT = struct.Struct(">i")
_LE_INT = struct.Struct("<i")
_END = _INT.pack(-1)
#: Hadoop's ChecksumFileSystem: "crc\0", bytes per checksum, then a CRC-32 per chunk.
_HADOOP_CRC_MAGIC = b"crc\x00"
_HADOOP_BYTES_PER_CHECKSUM = 512


def store_path(checkpoint: str, operator_id: int, partition_id: int, store_name: str = "default") -> str:
    """The directory of one store: ``<checkpoint>/state/<op>/<partition>[/<store>]``."""
    path = f"{checkpoint.rstrip('/')}/state/{operator_id}/{partition_id}"
    return path if store_name == "default" else f"{path}/{store_name}"


def hadoop_checksum_file(data: bytes, bytes_per_checksum: int = _HADOOP_BYTES_PER_CHECKSUM) -> bytes:
    """The ``.<name>.crc`` Hadoop's local file system keeps for a file of ``data``."""
    out = [_HADOOP_CRC_MAGIC, struct.pack(">i", bytes_per_checksum)]
    for i in range(0, len(data), bytes_per_checksum):
        out.append(struct.pack(">I", zlib.crc32(data[i:i + bytes_per_checksum])))
    return b"".join(out)


class SparkStateStoreFiles:
    """The delta and snapshot files of one of Spark's HDFS-provider stores.

    ``path``: the store's directory (``store_path``). ``key_schema``/``value_schema``: the
    rows' schemas as pyarrow storage types (``schema_file.arrow_schema`` of the operator's
    schema file). ``codec``: ``spark.sql.streaming.stateStore.compression.codec`` of the
    query (lz4 or zstd). ``fs``: the checkpoint's storage layer (``checkpoint/fs.py``; local
    disk when None). ``verify``: check LZ4 block checksums and row checksums on read.
    """

    def __init__(self, path: str, key_schema, value_schema, codec: str = "lz4", fs=None,
                 row_checksum: bool = False, verify: bool = True,
                 lz4_block_size: int = compression.LZ4_DEFAULT_BLOCK_SIZE,
                 hadoop_checksum: bool | None = None):
        if fs is None:
            from microbatch.checkpoint.fs import CheckpointFileSystem
            fs = CheckpointFileSystem()
        self.path = path.rstrip("/")
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.codec = compression.codec_name(codec)
        self.fs = fs
        self.row_checksum = row_checksum
        self.verify = verify
        self.lz4_block_size = lz4_block_size
        self.hadoop_checksum = (getattr(fs, "scheme", None) == "file") if hadoop_checksum is None \
            else hadoop_checksum
        self._key_decoder = row_decoder(key_schema, as_key=True)
        self._value_decoder = row_decoder(value_schema, as_key=False)
        self._key_fixed = fixed_size(key_schema)
        self._value_fixed = fixed_size(value_schema)

    @classmethod
    def for_store(cls, checkpoint: str, operator_id: int, partition_id: int, key_schema, value_schema,
                  store_name: str = "default", **options) -> "SparkStateStoreFiles":
        return cls(store_path(checkpoint, operator_id, partition_id, store_name), key_schema,
                   value_schema, **options)

    def __repr__(self) -> str:
        return f"SparkStateStoreFiles({self.path!r}, codec={self.codec!r})"

    # -- listing ------------------------------------------------------------------------
    def file_path(self, version: int, kind: str) -> str:
        return f"{self.path}/{version}.{kind}"

    def list_files(self) -> list[tuple[int, str]]:
        """(version, kind) of every delta and snapshot, oldest first, a version's snapshot
        before its delta."""
        files = []
        for name in self.fs.list(self.path):
            m = _FILE.match(name)
            if m:
                files.append((int(m.group(1)), m.group(2)))
            elif _FAMILY_FILE.match(name):
                raise SparkStateFormatError(
                    f"The state store {self.path} holds the file {name}: column-family files of "
                    "the HDFS provider, which Spark 4.3 does not write and this reader does not read.")
        return sorted(files, key=lambda f: (f[0], f[1] != "snapshot"))

    def versions(self) -> list[int]:
        """The versions that have a delta or a snapshot, ascending."""
        return sorted({v for v, _ in self.list_files()})

    def latest_version(self) -> int:
        """The newest version with a file (0: none)."""
        return max(self.versions(), default=0)

    # -- reading ------------------------------------------------------------------------
    def read_bytes(self, version: int, kind: str) -> bytes:
        """A file's decompressed bytes (FileNotFoundError when it does not exist)."""
        path = self.file_path(version, kind)
        return compression.decompress(self.fs.read_bytes(path), self.codec, self.verify, f" {path}")

    def read_records(self, version: int, kind: str) -> list[tuple[bytes, bytes | None]]:
        """(key bytes, value bytes or None for a removed key) of a file, in file order; with
        row checksums, the rows without them (verified when ``verify``)."""
        data = self.read_bytes(version, kind)
        spans = self._spans(data, self.file_path(version, kind), kind)
        records = [(data[k:k + ks], None if vs < 0 else data[v:v + vs]) for k, ks, v, vs in spans]
        return records

    def read_rows(self, version: int, kind: str) -> tuple[list[tuple], list[tuple | None]]:
        """The decoded keys and values of a file, in file order (a removed key's value: None)."""
        data = self.read_bytes(version, kind)
        path = self.file_path(version, kind)
        fast = self._fixed_stride(data, path)
        if fast is not None:
            return fast
        spans = self._spans(data, path, kind)
        decode_key, decode_value = self._key_decoder, self._value_decoder
        try:
            keys = [decode_key(data, k) for k, _, _, _ in spans]
            values = [None if vs < 0 else decode_value(data, v) for _, _, v, vs in spans]
        except (struct.error, UnicodeDecodeError, ValueError, OverflowError, IndexError) as e:
            raise self._schema_error(path, e) from e
        return keys, values

    def iter_rows(self, version: int, kind: str) -> Iterator[tuple[tuple, tuple | None]]:
        keys, values = self.read_rows(version, kind)
        return zip(keys, values)

    def newest_snapshot(self, version: int) -> int:
        """The newest snapshot at or below ``version`` (0: none)."""
        return max((v for v, kind in self.list_files() if kind == "snapshot" and v <= version), default=0)

    def load(self, version: int | None = None) -> dict[tuple, tuple]:
        """The state of ``version`` (the newest when None) as {key tuple: value tuple}: the
        newest snapshot at or below it, then the deltas after it, as Spark loads it."""
        version, snapshot = version_plan(
            self.list_files(), version, "snapshot", "delta", lambda version, v, snapshot: (
                f"The delta file {self.file_path(v, 'delta')} of state store {self.path} does not "
                f"exist, but version {version} needs it (the newest snapshot at or below it is "
                f"{snapshot or 'none'})."))
        if version == 0:
            return {}
        state: dict[tuple, tuple] = {}
        if snapshot:
            keys, values = self.read_rows(snapshot, "snapshot")
            state = dict(zip(keys, values))
        for v in range(snapshot + 1, version + 1):
            keys, values = self.read_rows(v, "delta")
            if None not in values:
                state.update(zip(keys, values))
                continue
            for key, value in zip(keys, values):
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
        return state

    # -- writing ------------------------------------------------------------------------
    def write_records(self, version: int, kind: str, records: Iterable[tuple[bytes, bytes | None]]) -> str:
        """Write a file of (key bytes, value bytes or None) records (None: a removed key, in a
        delta), compressed as Spark does, whole; the file's path."""
        if kind not in ("delta", "snapshot"):
            raise ValueError(f"A state file is a delta or a snapshot, not {kind!r}.")
        records = list(records)
        if self.row_checksum:
            records = self._with_row_checksums(records)
        parts: list[bytes] = []
        append = parts.append
        pack = _INT.pack
        for key, value in records:
            append(pack(len(key)))
            append(key)
            if value is None:
                if kind == "snapshot":
                    raise ValueError("A snapshot holds no removed keys.")
                append(_END)
            else:
                append(pack(len(value)))
                append(value)
        append(_END)
        raw = compression.compress(b"".join(parts), self.codec, self.lz4_block_size)
        path = self.file_path(version, kind)
        self._write_file(path, raw)
        return path

    def write_delta(self, version: int, changes: Iterable[tuple[tuple, tuple | None]] | Mapping) -> str:
        """Write ``<version>.delta``: (key, value) changes, a value of None removing the key."""
        items = changes.items() if isinstance(changes, Mapping) else changes
        encode_key, encode_value = row_encoder(self.key_schema), row_encoder(self.value_schema)
        return self.write_records(version, "delta", [
            (encode_key(tuple(k)), None if v is None else encode_value(tuple(v))) for k, v in items])

    def write_snapshot(self, version: int, state: Mapping | Iterable[tuple[tuple, tuple]]) -> str:
        """Write ``<version>.snapshot``: every key and value of the version."""
        items = state.items() if isinstance(state, Mapping) else state
        if not self.row_checksum and _plain_fixed(self.key_schema) and _plain_fixed(self.value_schema):
            items = list(items)
            body = _fixed_records([k for k, _ in items], [v for _, v in items], self.key_schema, self.value_schema)
            raw = compression.compress(body + _END, self.codec, self.lz4_block_size)
            path = self.file_path(version, "snapshot")
            self._write_file(path, raw)
            return path
        encode_key, encode_value = row_encoder(self.key_schema), row_encoder(self.value_schema)
        return self.write_records(version, "snapshot", [
            (encode_key(tuple(k)), encode_value(tuple(v))) for k, v in items])

    # -- internals ----------------------------------------------------------------------
    def _write_file(self, path: str, raw: bytes) -> None:
        directory, name = path.rsplit("/", 1)
        self.fs.write_bytes(path, raw)
        self.fs.delete(f"{path}.crc")                        # Spark's checkpoint checksum sidecar
        hidden = f"{directory}/.{name}.crc"                  # Hadoop's local checksum file
        if self.hadoop_checksum:
            self.fs.write_bytes(hidden, hadoop_checksum_file(raw))
        else:
            self.fs.delete(hidden)

    def _with_row_checksums(self, records: list) -> list:
        sums = crc32c_many([k if v is None else k + v for k, v in records])
        pack = _LE_INT.pack
        return [(pack(_signed(c)) + k, None) if v is None else (k, pack(_signed(c)) + v)
                for (k, v), c in zip(records, sums)]

    def _schema_error(self, path: str, error: Exception) -> SparkStateFormatError:
        hint = "" if self.row_checksum else (
            " If the query ran with spark.sql.streaming.stateStore.rowChecksum.enabled, read it "
            "with row_checksum=True.")
        return SparkStateFormatError(
            f"The state file {path} does not decode with the key schema {self.key_schema} and value "
            f"schema {self.value_schema}: {error}. The schemas are not the operator's.{hint}")

    def _spans(self, data: bytes, path: str, kind: str) -> list[tuple[int, int, int, int]]:
        """(key offset, key size, value offset, value size) per record, value size -1 for a
        removal; with row checksums, offsets and sizes of the rows without them."""
        spans = []
        append = spans.append
        unpack = _INT.unpack_from
        pos, end = 0, len(data)
        key_min, value_min = self._key_fixed, self._value_fixed
        extra = 4 if self.row_checksum else 0
        try:
            while True:
                (key_size,) = unpack(data, pos)
                pos += 4
                if key_size == -1:
                    break
                if key_size < 0:
                    raise SparkStateFormatError(f"The state file {path} has a record with key size {key_size}; it is damaged.")
                key_at = pos
                pos += key_size
                (value_size,) = unpack(data, pos)
                pos += 4
                if value_size < 0:
                    if kind == "snapshot":
                        raise SparkStateFormatError(
                            f"The snapshot file {path} has a record with value size {value_size}; it is damaged.")
                    append((key_at + extra, key_size - extra, pos, -1))
                    continue
                append((key_at, key_size, pos + extra, value_size - extra))
                pos += value_size
        except struct.error:
            raise SparkStateFormatError(
                f"The state file {path} ends before its end marker; it is truncated.") from None
        if pos > end:
            raise SparkStateFormatError(f"The state file {path} ends inside a record; it is truncated.")
        if pos != end:
            raise SparkStateFormatError(f"The state file {path} has {end - pos} bytes after its end marker.")
        for _, ks, _, vs in spans:
            if ks < key_min or (vs >= 0 and vs < value_min):
                raise self._schema_error(path, ValueError(
                    f"a record of a {ks}-byte key and a {vs}-byte value, shorter than the schemas' "
                    f"fixed parts ({key_min} and {value_min} bytes)"))
            if ks & 7 or (vs > 0 and vs & 7):
                # UnsafeRows are whole 8-byte words; 4 more bytes are a row checksum (or the
                # padding Spark before 2.3 appended to values, which is not read here)
                raise self._schema_error(path, ValueError(
                    f"a record of a {ks}-byte key and a {vs}-byte value, not whole 8-byte words "
                    "as UnsafeRows are"))
        if self.row_checksum and self.verify:
            self._verify_row_checksums(data, spans, path)
        return spans

    def _verify_row_checksums(self, data: bytes, spans, path: str) -> None:
        items, expected = [], []
        for k, ks, v, vs in spans:
            if vs < 0:
                items.append(data[k:k + ks])
                expected.append(_LE_INT.unpack_from(data, k - 4)[0])
            else:
                items.append(data[k:k + ks] + data[v:v + vs])
                expected.append(_LE_INT.unpack_from(data, v - 4)[0])
        for i, (got, want) in enumerate(zip(crc32c_many(items), expected)):
            if _signed(got) != want:
                raise SparkStateFormatError(
                    f"Row checksum verification failed for record {i} of {path}: expected {want}, "
                    f"computed {_signed(got)}. The file is damaged.")

    def _fixed_stride(self, data: bytes, path: str):
        """All rows at once when every record has the fixed-width schemas' sizes; None
        when the file is not like that (variable-length fields, removals, checksums)."""
        if self.row_checksum:
            return None
        key_layout = fixed_width_dtype(self.key_schema, 4)
        ks = self._key_fixed
        value_layout = fixed_width_dtype(self.value_schema, 8 + ks)
        vs = self._value_fixed
        if key_layout is None or value_layout is None:
            return None
        stride = 8 + ks + vs
        count, rest = divmod(len(data) - 4, stride)
        if rest or count == 0 or data[-4:] != _END:
            return None
        layout = [("ks", ">i4", 0), ("vs", ">i4", 4 + ks)]
        layout += [("k_" + name, fmt, off) for name, fmt, off in key_layout]
        layout += [("v_" + name, fmt, off) for name, fmt, off in value_layout]
        dtype = np.dtype({"names": [n for n, _, _ in layout], "formats": [f for _, f, _ in layout],
                          "offsets": [o for _, _, o in layout], "itemsize": stride})
        records = np.frombuffer(data, dtype=dtype, count=count)
        if not ((records["ks"] == ks).all() and (records["vs"] == vs).all()):
            return None
        key_columns = {name[2:]: records[name] for name, _, _ in layout if name.startswith("k_f")}
        value_columns = {name[2:]: records[name] for name, _, _ in layout if name.startswith("v_f")}
        try:
            keys = decode_columns(key_columns, self.key_schema, count)
            values = decode_columns(value_columns, self.value_schema, count)
        except (ValueError, OverflowError) as e:
            raise self._schema_error(path, e) from e
        # rows with a null to decode one by one (a null-type column, as a deduplication's
        # ``__dummy__``, is null in every row and decodes as None in the columns already)
        with_nulls = np.zeros(count, dtype=bool)
        if "k_nulls" in records.dtype.names:
            with_nulls |= (records["k_nulls"] & ~_null_type_bits(self.key_schema)) != 0
        if "v_nulls" in records.dtype.names:
            with_nulls |= (records["v_nulls"] & ~_null_type_bits(self.value_schema)) != 0
        for i in np.flatnonzero(with_nulls).tolist():
            at = i * stride
            keys[i] = self._key_decoder(data, at + 4)
            values[i] = self._value_decoder(data, at + 8 + ks)
        return keys, values


def version_plan(files: list[tuple[int, str]], version: int | None, snapshot_kind: str, delta_kind: str,
                 missing: Callable[[int, int, int], str]) -> tuple[int, int]:
    """How a store's ``version`` (the newest when None) loads, as Spark loads it: (version,
    the newest snapshot at or below it, 0 for none); the deltas after the snapshot must all
    be in ``files`` ((version, kind) pairs), else SparkStateFormatError(``missing(version,
    delta version, snapshot)``)."""
    present = set(files)
    if version is None:
        version = max((v for v, _ in files), default=0)
    if version < 0:
        raise ValueError(f"Version {version} of a state store: versions start at 0.")
    if version == 0:
        return 0, 0
    snapshot = max((v for v, kind in files if kind == snapshot_kind and v <= version), default=0)
    for v in range(snapshot + 1, version + 1):
        if (v, delta_kind) not in present:
            raise SparkStateFormatError(missing(version, v, snapshot))
    return version, snapshot


def _signed(x: int) -> int:
    return x - (1 << 32) if x >= 1 << 31 else x


_PLAIN = {"int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "float32": "<f4", "float64": "<f8",
          "bool": "?"}


def _plain_fixed(schema) -> bool:
    """Whether every field of a row is a number, a boolean or null (and at most 64 of them):
    rows numpy lays out whole (``_fixed_records``)."""
    fields = list(schema)
    return len(fields) <= 64 and all(pa.types.is_null(f.type) or _PLAIN.get(_field_kind(f.type)) for f in fields)


def _field_kind(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_signed_integer(t):
        return f"int{t.bit_width}"
    if pa.types.is_float32(t):
        return "float32"
    if pa.types.is_float64(t):
        return "float64"
    if pa.types.is_timestamp(t) and t.unit == "us":
        return "int64"
    return ""


def _fixed_row_columns(rows: list[tuple], schema, count: int) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """A fixed-width row's null bitset word and its fields' numpy columns (nulls as 0)."""
    nulls = np.zeros(count, dtype=np.uint64)
    columns = []
    transposed = list(zip(*rows)) if rows else [()] * len(schema)
    for i, (f, values) in enumerate(zip(schema, transposed)):
        if pa.types.is_null(f.type):
            nulls |= np.uint64(1 << i)
            continue
        fmt = _PLAIN[_field_kind(f.type)]
        if None in values:
            missing = np.fromiter((v is None for v in values), dtype=bool, count=count)
            nulls |= missing.astype(np.uint64) << np.uint64(i)
            values = [0 if v is None else v for v in values]
        columns.append((f"f{i}", np.array(values, dtype=fmt)))
    return nulls, columns


def _fixed_records(keys: list[tuple], values: list[tuple], key_schema, value_schema) -> bytes:
    """The records of rows whose fields are all numbers, booleans or nulls, laid out by
    numpy: ``[key size][key row][value size][value row]`` each, as ``write_records``
    writes them one by one."""
    count = len(keys)
    ks, vs = fixed_size(key_schema), fixed_size(value_schema)
    names, formats, offsets = ["ks", "vs"], [">i4", ">i4"], [0, 4 + ks]
    key_nulls, key_columns = _fixed_row_columns(keys, key_schema, count)
    value_nulls, value_columns = _fixed_row_columns(values, value_schema, count)
    for prefix, base, _nulls, columns, size in (("k", 4, key_nulls, key_columns, ks),
                                               ("v", 8 + ks, value_nulls, value_columns, vs)):
        if size:
            names.append(f"{prefix}_nulls")
            formats.append("<u8")
            offsets.append(base)
        for name, column in columns:
            names.append(f"{prefix}_{name}")
            formats.append(column.dtype.str)
            offsets.append(base + 8 + 8 * int(name[1:]))
    dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": 8 + ks + vs})
    records = np.zeros(count, dtype=dtype)
    records["ks"], records["vs"] = ks, vs
    for prefix, nulls, columns, size in (("k", key_nulls, key_columns, ks), ("v", value_nulls, value_columns, vs)):
        if size:
            records[f"{prefix}_nulls"] = nulls
        for name, column in columns:
            records[f"{prefix}_{name}"] = column
    return records.tobytes()


def _null_type_bits(schema) -> np.uint64:
    """The null-bitset bits of a fixed-width row's null-type fields."""
    return np.uint64(sum(1 << i for i, f in enumerate(schema) if pa.types.is_null(f.type)))


def offset_log_conf(checkpoint: str, fs=None, batch_id: int | None = None) -> dict[str, str]:
    """The session conf a Spark query recorded in its offset log (the newest batch, or
    ``batch_id``): where ``...stateStore.compression.codec``, ``...rowChecksum.enabled``
    and ``...stateStore.providerClass`` of a checkpoint are found."""
    if fs is None:
        from microbatch.checkpoint.fs import CheckpointFileSystem
        fs = CheckpointFileSystem()
    directory = f"{checkpoint.rstrip('/')}/offsets"
    if batch_id is None:
        batches = [int(n) for n in fs.list(directory) if n.isdigit()]
        if not batches:
            return {}
        batch_id = max(batches)
    lines = fs.read_text(f"{directory}/{batch_id}").split("\n")
    if len(lines) < 2:
        raise SparkStateFormatError(f"The offset log entry {directory}/{batch_id} has no metadata line.")
    return dict(json.loads(lines[1]).get("conf", {}))


def store_options_from_conf(conf: Mapping[str, str]) -> dict:
    """``SparkStateStoreFiles`` options (codec, row_checksum) from a query's recorded conf
    (``offset_log_conf``), with Spark 4.3's defaults for what it does not record."""
    provider = conf.get("spark.sql.streaming.stateStore.providerClass")
    if provider and not provider.endswith("HDFSBackedStateStoreProvider"):
        raise SparkStateFormatError(
            f"The checkpoint's state was written by {provider}; only Spark's "
            "HDFSBackedStateStoreProvider files are read here.")
    return {
        "codec": conf.get("spark.sql.streaming.stateStore.compression.codec", "lz4"),
        "row_checksum": conf.get("spark.sql.streaming.stateStore.rowChecksum.enabled", "false").lower() == "true",
    }
