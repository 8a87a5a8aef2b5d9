"""Spark's UnsafeRow format, decoded to and encoded from microbatch's state tuples.

The layout (Spark's ``UnsafeRow``, ``UnsafeArrayData``, ``UnsafeMapData`` and their
writers in ``expressions/codegen``), all little-endian, everything 8-byte aligned:

- **Row** of n fields: a null bitset of ``((n + 63) // 64) * 8`` bytes (bit i of the
  little-endian words: field i is null), then one 8-byte word per field, then the
  variable-length region. A fixed-width value sits in the low bytes of its word (the
  rest zero): boolean and byte 1 byte, short 2, int, float and date 4, long, double,
  timestamp and a decimal of precision <= 18 (its unscaled long) 8. A variable-length
  value's word is ``offset << 32 | size``, the offset relative to the row's start; its
  bytes are in the variable region, padded with zeros to a multiple of 8. A null
  field's word is 0, except a decimal of precision > 18, which always keeps 16 bytes
  of the variable region (zeros, size 0 when null): its value is the unscaled integer
  as Java's ``BigInteger.toByteArray`` (big-endian two's complement, shortest form).
  A nested struct is a nested row; an array and a map are below.
- **Array** of n elements: n as an 8-byte long, a null bitset of ``((n + 63) // 64) * 8``
  bytes, then n elements of the element's size (1, 2, 4 or 8 bytes as above; 8 for
  variable-length elements, their ``offset << 32 | size`` relative to the array's start,
  and for a decimal of precision <= 18), zero-padded to 8 bytes, then the variable
  region (a large decimal element takes its bytes rounded up to 8, not 16). A null
  element is zero.
- **Map**: the key array's size in bytes as an 8-byte long, the key array, the value array.

Values are microbatch's state values (``state/files.py``): ints, floats, bools, str,
bytes, ``decimal.Decimal``, ``datetime.date`` for a date, int64 microseconds for a
timestamp (``pa.int64()`` in the storage types, or a ``pa.timestamp("us")`` field);
``None`` for null. A nested struct is a tuple in a key and a dict in a value, an array a
tuple in a key and a list in a value, a map a tuple of (key, value) pairs in a key and a
list of them in a value: what ``files.from_struct_array`` makes of the same Arrow
column, so a state read from Spark's files equals the one read from microbatch's.

Schemas are pyarrow schemas (or struct types) in storage types, so the state layer needs
no PySpark. Refused, with a ``SparkStateFormatError`` naming the type: unsigned
integers, half floats, timestamps in another unit than microseconds, intervals,
variants, durations and anything else Spark's state does not hold in these forms.

A schema's decoder is Python source generated once per schema (``row_decoder``): one
``struct.unpack_from`` reads a row's bitset and fixed words at once, and a row without
nulls takes one tuple expression. ``fixed_width_dtype`` gives the numpy layout of a
schema whose rows are all the same size, for decoding whole files at once
(``hdfs_files``).
"""
from __future__ import annotations

import datetime
import decimal
import operator
import struct
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

from microbatch.errors import CheckpointError


class SparkStateFormatError(CheckpointError):
    """A Spark state file or row that cannot be read or written: damaged, or of a type
    this package does not handle."""


# -- the kinds of field ------------------------------------------------------------------
_FIXED = {   # kind -> (struct format of its 8-byte word in a row, size in an array, array format)
    "null": ("8x", 8, "8x"),
    "bool": ("?7x", 1, "?"),
    "int8": ("b7x", 1, "b"),
    "int16": ("h6x", 2, "h"),
    "int32": ("i4x", 4, "i"),
    "date": ("i4x", 4, "i"),
    "float32": ("f4x", 4, "f"),
    "int64": ("q", 8, "q"),
    "float64": ("d", 8, "d"),
    "decimal_long": ("q", 8, "q"),
}
_VARIABLE = ("string", "binary", "decimal_big", "struct", "list", "map")
_UNIX_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_DECIMAL_CONTEXT = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)
_MASK32 = 0xFFFFFFFF


def _kind(t: pa.DataType) -> str:
    """The layout kind of an Arrow storage type; SparkStateFormatError for one Spark's
    state cannot hold."""
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_signed_integer(t):
        return {8: "int8", 16: "int16", 32: "int32", 64: "int64"}[t.bit_width]
    if pa.types.is_float32(t):
        return "float32"
    if pa.types.is_float64(t):
        return "float64"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        if t.unit != "us":
            raise SparkStateFormatError(
                f"Spark's state holds timestamps in microseconds; the type {t} has unit "
                f"'{t.unit}'. Use pa.timestamp('us') or the storage type int64.")
        return "int64"
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise SparkStateFormatError(f"Spark's decimals have at most 38 digits; {t} has more.")
        return "decimal_long" if t.precision <= 18 else "decimal_big"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list"
    if pa.types.is_map(t):
        return "map"
    raise SparkStateFormatError(
        f"The type {t} has no UnsafeRow form this reader knows (supported: null, boolean, "
        "byte, short, int, long, float, double, date, timestamp in microseconds, decimal, "
        "string, binary, struct, array, map).")


def _fields(schema) -> tuple[pa.Field, ...]:
    """The fields of a pa.Schema, a pa.StructType or a sequence of fields."""
    if isinstance(schema, pa.Schema) or isinstance(schema, pa.StructType):
        return tuple(schema)
    return tuple(schema)


def _round8(n: int) -> int:
    return (n + 7) & ~7


def bitset_width(num_fields: int) -> int:
    """The bytes of a row's (or an array's) null bitset: ``((n + 63) // 64) * 8``."""
    return ((num_fields + 63) // 64) * 8


def fixed_size(schema) -> int:
    """The size of a row's bitset and fixed words: its smallest size."""
    n = len(_fields(schema))
    return bitset_width(n) + 8 * n


# -- values ------------------------------------------------------------------------------
def _date(days: int) -> datetime.date:
    return datetime.date.fromordinal(_UNIX_EPOCH_ORDINAL + days)


def _days(value) -> int:
    if isinstance(value, datetime.datetime):
        raise SparkStateFormatError(f"A date field got the datetime {value!r}; expected a date or days.")
    if isinstance(value, datetime.date):
        return value.toordinal() - _UNIX_EPOCH_ORDINAL
    return operator.index(value)


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled).scaleb(-scale, _DECIMAL_CONTEXT)


def _unscaled(value, precision: int, scale: int) -> int:
    """A Decimal (or int) as the unscaled integer of decimal(precision, scale), rounded half
    up as Spark's ``Decimal.changePrecision``; a value with too many digits is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        unscaled = value * 10 ** scale
    else:
        d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value))
        if not d.is_finite():
            raise SparkStateFormatError(f"The decimal {d} has no decimal({precision},{scale}) form.")
        q = d.quantize(decimal.Decimal(1).scaleb(-scale), context=_DECIMAL_CONTEXT)
        unscaled = int(q.scaleb(scale, _DECIMAL_CONTEXT))
    if abs(unscaled) >= 10 ** precision:
        raise SparkStateFormatError(f"The value {value} does not fit decimal({precision},{scale}).")
    return unscaled


def _big_decimal_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: big-endian two's complement, shortest."""
    n = ((~unscaled if unscaled < 0 else unscaled).bit_length() + 8) // 8
    return unscaled.to_bytes(n, "big", signed=True)


def _from_micros(value) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise SparkStateFormatError(
                f"A timestamp field got the naive datetime {value!r}; give int64 microseconds "
                "since the epoch or an aware datetime.")
        delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return operator.index(value)


# -- decoding ----------------------------------------------------------------------------
def _string(buf, base: int, word: int) -> str:
    start = base + (word >> 32)
    return bytes(buf[start:start + (word & _MASK32)]).decode("utf-8")


def _binary(buf, base: int, word: int) -> bytes:
    start = base + (word >> 32)
    return bytes(buf[start:start + (word & _MASK32)])


def _big_decimal(buf, base: int, word: int, scale: int) -> decimal.Decimal:
    start = base + (word >> 32)
    return _decimal(int.from_bytes(buf[start:start + (word & _MASK32)], "big", signed=True), scale)


class _Namespace(dict):
    """The globals of generated code: helpers and constants, named uniquely."""

    def add(self, prefix: str, obj) -> str:
        name = f"_{prefix}{len(self)}"
        self[name] = obj
        return name


def _element_decoder(t: pa.DataType, as_key: bool) -> Callable:
    """A function (buf, base, word) -> value for a variable-length type (the word gives
    offset and size relative to ``base``)."""
    kind = _kind(t)
    if kind == "string":
        return _string
    if kind == "binary":
        return _binary
    if kind == "decimal_big":
        scale = t.scale
        return lambda buf, base, word: _big_decimal(buf, base, word, scale)
    if kind == "struct":
        sub = row_decoder(t, as_key)
        if as_key:
            return lambda buf, base, word: sub(buf, base + (word >> 32))
        names = [f.name for f in t]
        return lambda buf, base, word: dict(zip(names, sub(buf, base + (word >> 32))))
    if kind == "list":
        decode_array = _array_decoder(t.value_type, as_key)
        if as_key:
            return lambda buf, base, word: tuple(decode_array(buf, base + (word >> 32)))
        return lambda buf, base, word: decode_array(buf, base + (word >> 32))
    if kind == "map":
        return _map_decoder(t, as_key)
    raise AssertionError(kind)


def _fixed_converter(t: pa.DataType) -> Callable | None:
    """What turns a fixed-width word's raw value into the state value (None: nothing)."""
    kind = _kind(t)
    if kind == "date":
        return _date
    if kind == "decimal_long":
        scale = t.scale
        return lambda unscaled: _decimal(unscaled, scale)
    return None


def _array_decoder(element_type: pa.DataType, as_key: bool) -> Callable:
    """A function (buf, start) -> list of the elements of the UnsafeArrayData at ``start``."""
    kind = _kind(element_type)
    if kind in _FIXED:
        _, size, fmt = _FIXED[kind]
        convert = _fixed_converter(element_type)
        is_null = kind == "null"

        def decode(buf, start):
            n = struct.unpack_from("<q", buf, start)[0]
            header = 8 + bitset_width(n)
            nulls = int.from_bytes(buf[start + 8:start + header], "little")
            if is_null:
                return [None] * n
            values = list(struct.unpack_from(f"<{n}{fmt}", buf, start + header))
            if convert is not None:
                values = [convert(v) for v in values]
            if nulls:
                values = [None if nulls >> i & 1 else v for i, v in enumerate(values)]
            return values
        return decode
    element = _element_decoder(element_type, as_key)

    def decode_variable(buf, start):
        n = struct.unpack_from("<q", buf, start)[0]
        header = 8 + bitset_width(n)
        nulls = int.from_bytes(buf[start + 8:start + header], "little")
        words = struct.unpack_from(f"<{n}Q", buf, start + header)
        if nulls:
            return [None if nulls >> i & 1 else element(buf, start, w) for i, w in enumerate(words)]
        return [element(buf, start, w) for w in words]
    return decode_variable


def _map_decoder(t: pa.DataType, as_key: bool) -> Callable:
    keys = _array_decoder(t.key_type, True)
    items = _array_decoder(t.item_type, as_key)

    def decode(buf, base, word):
        start = base + (word >> 32)
        key_bytes = struct.unpack_from("<q", buf, start)[0]
        pairs = list(zip(keys(buf, start + 8), items(buf, start + 8 + key_bytes)))
        return tuple(pairs) if as_key else pairs
    return decode


def _schema_key(schema) -> tuple:
    return tuple(_fields(schema))


@lru_cache(maxsize=256)
def _cached_row_decoder(fields: tuple, as_key: bool) -> Callable:
    n = len(fields)
    words = bitset_width(n) // 8
    ns = _Namespace()
    fmt = "<" + "Q" * words
    exprs, plain_words = [], []
    k = words   # the index of the next unpacked word (a null-type field's word is skipped)
    for f in fields:
        kind = _kind(f.type)
        if kind == "null":
            fmt += "8x"
            exprs.append("None")
            continue
        if kind in _FIXED:
            fmt += _FIXED[kind][0]
            convert = _fixed_converter(f.type)
            exprs.append(f"w[{k}]" if convert is None else f"{ns.add('c', convert)}(w[{k}])")
            if convert is None:
                plain_words.append(k)
        else:
            fmt += "Q"
            exprs.append(f"{ns.add('v', _element_decoder(f.type, as_key))}(buf, base, w[{k}])")
        k += 1
    ns["_unpack"] = struct.Struct(fmt).unpack_from
    ns["_size"] = struct.calcsize(fmt)
    nulls = " | ".join(f"w[{j}] << {64 * j}" if j else "w[0]" for j in range(words)) or "0"
    plain = ", ".join(exprs) + ("," if n == 1 else "")
    guarded = ", ".join(e if e == "None" else f"None if n >> {i} & 1 else {e}"
                        for i, e in enumerate(exprs)) + ("," if n == 1 else "")
    if n and words == 1 and plain_words == list(range(1, n + 1)):
        fast = "w[1:]"   # every field a plain fixed-width value: the unpacked words as they are
    else:
        fast = f"({plain})"
    source = (
        "def decode(buf, base=0):\n"
        "    w = _unpack(buf, base)\n"
        f"    n = {nulls}\n"
        "    if not n:\n"
        f"        return {fast}\n"
        f"    return ({guarded})\n")
    exec(compile(source, f"<unsafe row decoder {n} fields>", "exec"), ns)  # noqa: S102
    return ns["decode"]


def row_decoder(schema, as_key: bool = False) -> Callable[[Any, int], tuple]:
    """A function ``decode(buf, base=0) -> tuple`` reading the UnsafeRow of ``schema`` that
    starts at ``base`` of ``buf`` (bytes). ``as_key``: nested structs, arrays and maps as
    tuples (a key's form), else as dicts and lists (a value's form)."""
    return _cached_row_decoder(_schema_key(schema), as_key)


def decode_row(data, schema, as_key: bool = False) -> tuple:
    """One UnsafeRow's bytes as a tuple of state values; SparkStateFormatError when the bytes
    are shorter than the schema's fixed part (the row belongs to another schema)."""
    need = fixed_size(schema)
    if len(data) < need:
        raise SparkStateFormatError(
            f"An UnsafeRow of {len(data)} bytes is shorter than the {need} bytes of the bitset "
            f"and fixed words of its schema {pa.schema(list(_fields(schema)))}; the state "
            "belongs to another schema.")
    try:
        return row_decoder(schema, as_key)(data, 0)
    except (struct.error, UnicodeDecodeError, ValueError, OverflowError) as e:
        raise SparkStateFormatError(f"An UnsafeRow does not decode with its schema: {e}") from e


# -- encoding ----------------------------------------------------------------------------
def _set_bit(buf: bytearray, start: int, i: int) -> None:
    buf[start + (i >> 3)] |= 1 << (i & 7)


def _variable_bytes(kind: str, t: pa.DataType, value) -> bytes:
    """The variable-region bytes (unpadded) of a non-null variable-length value."""
    if kind == "string":
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if kind == "binary":
        return bytes(value)
    if kind == "struct":
        if isinstance(value, dict):
            value = tuple(value.get(f.name) for f in t)
        return encode_row(value, t)
    if kind == "list":
        return _encode_array(value, t.value_type)
    if kind == "map":
        pairs = list(value.items()) if isinstance(value, dict) else list(value)
        keys = _encode_array([k for k, _ in pairs], t.key_type)
        return struct.pack("<q", len(keys)) + keys + _encode_array([v for _, v in pairs], t.item_type)
    raise AssertionError(kind)


def _fixed_raw(kind: str, t: pa.DataType, value):
    """A non-null fixed-width value as struct.pack takes it."""
    if kind == "date":
        return _days(value)
    if kind == "decimal_long":
        return _unscaled(value, t.precision, t.scale)
    if kind == "int64":
        return _from_micros(value) if isinstance(value, datetime.datetime) else operator.index(value)
    if kind == "bool":
        return bool(value)
    if kind in ("float32", "float64"):
        return float(value)
    return operator.index(value)


def _encode_array(values: Sequence, element_type: pa.DataType) -> bytes:
    values = list(values)
    n = len(values)
    kind = _kind(element_type)
    header = 8 + bitset_width(n)
    size = _FIXED[kind][1] if kind in _FIXED else 8
    fixed_part = _round8(size * n)
    out = bytearray(header + fixed_part)
    struct.pack_into("<q", out, 0, n)
    fmt = "<" + (_FIXED[kind][2] if kind in _FIXED else "Q")
    for i, v in enumerate(values):
        if v is None or kind == "null":
            _set_bit(out, 8, i)
            continue
        pos = header + i * size
        if kind in _FIXED:
            struct.pack_into(fmt, out, pos, _fixed_raw(kind, element_type, v))
            continue
        if kind == "decimal_big":
            data = _big_decimal_bytes(_unscaled(v, element_type.precision, element_type.scale))
        else:
            data = _variable_bytes(kind, element_type, v)
        struct.pack_into("<Q", out, pos, len(out) << 32 | len(data))
        out += data
        out += bytes(_round8(len(data)) - len(data))
    return bytes(out)


@lru_cache(maxsize=256)
def _cached_row_encoder(fields: tuple) -> Callable:
    n = len(fields)
    kinds = [_kind(f.type) for f in fields]
    bitset = bitset_width(n)
    fixed = bitset + 8 * n
    all_fixed = all(k in _FIXED and k != "null" for k in kinds)
    if all_fixed and n and bitset == 8:
        # the fast path: every field a fixed-width value, a row without nulls is one pack
        pack = struct.Struct("<Q" + "".join(_FIXED[k][0] for k in kinds)).pack
        plain = all(k in ("int8", "int16", "int32", "int64", "float64", "bool", "float32") for k in kinds)
        raw = [(k, f.type) for k, f in zip(kinds, fields)]

        def encode_fixed(values) -> bytes:
            if len(values) != n:
                raise SparkStateFormatError(f"A row of {len(values)} values for a schema of {n} fields.")
            if None not in values:
                if plain:
                    try:
                        return pack(0, *values)
                    except struct.error:
                        pass
                return pack(0, *[_fixed_raw(k, t, v) for (k, t), v in zip(raw, values)])
            nulls = 0
            out = []
            for i, ((k, t), v) in enumerate(zip(raw, values)):
                if v is None:
                    nulls |= 1 << i
                    out.append(False if k == "bool" else 0.0 if k.startswith("float") else 0)
                else:
                    out.append(_fixed_raw(k, t, v))
            return pack(nulls, *out)
        return encode_fixed

    def encode(values) -> bytes:
        if len(values) != n:
            raise SparkStateFormatError(f"A row of {len(values)} values for a schema of {n} fields.")
        out = bytearray(fixed)
        for i, (kind, f, v) in enumerate(zip(kinds, fields, values)):
            pos = bitset + 8 * i
            if v is None or kind == "null":
                _set_bit(out, 0, i)
                if kind == "decimal_big":   # the 16 bytes stay reserved, size 0
                    struct.pack_into("<Q", out, pos, len(out) << 32)
                    out += bytes(16)
                continue
            if kind in _FIXED:
                struct.pack_into("<" + _FIXED[kind][0], out, pos, _fixed_raw(kind, f.type, v))
            elif kind == "decimal_big":
                data = _big_decimal_bytes(_unscaled(v, f.type.precision, f.type.scale))
                struct.pack_into("<Q", out, pos, len(out) << 32 | len(data))
                out += data
                out += bytes(16 - len(data))
            else:
                data = _variable_bytes(kind, f.type, v)
                struct.pack_into("<Q", out, pos, len(out) << 32 | len(data))
                out += data
                out += bytes(_round8(len(data)) - len(data))
        return bytes(out)
    return encode


def row_encoder(schema) -> Callable[[Sequence], bytes]:
    """A function ``encode(values) -> bytes``: a tuple of state values as the UnsafeRow
    Spark's generated projection would write for them, byte for byte (Spark's state maps
    compare keys by their bytes). Structs may be given as tuples or dicts, maps as pair
    sequences or dicts, timestamps as int64 microseconds or aware datetimes."""
    return _cached_row_encoder(_schema_key(schema))


def encode_row(values: Sequence, schema) -> bytes:
    """One tuple of state values as UnsafeRow bytes (``row_encoder``)."""
    try:
        return row_encoder(schema)(tuple(values))
    except (struct.error, TypeError, ValueError, OverflowError, decimal.InvalidOperation) as e:
        raise SparkStateFormatError(
            f"The values {tuple(values)!r} do not encode as the schema "
            f"{pa.schema(list(_fields(schema)))}: {e}") from e


# -- whole columns of fixed-width rows ---------------------------------------------------------
_NUMPY = {"bool": "?", "int8": "i1", "int16": "<i2", "int32": "<i4", "date": "<i4",
          "float32": "<f4", "int64": "<i8", "float64": "<f8", "decimal_long": "<i8"}


def fixed_width_dtype(schema, offset: int = 0) -> list[tuple] | None:
    """The numpy fields ``(name, format, offset)`` of a row whose fields are all fixed-width
    (every such row has the same size, ``fixed_size``): ``"nulls"`` for the bitset's first
    word, ``"f<i>"`` for field i (null-type fields have none); None when a field is
    variable-length or the row has more than 64 fields."""
    fields = _fields(schema)
    kinds = [_kind(f.type) for f in fields]
    if any(k not in _FIXED for k in kinds) or len(fields) > 64:
        return None
    layout = [("nulls", "<u8", offset)] if fields else []
    for i, k in enumerate(kinds):
        if k != "null":
            layout.append((f"f{i}", _NUMPY[k], offset + 8 + 8 * i))
    return layout


def column_converters(schema) -> list[Callable | None]:
    """Per field, what turns a numpy column's Python value into the state value (None:
    nothing; ``fixed_width_dtype``'s columns)."""
    return [_fixed_converter(f.type) for f in _fields(schema)]


def decode_columns(columns: dict, schema, count: int) -> list[tuple]:
    """Rows of a fixed-width schema from numpy columns (``fixed_width_dtype``'s names) without
    nulls, as tuples."""
    fields = _fields(schema)
    lists = []
    for i, (f, convert) in enumerate(zip(fields, column_converters(schema))):
        if _kind(f.type) == "null":
            lists.append([None] * count)
            continue
        values = columns[f"f{i}"].tolist()
        lists.append(values if convert is None else list(map(convert, values)))
    if not lists:
        return [()] * count
    return list(zip(*lists))


def encode_rows(rows: Iterable[Sequence], schema) -> list[bytes]:
    """Many tuples as UnsafeRow bytes."""
    encode = row_encoder(schema)
    try:
        return [encode(tuple(r)) for r in rows]
    except (struct.error, TypeError, ValueError, OverflowError, decimal.InvalidOperation) as e:
        raise SparkStateFormatError(f"A row does not encode as the schema {pa.schema(list(_fields(schema)))}: {e}") from e
