"""Spark's state schema files, and Spark's JSON data types as pyarrow storage types.

Spark (``StateSchemaCompatibilityChecker`` with ``SchemaHelper``) keeps an operator's key
and value schema in the store directory of partition 0:
``<checkpoint>/state/<op>/0[/<storeName>]/_metadata/schema`` (beside it, the operator's
``state/<op>/_metadata/metadata`` is JSON: operator name, stores, partitions), written
through ``java.io.DataOutputStream``:

- the version, ``writeUTF("v<N>")`` (a big-endian 2-byte length, then modified UTF-8);
- v1: the key schema's JSON and the value schema's JSON, each ``writeUTF``;
- v2 (what Spark 3.x and 4.x write for the operators of the HDFS provider): each schema
  JSON as a big-endian int count of chunks, then each chunk ``writeUTF`` (chunks of at
  most 65535 characters);
- v3 (transformWithState's files under ``state/<op>/_stateSchema/<store>/``): an int
  count of column families, then per family its name (``writeUTF``), the key schema,
  the value schema, the key encoder spec JSON and the user key encoder schema JSON
  (``{    }`` when none), each chunked as in v2.

The JSON is Spark's ``DataType.json``. ``arrow_type`` maps it to microbatch's state
storage types (``state/files.py``): timestamps (with or without time zone) as int64
microseconds, dates as date32, decimals as decimal128, arrays as lists, maps as maps;
interval, variant, time and user-defined types without a SQL type are refused.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass

import pyarrow as pa

from microbatch.state.spark_format.unsafe_row import SparkStateFormatError

_MAX_UTF_CHUNK = 65535
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)$")
_SIMPLE = {
    "null": pa.null(), "void": pa.null(), "boolean": pa.bool_(), "byte": pa.int8(),
    "short": pa.int16(), "integer": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "string": pa.string(), "binary": pa.binary(), "date": pa.date32(),
    "timestamp": pa.int64(), "timestamp_ntz": pa.int64(),
}


@dataclass(frozen=True)
class StateSchema:
    """One column family's schemas from a state schema file (Spark's JSON, parsed)."""
    column_family: str
    key_schema: dict
    value_schema: dict
    key_encoder_spec: dict | None = None

    def key_arrow(self) -> pa.Schema:
        return arrow_schema(self.key_schema)

    def value_arrow(self) -> pa.Schema:
        return arrow_schema(self.value_schema)


# -- java.io.DataInput/DataOutput strings ----------------------------------------------
def _decode_modified_utf8(raw: bytes) -> str:
    """Java's modified UTF-8: NUL as C0 80, characters beyond the BMP as two surrogates."""
    raw = raw.replace(b"\xc0\x80", b"\x00")
    text = raw.decode("utf-8", "surrogatepass")
    return text.encode("utf-16", "surrogatepass").decode("utf-16")


def _encode_modified_utf8(text: str) -> bytes:
    units = text.encode("utf-16-le", "surrogatepass")
    chars = "".join(chr(int.from_bytes(units[i:i + 2], "little")) for i in range(0, len(units), 2))
    return chars.encode("utf-8", "surrogatepass").replace(b"\x00", b"\xc0\x80")


def _read_utf(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">H", data, pos)
    raw = data[pos + 2:pos + 2 + n]
    if len(raw) != n:
        raise SparkStateFormatError("The state schema file ends inside a string; it is truncated.")
    return raw, pos + 2 + n


def _write_utf(text: str) -> bytes:
    raw = _encode_modified_utf8(text)
    if len(raw) > 65535:
        raise ValueError("A writeUTF string longer than 65535 bytes.")
    return struct.pack(">H", len(raw)) + raw


def _read_chunked(data: bytes, pos: int) -> tuple[str, int]:
    (chunks,) = struct.unpack_from(">i", data, pos)
    pos += 4
    raw = b""
    for _ in range(chunks):
        piece, pos = _read_utf(data, pos)
        raw += piece
    return _decode_modified_utf8(raw), pos


def _write_chunked(text: str) -> bytes:
    units = text.encode("utf-16-le", "surrogatepass")   # Java's chunks count UTF-16 units
    count = len(units) // 2
    chunks = [units[i * 2:(i + _MAX_UTF_CHUNK) * 2] for i in range(0, max(count, 1), _MAX_UTF_CHUNK)]
    out = struct.pack(">i", len(chunks))
    for chunk in chunks:
        raw = "".join(chr(int.from_bytes(chunk[j:j + 2], "little")) for j in range(0, len(chunk), 2))
        encoded = raw.encode("utf-8", "surrogatepass").replace(b"\x00", b"\xc0\x80")
        out += struct.pack(">H", len(encoded)) + encoded
    return out


# -- the schema files ----------------------------------------------------------------
def parse_state_schema(data: bytes) -> list[StateSchema]:
    """The column families of a Spark state schema file (v1, v2 or v3)."""
    try:
        raw, pos = _read_utf(data, 0)
        version = _decode_modified_utf8(raw)
        if version == "v1":
            key, pos = _read_utf(data, pos)
            value, pos = _read_utf(data, pos)
            return [StateSchema("default", json.loads(_decode_modified_utf8(key)),
                                json.loads(_decode_modified_utf8(value)))]
        if version == "v2":
            key, pos = _read_chunked(data, pos)
            value, pos = _read_chunked(data, pos)
            return [StateSchema("default", json.loads(key), json.loads(value))]
        if version == "v3":
            (count,) = struct.unpack_from(">i", data, pos)
            pos += 4
            families = []
            for _ in range(count):   # (StateSchemaV3File: each schema after its 2-byte id)
                name, pos = _read_utf(data, pos)
                pos += 2
                key, pos = _read_chunked(data, pos)
                pos += 2
                value, pos = _read_chunked(data, pos)
                spec, pos = _read_chunked(data, pos)
                _user_key, pos = _read_chunked(data, pos)
                families.append(StateSchema(_decode_modified_utf8(name), json.loads(key), json.loads(value),
                                            json.loads(spec)))
            if pos != len(data):
                raise SparkStateFormatError(f"The state schema file has {len(data) - pos} bytes after its last "
                                            "column family.")
            return families
    except (struct.error, ValueError) as e:
        raise SparkStateFormatError(f"The state schema file does not parse: {e}") from e
    raise SparkStateFormatError(
        f"The state schema file has version '{version}'; Spark's versions v1, v2 and v3 are known.")


def state_schema_path(checkpoint: str, operator_id: int, store_name: str = "default") -> str:
    """Where Spark keeps an operator's schema file: under the store directory of partition 0,
    ``<checkpoint>/state/<op>/0[/<store>]/_metadata/schema``."""
    store = f"{checkpoint.rstrip('/')}/state/{operator_id}/0"
    return f"{store}/_metadata/schema" if store_name == "default" else f"{store}/{store_name}/_metadata/schema"


def read_state_schema(checkpoint: str, operator_id: int, fs=None, store_name: str = "default") -> list[StateSchema]:
    """An operator's state schema file (``state_schema_path``), parsed."""
    if fs is None:
        from microbatch.checkpoint.fs import CheckpointFileSystem
        fs = CheckpointFileSystem()
    path = state_schema_path(checkpoint, operator_id, store_name)
    try:
        data = fs.read_bytes(path)
    except FileNotFoundError:
        raise SparkStateFormatError(
            f"The state schema file {path} does not exist: the checkpoint has no state for operator "
            f"{operator_id}{'' if store_name == 'default' else ' store ' + store_name}, or was not written "
            "by Spark's engine (transformWithState keeps v3 schema files under _stateSchema/, not "
            "read here).") from None
    return parse_state_schema(data)


def state_schema_v2(key_schema: dict | str, value_schema: dict | str) -> bytes:
    """A v2 state schema file for these schemas (Spark's JSON, as dicts or text): what Spark
    writes for an operator of the HDFS provider."""
    key = key_schema if isinstance(key_schema, str) else json.dumps(key_schema, separators=(",", ":"))
    value = value_schema if isinstance(value_schema, str) else json.dumps(value_schema, separators=(",", ":"))
    return _write_utf("v2") + _write_chunked(key) + _write_chunked(value)


def all_nullable(data_type):
    """A Spark JSON type (as ``DataType.jsonValue()`` gives) with every field, array element
    and map value nullable: Spark's state schema check takes a stored nullable field for the
    query's field either way, and its state reader reads every column nullable."""
    if isinstance(data_type, dict):
        out = {k: all_nullable(v) for k, v in data_type.items()}
        for flag in ("nullable", "containsNull", "valueContainsNull"):
            if flag in out:
                out[flag] = True
        return out
    if isinstance(data_type, list):
        return [all_nullable(v) for v in data_type]
    return data_type


# -- Spark's types as pyarrow storage types -------------------------------------------------
def arrow_type(spark_type) -> pa.DataType:
    """Spark's JSON data type (a string or a dict, as ``DataType.json`` gives) as the
    pyarrow type microbatch keeps its state in."""
    if isinstance(spark_type, str):
        name = spark_type.strip()
        if name in _SIMPLE:
            return _SIMPLE[name]
        if name.startswith("string collate") or name.startswith("char(") or name.startswith("varchar("):
            return pa.string()
        m = _DECIMAL.match(name)
        if m:
            precision, scale = int(m.group(1)), int(m.group(2))
            if scale < 0:
                raise SparkStateFormatError(f"The decimal type {name} has a negative scale.")
            return pa.decimal128(precision, scale)
        if name == "decimal":
            return pa.decimal128(10, 0)
        raise SparkStateFormatError(
            f"Spark's type '{name}' has no state form in microbatch's reader of Spark's state "
            "(intervals, variants and times are not supported).")
    kind = spark_type.get("type")
    if kind == "struct":
        return pa.struct(_arrow_fields(spark_type))
    if kind == "array":
        return pa.list_(pa.field("element", arrow_type(spark_type["elementType"]),
                                 spark_type.get("containsNull", True)))
    if kind == "map":
        return pa.map_(arrow_type(spark_type["keyType"]),
                       pa.field("value", arrow_type(spark_type["valueType"]),
                                spark_type.get("valueContainsNull", True)))
    if kind == "udt" and "sqlType" in spark_type:
        return arrow_type(spark_type["sqlType"])
    raise SparkStateFormatError(f"Spark's type {json.dumps(spark_type)} has no state form here.")


def _arrow_fields(struct_type: dict) -> list[pa.Field]:
    return [pa.field(f["name"], arrow_type(f["type"]), f.get("nullable", True))
            for f in struct_type.get("fields", [])]


def arrow_schema(struct_type) -> pa.Schema:
    """A Spark struct type (JSON text or dict) as a pyarrow schema of storage types."""
    if isinstance(struct_type, str):
        struct_type = json.loads(struct_type)
    if struct_type.get("type") != "struct":
        raise SparkStateFormatError(f"A state schema must be a struct type, not {json.dumps(struct_type)}.")
    return pa.schema(_arrow_fields(struct_type))
