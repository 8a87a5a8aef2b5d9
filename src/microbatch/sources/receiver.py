"""Receivers: push sources made replayable by a write-ahead log of blocks.

The design, and how it maps to Spark Streaming's receivers and WAL, is docs/receivers.md.
In short:

- ``BlockLog``: ``<ckpt>/sources/<id>/blocks/<first>.arrow``, one immutable Arrow IPC
  file per block (records ``first .. first+n-1``), written through the storage layer.
- ``BlockWriter``: the one thread that appends blocks, in order, and completes each
  submission's future only once its block is durable (the acknowledgement). It groups
  records by ``ackMode``: a block per record, per submission, or per ``blockInterval``.
- ``Admission``: what a receiver may take in now: ``maxRate`` (records a second) and the
  bound on unconsumed blocks; the answer says how long to wait.
- ``ReceiverSource``: the Source over the log. Offsets are record indexes (Spark's socket
  source's LongOffset: the last record's index, -1 before any), so ``offsets/N`` names
  the records, and through them the blocks, of batch N; ``get_batch`` reads those blocks
  in Spark tasks; ``commit`` deletes the blocks of batches older than
  ``minBatchesToRetain``.
"""
from __future__ import annotations

import bisect
import collections
import concurrent.futures
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.fs import CheckpointFileSystem, storage_from_spec
from microbatch.errors import AnalysisException, CheckpointError
from microbatch.sources.base import ALL_AVAILABLE, ReadLimit, ReadMaxRows, Source, SourceContext
from microbatch.util import CaseInsensitiveOptions, byte_size, time_string_as_ms

log = logging.getLogger(__name__)

BLOCK_METADATA_KEY = b"microbatch.block"
ACK_MODES = ("record", "block", "interval")


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema blocks of a stream of ``schema`` are written in (PySpark's own
    conversion: timestamps as microseconds in UTC, as mapInArrow hands them to Spark)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema
    if "timezone" in inspect.signature(to_arrow_schema).parameters:   # PySpark 4.1+
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


# -- the block log ---------------------------------------------------------------------
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


# -- admission: rate and unconsumed blocks -------------------------------------------------
class Backpressure(Exception):
    """A receiver cannot take records now. ``status``: the HTTP answer (429 over the rate,
    503 over the unconsumed bound or when the log cannot be written); ``retry_after``:
    seconds to wait."""

    def __init__(self, status: int, retry_after: float, reason: str):
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after
        self.reason = reason


class RateLimiter:
    """A token bucket of ``rate`` records a second (Spark Streaming's receiver RateLimiter,
    ``spark.streaming.receiver.maxRate``), holding at most one second's worth."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self._clock = clock
        self._tokens = float(rate)
        self._at = clock()
        self._lock = threading.Lock()

    def set_rate(self, rate: int) -> None:
        """A new rate (Spark's RateLimiter.updateRate, what backpressure publishes); the
        bucket keeps what it holds, up to one second of the new rate."""
        with self._lock:
            self.rate = rate
            self._tokens = min(self._tokens, float(rate))

    def wait_time(self, n: int) -> float:
        """Take ``n`` records if the bucket holds them (0.0); else take nothing and return
        the seconds until it will (a request larger than a second's worth waits for a
        full bucket and then takes it)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
            self._at = now
            need = min(float(n), float(self.rate))
            if self._tokens >= need:
                self._tokens -= n
                return 0.0
            return (need - self._tokens) / self.rate


class PIDRateEstimator:
    """Spark Streaming's PIDRateEstimator (``spark.streaming.backpressure.*``), the same
    formula: after each batch, the rate (records a second) the stream should take in,
    from the batch's records, processing delay and scheduling delay.

    ``error`` is the last published rate minus the batch's processing rate; the integral
    term is the backlog (``schedulingDelay * processingRate`` records) spread over one
    batch interval; the derivative, the change of the error a second. The first batch
    only sets the rate to its processing rate (``None``: nothing published), as Spark's.
    ``batch_interval_ms`` is Spark's batch duration; the receiver source sets it to the
    observed time between batches before each ``compute`` (docs/receivers.md)."""

    def __init__(self, batch_interval_ms: float, proportional: float = 1.0, integral: float = 0.2,
                 derivative: float = 0.0, min_rate: float = 100.0):
        for name, value in (("proportional", proportional), ("integral", integral),
                            ("derivative", derivative)):
            if value < 0:
                raise ValueError(f"{name.capitalize()} term {value} in PIDRateEstimator should be >= 0.")
        if min_rate <= 0:
            raise ValueError("Minimum rate in PIDRateEstimator should be > 0")
        if batch_interval_ms <= 0:
            raise ValueError(f"Specified batch interval {batch_interval_ms} in PIDRateEstimator is invalid.")
        self.batch_interval_ms = batch_interval_ms
        self.proportional = proportional
        self.integral = integral
        self.derivative = derivative
        self.min_rate = min_rate
        self._first_run = True
        self.latest_time = -1
        self.latest_rate = -1.0
        self.latest_error = -1.0
        self._lock = threading.Lock()

    def compute(self, time_ms: int, elements: int, processing_delay_ms: int,
                scheduling_delay_ms: int) -> float | None:
        """The new rate, or None when the batch says nothing (no records, no time, the
        first batch)."""
        with self._lock:
            if not (time_ms > self.latest_time and elements > 0 and processing_delay_ms > 0):
                return None
            delay_since_update = (time_ms - self.latest_time) / 1000.0          # seconds
            processing_rate = elements / processing_delay_ms * 1000.0            # records/s
            error = self.latest_rate - processing_rate
            historical_error = scheduling_delay_ms * processing_rate / self.batch_interval_ms
            d_error = (error - self.latest_error) / delay_since_update
            new_rate = max(self.latest_rate - self.proportional * error
                           - self.integral * historical_error
                           - self.derivative * d_error, self.min_rate)
            self.latest_time = time_ms
            if self._first_run:
                self.latest_rate = processing_rate
                self.latest_error = 0.0
                self._first_run = False
                return None
            self.latest_rate = new_rate
            self.latest_error = error
            return new_rate


# the backpressure options; each also read from the Spark conf spark.streaming.<name>
BACKPRESSURE_OPTIONS = ("backpressure.enabled", "backpressure.initialRate", "backpressure.rateEstimator",
                        "backpressure.pid.proportional", "backpressure.pid.integral",
                        "backpressure.pid.derived", "backpressure.pid.minRate")


def backpressure_confs(spark: Any) -> dict[str, str]:
    """The session's ``spark.streaming.backpressure.*`` settings, by option name: the
    defaults of the backpressure options (an option set on the source wins)."""
    confs = {}
    for name in BACKPRESSURE_OPTIONS:
        value = spark.conf.get(f"spark.streaming.{name}", None)
        if value is not None:
            confs[name] = str(value)
    return confs


@dataclass
class BackpressureOptions:
    """``backpressure.*``: Spark Streaming's adaptive rate (docs/receivers.md)."""
    initial_rate: int | None = None
    proportional: float = 1.0
    integral: float = 0.2
    derived: float = 0.0
    min_rate: float = 100.0


@dataclass
class ReceiverOptions:
    ack_mode: str
    block_interval_ms: int
    max_records_per_trigger: int | None
    max_rate: int | None
    max_unconsumed_blocks: int
    max_unconsumed_bytes: int
    backpressure: BackpressureOptions | None = None     # None: backpressure.enabled false

    @staticmethod
    def parse(options: CaseInsensitiveOptions, default_ack_mode: str,
              confs: dict[str, str] | None = None) -> "ReceiverOptions":
        """``confs``: the ``spark.streaming.backpressure.*`` settings (``backpressure_confs``),
        the defaults of the backpressure options."""
        ack_mode = options.get("ackMode", default_ack_mode).strip().lower()
        if ack_mode not in ACK_MODES:
            raise AnalysisException(
                f"Invalid value '{options['ackMode']}' for option 'ackMode': use one of "
                f"{', '.join(ACK_MODES)} (docs/receivers.md: when a sender is acknowledged).")
        interval = time_string_as_ms(options.get("blockInterval", "200ms"))
        if interval <= 0:
            raise AnalysisException(
                f"Invalid value '{options['blockInterval']}' for option 'blockInterval': it must "
                "be positive, e.g. '200ms'.")

        def positive(name: str, default: int | None) -> int | None:
            value = options.get_int(name, default) if name in options else default
            if value is not None and value <= 0:
                raise AnalysisException(
                    f"Invalid value '{options[name]}' for option '{name}': it must be a positive "
                    "integer.")
            return value

        max_bytes = byte_size(options.get("maxUnconsumedBytes", "1g"))
        if max_bytes <= 0:
            raise AnalysisException("Invalid value for option 'maxUnconsumedBytes': it must be "
                                    "positive, e.g. '1g'.")
        return ReceiverOptions(ack_mode, interval, positive("maxRecordsPerTrigger", None),
                               positive("maxRate", None), positive("maxUnconsumedBlocks", 10000),
                               max_bytes, _parse_backpressure(options, confs or {}))


def _parse_backpressure(options: CaseInsensitiveOptions, confs: dict[str, str]) -> BackpressureOptions | None:
    def setting(name: str) -> tuple[str, str] | None:
        """(where it was set, its value): the source's option, else the Spark conf."""
        if name in options:
            return f"option '{name}'", str(options[name]).strip()
        if name in confs:
            return f"the Spark conf 'spark.streaming.{name}'", confs[name].strip()
        return None

    def number(name: str, default: float, minimum: float, strict: bool) -> float:
        found = setting(name)
        if found is None:
            return default
        where, raw = found
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value == value or (value <= minimum if strict else value < minimum) or value == float("inf"):
            bound = f"greater than {minimum:g}" if strict else f"at least {minimum:g}"
            raise AnalysisException(f"Invalid value '{raw}' for {where}: it must be a number "
                                    f"{bound} (docs/receivers.md: backpressure).")
        return value

    enabled = setting("backpressure.enabled")
    if enabled is None or enabled[1].lower() == "false":
        return None
    if enabled[1].lower() != "true":
        raise AnalysisException(f"Invalid value '{enabled[1]}' for {enabled[0]}: must be 'true' or 'false'.")
    estimator = setting("backpressure.rateEstimator")
    if estimator is not None and estimator[1] != "pid":
        raise AnalysisException(f"Unknown rate estimator: {estimator[1]} ({estimator[0]}): the only "
                                "estimator is 'pid' (Spark Streaming's PIDRateEstimator).")
    initial = number("backpressure.initialRate", 0, 0, strict=True) if setting("backpressure.initialRate") else None
    return BackpressureOptions(
        initial_rate=max(1, int(initial)) if initial is not None else None,
        proportional=number("backpressure.pid.proportional", 1.0, 0, strict=False),
        integral=number("backpressure.pid.integral", 0.2, 0, strict=False),
        derived=number("backpressure.pid.derived", 0.0, 0, strict=False),
        min_rate=number("backpressure.pid.minRate", 100.0, 0, strict=True))


# -- the block writer ------------------------------------------------------------------------
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
            except Exception as e:  # noqa: BLE001
                self.failed_writes += 1
                log.warning("Writing receiver block %s failed (%s: %s)", block_name(first),
                            type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
                if not self._retry or self._stopped:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        self.next_index = first + table.num_rows
        self._on_durable(Block(first, table.num_rows, len(data), tuple(keys), received_ms))


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
