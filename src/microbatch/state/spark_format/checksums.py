"""The two hashes Spark's state files carry, without a native library (numpy only).

- ``xxh32``: xxHash32, which lz4-java's ``LZ4BlockOutputStream`` stores per block
  (Spark's LZ4 codec: seed ``0x9747b28c``, the value masked to 28 bits by
  ``StreamingXXHash32.asChecksum``).
- ``crc32c``: CRC-32C (Castagnoli), which Spark 4.1+'s optional row checksums
  (``spark.sql.streaming.stateStore.rowChecksum.enabled``) store per key and value.

Both run in Python; ``xxh32_many`` and ``crc32c_many`` hash many inputs of one length
together, one numpy operation per 16-byte stripe (xxHash) or per byte (CRC) across all
of them, which is what makes a file of many 32 KB blocks or many same-size rows cheap.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

try:
    import xxhash as _xxhash
except ImportError:   # (a dependency; the numpy form below is the fallback)
    _xxhash = None

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _xxh32_finish(h: int, data: bytes, i: int) -> int:
    n = len(data)
    while i + 4 <= n:
        h = _rotl((h + int.from_bytes(data[i:i + 4], "little") * _P3) & _M, 17) * _P4 & _M
        i += 4
    while i < n:
        h = _rotl((h + data[i] * _P5) & _M, 11) * _P1 & _M
        i += 1
    h ^= h >> 15
    h = h * _P2 & _M
    h ^= h >> 13
    h = h * _P3 & _M
    h ^= h >> 16
    return h


def xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of ``data`` (an unsigned 32-bit int)."""
    return xxh32_many([data], seed)[0]


def _np_rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def xxh32_many(blocks: Sequence[bytes], seed: int = 0) -> list[int]:
    """xxHash32 of each of ``blocks``: the xxhash package's C code; without it, numpy (blocks
    of one length hashed together)."""
    seed &= _M
    if _xxhash is not None:
        return [_xxhash.xxh32_intdigest(bytes(b), seed) for b in blocks]
    return _xxh32_many_numpy(blocks, seed)


def _xxh32_many_numpy(blocks: Sequence[bytes], seed: int) -> list[int]:
    out: list[int | None] = [None] * len(blocks)
    by_length: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        by_length.setdefault(len(b), []).append(i)
    for n, indices in by_length.items():
        stripes = n // 16
        if stripes == 0:
            for i in indices:
                out[i] = _xxh32_finish((seed + _P5 + n) & _M, bytes(blocks[i]), 0)
            continue
        words = np.frombuffer(b"".join(bytes(blocks[i])[:stripes * 16] for i in indices),
                              dtype="<u4").reshape(len(indices), stripes, 4)
        v = np.empty((len(indices), 4), dtype=np.uint32)
        v[:] = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        p1, p2 = np.uint32(_P1), np.uint32(_P2)
        with np.errstate(over="ignore"):
            for s in range(stripes):
                v += words[:, s, :] * p2
                v = _np_rotl(v, 13)
                v *= p1
        for row, i in enumerate(indices):
            v1, v2, v3, v4 = (int(x) for x in v[row])
            h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18) + n) & _M
            out[i] = _xxh32_finish(h, bytes(blocks[i]), stripes * 16)
    return out  # type: ignore[return-value]


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()
_CRC_NP = np.array(_CRC_TABLE, dtype=np.uint32)


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of ``data`` (continuing ``crc``), as ``java.util.zip.CRC32C``."""
    c = crc ^ _M
    table = _CRC_TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ _M


def crc32c_many(items: Sequence[bytes]) -> list[int]:
    """CRC-32C of each of ``items``; items of one length are computed together."""
    out: list[int | None] = [None] * len(items)
    by_length: dict[int, list[int]] = {}
    for i, b in enumerate(items):
        by_length.setdefault(len(b), []).append(i)
    for n, indices in by_length.items():
        if len(indices) < 8:
            for i in indices:
                out[i] = crc32c(items[i])
            continue
        matrix = np.frombuffer(b"".join(bytes(items[i]) for i in indices), dtype=np.uint8)
        matrix = matrix.reshape(len(indices), n)
        c = np.full(len(indices), _M, dtype=np.uint32)
        for j in range(n):
            c = _CRC_NP[(c ^ matrix[:, j]) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
        for row, i in enumerate(indices):
            out[i] = int(c[row]) ^ _M
    return out  # type: ignore[return-value]
