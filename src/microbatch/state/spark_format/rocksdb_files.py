"""The files of Spark's ``RocksDBStateStoreProvider`` (Spark 4.3), read.

One store is ``<checkpoint>/state/<operatorId>/<partitionId>[/<storeName>]/`` (as the HDFS
provider's, ``hdfs_files.store_path``). In it (``RocksDBFileManager``):

- ``<v>.zip``: a snapshot of version v: the RocksDB checkpoint's small files (``CURRENT``,
  ``MANIFEST-*``, ``OPTIONS-*``, the empty WAL ``*.log``) and ``metadata``: the line ``v1``,
  then JSON: ``sstFiles`` (``localFileName``, ``dfsSstFileName``, ``sizeBytes``), ``logFiles``
  (``localFileName``, ``dfsLogFileName``, ``sizeBytes``; archived WALs, none while Spark
  writes with the WAL off), ``numKeys``, ``numInternalKeys``, ``columnFamilyMapping``,
  ``columnFamilyTypeMap``, ``maxColumnFamilyId``.
- ``SSTs/<localName-without-.sst>-<uuid>.sst``: the SST files, shared by the snapshots that
  list them (``logs/`` likewise for archived WALs); a snapshot is restored by copying its
  SSTs back under their ``localFileName`` (the WALs under ``archive/``) beside the zip's
  files, which is what this reader does, into a temporary directory it opens read-only
  with ``rocksdict`` and removes after.
- ``<v>.changelog`` (``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``,
  off by default): the changes that make version v from v-1, one stream compressed with
  ``spark.sql.streaming.stateStore.compression.codec`` (``compression.py``: lz4 by default,
  or zstd). The format of a store without column families and without checkpoint ids
  (``StateStoreChangelogWriterV1``), written with ``java.io.DataOutputStream``: the key's
  size (big-endian int), the key, the value's size, the value; a removed key has value
  size -1 and no value; the file ends with a key size of -1. V1 has no header; Spark's
  reader takes a file for v2 to v4 when it starts with ``writeUTF("v<N>")``, as this one.

Version v is loaded as Spark does (``RocksDB.loadWithoutCheckpointId``): the newest
snapshot at or below v (none: the empty store of version 0), then the changelogs after
it, in order. With changelog checkpointing off every commit writes a snapshot; with it on,
every commit writes a changelog and a snapshot is written every
``spark.sql.streaming.stateStore.minDeltasForSnapshot`` versions, by the task or by
maintenance (the maintenance thread uploads it, so a store can have changelogs only).

What a RocksDB key and value hold (``RocksDBStateEncoder``, ``UnsafeRowDataEncoder``,
``RocksDB.put``/``remove``), for the operators that keep no column families
(aggregations, deduplication, session windows, stream-stream joins' four stores, ...):

- key: one version byte (``STATE_ENCODING_VERSION``, 0) and the key's UnsafeRow bytes;
  with a prefix of n key columns (``PrefixKeyScanStateEncoder``: the operator metadata's
  ``numColsPrefixKey``, 1 for session windows, read by ``for_store``), the size of the
  encoded prefix (a native, little-endian int), the prefix columns' row encoded so, and
  the other columns' row encoded so;
- value: one version byte (0) and the value's UnsafeRow bytes;
- with row checksums (``spark.sql.streaming.stateStore.rowChecksum.enabled``, 4.1.0, off
  by default, recorded in the offset log's conf): the value is a 4-byte CRC-32C of the
  key's bytes and the value's bytes (both with their version byte), then the value's
  size, both native (little-endian) ints, then the value
  (``KeyValueChecksumEncoder.encodeValueRowWithChecksum``); a removed key in a changelog
  is a 4-byte CRC-32C of the key, then the key. Checked when ``verify``.

``spark.sql.streaming.stateStore.rocksdb.formatVersion`` (5 by default, recorded in the
offset log) is RocksDB's own ``BlockBasedTableOptions.format_version`` of the SST files,
not a framing of the rows: rocksdict's RocksDB (9.x, as Spark's rocksdbjni 9.8) reads the
SST files whatever it is. ``...rocksdb.mergeOperatorVersion`` matters only to merged
values, which these stores do not have.

Refused, with a ``SparkStateFormatError`` naming the file: a store with column families
(``transformWithState``: a non-empty ``columnFamilyMapping``, changelogs v2 and v4, keys
prefixed with a 2-byte family id; ``rocksdb_families`` reads them, with this class's
``read_snapshot_files(families=True)`` and ``read_changelog``), checkpoint format version 2
(``spark.sql.streaming.stateStore.checkpointFormatVersion``: files named
``<v>_<uniqueId>.zip``/``.changelog``, whose lineage is in the commit log), a metadata
version other than ``v1``, a changelog version above 4, a key or value version byte other
than 0, merged (multi-)values, a snapshot whose key count is not its metadata's
``numKeys``, a missing or short SST file, a missing changelog, anything truncated.
"""
from __future__ import annotations

import io
import json
import operator
import os
import re
import shutil
import struct
import tempfile
import zipfile
from typing import Mapping

import numpy as np
import pyarrow as pa

from microbatch.state.spark_format import compression
from microbatch.state.spark_format.checksums import crc32c_many
from microbatch.state.spark_format.hdfs_files import store_path, version_plan
from microbatch.state.spark_format.schema_file import _decode_modified_utf8
from microbatch.state.spark_format.unsafe_row import (
    SparkStateFormatError, decode_columns, fixed_size, fixed_width_dtype, row_decoder,
)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: ``RocksDBStateStoreProvider.STATE_ENCODING_VERSION``: the first byte of every key and value.
ENCODING_VERSION = 0
#: ``RocksDBCheckpointMetadata.VERSION``: the first line of a zip's ``metadata``.
METADATA_VERSION = "v1"
SST_DIR = "SSTs"
LOG_DIR = "logs"
LOG_LOCAL_DIR = "archive"

#: ``RecordType``'s bytes in changelogs v2 and v4.
EOF_RECORD, PUT_RECORD, DELETE_RECORD, MERGE_RECORD = 0x00, 0x01, 0x10, 0x11

_FILE = re.compile(r"^(\d+)\.(zip|changelog)$")
_UNIQUE_ID_FILE = re.compile(r"^(\d+)_(.+)\.(zip|changelog)$")
_INT = struct.Struct(">i")
_LE_INT = struct.Struct("<i")
_CHECKSUM_AND_SIZE = struct.Struct("<iI")


def rocksdb_store_options_from_conf(conf: Mapping[str, str]) -> dict:
    """``SparkRocksDBStoreFiles`` options (codec, row_checksum) from a query's recorded conf
    (``hdfs_files.offset_log_conf``), with Spark 4.3's defaults for what it does not record;
    SparkStateFormatError when the conf names another provider or an encoding other than
    UnsafeRow."""
    provider = conf.get("spark.sql.streaming.stateStore.providerClass")
    if provider and provider != ROCKSDB_PROVIDER and not provider.endswith(".RocksDBStateStoreProvider"):
        raise SparkStateFormatError(
            f"The checkpoint's state was written by {provider}, not Spark's RocksDBStateStoreProvider.")
    encoding = conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow")
    if encoding.lower() != "unsaferow":
        raise SparkStateFormatError(
            f"The checkpoint's state was written with spark.sql.streaming.stateStore.encodingFormat="
            f"{encoding}; only the UnsafeRow encoding is read here.")
    return {
        "codec": conf.get("spark.sql.streaming.stateStore.compression.codec", "lz4"),
        "row_checksum": conf.get("spark.sql.streaming.stateStore.rowChecksum.enabled", "false").lower() == "true",
    }


class SparkRocksDBStoreFiles:
    """The snapshot (``<v>.zip`` and ``SSTs/``) and changelog files of one of Spark's
    RocksDB-provider stores, read.

    ``path``: the store's directory (``hdfs_files.store_path``). ``key_schema``/``value_schema``:
    the rows' schemas as pyarrow storage types (``schema_file.arrow_schema`` of the
    operator's schema file). ``codec``: ``spark.sql.streaming.stateStore.compression.codec``
    of the query (lz4 or zstd; the changelogs'). ``row_checksum``:
    ``spark.sql.streaming.stateStore.rowChecksum.enabled`` of the query. ``fs``: the
    checkpoint's storage layer (``checkpoint/fs.py``; local disk when None); every file is
    read through it. ``verify``: check LZ4 block checksums and row checksums.
    ``local_dir``: where a snapshot is restored while it is read (the system's temporary
    directory when None). ``num_cols_prefix_key``: the store's key prefix columns (the
    operator metadata's ``numColsPrefixKey``; ``for_store`` reads it).
    """

    def __init__(self, path: str, key_schema, value_schema, fs=None, codec: str = "lz4",
                 row_checksum: bool = False, verify: bool = True, local_dir: str | None = None,
                 num_cols_prefix_key: int = 0):
        if fs is None:
            from microbatch.checkpoint.fs import CheckpointFileSystem
            fs = CheckpointFileSystem()
        self.path = path.rstrip("/")
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.fs = fs
        self.codec = compression.codec_name(codec)
        self.row_checksum = row_checksum
        self.verify = verify
        self.local_dir = local_dir
        self._key_decoder = row_decoder(key_schema, as_key=True)
        self._value_decoder = row_decoder(value_schema, as_key=False)
        self._key_min = 1 + fixed_size(key_schema)
        fields = list(key_schema)
        if not 0 <= num_cols_prefix_key < max(len(fields), 1):
            raise SparkStateFormatError(
                f"A prefix of {num_cols_prefix_key} key columns for the key schema {key_schema} of the "
                f"state store {self.path}: it must be shorter than the key.")
        self.num_cols_prefix_key = num_cols_prefix_key
        if num_cols_prefix_key:
            prefix, rest = pa.schema(fields[:num_cols_prefix_key]), pa.schema(fields[num_cols_prefix_key:])
            self._prefix_decoder = row_decoder(prefix, as_key=True)
            self._rest_decoder = row_decoder(rest, as_key=True)
            self._prefix_min, self._rest_min = 1 + fixed_size(prefix), 1 + fixed_size(rest)
        self._value_min = 1 + fixed_size(value_schema) + (8 if row_checksum else 0)

    @classmethod
    def for_store(cls, checkpoint: str, operator_id: int, partition_id: int, key_schema, value_schema,
                  store_name: str = "default", **options) -> "SparkRocksDBStoreFiles":
        """The store of a checkpoint's operator and partition; its key encoding (the number of
        prefix columns, session windows' 1) from the operator's metadata file when it has
        one and ``num_cols_prefix_key`` is not given."""
        if "num_cols_prefix_key" not in options:
            options["num_cols_prefix_key"] = operator_prefix_columns(
                checkpoint, operator_id, store_name, options.get("fs"))
        return cls(store_path(checkpoint, operator_id, partition_id, store_name), key_schema,
                   value_schema, **options)

    def __repr__(self) -> str:
        return f"SparkRocksDBStoreFiles({self.path!r}, codec={self.codec!r})"

    # -- listing ------------------------------------------------------------------------
    def file_path(self, version: int, kind: str) -> str:
        return f"{self.path}/{version}.{kind}"

    def list_files(self) -> list[tuple[int, str]]:
        """(version, kind) of every snapshot (``zip``) and changelog (``changelog``), oldest
        first, a version's snapshot before its changelog."""
        files = []
        for name in self.fs.list(self.path):
            m = _FILE.match(name)
            if m:
                files.append((int(m.group(1)), m.group(2)))
            elif _UNIQUE_ID_FILE.match(name):
                raise SparkStateFormatError(
                    f"The state store {self.path} holds the file {name}: a version with a "
                    "checkpoint id, which Spark writes with spark.sql.streaming.stateStore."
                    "checkpointFormatVersion=2 (the ids are in the commit log); only checkpoint "
                    "format version 1 (Spark's default) is read here.")
        return sorted(files, key=lambda f: (f[0], f[1] != "zip"))

    def versions(self) -> list[int]:
        """The versions that have a snapshot or a changelog, ascending."""
        return sorted({v for v, _ in self.list_files()})

    def latest_version(self) -> int:
        """The newest version with a file (0: none), as ``RocksDBFileManager.getLatestVersion``."""
        return max(self.versions(), default=0)

    def newest_snapshot(self, version: int) -> int:
        """The newest snapshot at or below ``version`` (0: none)."""
        return max((v for v, kind in self.list_files() if kind == "zip" and v <= version), default=0)

    # -- snapshots ----------------------------------------------------------------------
    def _zip(self, version: int) -> tuple[zipfile.ZipFile, str]:
        path = self.file_path(version, "zip")
        try:
            raw = self.fs.read_bytes(path)
        except FileNotFoundError:
            raise SparkStateFormatError(f"The snapshot file {path} does not exist.") from None
        try:
            return zipfile.ZipFile(io.BytesIO(raw)), path
        except zipfile.BadZipFile as e:
            raise SparkStateFormatError(f"The snapshot file {path} is not a zip file ({e}); it is damaged.") from e

    @staticmethod
    def _parse_metadata(text: bytes, path: str, families: bool = False) -> dict:
        try:
            first, _, rest = text.decode("utf-8").partition("\n")
        except UnicodeDecodeError:
            raise SparkStateFormatError(f"The metadata of the snapshot {path} is not text; it is damaged.") from None
        first = first.strip()
        if first != METADATA_VERSION:
            raise SparkStateFormatError(
                f"The metadata of the snapshot {path} has version {first!r}; this reader knows "
                f"{METADATA_VERSION!r} (Spark 4.3's). The snapshot was written by a newer Spark.")
        try:
            metadata = json.loads(rest)
        except ValueError as e:
            raise SparkStateFormatError(f"The metadata of the snapshot {path} is not JSON ({e}); it is damaged.") from e
        if not isinstance(metadata, dict) or not isinstance(metadata.get("sstFiles", []), list):
            raise SparkStateFormatError(f"The metadata of the snapshot {path} has no list of SST files.")
        if metadata.get("columnFamilyMapping") and not families:
            raise SparkStateFormatError(
                f"The snapshot {path} holds column families "
                f"({', '.join(sorted(metadata['columnFamilyMapping']))}): a store of transformWithState "
                "or another operator that uses RocksDB column families, which this reader does not read.")
        return metadata

    def read_metadata(self, version: int, families: bool = False) -> dict:
        """The JSON of a snapshot's ``metadata`` (SST files, numKeys, ...); ``families``: a
        store with column families is read too (``rocksdb_families``), not refused."""
        archive, path = self._zip(version)
        try:
            text = archive.read("metadata")
        except KeyError:
            raise SparkStateFormatError(f"The snapshot file {path} has no metadata entry; it is damaged.") from None
        return self._parse_metadata(text, path, families)

    def read_snapshot_files(self, version: int, families: bool = False) -> tuple[dict, dict, list, list]:
        """The files of snapshot ``version``: its metadata, the zip's other entries ({name:
        bytes}), and its SST files and archived WALs ([(local name, bytes)]), each checked
        against the size its metadata gives; ``families``: a store with column families is
        read too, not refused."""
        archive, path = self._zip(version)
        names = archive.namelist()
        if "metadata" not in names:
            raise SparkStateFormatError(f"The snapshot file {path} has no metadata entry; it is damaged.")
        metadata = self._parse_metadata(archive.read("metadata"), path, families)
        if "CURRENT" not in names:
            raise SparkStateFormatError(f"The snapshot file {path} has no RocksDB CURRENT file; it is damaged.")
        entries = {}
        for name in names:
            if name == "metadata" or name.endswith("/"):
                continue
            if os.path.isabs(name) or ".." in name.split("/") or "/" in name:
                raise SparkStateFormatError(f"The snapshot file {path} holds an entry named {name!r}, "
                                            "which a RocksDB checkpoint does not have; it is damaged.")
            entries[name] = archive.read(name)
        immutable = {"sst": [], "log": []}
        listed = [(f, "dfsSstFileName", SST_DIR, "sst") for f in metadata.get("sstFiles") or []]
        listed += [(f, "dfsLogFileName", LOG_DIR, "log") for f in metadata.get("logFiles") or []]
        for entry, key, dfs_dir, kind in listed:
            try:
                local, remote, size = entry["localFileName"], entry[key], int(entry["sizeBytes"])
            except (KeyError, TypeError, ValueError):
                raise SparkStateFormatError(
                    f"The metadata of the snapshot {path} has a file entry {entry!r} without a local "
                    "name, a name in the checkpoint and a size.") from None
            if "/" in local or "/" in remote or local in ("", ".", ".."):
                raise SparkStateFormatError(f"The metadata of the snapshot {path} names the file {remote!r} "
                                            f"as {local!r}; it is damaged.")
            source = f"{self.path}/{dfs_dir}/{remote}"
            try:
                data = self.fs.read_bytes(source)
            except FileNotFoundError:
                raise SparkStateFormatError(
                    f"The file {source} that the snapshot {path} needs does not exist.") from None
            if len(data) != size:
                raise SparkStateFormatError(
                    f"The file {source} that the snapshot {path} needs has {len(data)} bytes; its "
                    f"metadata says {size}. It is damaged or was replaced.")
            immutable[kind].append((local, data))
        return metadata, entries, immutable["sst"], immutable["log"]

    def restore_snapshot(self, version: int, directory: str) -> dict:
        """Write the RocksDB checkpoint of snapshot ``version`` into ``directory`` (the zip's
        files, the SSTs under their local names, archived WALs under ``archive/``), as
        ``RocksDBFileManager.loadCheckpointFromDfs``; its metadata."""
        metadata, entries, ssts, logs = self.read_snapshot_files(version)
        os.makedirs(directory, exist_ok=True)
        for name, data in entries.items():
            with open(os.path.join(directory, name), "wb") as out:
                out.write(data)
        for local_sub, files in (("", ssts), (LOG_LOCAL_DIR, logs)):
            target_dir = os.path.join(directory, local_sub) if local_sub else directory
            os.makedirs(target_dir, exist_ok=True)
            for local, data in files:
                with open(os.path.join(target_dir, local), "wb") as out:
                    out.write(data)
        return metadata

    def read_snapshot_records(self, version: int) -> dict[bytes, bytes]:
        """Every RocksDB key and value of snapshot ``version``, as stored (with their version
        bytes and, with row checksums, the values' checksums)."""
        from rocksdict import AccessType, Options, Rdict
        path = self.file_path(version, "zip")
        directory = tempfile.mkdtemp(prefix="microbatch-spark-rocksdb-", dir=self.local_dir)
        try:
            metadata = self.restore_snapshot(version, directory)
            db = None
            try:
                db = Rdict(directory, Options(raw_mode=True), access_type=AccessType.read_only())
                records = dict(db.items())
            except Exception as e:   # rocksdict raises plain Exceptions for RocksDB's errors
                raise SparkStateFormatError(
                    f"RocksDB cannot read the snapshot {path} with its SST files: {e}") from e
            finally:
                if db is not None:
                    db.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        expected = metadata.get("numKeys", -1)
        if isinstance(expected, int) and expected >= 0 and expected != len(records):
            raise SparkStateFormatError(
                f"The snapshot {path} holds {len(records)} keys; its metadata says {expected}. Its "
                "SST files are not the ones it was written with.")
        return records

    # -- changelogs ---------------------------------------------------------------------
    def changelog_version(self, data: bytes) -> int:
        """The changelog format of decompressed ``data``, as Spark's
        ``StateStoreChangelogReaderFactory``: a leading ``writeUTF("v<N>")``, else 1."""
        if len(data) < 2:
            return 1
        (n,) = struct.unpack_from(">H", data, 0)
        if len(data) < 2 + n:
            return 1
        try:
            text = _decode_modified_utf8(data[2:2 + n])
        except UnicodeDecodeError:
            return 1
        if not text.startswith("v"):
            return 1
        try:
            number = int(text[1:])
        except ValueError:
            return 1
        return number if -32768 <= number <= 32767 else 1

    def read_changelog(self, version: int) -> tuple[int, list[tuple[int, bytes, bytes | None]]]:
        """The format (1 to 4) of changelog ``version`` and its records in file order:
        (type, key, value or None for a removal), the type Spark's ``RecordType`` byte
        (``PUT``, ``DELETE``, ``MERGE``; v1 has puts and removals only), key and value as
        stored. v2 and v4 (stores with column families): a type byte, then the key's size
        and the key, then the value's size and the value (-1 and none for a removal); the
        file ends with the type byte 0. v3 and v4 have the checkpoint ids' lineage
        (``writeUTF`` of JSON) after the version."""
        path, data, kind = self._changelog_data(version)
        return kind, self._parse_changelog(data, kind, path)

    def _changelog_data(self, version: int) -> tuple[str, bytes, int]:
        path = self.file_path(version, "changelog")
        try:
            raw = self.fs.read_bytes(path)
        except FileNotFoundError:
            raise SparkStateFormatError(f"The changelog file {path} does not exist.") from None
        data = compression.decompress(raw, self.codec, self.verify, f" {path}")
        kind = self.changelog_version(data)
        if not 1 <= kind <= 4:
            raise SparkStateFormatError(
                f"The changelog file {path} has format v{kind}; this reader knows v1 to v4 (Spark "
                "4.3's). It was written by a newer Spark.")
        return path, data, kind

    @staticmethod
    def _parse_changelog(data: bytes, kind: int, path: str) -> list[tuple[int, bytes, bytes | None]]:
        records: list[tuple[int, bytes, bytes | None]] = []
        append = records.append
        unpack = _INT.unpack_from
        pos, end = 0, len(data)
        try:
            if kind > 1:
                pos = 2 + struct.unpack_from(">H", data, 0)[0]
            if kind > 2:
                pos += 2 + struct.unpack_from(">H", data, pos)[0]
            while True:
                if kind in (2, 4):
                    record = data[pos]
                    pos += 1
                    if record == EOF_RECORD:
                        break
                    if record not in (PUT_RECORD, DELETE_RECORD, MERGE_RECORD):
                        raise SparkStateFormatError(
                            f"The changelog file {path} has a record of type {record:#x}, which Spark 4.3 "
                            "does not write (put 0x01, delete 0x10, merge 0x11); it is damaged.")
                else:
                    record = PUT_RECORD
                (key_size,) = unpack(data, pos)
                pos += 4
                if key_size == -1 and kind in (1, 3):
                    break
                if key_size < 0:
                    raise SparkStateFormatError(f"The changelog file {path} has a record with key size {key_size}; it is damaged.")
                key = data[pos:pos + key_size]
                pos += key_size
                (value_size,) = unpack(data, pos)
                pos += 4
                if value_size < 0:
                    if record == MERGE_RECORD or (record == PUT_RECORD and kind in (2, 4)):
                        raise SparkStateFormatError(
                            f"The changelog file {path} has a put or merge record without a value; it is damaged.")
                    append((DELETE_RECORD, key, None))
                    continue
                if record == DELETE_RECORD:
                    raise SparkStateFormatError(f"The changelog file {path} has a removal with a value; it is damaged.")
                append((record, key, data[pos:pos + value_size]))
                pos += value_size
        except (struct.error, IndexError):
            raise SparkStateFormatError(f"The changelog file {path} ends before its end marker; it is truncated.") from None
        if pos > end:
            raise SparkStateFormatError(f"The changelog file {path} ends inside a record; it is truncated.")
        if pos != end:
            raise SparkStateFormatError(f"The changelog file {path} has {end - pos} bytes after its end marker.")
        return records

    def read_changelog_records(self, version: int) -> list[tuple[bytes, bytes | None]]:
        """(key, value or None for a removal) of changelog ``version``, in file order, as
        stored (a removal's key with its checksum, with row checksums); a changelog of a
        store with column families or checkpoint ids (v2 to v4) refused."""
        path, data, kind = self._changelog_data(version)
        if kind in (2, 4):
            raise SparkStateFormatError(
                f"The changelog file {path} has format v{kind}: a store with column families "
                "(transformWithState), which this reader does not read (rocksdb_families does).")
        if kind == 3:
            raise SparkStateFormatError(
                f"The changelog file {path} has format v3: a store with checkpoint ids "
                "(spark.sql.streaming.stateStore.checkpointFormatVersion=2), which this reader does not read.")
        return [(key, value) for _, key, value in self._parse_changelog(data, kind, path)]

    # -- loading ------------------------------------------------------------------------
    def load_records(self, version: int | None = None) -> dict[bytes, bytes]:
        """Every RocksDB key and value of ``version`` (the newest when None), as stored: the
        newest snapshot at or below it, then the changelogs after it."""
        version, snapshot = version_plan(
            self.list_files(), version, "zip", "changelog", lambda version, v, snapshot: (
                f"Version {version} of the state store {self.path} cannot be loaded: it has no "
                f"{version}.zip, and the changelog {self.file_path(v, 'changelog')} it needs after "
                f"the newest snapshot at or below it ({f'{snapshot}.zip' if snapshot else 'none'}) "
                "does not exist."))
        if version == 0:
            return {}
        state = self.read_snapshot_records(snapshot) if snapshot else {}
        if self.row_checksum and self.verify and snapshot:
            self._verify_values(state, self.file_path(snapshot, "zip"))
        for v in range(snapshot + 1, version + 1):
            records = self.read_changelog_records(v)
            path = self.file_path(v, "changelog")
            if self.row_checksum:
                records = self._strip_removal_checksums(records, path)
                if self.verify:
                    self._verify_values({k: x for k, x in records if x is not None}, path)
            for key, value in records:
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
        return state

    def load(self, version: int | None = None) -> dict[tuple, tuple]:
        """The state of ``version`` (the newest when None) as {key tuple: value tuple}."""
        if version is None:
            version = self.latest_version()
        records = self.load_records(version)
        where = f"version {version} of the state store {self.path}"
        keys = list(records)
        values = list(records.values())
        self._check_framing(keys, values, where)
        try:
            decoded_keys = self._decode_prefixed_keys(keys, where) if self.num_cols_prefix_key else \
                _decode_rows(keys, self.key_schema, self._key_decoder, 1)
            decoded_values = _decode_rows(values, self.value_schema, self._value_decoder,
                                          9 if self.row_checksum else 1)
        except (struct.error, UnicodeDecodeError, ValueError, OverflowError, IndexError) as e:
            raise self._schema_error(where, e) from e
        state = dict(zip(decoded_keys, decoded_values))
        if len(state) != len(records):
            raise SparkStateFormatError(
                f"{where[0].upper()}{where[1:]} holds {len(records)} keys that decode to "
                f"{len(state)} distinct keys with the key schema {self.key_schema}; the schema is "
                "not the operator's.")
        return state

    # -- internals ----------------------------------------------------------------------
    def _schema_error(self, where: str, error: Exception) -> SparkStateFormatError:
        hint = "" if self.row_checksum else (
            " If the query ran with spark.sql.streaming.stateStore.rowChecksum.enabled, read it "
            "with row_checksum=True.")
        return SparkStateFormatError(
            f"The rows of {where} do not decode with the key schema {self.key_schema} and value "
            f"schema {self.value_schema}: {error}. The schemas are not the operator's.{hint}")

    def _check_framing(self, keys: list[bytes], values: list[bytes], where: str) -> None:
        """Every key and value starts with the encoding's version byte, and is one UnsafeRow
        (whole 8-byte words after its framing) at least as long as its schema's fixed part."""
        if not keys:
            return
        value_extra = 1 + (8 if self.row_checksum else 0)
        checks = [(values, value_extra, self._value_min, "value")]
        if not self.num_cols_prefix_key:   # a prefixed key is checked as it is decoded
            checks.append((keys, 1, self._key_min, "key"))
        for blobs, extra, least, what in checks:
            sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
            bad = (sizes < least) | ((sizes - extra) & 7 != 0)
            if bad.any():
                size = int(sizes[np.flatnonzero(bad)[0]])
                framing = "a checksum, a size, " if extra > 1 else ""
                raise self._schema_error(where, ValueError(
                    f"a {size}-byte {what}, where {framing}a version byte and an UnsafeRow of at "
                    f"least {least - extra} bytes in whole 8-byte words are expected"))
            versions = set(map(_BYTE_AT[extra - 1], blobs))
            if versions != {ENCODING_VERSION}:
                raise self._schema_error(where, ValueError(
                    f"rows with the encoding version byte {max(versions - {ENCODING_VERSION})}, where "
                    f"Spark 4.3 writes {ENCODING_VERSION} (an unknown encoding, or rows of another framing)"))

    def _decode_prefixed_keys(self, keys: list[bytes], where: str) -> list[tuple]:
        """Keys of ``PrefixKeyScanStateEncoder``: the encoded prefix's size (a native,
        little-endian int), the encoded prefix columns' row, the encoded other columns' row,
        each encoded with its version byte."""
        prefix_min, rest_min = self._prefix_min, self._rest_min
        decode_prefix, decode_rest = self._prefix_decoder, self._rest_decoder
        unpack = _LE_INT.unpack_from
        out = []
        for k in keys:
            (size,) = unpack(k, 0) if len(k) >= 4 else (-1,)
            rest = len(k) - 4 - size
            if size < prefix_min or (size - 1) & 7 or rest < rest_min or (rest - 1) & 7:
                raise self._schema_error(where, ValueError(
                    f"a {len(k)}-byte key whose prefix says {size} bytes, where the encoded rows of "
                    f"the {self.num_cols_prefix_key} prefix columns and of the others (a version byte "
                    "and an UnsafeRow each) are expected"))
            if k[4] != ENCODING_VERSION or k[4 + size] != ENCODING_VERSION:
                raise self._schema_error(where, ValueError(
                    f"a key with the encoding version bytes {k[4]} and {k[4 + size]}, where Spark 4.3 "
                    f"writes {ENCODING_VERSION}"))
            out.append(decode_prefix(k, 5) + decode_rest(k, 5 + size))
        return out

    def _strip_removal_checksums(self, records, path: str) -> list[tuple[bytes, bytes | None]]:
        """A changelog's removals without their key checksums (verified when ``verify``)."""
        removals = [(i, k) for i, (k, x) in enumerate(records) if x is None]
        if not removals:
            return records
        if any(len(k) < 5 for _, k in removals):
            raise SparkStateFormatError(
                f"The changelog file {path} has a removal shorter than a row checksum and a key; it is damaged.")
        if self.verify:
            sums = crc32c_many([k[4:] for _, k in removals])
            for (i, k), got in zip(removals, sums):
                want = _LE_INT.unpack_from(k)[0]
                if _signed(got) != want:
                    raise SparkStateFormatError(
                        f"Row checksum verification failed for the removal in record {i} of {path}: "
                        f"expected {want}, computed {_signed(got)}. The file is damaged.")
        out = list(records)
        for i, k in removals:
            out[i] = (k[4:], None)
        return out

    def _verify_values(self, records: Mapping[bytes, bytes], where: str) -> None:
        """Each value's checksum (of its key and value) and size; merged values refused."""
        items, expected = [], []
        for key, value in records.items():
            if len(value) < 8:
                raise SparkStateFormatError(
                    f"A value in {where} has {len(value)} bytes, shorter than a row checksum and a size; "
                    "it is damaged, or the query ran without spark.sql.streaming.stateStore."
                    "rowChecksum.enabled (read it with row_checksum=False).")
            checksum, size = _CHECKSUM_AND_SIZE.unpack_from(value)
            if size != len(value) - 8:
                raise SparkStateFormatError(
                    f"A value in {where} says it holds {size} bytes after its checksum and size, where "
                    f"{len(value) - 8} follow: merged values (several values of one key), which this "
                    "reader does not read, or a value without a row checksum (read it with "
                    "row_checksum=False).")
            items.append(key + value[8:])
            expected.append(checksum)
        for got, want in zip(crc32c_many(items), expected):
            if _signed(got) != want:
                raise SparkStateFormatError(
                    f"Row checksum verification failed for a value in {where}: expected {want}, "
                    f"computed {_signed(got)}. The file is damaged.")


_BYTE_AT = {0: operator.itemgetter(0), 8: operator.itemgetter(8)}


def operator_prefix_columns(checkpoint: str, operator_id: int, store_name: str = "default", fs=None) -> int:
    """``numColsPrefixKey`` of a store in the operator's metadata file
    (``state/<op>/_metadata/metadata``, ``v1`` then JSON); 0 when there is none."""
    if fs is None:
        from microbatch.checkpoint.fs import CheckpointFileSystem
        fs = CheckpointFileSystem()
    path = f"{checkpoint.rstrip('/')}/state/{operator_id}/_metadata/metadata"
    if not fs.exists(path):
        return 0
    first, _, rest = fs.read_bytes(path).decode("utf-8", "replace").partition("\n")
    if first.strip() != "v1":
        # v2 (transformWithState) keeps its stores' encoders in its schema files
        raise SparkStateFormatError(
            f"The operator metadata {path} has version {first.strip()!r}: an operator this reader "
            "does not read (version v1 is the one of Spark's operators without column families).")
    try:
        stores = json.loads(rest).get("stateStoreInfo", [])
    except ValueError as e:
        raise SparkStateFormatError(f"The operator metadata {path} is not JSON ({e}); it is damaged.") from e
    for store in stores:
        if store.get("storeName", "default") == store_name:
            return int(store.get("numColsPrefixKey", 0))
    return 0


def _decode_rows(blobs: list[bytes], schema, decoder, start: int) -> list[tuple]:
    """The UnsafeRows at ``start`` of each of ``blobs``: all at once with numpy when the
    schema is fixed-width (every row the same size), a row at a time otherwise (and for
    the rows with nulls)."""
    layout = fixed_width_dtype(schema, start)
    size = start + fixed_size(schema)
    if layout is None or len(blobs) < 64 or any(len(b) != size for b in blobs):
        return [decoder(b, start) for b in blobs]
    dtype = np.dtype({"names": [n for n, _, _ in layout], "formats": [f for _, f, _ in layout],
                      "offsets": [o for _, _, o in layout], "itemsize": size})
    rows = np.frombuffer(b"".join(blobs), dtype=dtype, count=len(blobs))
    decoded = decode_columns({n: rows[n] for n, _, _ in layout if n != "nulls"}, schema, len(blobs))
    if "nulls" in rows.dtype.names:
        for i in np.flatnonzero(rows["nulls"] != 0).tolist():
            decoded[i] = decoder(blobs[i], start)
    return decoded


def _signed(x: int) -> int:
    return x - (1 << 32) if x >= 1 << 31 else x
