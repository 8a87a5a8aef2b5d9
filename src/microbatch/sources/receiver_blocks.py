"""A receiver's write-ahead log of blocks (docs/receivers.md): ``<ckpt>/sources/<id>/blocks/
<first>.arrow``, one immutable Arrow IPC file per block (records ``first .. first+n-1``),
its footer's metadata (count, when it was received, the idempotency keys it holds), the
log's recovery after a restart, and the Spark task that reads a batch's slices of
blocks on the executors."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from microbatch.checkpoint.fs import CheckpointFileSystem

from microbatch.checkpoint.stores import storage_from_spec
from microbatch.errors import CheckpointError

BLOCK_METADATA_KEY = b"microbatch.block"


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema blocks of a stream of ``schema`` are written in (PySpark's own
    conversion: timestamps as microseconds in UTC, as mapInArrow hands them to Spark)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema
    if "timezone" in inspect.signature(to_arrow_schema).parameters:   # PySpark 4.1+
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


def block_name(first: int) -> str:
    return f"{first:020d}.arrow"


def _block_first(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "arrow" and stem.isdigit() and len(stem) == 20 else None


@dataclass
class Block:
    first: int
    count: int
    size: int
    keys: tuple = ()
    received_ms: int = 0        # when the block was written (its footer's receivedMs)

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def encode_block(table: pa.Table, first: int, keys: list[str], received_ms: int) -> bytes:
    meta = {"v": 1, "first": first, "count": table.num_rows, "receivedMs": received_ms, "keys": keys}
    schema = table.schema.with_metadata({BLOCK_METADATA_KEY: json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
    return sink.getvalue().to_pybytes()


def block_metadata(schema: pa.Schema, path: str) -> dict:
    raw = (schema.metadata or {}).get(BLOCK_METADATA_KEY)
    if raw is None:
        raise CheckpointError(f"Receiver block '{path}' has no '{BLOCK_METADATA_KEY.decode()}' "
                              "metadata: it is not a block microbatch wrote. Remove it.")
    meta = json.loads(raw)
    if meta.get("v") != 1:
        raise CheckpointError(f"Receiver block '{path}' is of version {meta.get('v')}, which this "
                              "microbatch cannot read (it reads version 1). Upgrade microbatch.")
    return meta


class BlockLog:
    """The blocks of one receiver source, under ``<metadata_path>/blocks``."""

    def __init__(self, fs: CheckpointFileSystem, metadata_path: str):
        self.fs = fs
        self.directory = f"{metadata_path}/blocks"

    def path(self, first: int) -> str:
        return f"{self.directory}/{block_name(first)}"

    def write(self, first: int, data: bytes) -> None:
        self.fs.write_bytes(self.path(first), data)

    def delete(self, first: int) -> None:
        self.fs.delete(self.path(first))

    def recover(self) -> list[Block]:
        """The blocks in the log, in order, with their counts and idempotency keys (read
        from each block's footer). A gap (a block deleted by hand) is damage: refused."""
        firsts = sorted(f for f in (_block_first(n) for n in self.fs.list(self.directory)) if f is not None)
        blocks = []
        for first in firsts:
            path = self.path(first)
            try:
                with self.fs.open_input(path) as f:
                    reader = pa.ipc.open_file(f)
                    meta = block_metadata(reader.schema, path)
                    size = f.seek(0, 2)
            except (pa.ArrowInvalid, OSError, ValueError) as e:
                raise CheckpointError(
                    f"Receiver block '{path}' cannot be read ({str(e).splitlines()[0][:200]}): the "
                    "write-ahead log is damaged. Restore the file, or start the query on a new "
                    "checkpoint location.") from None
            if meta["first"] != first:
                raise CheckpointError(f"Receiver block '{path}' says it starts at record "
                                      f"{meta['first']}, its name {first}: the log is damaged.")
            if blocks and blocks[-1].first + blocks[-1].count != first:
                raise CheckpointError(
                    f"The receiver's write-ahead log '{self.directory}' has a gap before "
                    f"'{block_name(first)}' (records {blocks[-1].first + blocks[-1].count} to "
                    f"{first - 1} are missing): the log is damaged. Restore the missing blocks, "
                    "or start the query on a new checkpoint location.")
            blocks.append(Block(first, meta["count"], size, tuple(meta.get("keys") or ()),
                                int(meta.get("receivedMs") or 0)))
        return blocks


def read_block_slices(spec: tuple, pieces: list[tuple[str, int, int]]) -> Iterator[pa.RecordBatch]:
    """Executor side: the records ``[lo, hi)`` (positions within the block) of each block."""
    fs = storage_from_spec(spec)
    for path, lo, hi in pieces:
        try:
            with fs.open_input(path) as f:
                table = pa.ipc.open_file(f).read_all()
        except FileNotFoundError:
            raise CheckpointError(
                f"Receiver block '{path}' is gone, but a batch still needs it: the write-ahead "
                "log lost records (deleted by hand?). Restore the block, or start the query on "
                "a new checkpoint location.") from None
        table = table.replace_schema_metadata(None).slice(lo, hi - lo)
        yield from table.to_batches()


def _read_task(spec: tuple, groups: list[list[tuple[str, int, int]]]):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_block_slices(spec, groups[index])
    return run
