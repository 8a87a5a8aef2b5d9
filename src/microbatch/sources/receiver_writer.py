"""A receiver's block writer: the one thread that appends blocks to the log, in order,
grouping records by ``ackMode``, and completes each submission's future only once its
block is durable (the acknowledgement)."""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from microbatch import crash_points
from microbatch.sources.backpressure import Backpressure
from microbatch.sources.receiver_blocks import Block, BlockLog, block_name, encode_block
from microbatch.sources.receiver_options import ReceiverOptions

log = logging.getLogger(__name__)


@dataclass
class Submission:
    table: pa.Table
    key: str | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class BlockWriter:
    """The receiver's one writer: appends blocks in order and acknowledges them.

    ``submit`` queues records; the future resolves to the index of their first record
    once the block(s) holding them are durable, or fails with ``Backpressure`` (503) when
    the write failed: nothing of it was acknowledged, and the next block takes the same
    index. With ``retry_failed_writes`` (a socket, whose lines cannot be refused) a failed
    write is retried until it succeeds or the source stops."""

    def __init__(self, log_: BlockLog, schema: pa.Schema, blocks: list[Block], options: ReceiverOptions,
                 clock_ms: Callable[[], int], on_durable: Callable[[Block], None],
                 retry_failed_writes: bool = False, name: str = "receiver"):
        self._log = log_
        self._schema = schema
        self._options = options
        self._clock_ms = clock_ms
        self._on_durable = on_durable
        self._retry = retry_failed_writes
        self.next_index = blocks[-1].first + blocks[-1].count if blocks else 0
        self._queue: collections.deque[Submission] = collections.deque()
        self._cond = threading.Condition()
        self._stopped = False
        self.failed_writes = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"{name} block writer")
        self._thread.start()

    @property
    def queued_records(self) -> int:
        with self._cond:
            return sum(s.table.num_rows for s in self._queue)

    def submit(self, table: pa.Table, key: str | None = None) -> Submission:
        submission = Submission(table, key)
        with self._cond:
            if self._stopped:
                submission.future.set_exception(Backpressure(503, 1.0, "the receiver is stopping"))
                return submission
            self._queue.append(submission)
            self._cond.notify_all()
        return submission

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(10)
        for s in self._queue:
            if not s.future.done():
                s.future.set_exception(Backpressure(503, 1.0, "the receiver stopped"))

    def _take(self) -> list[Submission] | None:
        """The submissions of the next block (by ackMode), or None when stopping."""
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait(0.5)
            if self._stopped:
                return None
            if self._options.ack_mode != "interval":
                return [self._queue.popleft()]
        # interval: gather what arrives within one block interval of the first
        deadline = time.monotonic() + self._options.block_interval_ms / 1000.0
        with self._cond:
            while not self._stopped and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            taken = list(self._queue)
            self._queue.clear()
        return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            tables = [s.table for s in taken if s.table.num_rows]
            if not tables:
                for s in taken:
                    s.future.set_result(self.next_index)
                continue
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            parts = ([table.slice(i, 1) for i in range(table.num_rows)]
                     if self._options.ack_mode == "record" else [table])
            keys = [s.key for s in taken if s.key is not None]
            first = self.next_index
            try:
                # a key says its request is wholly in the log: only the last block carries it
                for i, part in enumerate(parts):
                    self._write(part, keys if i == len(parts) - 1 else [])
            except Exception as e:  # noqa: BLE001 - any store error: nothing acknowledged
                error = Backpressure(503, 1.0, f"the write-ahead log cannot be written "
                                               f"({type(e).__name__}); nothing was accepted")
                # blocks of this submission already written stay (they are durable and will be
                # read); their senders hear 503 and retry: at-least-once for those records
                for s in taken:
                    s.future.set_exception(error)
                continue
            position = first
            for s in taken:
                s.future.set_result(position)
                position += s.table.num_rows

    def _write(self, table: pa.Table, keys: list[str]) -> None:
        first = self.next_index
        received_ms = self._clock_ms()
        data = encode_block(table.cast(self._schema), first, keys, received_ms)
        delay = 0.05
        while True:
            try:
                self._log.write(first, data)
                crash_points.reached("receiver-block-written")
                break
            except Exception as e:
                self.failed_writes += 1
                log.warning("Writing receiver block %s failed (%s: %s)", block_name(first),
                            type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
                if not self._retry or self._stopped:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        self.next_index = first + table.num_rows
        self._on_durable(Block(first, table.num_rows, len(data), tuple(keys), received_ms))
