"""The compression of Spark's state files: ``CompressionCodec.createCodec(sparkConf,
spark.sql.streaming.stateStore.compression.codec)`` around the whole file.

- **lz4** (Spark's default): lz4-java's ``LZ4BlockOutputStream`` framing, as Spark's
  ``LZ4CompressionCodec`` makes it (block size ``spark.io.compression.lz4.blockSize``,
  32 KB by default; fast compressor; xxHash32 with seed ``0x9747b28c``). Each block is a
  21-byte header — the magic ``LZ4Block``, a token (method ``0x10`` stored or ``0x20``
  LZ4, or'ed with the compression level ``log2(blockSize) - 10``), the compressed and the
  decompressed length and the checksum (xxHash32 of the decompressed bytes & 0x0FFFFFFF),
  little-endian ints — and the block's bytes: a raw LZ4 block (decompressed by pyarrow's
  ``lz4_raw`` codec) or the bytes themselves when LZ4 would not make them smaller. The
  stream ends with an empty stored block (lengths and checksum 0); Spark's reader goes on
  to a following stream if there is one (``stopOnEmptyBlock`` false), and so does this one.
- **zstd**: the standard Zstandard frame format of zstd-jni's ``ZstdOutputStream``
  (pyarrow's zstd stream codec reads and writes it; several frames read as one stream).
  Spark's frames have no content size and end with an empty last block; ours too.

Checked against Spark 4.3 (``tests/test_spark_state_format.py``): every lz4 and zstd state
file Spark's queries wrote there is reproduced byte for byte by ``compress(decompress(f))``.

Other codecs (Spark's lzf and snappy, or a codec class name) are refused with an error
naming the codec.
"""
from __future__ import annotations

import struct

import pyarrow as pa

from microbatch.state.spark_format.checksums import xxh32_many
from microbatch.state.spark_format.unsafe_row import SparkStateFormatError

LZ4_MAGIC = b"LZ4Block"
LZ4_HEADER = struct.Struct("<8sBiii")        # magic, token, compressed, decompressed, checksum
LZ4_SEED = 0x9747B28C
LZ4_DEFAULT_BLOCK_SIZE = 32 * 1024
_RAW, _LZ4 = 0x10, 0x20
_CHECKSUM_MASK = 0x0FFFFFFF
#: The codec names Spark accepts for the two codecs read here (short names and class names).
_ALIASES = {
    "lz4": "lz4", "org.apache.spark.io.lz4compressioncodec": "lz4",
    "zstd": "zstd", "org.apache.spark.io.zstdcompressioncodec": "zstd",
}


def codec_name(codec: str) -> str:
    """``lz4`` or ``zstd`` for the codec setting ``codec``; SparkStateFormatError otherwise."""
    name = _ALIASES.get(str(codec).strip().lower())
    if name is None:
        raise SparkStateFormatError(
            f"The state store compression codec '{codec}' "
            "(spark.sql.streaming.stateStore.compression.codec) cannot be read or written by "
            "microbatch's reader of Spark's state files; it supports lz4 (Spark's default) and "
            "zstd. Convert the checkpoint with Spark using one of those.")
    return name


def _level(block_size: int) -> int:
    return max(0, (block_size - 1).bit_length() - 10)


def lz4_block_decompress(data: bytes, verify: bool = True, where: str = "") -> bytes:
    """The bytes of an ``LZ4BlockOutputStream`` stream (or several, one after another)."""
    view = memoryview(data)
    pos, end = 0, len(data)
    codec = pa.Codec("lz4_raw")
    pieces: list[bytes] = []
    checks: list[int] = []
    while pos < end:
        if end - pos < LZ4_HEADER.size:
            raise SparkStateFormatError(f"The LZ4 stream{where} ends inside a block header "
                                        f"({end - pos} bytes at offset {pos}); the file is truncated.")
        magic, token, compressed, length, check = LZ4_HEADER.unpack_from(data, pos)
        if magic != LZ4_MAGIC:
            raise SparkStateFormatError(
                f"The state file{where} is not an LZ4 block stream (no 'LZ4Block' magic at offset "
                f"{pos}): it was written with another compression codec, or is damaged.")
        method = token & 0xF0
        pos += LZ4_HEADER.size
        if length < 0 or compressed < 0 or length > (1 << 25) or method not in (_RAW, _LZ4) \
                or (method == _RAW and compressed != length):
            raise SparkStateFormatError(f"A damaged LZ4 block header{where} at offset {pos - LZ4_HEADER.size}.")
        if length == 0:   # the end of a stream
            if check != 0 or compressed != 0:
                raise SparkStateFormatError(f"A damaged LZ4 end block{where} at offset {pos - LZ4_HEADER.size}.")
            continue
        if pos + compressed > end:
            raise SparkStateFormatError(f"The LZ4 stream{where} is truncated inside a block.")
        block = view[pos:pos + compressed]
        pos += compressed
        if method == _RAW:
            piece = bytes(block)
        else:
            try:
                piece = codec.decompress(block, decompressed_size=length, asbytes=True)
            except (OSError, pa.ArrowException) as e:
                raise SparkStateFormatError(f"A damaged LZ4 block{where}: {e}") from e
            if len(piece) != length:
                raise SparkStateFormatError(f"An LZ4 block{where} decompressed to {len(piece)} bytes, not {length}.")
        pieces.append(piece)
        checks.append(check)
    if verify and pieces:
        for i, (h, check) in enumerate(zip(xxh32_many(pieces, LZ4_SEED), checks)):
            if h & _CHECKSUM_MASK != check & 0xFFFFFFFF:
                raise SparkStateFormatError(
                    f"The checksum of LZ4 block {i}{where} does not match its bytes: the file is damaged.")
    return b"".join(pieces)


def lz4_block_compress(data: bytes, block_size: int = LZ4_DEFAULT_BLOCK_SIZE) -> bytes:
    """``data`` as Spark's LZ4 codec writes it: blocks of ``block_size`` bytes, each LZ4 or
    stored, then the end block."""
    if block_size < 64 or block_size > (1 << 25):
        raise ValueError(f"An LZ4 block size of {block_size} bytes is outside lz4-java's 64 B..32 MB.")
    level = _level(block_size)
    codec = pa.Codec("lz4_raw")
    blocks = [bytes(data[i:i + block_size]) for i in range(0, len(data), block_size)]
    checks = xxh32_many(blocks, LZ4_SEED)
    out = []
    for block, check in zip(blocks, checks):
        compressed = codec.compress(block, asbytes=True)
        if len(compressed) >= len(block):
            method, payload = _RAW, block
        else:
            method, payload = _LZ4, compressed
        out.append(LZ4_HEADER.pack(LZ4_MAGIC, method | level, len(payload), len(block),
                                   _signed(check & _CHECKSUM_MASK)))
        out.append(payload)
    out.append(LZ4_HEADER.pack(LZ4_MAGIC, _RAW | level, 0, 0, 0))
    return b"".join(out)


def _signed(x: int) -> int:
    return x - (1 << 32) if x >= 1 << 31 else x


def zstd_decompress(data: bytes, where: str = "") -> bytes:
    try:
        return pa.input_stream(pa.py_buffer(data), compression="zstd").read()
    except (OSError, pa.ArrowException) as e:
        raise SparkStateFormatError(f"The zstd stream{where} does not decompress: {e}") from e


def zstd_compress(data: bytes) -> bytes:
    """A zstd frame as zstd-jni's ``ZstdOutputStream`` ends one that Spark closes: streamed
    at level 1 (Spark's ``spark.io.compression.zstd.level`` default, and Arrow's), no content
    size in the header, the data's blocks not marked last, then an empty last raw block.
    (For a file of one block this is Spark's file byte for byte.)"""
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(data)
    return _end_with_empty_block(sink.getvalue().to_pybytes())


def _end_with_empty_block(frame: bytes) -> bytes:
    """``frame`` with its last block unmarked and an empty last raw block appended; the
    frame unchanged if its layout is not the simple one expected (it reads the same)."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd" or frame[4] != 0:
        return frame                 # only a header of no content size, checksum or dictionary
    pos, last_header = 6, None       # magic, descriptor 0x00, window byte
    while pos + 3 <= len(frame):
        header = int.from_bytes(frame[pos:pos + 3], "little")
        kind, size = (header >> 1) & 3, header >> 3
        last_header = pos
        pos += 3 + (1 if kind == 1 else size)
        if header & 1:
            break
    if last_header is None or pos != len(frame):
        return frame
    out = bytearray(frame)
    out[last_header] &= 0xFE
    return bytes(out) + b"\x01\x00\x00"


def decompress(data: bytes, codec: str = "lz4", verify: bool = True, where: str = "") -> bytes:
    """A state file's bytes, decompressed with Spark's codec ``codec``."""
    name = codec_name(codec)
    if name == "lz4":
        return lz4_block_decompress(data, verify, where)
    return zstd_decompress(data, where)


def compress(data: bytes, codec: str = "lz4", lz4_block_size: int = LZ4_DEFAULT_BLOCK_SIZE) -> bytes:
    """Bytes compressed as Spark's codec ``codec`` writes a state file."""
    name = codec_name(codec)
    if name == "lz4":
        return lz4_block_compress(data, lz4_block_size)
    return zstd_compress(data)
