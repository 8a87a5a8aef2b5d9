"""The state of Spark's transformWithState (``transformWithState`` /
``transformWithStateInPandas``, Spark 4.3), read from the files of Spark's
``RocksDBStateStoreProvider``, which Spark requires for it.

One store per partition (``state/<op>/<partition>/``, the files of ``rocksdb_files``) holds
every state variable of the operator in *virtual column families* of one RocksDB: each
RocksDB key starts with the family's id, a 2-byte short in the machine's (little-endian)
order (``RocksDBStateStoreProvider.encodeStateRowWithPrefix``, ``Platform.putShort``). A
snapshot's ``metadata`` maps the families' names to their ids (``columnFamilyMapping``,
with ``columnFamilyTypeMap`` and ``maxColumnFamilyId``); Spark writes a snapshot whenever
a family is created, and ids are never reused. Changelogs are format v2 (v1's records,
each after a type byte: put, delete or merge; the file ends with the type byte 0), their
keys with the family's id.

The families of a store (Spark 4.3, as its files show; ids from 1, ``default`` first, which
transformWithState leaves empty; ``columnFamilyTypeMap`` true for the internal ``$``
families, whose keys the metadata counts in ``numInternalKeys``, the others' in
``numKeys``). Their schemas and key encoders are in the operator's v3 schema file
(``read_state_schemas_v3``), the variables' kinds in its metadata v2:

- ``<name>`` of a value state: key the grouping key's columns (NoPrefix), value the
  value's row;
- ``<name>`` of a list state: the same key, and a value of *merged* elements (RocksDB's
  merge operator ``StringAppendOperator`` with the delimiter of
  ``spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion``: 1 a comma, 2 none
  (what 4.3 records for a new query); a checkpoint from before the conf has 1): each
  element its encoded row's size (a little-endian int) and the encoded row. Beside it
  ``$rowCounter_<name>`` (key the grouping key, value ``count``: the elements);
- ``<name>`` of a map state: key (``key``: the grouping key as a struct, ``userKey``: the
  user key as a struct; PrefixKeyScan, 1 prefix column), value the map value's row;
- with a TTL the value's row is (``value``: the value as a struct, ``ttlExpirationMs``),
  for each list element too; beside it ``$ttl_<name>`` (key (``expirationMs``,
  ``elementKey``: the grouping key, or for a map (grouping key, user key)), RangeKeyScan
  on the time, value ``__empty__`` of type void), and for a list ``$min_<name>`` (the
  earliest ``expirationMs`` per grouping key) and ``$count_<name>`` (its elements) in
  place of ``$rowCounter_<name>``;
- timers: ``$eventTimers_keyToTimestamp`` / ``$procTimers_keyToTimestamp`` (key (``key``:
  the grouping key as a struct, ``expiryTimestampMs``), PrefixKeyScan) and
  ``..._timestampToKey`` (key (``expiryTimestampMs``, ``key``), RangeKeyScan on the
  time), both with a value ``__dummy__`` of type void (a row of one null).

Spark's ``statestore`` reader shows these rows as they are (a TTL's value with its
expiration time, expired values not yet evicted included).

A key is encoded by the family's key encoder spec (the schema file's): ``NoPrefix`` one
version byte (0) and the key's UnsafeRow; ``PrefixKeyScan`` the encoded prefix's size (a
little-endian int), the prefix columns' encoded row and the other columns' encoded row;
``RangeKeyScan`` the same with the ordering columns' row, each of its columns a binary of
a marker byte (0 negative, 1 positive, 2 null) and the value big-endian (negative floats
with their bits flipped). A value is a version byte and the UnsafeRow; with row checksums
(``rowChecksum.enabled``) each value or list element is a CRC-32C of the key and the
value and the value's size before it (``rocksdb_files``).

RocksDB cannot read a key with merge operands without the merge operator, which rocksdict
cannot be given (and rocksdict does not refuse such a key: it reads a wrong value, as
Spark's list states showed): a snapshot's SST files are read here (RocksDB's
block-based table format, format versions 2 to 5; none, snappy, zlib, lz4 or zstd
blocks; binary-search, hash and two-level indexes) and their entries combined as RocksDB
does, then the changelogs after the snapshot applied (a merge record appended to the
key's value with the delimiter).

Refused with a ``SparkStateFormatError`` naming the file: a key whose family id the
snapshot metadata does not name, a family the schema file does not have, a key encoder
spec other than the three above, a range-scan column of a type Spark does not order
(booleans), the Avro encoding, SST files with range deletions or another table format,
a snapshot with write-ahead log records, anything ``rocksdb_files`` refuses but the
families.
"""
from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from microbatch.state.spark_format.hdfs_files import store_path, version_plan
from microbatch.state.spark_format.rocksdb_files import (
    DELETE_RECORD, ENCODING_VERSION, MERGE_RECORD, SparkRocksDBStoreFiles, _signed,
    rocksdb_store_options_from_conf,
)
from microbatch.state.spark_format.checksums import crc32c_many
from microbatch.state.spark_format.schema_file import (
    StateSchema, _decode_modified_utf8, _read_utf, parse_state_schema,
)
from microbatch.state.spark_format.unsafe_row import SparkStateFormatError, fixed_size, row_decoder

MERGE_DELIMITERS = {1: b",", 2: b""}
_CF_ID = struct.Struct("<h")
_LE_INT = struct.Struct("<i")
_SCHEMA_FILE = re.compile(r"^(\d+)_(.+)$")
_METADATA_FILE = re.compile(r"^(\d+)$")


def families_options_from_conf(conf: Mapping[str, str]) -> dict:
    """``SparkRocksDBFamilies`` options (codec, row_checksum, merge_operator_version) from a
    query's recorded conf (``hdfs_files.offset_log_conf``), Spark 4.3's defaults for what it
    does not record (the merge operator's version 1 for a checkpoint from before the conf)."""
    options = rocksdb_store_options_from_conf(conf)
    version = conf.get("spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion", "1")
    try:
        options["merge_operator_version"] = int(version)
    except ValueError:
        raise SparkStateFormatError(
            f"The checkpoint records spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion={version}; "
            "Spark writes 1 or 2.") from None
    return options


# -- the v3 schema files and the operator metadata v2 ---------------------------------------
def _fs(fs):
    if fs is None:
        from microbatch.checkpoint.fs import CheckpointFileSystem
        fs = CheckpointFileSystem()
    return fs


def _newest(fs, directory: str, what: str, pattern=_SCHEMA_FILE) -> str:
    try:
        names = fs.list(directory)
    except FileNotFoundError:
        names = []
    found = [(int(m.group(1)), name) for name in names if (m := pattern.match(name))]
    if not found:
        raise SparkStateFormatError(
            f"The directory {directory} has no {what}: the operator is not one of transformWithState, "
            "or the checkpoint was not written by Spark 4.x's engine.")
    return f"{directory}/{max(found)[1]}"


def read_operator_metadata_v2(checkpoint: str, operator_id: int, fs=None) -> dict:
    """The newest operator metadata v2 of a transformWithState operator
    (``state/<op>/_metadata/v2/<batchId>``: the line ``v2``, then JSON: ``operatorInfo``,
    ``stateStoreInfo`` (each store's ``stateSchemaFilePaths``), ``operatorPropertiesJson``
    (time mode, output mode, ``stateVariables``: each ``stateName``, ``stateVariableType``,
    ``ttlEnabled``)), as {"operatorInfo", "stateStoreInfo", "operatorProperties", "path"},
    the operator's properties parsed."""
    fs = _fs(fs)
    path = _newest(fs, f"{checkpoint.rstrip('/')}/state/{operator_id}/_metadata/v2", "operator metadata v2",
                   _METADATA_FILE)
    first, _, rest = fs.read_bytes(path).decode("utf-8", "replace").partition("\n")
    if first.strip() != "v2":
        raise SparkStateFormatError(
            f"The operator metadata {path} does not start with the line 'v2'; it is damaged, or was "
            "written by a newer Spark.")
    try:
        info = json.loads(rest)
    except ValueError as e:
        raise SparkStateFormatError(f"The operator metadata {path} is not JSON ({e}); it is damaged.") from e
    if not isinstance(info, dict):
        raise SparkStateFormatError(f"The operator metadata {path} is not a JSON object; it is damaged.")
    stores = info.get("stateStoreInfo") or []
    properties = info.get("operatorPropertiesJson") or "{}"
    try:
        properties = json.loads(properties) if isinstance(properties, str) else properties
    except ValueError as e:
        raise SparkStateFormatError(f"The operator properties in {path} are not JSON ({e}).") from e
    return {"operatorInfo": info.get("operatorInfo", {}), "stateStoreInfo": stores,
            "operatorProperties": properties, "path": path}


def state_schema_v3_path(checkpoint: str, operator_id: int, fs=None, store_name: str = "default") -> str:
    """The schema file a transformWithState operator's state has now: the one its newest
    operator metadata v2 names (``stateSchemaFilePath``), else the newest of
    ``state/<op>/_stateSchema/<store>/<batchId>_<uuid>``."""
    fs = _fs(fs)
    directory = f"{checkpoint.rstrip('/')}/state/{operator_id}/_stateSchema/{store_name}"
    try:
        metadata = read_operator_metadata_v2(checkpoint, operator_id, fs)
    except SparkStateFormatError:
        metadata = None
    if metadata:
        for store in metadata["stateStoreInfo"]:
            if not isinstance(store, dict) or store.get("storeName", "default") != store_name:
                continue
            named = store.get("stateSchemaFilePaths") or []
            if named:   # the newest is the last; its name in this checkpoint (it may have moved)
                name = str(named[-1]).rstrip("/").rsplit("/", 1)[-1]
                if fs.exists(f"{directory}/{name}"):
                    return f"{directory}/{name}"
    return _newest(fs, directory, "state schema files (v3)")


def read_state_schemas_v3(checkpoint: str, operator_id: int, fs=None, store_name: str = "default") -> dict[str, StateSchema]:
    """The column families of a transformWithState operator's schema file (v3), by name,
    with their key encoder specs."""
    fs = _fs(fs)
    path = state_schema_v3_path(checkpoint, operator_id, fs, store_name)
    return {family.column_family: family for family in parse_state_schema_v3(fs.read_bytes(path), path)}


def parse_state_schema_v3(data: bytes, path: str = "") -> list[StateSchema]:
    """The column families of a v3 state schema file (``StateSchemaV3File``, Spark 4.3;
    ``schema_file.parse_state_schema`` reads it), refusing another version."""
    where = f"The state schema file {path}" if path else "The state schema file"
    try:
        raw, _ = _read_utf(data, 0)
        version = _decode_modified_utf8(raw)
    except (struct.error, ValueError) as e:
        raise SparkStateFormatError(f"{where} does not parse: {e}; it is damaged.") from e
    if version != "v3":
        raise SparkStateFormatError(f"{where} has version {version!r}; transformWithState's schema files are v3.")
    try:
        return parse_state_schema(data)
    except SparkStateFormatError as e:
        raise SparkStateFormatError(f"{where}: {e}") from e


def read_state_schema_v3(checkpoint: str, operator_id: int, fs=None, store_name: str = "default") -> dict[str, tuple[pa.Schema, pa.Schema]]:
    """{column family: (key schema, value schema)} of a transformWithState operator, as
    pyarrow storage types (``schema_file.arrow_schema``), from its v3 schema file."""
    return {name: (family.key_arrow(), family.value_arrow())
            for name, family in read_state_schemas_v3(checkpoint, operator_id, fs, store_name).items()}


# -- the families' encodings -----------------------------------------------------------------
@dataclass(frozen=True)
class FamilyEncoding:
    """How one column family's keys and values are encoded: its key and value schemas (pyarrow
    storage types), the key encoder (``none``, ``prefix`` with ``num_prefix`` columns or
    ``range`` with ``ordinals``), and whether a key has several values (list state)."""
    key_schema: pa.Schema
    value_schema: pa.Schema
    encoder: str = "none"
    num_prefix: int = 0
    ordinals: tuple = ()
    multi_value: bool = False

    @classmethod
    def from_schema(cls, schema: StateSchema, multi_value: bool = False, where: str = "") -> "FamilyEncoding":
        spec = schema.key_encoder_spec or {}
        kind = spec.get("keyStateEncoderType", "NoPrefixKeyStateEncoderSpec")
        key, value = schema.key_arrow(), schema.value_arrow()
        if kind == "NoPrefixKeyStateEncoderSpec":
            return cls(key, value, "none", multi_value=multi_value)
        if kind == "PrefixKeyScanStateEncoderSpec":
            return cls(key, value, "prefix", num_prefix=int(spec.get("numColsPrefixKey", 0)), multi_value=multi_value)
        if kind == "RangeKeyScanStateEncoderSpec":
            return cls(key, value, "range", ordinals=tuple(int(o) for o in spec.get("orderingOrdinals", [])),
                       multi_value=multi_value)
        raise SparkStateFormatError(
            f"The column family {schema.column_family}{where} has the key encoder {json.dumps(spec)}; "
            "NoPrefix, PrefixKeyScan and RangeKeyScan (Spark 4.3's) are read here.")


_RANGE_TYPES = {  # pyarrow type id -> (struct format of the big-endian value, Spark's defaultSize)
    pa.int8().id: (">b", 1), pa.int16().id: (">h", 2), pa.int32().id: (">i", 4),
    pa.int64().id: (">q", 8), pa.float32().id: (">f", 4), pa.float64().id: (">d", 8),
}


class _KeyDecoder:
    """Decodes a family's keys (without the family id) to tuples of the key schema's columns."""

    def __init__(self, enc: FamilyEncoding, name: str):
        fields = list(enc.key_schema)
        self.enc = enc
        self.name = name
        if enc.encoder == "none":
            self.decode = self._plain
            self._row = row_decoder(enc.key_schema, as_key=True)
            self._min = 1 + fixed_size(enc.key_schema)
            return
        if enc.encoder == "prefix":
            if not 0 < enc.num_prefix <= len(fields):
                raise SparkStateFormatError(
                    f"The column family {name} has a prefix of {enc.num_prefix} key columns of {len(fields)}.")
            first, rest = fields[:enc.num_prefix], fields[enc.num_prefix:]
            self._order = list(range(len(fields)))
        else:
            if not enc.ordinals or any(not 0 <= o < len(fields) for o in enc.ordinals) \
                    or len(set(enc.ordinals)) != len(enc.ordinals):
                raise SparkStateFormatError(
                    f"The column family {name} orders its keys by the columns {list(enc.ordinals)} of {len(fields)}.")
            rest_ordinals = [i for i in range(len(fields)) if i not in enc.ordinals]
            first = [pa.field(fields[o].name, pa.binary()) for o in enc.ordinals]
            self._range = []
            for o in enc.ordinals:
                t = fields[o].type
                if t.id not in _RANGE_TYPES:
                    raise SparkStateFormatError(
                        f"The column family {name} orders its keys by the column {fields[o].name} of type "
                        f"{t}, which Spark's range scan encoding does not order (fixed-size numbers only).")
                fmt, size = _RANGE_TYPES[t.id]
                self._range.append((struct.Struct(fmt), size, pa.types.is_floating(t)))
            rest = [fields[i] for i in rest_ordinals]
            placed = list(enc.ordinals) + rest_ordinals
            self._order = [placed.index(i) for i in range(len(fields))]
        self._first = row_decoder(pa.schema(first), as_key=True)
        self._rest = row_decoder(pa.schema(rest), as_key=True)
        self._first_min, self._rest_min = 1 + fixed_size(pa.schema(first)), 1 + fixed_size(pa.schema(rest))
        self.decode = self._split

    def _plain(self, k: bytes, start: int) -> tuple:
        if len(k) - start < self._min or (len(k) - start - 1) & 7:
            raise ValueError(f"a {len(k) - start}-byte key, where a version byte and an UnsafeRow of at least "
                             f"{self._min - 1} bytes in whole 8-byte words are expected")
        if k[start] != ENCODING_VERSION:
            raise ValueError(f"a key with the encoding version byte {k[start]}, where Spark 4.3 writes 0")
        return self._row(k, start + 1)

    def _split(self, k: bytes, start: int) -> tuple:
        if len(k) < start + 4:
            raise ValueError(f"a {len(k) - start}-byte key, shorter than its prefix's size")
        (size,) = _LE_INT.unpack_from(k, start)
        rest = len(k) - start - 4 - size
        if size < self._first_min or (size - 1) & 7 or rest < self._rest_min or (rest - 1) & 7:
            raise ValueError(
                f"a {len(k) - start}-byte key whose prefix says {size} bytes, where the encoded rows of the "
                "prefix (or ordering) columns and of the others are expected")
        a, b = start + 4, start + 4 + size
        if k[a] != ENCODING_VERSION or k[b] != ENCODING_VERSION:
            raise ValueError(f"a key with the encoding version bytes {k[a]} and {k[b]}, where Spark 4.3 writes 0")
        first = self._first(k, a + 1)
        if self.enc.encoder == "range":
            first = tuple(self._ordered(v, i) for i, v in enumerate(first))
        joined = first + self._rest(k, b + 1)
        return tuple(joined[i] for i in self._order)

    def _ordered(self, raw: bytes, i: int):
        unpack, size, floating = self._range[i]
        if raw is None or len(raw) != size + 1:
            raise ValueError(f"a range-scan column of {None if raw is None else len(raw)} bytes, where "
                             f"a marker byte and {size} bytes are expected")
        marker = raw[0]
        if marker == 2:
            return None
        if marker not in (0, 1):
            raise ValueError(f"a range-scan column with the marker byte {marker} (0, 1 or 2 expected)")
        if floating and marker == 0:   # a negative float: its bits were flipped
            flipped = bytes(b ^ 0xFF for b in raw[1:])
            return unpack.unpack(flipped)[0]
        return unpack.unpack_from(raw, 1)[0]


# -- the store ----------------------------------------------------------------------------------
class SparkRocksDBFamilies:
    """The column families of one of Spark's RocksDB-provider stores (transformWithState's),
    read.

    ``path``: the store's directory (``hdfs_files.store_path``). ``codec``, ``row_checksum``,
    ``verify``, ``fs``: as ``SparkRocksDBStoreFiles``'s. ``merge_operator_version``: the
    query's ``spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion`` (1: list elements
    merged with a comma between them, 2: with nothing; ``families_options_from_conf``).
    ``schemas``: the families' ``StateSchema`` by name (``read_state_schemas_v3``), which
    ``load_family`` decodes with when it is given no schema. ``list_families``: the names of
    the families whose keys have several values (list states; ``for_store`` takes them from
    the operator metadata v2).
    """

    def __init__(self, path: str, fs=None, codec: str = "lz4", row_checksum: bool = False,
                 verify: bool = True, local_dir: str | None = None, merge_operator_version: int = 2,
                 schemas: Mapping[str, StateSchema] | None = None, list_families=()):
        if merge_operator_version not in MERGE_DELIMITERS:
            raise SparkStateFormatError(
                f"The RocksDB merge operator version {merge_operator_version}: Spark 4.3 has 1 and 2.")
        self.files = SparkRocksDBStoreFiles(path, pa.schema([]), pa.schema([]), fs=fs, codec=codec,
                                            row_checksum=row_checksum, verify=verify, local_dir=local_dir)
        self.path = self.files.path
        self.row_checksum = row_checksum
        self.verify = verify
        self.delimiter = MERGE_DELIMITERS[merge_operator_version]
        self.schemas = dict(schemas or {})
        self.list_families = set(list_families)

    @classmethod
    def for_store(cls, checkpoint: str, operator_id: int, partition_id: int, store_name: str = "default",
                  **options) -> "SparkRocksDBFamilies":
        """The store of a checkpoint's transformWithState operator and partition, with the
        families' schemas of its v3 schema file, its list states from its operator metadata
        v2, and the options (codec, row checksums, merge operator) its offset log records
        unless given."""
        from microbatch.state.spark_format.hdfs_files import offset_log_conf
        fs = options.get("fs")
        for key, value in families_options_from_conf(offset_log_conf(checkpoint, fs)).items():
            options.setdefault(key, value)
        if "schemas" not in options:
            options["schemas"] = read_state_schemas_v3(checkpoint, operator_id, fs, store_name)
        if "list_families" not in options:
            options["list_families"] = list_state_families(checkpoint, operator_id, fs)
        return cls(store_path(checkpoint, operator_id, partition_id, store_name), **options)

    def __repr__(self) -> str:
        return f"SparkRocksDBFamilies({self.path!r})"

    # -- listing -------------------------------------------------------------------------
    def versions(self) -> list[int]:
        return self.files.versions()

    def latest_version(self) -> int:
        return self.files.latest_version()

    def family_ids(self, version: int) -> dict[str, int]:
        """{family name: id} for ``version``: the mapping of the newest snapshot at or below
        it, else of the oldest snapshot after it (Spark writes a snapshot when a family is
        created and never reuses an id); {} for version 0."""
        if version == 0:
            return {}
        files = self.files.list_files()
        at_or_below = [v for v, kind in files if kind == "zip" and v <= version]
        above = [v for v, kind in files if kind == "zip" and v > version]
        if not at_or_below and not above:
            raise SparkStateFormatError(
                f"Version {version} of the state store {self.path} cannot be read: the store has no "
                "snapshot (<v>.zip), whose metadata alone records the column families' ids.")
        snapshot = max(at_or_below) if at_or_below else min(above)
        return self._mapping(self.files.read_metadata(snapshot, families=True), snapshot)

    def _mapping(self, metadata: dict, snapshot: int) -> dict[str, int]:
        mapping = metadata.get("columnFamilyMapping") or {}
        try:
            return {str(name): int(cf) for name, cf in mapping.items()}
        except (TypeError, ValueError, AttributeError):
            raise SparkStateFormatError(
                f"The metadata of the snapshot {self.files.file_path(snapshot, 'zip')} has a column family "
                f"mapping {mapping!r} that is not names to ids; it is damaged.") from None

    def families(self, version: int | None = None) -> list[str]:
        """The names of the column families of ``version`` (the newest when None), in id order."""
        if version is None:
            version = self.latest_version()
        ids = self.family_ids(version)
        return sorted(ids, key=ids.get)

    # -- records -------------------------------------------------------------------------
    def read_snapshot_records(self, version: int) -> tuple[dict[bytes, bytes], set[bytes]]:
        """Every RocksDB key and value of snapshot ``version`` as stored (keys with their
        family id), read from its SST files; and the keys whose values are merged."""
        path = self.files.file_path(version, "zip")
        metadata, entries, ssts, logs = self.files.read_snapshot_files(version, families=True)
        wal = [name for name, data in entries.items() if name.endswith(".log") and data]
        if logs or wal:
            raise SparkStateFormatError(
                f"The snapshot {path} holds write-ahead log records ({', '.join(wal) or 'archived logs'}), "
                "which this reader does not replay (Spark writes its state with the WAL off).")
        read = [_SstFile(data, f"{self.path}/SSTs ({local}, of {path})").entries() for local, data in ssts]
        records, merged = merge_sst_entries(read, self.delimiter, path)
        expected = metadata.get("numKeys", -1)
        internal = metadata.get("numInternalKeys", 0)
        if isinstance(expected, int) and isinstance(internal, int) and expected >= 0 \
                and expected + internal != len(records):
            raise SparkStateFormatError(
                f"The snapshot {path} holds {len(records)} keys; its metadata says {expected} and "
                f"{internal} internal ones. Its SST files are not the ones it was written with.")
        return records, merged

    def load_records(self, version: int | None = None) -> dict[bytes, bytes]:
        """Every RocksDB key and value of ``version`` (the newest when None), as stored: the
        newest snapshot at or below it, then the changelogs after it (merges appended with
        the merge operator's delimiter)."""
        version, snapshot = version_plan(
            self.files.list_files(), version, "zip", "changelog", lambda version, v, snapshot: (
                f"Version {version} of the state store {self.path} cannot be loaded: it has no "
                f"{version}.zip, and the changelog {self.files.file_path(v, 'changelog')} it needs after "
                f"the newest snapshot at or below it ({f'{snapshot}.zip' if snapshot else 'none'}) "
                "does not exist."))
        if version == 0:
            return {}
        state = self.read_snapshot_records(snapshot)[0] if snapshot else {}
        for v in range(snapshot + 1, version + 1):
            path = self.files.file_path(v, "changelog")
            _, records = self.files.read_changelog(v)
            for kind, key, value in records:
                if kind == DELETE_RECORD:
                    if self.row_checksum:
                        key = self._strip_removal_checksum(key, path)
                    state.pop(key, None)
                elif kind == MERGE_RECORD and key in state:
                    state[key] = state[key] + self.delimiter + value
                else:
                    state[key] = value
        return state

    # -- families ------------------------------------------------------------------------
    def encoding(self, name: str, key_schema=None, value_schema=None, multi_value: bool | None = None,
                 encoder: str | None = None, num_prefix: int | None = None, ordinals=None) -> FamilyEncoding:
        """A family's encoding: its schema file's, with what is given instead."""
        schema = self.schemas.get(name)
        if schema is not None:
            base = FamilyEncoding.from_schema(schema, name in self.list_families, f" of {self.path}")
        elif key_schema is None or value_schema is None:
            raise SparkStateFormatError(
                f"The column family {name} of the state store {self.path} is not in its schema file "
                f"(which has {', '.join(sorted(self.schemas)) or 'none'}); give its key and value schemas.")
        else:
            base = FamilyEncoding(pa.schema(list(key_schema)), pa.schema(list(value_schema)))
        return FamilyEncoding(
            pa.schema(list(key_schema)) if key_schema is not None else base.key_schema,
            pa.schema(list(value_schema)) if value_schema is not None else base.value_schema,
            encoder or base.encoder, base.num_prefix if num_prefix is None else num_prefix,
            base.ordinals if ordinals is None else tuple(ordinals),
            base.multi_value if multi_value is None else multi_value)

    def load_family(self, version: int | None, name: str, key_schema=None, value_schema=None,
                    multi_value: bool | None = None, records: Mapping[bytes, bytes] | None = None,
                    **encoding) -> dict:
        """The rows of family ``name`` in ``version`` (the newest when None): {key tuple:
        value tuple}, or {key tuple: [value tuple, ...]} for a family with several values
        per key (a list state's). A map state's key tuple is (grouping key, user key), each a
        tuple (its columns are structs); a value state with a TTL has its expiration time as
        the value's last column, as Spark keeps it. The schemas and the key encoding are the
        schema file's unless given (``encoder``, ``num_prefix``, ``ordinals``). ``records``:
        the store's records of that version (``load_records``), to read several families
        with one load."""
        if version is None:
            version = self.latest_version()
        where = f"the column family {name} of version {version} of the state store {self.path}"
        ids = self.family_ids(version)
        if multi_value is None and name not in self.list_families and (
                f"$rowCounter_{name}" in ids or f"$count_{name}" in ids):
            multi_value = True   # a list state's companions: its row counter (with a TTL, its count)
        enc = self.encoding(name, key_schema, value_schema, multi_value, **encoding)
        if name not in ids:
            raise SparkStateFormatError(
                f"The state store {self.path} has no column family {name} in version {version} (it has "
                f"{', '.join(sorted(ids)) or 'none'}).")
        if records is None:
            records = self.load_records(version)
        known = set(ids.values())
        prefix = _CF_ID.pack(ids[name])
        mine = []
        for key, value in records.items():
            if key[:2] == prefix:
                mine.append((key, value))
            elif len(key) < 2 or _CF_ID.unpack_from(key)[0] not in known:
                cf = _CF_ID.unpack_from(key)[0] if len(key) >= 2 else None
                raise SparkStateFormatError(
                    f"Version {version} of the state store {self.path} has a key of the column family id "
                    f"{cf}, which its snapshot's metadata does not name (it names {json.dumps(ids)}).")
        keys = _KeyDecoder(enc, name)
        value_row = row_decoder(enc.value_schema, as_key=False)
        value_min = 1 + fixed_size(enc.value_schema)
        out = {}
        try:
            for key, value in mine:
                k = keys.decode(key, 2)
                if enc.multi_value:
                    out[k] = [self._value(key, v, value_row, value_min, where)
                              for v in self._elements(key, value, where)]
                else:
                    out[k] = self._value(key, self._unframe(key, value, where), value_row, value_min, where)
        except (struct.error, UnicodeDecodeError, ValueError, OverflowError, IndexError) as e:
            raise SparkStateFormatError(
                f"The rows of {where} do not decode with the key schema {enc.key_schema} ({enc.encoder} key "
                f"encoding) and value schema {enc.value_schema}: {e}.") from e
        if len(out) != len(mine):
            raise SparkStateFormatError(
                f"{where[0].upper()}{where[1:]} has {len(mine)} keys that decode to {len(out)} distinct "
                f"keys with the key schema {enc.key_schema}; the schema is not the family's.")
        return out

    def load(self, version: int | None = None) -> dict[str, dict]:
        """Every family of the schema file that ``version`` (the newest when None) has:
        {family name: ``load_family``'s rows}."""
        if version is None:
            version = self.latest_version()
        records = self.load_records(version)
        return {name: self.load_family(version, name, records=records)
                for name in self.families(version) if name in self.schemas}

    # -- internals -------------------------------------------------------------------------
    def _value(self, key: bytes, v: bytes, decode, least: int, where: str) -> tuple:
        if len(v) < least or (len(v) - 1) & 7:
            raise ValueError(f"a {len(v)}-byte value, where a version byte and an UnsafeRow of at least "
                             f"{least - 1} bytes in whole 8-byte words are expected")
        if v[0] != ENCODING_VERSION:
            raise ValueError(f"a value with the encoding version byte {v[0]}, where Spark 4.3 writes 0")
        return decode(v, 1)

    def _unframe(self, key: bytes, value: bytes, where: str) -> bytes:
        """A single value without its row checksum framing (checked when ``verify``)."""
        if not self.row_checksum:
            return value
        if len(value) < 8:
            raise ValueError(f"a {len(value)}-byte value, shorter than a row checksum and a size")
        checksum, size = struct.unpack_from("<iI", value)
        if size != len(value) - 8:
            raise ValueError(f"a value that says it holds {size} bytes after its checksum, where "
                             f"{len(value) - 8} follow")
        body = value[8:]
        self._check(key, body, checksum, where)
        return body

    def _check(self, key: bytes, body: bytes, checksum: int, where: str) -> None:
        if self.verify:
            got = _signed(crc32c_many([key + body])[0])
            if got != checksum:
                raise SparkStateFormatError(
                    f"Row checksum verification failed for a value in {where}: expected {checksum}, "
                    f"computed {got}. The file is damaged.")

    def _elements(self, key: bytes, value: bytes, where: str) -> list[bytes]:
        """A list state's merged value as its elements' encoded rows: each element (after its
        row checksum and size, with row checksums) its row's size and the row, the elements
        separated by the merge operator's delimiter."""
        out, pos, end, step = [], 0, len(value), len(self.delimiter)
        while pos < end:
            if self.row_checksum:
                checksum, size = struct.unpack_from("<iI", value, pos)
                body = value[pos + 8:pos + 8 + size]
                if len(body) != size:
                    raise ValueError("a list element that runs past its value's end")
                self._check(key, body, checksum, where)
                element, next_pos = body, pos + 8 + size
            else:
                element, next_pos = value, pos
            (n,) = _LE_INT.unpack_from(element, 0 if self.row_checksum else pos)
            start = 4 if self.row_checksum else pos + 4
            row = element[start:start + n]
            if n < 1 or len(row) != n or (self.row_checksum and start + n != len(element)):
                raise ValueError(f"a list element of {n} bytes that does not fit its value")
            out.append(row)
            pos = next_pos if self.row_checksum else start + n
            if pos < end:
                if value[pos:pos + step] != self.delimiter:
                    raise ValueError(
                        f"list elements separated by {value[pos:pos + step]!r}, where the merge operator's "
                        f"delimiter {self.delimiter!r} is expected (mergeOperatorVersion)")
                pos += step
        return out

    def _strip_removal_checksum(self, key: bytes, path: str) -> bytes:
        if len(key) < 5:
            raise SparkStateFormatError(
                f"The changelog file {path} has a removal shorter than a row checksum and a key; it is damaged.")
        if self.verify:
            want, got = _LE_INT.unpack_from(key)[0], _signed(crc32c_many([key[4:]])[0])
            if got != want:
                raise SparkStateFormatError(
                    f"Row checksum verification failed for a removal in {path}: expected {want}, "
                    f"computed {got}. The file is damaged.")
        return key[4:]


def list_state_families(checkpoint: str, operator_id: int, fs=None) -> list[str]:
    """The names of a transformWithState operator's list states (from its operator metadata
    v2's state variables); [] when it has no metadata."""
    try:
        metadata = read_operator_metadata_v2(checkpoint, operator_id, fs)
    except SparkStateFormatError:
        return []
    variables = metadata["operatorProperties"].get("stateVariables", []) if isinstance(
        metadata["operatorProperties"], dict) else []
    return [v.get("stateName") for v in variables
            if isinstance(v, dict) and str(v.get("stateVariableType", "")).lower() in ("liststate", "list")]


# rocksdict cannot be given a merge operator, and RocksDB refuses to read a key that has
# merge operands without one; Spark's list state is kept in merge operands. So the SST files
# (RocksDB's block-based table format, format versions 2 to 5) are read here: every entry
# of every file with its sequence number and type, then combined as RocksDB would.

_MAGIC_BLOCK_BASED = 0x88E241B785F4CFF7
_MAGIC_LEGACY_BLOCK_BASED = 0xDB4775248B80FB57
_FOOTER_SIZE = 53
_TRAILER = 5
#: RocksDB's value types (``dbformat.h``) that a state store's SST files may hold.
_DELETION, _VALUE, _MERGE, _SINGLE_DELETION, _DELETION_WITH_TIMESTAMP = 0x0, 0x1, 0x2, 0x7, 0x14
_DELETIONS = (_DELETION, _SINGLE_DELETION, _DELETION_WITH_TIMESTAMP)


def _varint(data, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _signed_varint(data, pos: int) -> tuple[int, int]:
    n, pos = _varint(data, pos)
    return (n >> 1) ^ -(n & 1), pos


class _SstFile:
    """One SST file's entries: (user key, sequence number, type, value), in file order."""

    def __init__(self, data: bytes, name: str):
        self.data = data
        self.name = name

    def error(self, problem: str) -> SparkStateFormatError:
        return SparkStateFormatError(f"The SST file {self.name} cannot be read: {problem}.")

    def entries(self) -> list[tuple[bytes, int, int, bytes]]:
        try:
            return self._entries()
        except SparkStateFormatError:
            raise
        except (IndexError, ValueError, struct.error, OSError, zlib.error, pa.ArrowException) as e:
            raise self.error(f"it is damaged or truncated ({e})") from e

    def _entries(self):
        data = self.data
        if len(data) < _FOOTER_SIZE:
            raise self.error(f"it has {len(data)} bytes, fewer than a footer")
        footer = len(data) - _FOOTER_SIZE
        (magic,) = struct.unpack_from("<Q", data, len(data) - 8)
        if magic == _MAGIC_LEGACY_BLOCK_BASED:
            raise self.error("it has RocksDB's legacy table format (format version 0)")
        if magic != _MAGIC_BLOCK_BASED:
            raise self.error(f"its magic number {magic:#x} is not a block-based table's")
        (format_version,) = struct.unpack_from("<I", data, len(data) - 12)
        if not 2 <= format_version <= 5:
            raise self.error(
                f"it has the table format version {format_version}; format versions 2 to 5 are read "
                "here (Spark writes 5: spark.sql.streaming.stateStore.rocksdb.formatVersion)")
        pos = footer + 1   # the checksum type, then the meta index's and the index's handles
        meta_offset, pos = _varint(data, pos)
        meta_size, pos = _varint(data, pos)
        index_offset, pos = _varint(data, pos)
        index_size, pos = _varint(data, pos)
        meta = dict(self._block_entries(self._block(meta_offset, meta_size)))
        properties = {}
        if b"rocksdb.properties" in meta:
            handle = meta[b"rocksdb.properties"]
            offset, p = _varint(handle, 0)
            size, _ = _varint(handle, p)
            properties = dict(self._block_entries(self._block(offset, size)))
        for name in (b"rocksdb.range_del", b"rocksdb.range_del2"):
            if name in meta:
                offset, p = _varint(meta[name], 0)
                size, _ = _varint(meta[name], p)
                if self._block_entries(self._block(offset, size)):
                    raise self.error("it holds range deletions, which this reader does not apply")
        index_type = struct.unpack_from("<I", properties.get(b"rocksdb.block.based.table.index.type", b"\0\0\0\0"))[0]
        if index_type not in (0, 1, 2):
            raise self.error(f"its index has the type {index_type}; binary search, hash and two-level "
                             "indexes are read here")
        delta = _varint(properties.get(b"rocksdb.index.value.is.delta.encoded", b"\0"), 0)[0] != 0
        handles = self._index_handles(self._block(index_offset, index_size), delta)
        if index_type == 2:   # a two-level index: the top level's handles are the partitions'
            handles = [h for o, s in handles for h in self._index_handles(self._block(o, s), delta)]
        out = []
        append = out.append
        for offset, size in handles:
            for key, value in self._block_entries(self._block(offset, size)):
                if len(key) < 8:
                    raise self.error("it has a key shorter than its sequence number and type")
                (trailer,) = struct.unpack_from("<Q", key, len(key) - 8)
                append((key[:-8], trailer >> 8, trailer & 0xFF, value))
        expected = properties.get(b"rocksdb.num.entries")
        if expected is not None and _varint(expected, 0)[0] != len(out):
            raise self.error(f"it holds {len(out)} entries; its properties say {_varint(expected, 0)[0]}")
        return out

    def _block(self, offset: int, size: int) -> bytes:
        data = self.data
        if offset + size + _TRAILER > len(data):
            raise self.error(f"a block at {offset} of {size} bytes goes past the file's end")
        raw = data[offset:offset + size]
        kind = data[offset + size]
        if kind == 0:
            return raw
        if kind in (1, 2, 4, 5, 7):
            if kind == 1:   # snappy: its own length prefix
                length, _ = _varint(raw, 0)
                return pa.decompress(raw, length, codec="snappy", asbytes=True)
            length, p = _varint(raw, 0)
            payload = raw[p:]
            if kind == 2:
                out = zlib.decompress(payload, -15)
            else:
                out = pa.decompress(payload, length, codec="zstd" if kind == 7 else "lz4_raw", asbytes=True)
            if len(out) != length:
                raise self.error(f"a block decompresses to {len(out)} bytes where {length} are expected")
            return out
        raise self.error(f"a block has the compression type {kind}; none, snappy, zlib, lz4 and zstd are read")

    def _restarts(self, block: bytes) -> int:
        """Where a block's entries end (its restart points begin)."""
        (packed,) = struct.unpack_from("<I", block, len(block) - 4)
        restarts, end = packed & 0x7FFFFFFF, len(block) - 4
        if packed >> 31:   # a data block hash index after the restart points
            (buckets,) = struct.unpack_from("<H", block, end - 2)
            end -= 2 + buckets
        end -= 4 * restarts
        if restarts == 0 or end < 0:
            raise ValueError(f"a block with {restarts} restart points in {len(block)} bytes")
        return end

    def _block_entries(self, block: bytes) -> list[tuple[bytes, bytes]]:
        end = self._restarts(block)
        out, pos, key = [], 0, b""
        while pos < end:
            shared, pos = _varint(block, pos)
            non_shared, pos = _varint(block, pos)
            size, pos = _varint(block, pos)
            key = key[:shared] + block[pos:pos + non_shared]
            pos += non_shared
            out.append((key, block[pos:pos + size]))
            pos += size
        if pos != end:
            raise ValueError("a block's last entry runs into its restart points")
        return out

    def _index_handles(self, block: bytes, delta: bool) -> list[tuple[int, int]]:
        if not delta:
            handles = []
            for _, value in self._block_entries(block):
                offset, p = _varint(value, 0)
                size, _ = _varint(value, p)
                handles.append((offset, size))
            return handles
        end = self._restarts(block)
        handles, pos = [], 0
        while pos < end:   # entries of <shared><non_shared><key delta><handle or size delta>
            shared, pos = _varint(block, pos)
            non_shared, pos = _varint(block, pos)
            pos += non_shared
            if shared == 0:
                offset, pos = _varint(block, pos)
                size, pos = _varint(block, pos)
            else:
                previous_offset, previous_size = handles[-1]
                change, pos = _signed_varint(block, pos)
                offset, size = previous_offset + previous_size + _TRAILER, previous_size + change
            handles.append((offset, size))
        return handles


def merge_sst_entries(files: list[list[tuple[bytes, int, int, bytes]]], delimiter: bytes,
                      where: str) -> tuple[dict[bytes, bytes], set[bytes]]:
    """The key-values the entries of several SST files make, as RocksDB reads them with
    ``StringAppendOperator(delimiter)``: per key, from the newest sequence number, merge
    operands gathered until a value (appended to it) or a deletion (appended to nothing).
    Also the keys that had merge operands."""
    by_key: dict[bytes, list[tuple[int, int, bytes]]] = {}
    for entries in files:
        for key, seq, kind, value in entries:
            by_key.setdefault(key, []).append((seq, kind, value))
    state, merged = {}, set()
    for key, versions in by_key.items():
        versions.sort(key=lambda v: v[0], reverse=True)
        operands: list[bytes] = []
        base = None
        deleted = False
        for _seq, kind, value in versions:
            if kind == _MERGE:
                operands.append(value)
                continue
            if kind == _VALUE:
                base = value
            elif kind in _DELETIONS:
                deleted = True
            else:
                raise SparkStateFormatError(
                    f"The SST files of {where} hold an entry of RocksDB value type {kind:#x}, which "
                    "Spark's state stores do not write (values, deletions and merges are read here).")
            break
        if operands:
            merged.add(key)
            operands.reverse()
            state[key] = delimiter.join(([base] if base is not None else []) + operands)
        elif base is not None:
            state[key] = base
        else:
            assert deleted
    return state, merged
