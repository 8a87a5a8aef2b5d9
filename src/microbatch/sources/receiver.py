"""Receivers: push sources made replayable by a write-ahead log of blocks.

The design, and how it maps to Spark Streaming's receivers and WAL, is docs/receivers.md.
In short:

- ``BlockLog`` (``receiver_blocks``): ``<ckpt>/sources/<id>/blocks/<first>.arrow``, one
  immutable Arrow IPC file per block (records ``first .. first+n-1``), written through
  the storage layer.
- ``BlockWriter`` (``receiver_writer``): the one thread that appends blocks, in order, and
  completes each submission's future only once its block is durable (the
  acknowledgement). It groups records by ``ackMode``: a block per record, per submission,
  or per ``blockInterval``.
- Admission (``ReceiverSource.admit``, with ``backpressure``'s ``RateLimiter`` and
  ``Backpressure``): what a receiver may take in now: ``maxRate`` (records a second, or
  the rate ``rate_estimator`` estimates with backpressure on) and the bound on
  unconsumed blocks; the answer says how long to wait. Options: ``receiver_options``.
- ``ReceiverSource`` (here): the Source over the log. Offsets are record indexes (Spark's
  socket source's LongOffset: the last record's index, -1 before any), so ``offsets/N``
  names the records, and through them the blocks, of batch N; ``get_batch`` reads those
  blocks in Spark tasks; ``commit`` deletes the blocks of batches older than
  ``minBatchesToRetain``.
"""
from __future__ import annotations

import bisect
import collections
import logging
import queue
import threading
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.errors import CheckpointError
from microbatch.sources.backpressure import Backpressure, RateLimiter
from microbatch.sources.base import ALL_AVAILABLE, ReadLimit, ReadMaxRows, Source, SourceContext
from microbatch.sources.rate_estimator import PIDRateEstimator
from microbatch.sources.receiver_blocks import Block, BlockLog, _read_task, arrow_schema, block_name
from microbatch.sources.receiver_options import ReceiverOptions, backpressure_confs
from microbatch.sources.receiver_writer import BlockWriter
from microbatch.util import CaseInsensitiveOptions

log = logging.getLogger(__name__)


# -- the source ----------------------------------------------------------------------------
class ReceiverSource(Source):
    """A Source over a receiver's block log. Subclasses start their receiver (which calls
    ``admit`` and ``writer.submit``) and stop it in ``stop_receiver``."""

    default_ack_mode = "block"
    retry_failed_writes = False

    def __init__(self, context: SourceContext, options: CaseInsensitiveOptions, schema: StructType):
        self._context = context
        self._schema = schema
        self.options = ReceiverOptions.parse(options, self.default_ack_mode, backpressure_confs(context.spark))
        self._arrow_schema = arrow_schema(schema)
        self._spec = context.fs.spec()
        self._log = BlockLog(context.fs, context.metadata_path)
        self._lock = threading.Lock()
        self._blocks: list[Block] = self._log.recover()
        # for admission in O(log n) a request: each block's last record, and the bytes of
        # the blocks up to each one (counted from before the oldest retained block)
        self._lasts = [b.last for b in self._blocks]
        self._bytes_before = 0
        self._bytes_through: list[int] = []
        for b in self._blocks:
            self._bytes_through.append((self._bytes_through[-1] if self._bytes_through else 0) + b.size)
        self._keys: dict[str, int] = {k: b.first for b in self._blocks for k in b.keys}
        # blocks of old batches are deleted off the batch's path, oldest first (no gap)
        self._doomed: queue.Queue[int | None] = queue.Queue()
        self._deleter = threading.Thread(target=self._delete_doomed, daemon=True, name=f"{self} clean-up")
        self._deleter.start()
        self._consumed = -1            # the last record of a planned batch
        self._committed: collections.deque[int] = collections.deque()
        self._retain = int(context.spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100"))
        # the rate admitted: maxRate, or with backpressure the smaller of maxRate and the
        # estimated rate (before the first estimate, backpressure.initialRate)
        self._limiter: RateLimiter | None = None
        self._rate_reason = ""
        bp = self.options.backpressure
        self._estimator = (PIDRateEstimator(1, bp.proportional, bp.integral, bp.derived, bp.min_rate)
                           if bp is not None else None)
        self._running: tuple[int, int, int, int] | None = None   # (end, records, started ms, oldest ms)
        self._previous_start_ms: int | None = None
        self.estimated_rate: float | None = None
        if bp is not None and bp.initial_rate is not None:
            self._set_rate(bp.initial_rate, f"backpressure.initialRate ({bp.initial_rate} records a second)")
        elif self.options.max_rate:
            self._set_rate(self.options.max_rate, "")
        self.writer = BlockWriter(self._log, self._arrow_schema, self._blocks, self.options,
                                  context.clock.get_time_millis, self._durable,
                                  self.retry_failed_writes, name=str(self))
        if self._blocks:
            log.info("%s recovered %d blocks (records %d to %d) from its write-ahead log", self,
                     len(self._blocks), self._blocks[0].first, self._blocks[-1].last)

    # -- the receiver's side
    def _durable(self, block: Block) -> None:
        with self._lock:
            self._blocks.append(block)
            self._lasts.append(block.last)
            self._bytes_through.append((self._bytes_through[-1] if self._bytes_through
                                        else self._bytes_before) + block.size)
            for k in block.keys:
                self._keys[k] = block.first

    def _unconsumed(self, after: int) -> tuple[int, int]:
        """(blocks, bytes) holding records beyond ``after``; under the lock."""
        i = bisect.bisect_right(self._lasts, after)
        if i >= len(self._blocks):
            return 0, 0
        before = self._bytes_through[i - 1] if i else self._bytes_before
        return len(self._blocks) - i, self._bytes_through[-1] - before

    def durable_first(self, key: str) -> int | None:
        """The block a request with this idempotency key went into, if it is in the log."""
        with self._lock:
            return self._keys.get(key)

    def admit(self, records: int) -> None:
        """Raise ``Backpressure`` if ``records`` more cannot be taken now."""
        with self._lock:
            blocks, size = self._unconsumed(self._consumed)
        queued = self.writer.queued_records
        if blocks >= self.options.max_unconsumed_blocks or size >= self.options.max_unconsumed_bytes:
            raise Backpressure(503, max(1.0, self.options.block_interval_ms / 1000.0),
                               f"{blocks} blocks are waiting for the query "
                               f"(maxUnconsumedBlocks {self.options.max_unconsumed_blocks}, "
                               f"maxUnconsumedBytes {self.options.max_unconsumed_bytes})")
        if queued >= 1_000_000:
            raise Backpressure(503, 1.0, f"{queued} records are waiting to be written")
        limiter = self._limiter
        if limiter is not None:
            wait = limiter.wait_time(records)
            if wait > 0:
                raise Backpressure(429, wait, f"over {self._rate_reason}")

    @property
    def rate_limit(self) -> int | None:
        """The records a second admitted now (None: no limit)."""
        limiter = self._limiter
        return limiter.rate if limiter is not None else None

    def _set_rate(self, rate: float, reason: str) -> None:
        max_rate = self.options.max_rate
        if max_rate and max_rate <= rate:
            rate, reason = max_rate, ""
        rate = max(1, int(rate))        # Spark publishes the estimate as a Long
        self._rate_reason = reason or f"maxRate ({max_rate} records a second)"
        if self._limiter is None:
            self._limiter = RateLimiter(rate)
        else:
            self._limiter.set_rate(rate)

    def _batch_started(self, start: int, end: int) -> None:
        """Backpressure: the batch ``(start, end]`` starts now (its processing start)."""
        now = self._context.clock.get_time_millis()
        with self._lock:
            i = bisect.bisect_right(self._lasts, start)
            oldest = self._blocks[i].received_ms if i < len(self._blocks) else now
        self._running = (end, end - start, now, oldest)

    def _batch_completed(self, end: int) -> None:
        """Backpressure (Spark's RateController.onBatchCompleted): the batch that ended at
        ``end`` completed now; feed the estimator and publish its rate."""
        running, self._running = self._running, None
        if running is None or running[0] != end or self._estimator is None:
            return
        _, records, started, oldest = running
        now = self._context.clock.get_time_millis()
        processing = now - started
        # Spark's batch interval: here the time between the starts of batches (this one's
        # processing time for the first); the scheduling delay: how much longer than one
        # batch interval the batch's oldest record waited for it to start
        previous, self._previous_start_ms = self._previous_start_ms, started
        interval = started - previous if previous is not None and started > previous else processing
        self._estimator.batch_interval_ms = max(1, interval)
        waited = max(0, started - oldest - interval)
        rate = self._estimator.compute(now, records, processing, waited)
        log.debug("%s: batch of %d records in %d ms, oldest record waited %d ms more than the "
                  "batch interval (%d ms); rate %s", self, records, processing, waited, interval, rate)
        if rate is not None:
            self.estimated_rate = rate
            self._set_rate(rate, f"the rate the query keeps up with ({max(1, int(rate))} records a "
                                 "second, estimated by backpressure)")

    def lag(self, after: int | None = None) -> dict[str, int]:
        """Records and blocks durable beyond record ``after`` (default: the end of the last
        planned batch): the receiver's lag behind the query."""
        with self._lock:
            after = self._consumed if after is None else after
            blocks, size = self._unconsumed(after)
            end = self._blocks[-1].last if self._blocks else -1
        return {"unconsumedRecords": max(0, end - after), "unconsumedBlocks": blocks,
                "unconsumedBytes": size}

    # -- the Source contract
    @property
    def schema(self) -> StructType:
        return self._schema

    def initial_offset(self) -> Any:
        return -1

    def default_read_limit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ALL_AVAILABLE

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        begin = -1 if start is None else int(start)
        with self._lock:
            self._consumed = max(self._consumed, begin)
            if not self._blocks:
                return None if begin < 0 else begin
            end = self._blocks[-1].last
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.rows)
        return max(end, begin)

    def report_latest_offset(self, latest: Any) -> Any:
        with self._lock:
            return self._blocks[-1].last if self._blocks else latest

    def num_rows(self, start: Any, end: Any) -> int | None:
        return int(end) - (-1 if start is None else int(start))

    def metrics(self, consumed: Any) -> dict[str, str]:
        """The progress entry's ``metrics``: the receiver's lag behind the batch's end (and
        with backpressure the rate admitted now). The engine asks once a batch, after its
        commit: for backpressure, the batch's completion."""
        if consumed is not None and self._estimator is not None:
            self._batch_completed(int(consumed))
        metrics = {k: str(v) for k, v in self.lag(-1 if consumed is None else int(consumed)).items()}
        if self._estimator is not None and self.rate_limit is not None:
            metrics["rateLimit"] = str(self.rate_limit)
        return metrics

    def _pieces(self, start: int, end: int) -> list[tuple[str, int, int]]:
        """(path, lo, hi) of each block overlapping records ``(start, end]``."""
        with self._lock:
            blocks = [b for b in self._blocks if b.last > start and b.first <= end]
        if not blocks or blocks[0].first > start + 1 or blocks[-1].last < end:
            have = f"records {blocks[0].first} to {blocks[-1].last}" if blocks else "no blocks"
            raise CheckpointError(
                f"{self}: the write-ahead log '{self._log.directory}' has {have} for records "
                f"{start + 1} to {end}, which the offset log says batch (…, {end}] read. Blocks "
                "were deleted (by hand, or a rollback past minBatchesToRetain): restore them, or "
                "start the query on a new checkpoint location.")
        return [(self._log.path(b.first), max(0, start + 1 - b.first), min(b.count, end + 1 - b.first))
                for b in blocks]

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        lo = -1 if start is None else int(start)
        hi = int(end)
        spark = self._context.spark
        if hi <= lo:
            return spark_internals.empty_batch(spark, self._schema)
        pieces = self._pieces(lo, hi)
        if self._estimator is not None:
            self._batch_started(lo, hi)
        tasks = min(len(pieces), max(1, spark.sparkContext.defaultParallelism))
        groups = [pieces[i * len(pieces) // tasks:(i + 1) * len(pieces) // tasks] for i in range(tasks)]
        return spark.range(0, tasks, 1, tasks).mapInArrow(_read_task(self._spec, groups), self._schema)

    def commit(self, end: Any) -> None:
        """Batch ``(…, end]`` is committed: remember it, and delete the blocks wholly at or
        before the end of the batch ``minBatchesToRetain`` commits back."""
        end = int(end)
        if self._committed and self._committed[-1] >= end:
            return
        self._committed.append(end)
        if len(self._committed) <= self._retain:
            return
        threshold = self._committed.popleft()
        with self._lock:
            # a prefix of the blocks, never the newest: the next record's index is known
            # from it after a restart
            n = min(bisect.bisect_right(self._lasts, threshold), len(self._blocks) - 1)
            if n <= 0:
                return
            doomed = self._blocks[:n]
            self._bytes_before = self._bytes_through[n - 1]
            del self._blocks[:n], self._lasts[:n], self._bytes_through[:n]
            for b in doomed:
                for k in b.keys:
                    self._keys.pop(k, None)
        for b in doomed:
            self._doomed.put(b.first)

    def _delete_doomed(self) -> None:
        while (first := self._doomed.get()) is not None:
            try:
                self._log.delete(first)
            except Exception as e:  # noqa: BLE001 - left for the clean-up after a restart
                log.warning("%s: deleting block %s failed (%s); it is deleted after a restart",
                            self, block_name(first), type(e).__name__)

    def stop(self) -> None:
        try:
            self.stop_receiver()
        finally:
            self.stop_log()

    def stop_log(self) -> None:
        """Stop the block writer (what is queued is answered 503) and the clean-up."""
        self.writer.stop()
        self._doomed.put(None)
        self._deleter.join(10)

    def stop_receiver(self) -> None:
        pass
