"""Spark's ``RocksDBStateStoreProvider`` snapshots, written: what ``rocksdb_files`` and
``rocksdb_families`` read, so Spark's engine (and its ``statestore`` reader) loads a store
microbatch's state was converted to (``microbatch checkpoint convert CKPT --to spark``).

A snapshot of version v of one store (``RocksDBFileManager.saveCheckpointToDfs``):

- the store's keys and values are written into a new RocksDB in a local directory with
  ``rocksdict``, whose RocksDB is the one Spark 4.3 ships (9.8: its ``rocksdbjni``),
  write-ahead log off, then flushed: its SST files (RocksDB's block-based table format
  version of ``spark.sql.streaming.stateStore.rocksdb.formatVersion``, lz4 blocks as Spark's
  default ``...rocksdb.compression``);
- each SST file goes to ``SSTs/<number>-<uuid>.sst``; then ``<v>.zip``: ``CURRENT``, the
  ``MANIFEST``, the ``OPTIONS`` file, the (empty) WAL and ``metadata`` (the line ``v1``, then
  JSON: ``sstFiles``, ``numKeys``, ``numInternalKeys``, ``columnFamilyMapping``,
  ``columnFamilyTypeMap``, ``maxColumnFamilyId``). The zip is written last: a snapshot
  without its zip is no snapshot, and a write cut short is redone whole.

A key and a value are encoded as Spark's encoders do (the inverse of what
``rocksdb_families`` decodes; its docstring has the layouts): a version byte and the
UnsafeRow, a prefix or range-scan key's two rows after the first one's size, a list
state's elements each after its size, and with row checksums each value (or list
element) after a CRC-32C of the key and it and its size. A store with column families has
each key after its family's id (2 bytes, little-endian).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from typing import Iterable

import pyarrow as pa

from microbatch.state.spark_format.checksums import crc32c_many
from microbatch.state.spark_format.rocksdb_families import FamilyEncoding, _RANGE_TYPES
from microbatch.state.spark_format.rocksdb_files import ENCODING_VERSION, METADATA_VERSION, SST_DIR, _signed
from microbatch.state.spark_format.schema_file import _write_chunked, _write_utf
from microbatch.state.spark_format.unsafe_row import SparkStateFormatError, row_encoder

_VERSION = bytes([ENCODING_VERSION])
_LE_INT = struct.Struct("<i")
_CF_ID = struct.Struct("<h")
_CHECKSUM_AND_SIZE = struct.Struct("<iI")
#: the families' ids Spark gives first: ``default`` (left empty by transformWithState)
DEFAULT_FAMILY = "default"


class FamilyEncoder:
    """Encodes one column family's (or a plain store's) keys and values as Spark's
    ``RocksDBStateEncoder`` does. ``family_id``: the 2-byte prefix of a store with column
    families (None: a store without). ``merge_delimiter``: what joins a list state's
    elements (``rocksdb_families.MERGE_DELIMITERS``)."""

    def __init__(self, enc: FamilyEncoding, family_id: int | None = None, row_checksum: bool = False,
                 merge_delimiter: bytes = b""):
        self.enc = enc
        self.prefix = b"" if family_id is None else _CF_ID.pack(family_id)
        self.row_checksum = row_checksum
        self.delimiter = merge_delimiter
        self._value = row_encoder(enc.value_schema)
        fields = list(enc.key_schema)
        if enc.encoder == "none":
            self._key = row_encoder(enc.key_schema)
        elif enc.encoder == "prefix":
            self._first = row_encoder(pa.schema(fields[:enc.num_prefix]))
            self._rest = row_encoder(pa.schema(fields[enc.num_prefix:]))
            self._order = list(range(len(fields)))
        elif enc.encoder == "range":
            others = [i for i in range(len(fields)) if i not in enc.ordinals]
            self._order = list(enc.ordinals) + others
            self._first = row_encoder(pa.schema([pa.field(fields[o].name, pa.binary()) for o in enc.ordinals]))
            self._rest = row_encoder(pa.schema([fields[i] for i in others]))
            self._range = []
            for o in enc.ordinals:
                if fields[o].type.id not in _RANGE_TYPES:
                    raise SparkStateFormatError(
                        f"A range-scan key column {fields[o].name} of type {fields[o].type}: Spark orders "
                        "fixed-size numbers only.")
                fmt, size = _RANGE_TYPES[fields[o].type.id]
                self._range.append((struct.Struct(fmt), size, pa.types.is_floating(fields[o].type)))
        else:
            raise SparkStateFormatError(f"The key encoder {enc.encoder!r}: none, prefix and range are written.")

    def key(self, key: tuple) -> bytes:
        enc = self.enc
        if enc.encoder == "none":
            return self.prefix + _VERSION + self._key(tuple(key))
        values = [key[i] for i in self._order]
        count = enc.num_prefix if enc.encoder == "prefix" else len(enc.ordinals)
        first = values[:count]
        if enc.encoder == "range":
            first = [self._ordered(v, i) for i, v in enumerate(first)]
        head = _VERSION + self._first(tuple(first))
        return self.prefix + _LE_INT.pack(len(head)) + head + _VERSION + self._rest(tuple(values[count:]))

    def _ordered(self, value, i: int) -> bytes:
        pack, size, floating = self._range[i]
        if value is None:
            return bytes([2]) + bytes(size)
        raw = pack.pack(value)
        if value < 0:     # (Spark's test: -0.0 is not negative)
            return bytes([0]) + (bytes(b ^ 0xFF for b in raw) if floating else raw)
        return bytes([1]) + raw

    def value(self, key: bytes, value: tuple) -> bytes:
        """A single value (of a key encoded with ``key``)."""
        body = _VERSION + self._value(tuple(value))
        return self._framed(key, body)

    def values(self, key: bytes, elements: Iterable[tuple]) -> bytes:
        """A list state's elements as one value: what Spark's merges of them read as."""
        parts = []
        for element in elements:
            row = _VERSION + self._value(tuple(element))
            parts.append(self._framed(key, _LE_INT.pack(len(row)) + row))
        return self.delimiter.join(parts)

    def _framed(self, key: bytes, body: bytes) -> bytes:
        if not self.row_checksum:
            return body
        return _CHECKSUM_AND_SIZE.pack(_signed(crc32c_many([key + body])[0]), len(body)) + body


@dataclass(frozen=True)
class SnapshotResult:
    path: str              # the zip's
    num_keys: int
    num_internal_keys: int
    sst_files: int


def write_rocksdb_snapshot(path: str, version: int, records: Iterable[tuple[bytes, bytes]], fs,
                           families: dict[str, tuple[int, bool]] | None = None, format_version: int = 5,
                           local_dir: str | None = None) -> SnapshotResult:
    """Write ``<path>/<version>.zip`` and its SST files from (key, value) records as stored
    (keys with their family's id when ``families``, {name: (id, internal)}, is given; the
    internal families' keys count in ``numInternalKeys``)."""
    families = families or {}
    internal_ids = {_CF_ID.pack(cf) for cf, internal in families.values() if internal}
    work = tempfile.mkdtemp(prefix="spark-rocksdb-", dir=local_dir)
    try:
        import rocksdict
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        table = rocksdict.BlockBasedOptions()
        table.set_format_version(format_version)
        options.set_block_based_table_factory(table)
        options.set_compression_type(rocksdict.DBCompressionType.lz4())
        db_dir = os.path.join(work, "db")
        db = rocksdict.Rdict(db_dir, options)
        write = rocksdict.WriteOptions()
        write.disable_wal = True
        db.set_write_options(write)
        keys = internal = 0
        try:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in records:
                batch.put(key, value)
                if key[:2] in internal_ids:
                    internal += 1
                else:
                    keys += 1
                if len(batch) >= 100_000:
                    db.write(batch)
                    batch = rocksdict.WriteBatch(raw_mode=True)
            if len(batch):
                db.write(batch)
            db.flush()
        finally:
            db.close()
        names = sorted(os.listdir(db_dir))
        sst_files = []
        for name in names:
            if not name.endswith(".sst"):
                continue
            dfs_name = f"{name[:-4]}-{uuid.uuid4()}.sst"
            with open(os.path.join(db_dir, name), "rb") as f:
                data = f.read()
            fs.mkdirs(f"{path}/{SST_DIR}")
            fs.write_bytes(f"{path}/{SST_DIR}/{dfs_name}", data)
            sst_files.append({"localFileName": name, "dfsSstFileName": dfs_name, "sizeBytes": len(data)})
        metadata = {"sstFiles": sst_files, "numKeys": keys, "numInternalKeys": internal,
                    "columnFamilyMapping": {name: cf for name, (cf, _) in families.items()},
                    "columnFamilyTypeMap": {name: flag for name, (_, flag) in families.items()},
                    "maxColumnFamilyId": max((cf for cf, _ in families.values()), default=0)}
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            for name in names:
                if name == "CURRENT" or name.startswith(("MANIFEST-", "OPTIONS-")) or name.endswith(".log"):
                    local = os.path.join(db_dir, name)
                    if name.endswith(".log") and os.path.getsize(local):
                        raise SparkStateFormatError(f"RocksDB left write-ahead log records in {name}.")
                    out.write(local, name)
            out.writestr("metadata", f"{METADATA_VERSION}\n{json.dumps(metadata, separators=(',', ':'))}")
        zip_path = f"{path}/{version}.zip"
        fs.write_bytes(zip_path, archive.getvalue())
        return SnapshotResult(zip_path, keys, internal, len(sst_files))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- transformWithState's schema file and operator metadata ---------------------------------------
_NO_USER_KEY = "{    }"


def state_schema_v3(families: Iterable[tuple[str, dict, dict, dict, dict | None]]) -> bytes:
    """A v3 state schema file (``StateSchemaV3File``) of column families: (name, key schema,
    value schema, key encoder spec, user key schema or None), Spark's JSON as dicts; in name
    order, as Spark writes them, each schema id 0."""
    ordered = sorted(families, key=lambda f: f[0])
    out = [_write_utf("v3"), struct.pack(">i", len(ordered))]

    def text(doc: dict) -> str:
        return json.dumps(doc, separators=(",", ":"))
    for name, key, value, spec, user_key in ordered:
        out += [_write_utf(name), struct.pack(">h", 0), _write_chunked(text(key)), struct.pack(">h", 0),
                _write_chunked(text(value)), _write_chunked(text(spec)),
                _write_chunked(_NO_USER_KEY if user_key is None else text(user_key))]
    return b"".join(out)


def operator_metadata_v2(operator_id: int, operator_name: str, num_partitions: int, schema_file_uri: str,
                         properties: dict) -> bytes:
    """A transformWithState operator's metadata v2 (``state/<op>/_metadata/v2/<batchId>``),
    what Spark's ``state-metadata`` reader and its restart checks read."""
    info = {"operatorInfo": {"operatorId": operator_id, "operatorName": operator_name},
            "stateStoreInfo": [{"storeName": DEFAULT_FAMILY, "numColsPrefixKey": 0, "numPartitions": num_partitions,
                                "stateSchemaFilePaths": [schema_file_uri]}],
            "operatorPropertiesJson": json.dumps(properties, separators=(",", ":"))}
    return b"v2\n" + json.dumps(info, separators=(",", ":")).encode()
