"""How a store's tuples are kept in its RocksDB database: ``marshal`` format 0 (no
interning flags or back-references, so equal tuples are equal bytes), with dates, times,
decimals and durations made numbers or text first."""
from __future__ import annotations

import datetime
import decimal
import marshal

import pyarrow as pa

from microbatch.state.files import storage_type


def _needs_conversion(t: pa.DataType) -> bool:
    """Whether values of ``t`` hold Python objects ``marshal`` cannot write."""
    if pa.types.is_struct(t):
        return any(_needs_conversion(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _needs_conversion(t.value_type)
    if pa.types.is_map(t):
        return _needs_conversion(t.key_type) or _needs_conversion(t.item_type)
    return pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_decimal(t) or pa.types.is_duration(t)


def _to_plain(value, t: pa.DataType):
    if value is None:
        return None
    if pa.types.is_struct(t):
        if isinstance(value, dict):
            return {f.name: _to_plain(value[f.name], f.type) for f in t}
        return tuple(_to_plain(v, f.type) for v, f in zip(value, t))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = type(value)
        return kind(_to_plain(v, t.value_type) for v in value)
    if pa.types.is_map(t):
        kind = type(value)
        return kind((_to_plain(k, t.key_type), _to_plain(v, t.item_type)) for k, v in value)
    if pa.types.is_date(t):
        return value.toordinal()
    if pa.types.is_time(t):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if pa.types.is_decimal(t):
        return str(value)
    if pa.types.is_duration(t):
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    return value


def _from_plain(value, t: pa.DataType):
    if value is None:
        return None
    if pa.types.is_struct(t):
        if isinstance(value, dict):
            return {f.name: _from_plain(value[f.name], f.type) for f in t}
        return tuple(_from_plain(v, f.type) for v, f in zip(value, t))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = type(value)
        return kind(_from_plain(v, t.value_type) for v in value)
    if pa.types.is_map(t):
        kind = type(value)
        return kind((_from_plain(k, t.key_type), _from_plain(v, t.item_type)) for k, v in value)
    if pa.types.is_date(t):
        return datetime.date.fromordinal(value)
    if pa.types.is_time(t):
        seconds, micros = divmod(value, 1_000_000)
        minutes, second = divmod(seconds, 60)
        return datetime.time(minutes // 60, minutes % 60, second, micros)
    if pa.types.is_decimal(t):
        return decimal.Decimal(value)
    if pa.types.is_duration(t):
        return datetime.timedelta(microseconds=value)
    return value


class TupleCodec:
    """A schema's tuples to bytes and back; equal tuples give equal bytes."""

    def __init__(self, schema: pa.Schema):
        types = [storage_type(f.type) for f in schema]
        if any(_needs_conversion(t) for t in types):
            def encode(row, _types=types):
                return marshal.dumps(tuple(_to_plain(v, t) for v, t in zip(row, _types)), 0)

            def decode(data, _types=types):
                return tuple(_from_plain(v, t) for v, t in zip(marshal.loads(data), _types))
            self.encode, self.decode = encode, decode
        else:
            self.encode = lambda row, _dumps=marshal.dumps: _dumps(row, 0)
            self.decode = marshal.loads
