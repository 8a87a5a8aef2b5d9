"""The Kafka source's Spark tasks: the offset ranges a batch reads (split for
``maxRecordsPerPartition`` and ``minPartitions``, packed into tasks), the read of a task's ranges by a consumer in the
executor's Python worker (as Arrow batches with the source's columns), and the
``mapInArrow`` functions that run it."""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from microbatch.kafka.client import _new_consumer
from microbatch.kafka.data_loss import INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE, KafkaDataLoss
from microbatch.kafka.pool import CONSUMERS, settings_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int          # inclusive
    until: int          # exclusive

    @property
    def size(self) -> int:
        return self.until - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None = None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator.getRanges (Spark 4.x): empty ranges dropped; a
    range of more than ``maxRecordsPerPartition`` offsets split into
    ``ceil(size / maxRecordsPerPartition)`` pieces; then, with ``minPartitions`` above
    the number of ranges, the large ones split in proportion to their size (the small
    ones, each worth one part, kept whole and left out of the proportion)."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records:
        ranges = [piece for r in ranges for piece in _divided(r, -(-r.size // max_records))]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    unsplit = [r for r in ranges if _part_count(r.size, total, min_partitions) == 1]
    unsplit_partitions = {(r.topic, r.partition) for r in unsplit}   # (Spark keys them by topic-partition)
    split_total = total - sum(r.size for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    return [piece for r in ranges
            for piece in _divided(r, 1 if (r.topic, r.partition) in unsplit_partitions
                                  else _part_count(r.size, split_total, split_min))]


def _part_count(size: int, total: int, parts: int) -> int:
    """Spark's getPartCount: ``max(round(size / total * parts), 1)``, rounding half up as
    Scala's math.round."""
    return max(math.floor(size / total * parts + 0.5), 1)


def _divided(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """Spark's getDividedPartition: ``parts`` pieces by integer division of what remains,
    the last taking the remainder; empty pieces dropped."""
    out, remaining, start = [], r.size, r.start
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end = min(start + this, r.until)
        if end > start:
            out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return out


_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}   # librdkafka's to Java's (CreateTime 0, LogAppendTime 1)


def read_ranges(config: dict, ranges: list[OffsetRange], include_headers: bool,  # noqa: C901 - one consumer's poll loop and its cases
                fail_on_data_loss: bool, poll_timeout_ms: int,
                batch_rows: int = 20_000, pooling: tuple[int, float] | None = None
                ) -> Iterator[pa.RecordBatch]:
    """One task's read: records ``[start, until)`` of each range (each of another
    topic-partition) as Arrow batches with the source's columns, by one consumer assigned
    to all of them, so the broker serves them together. Offsets missing inside a range
    (compaction, transaction markers) are skipped. Records no longer there are data loss
    (``failOnDataLoss``): the start aged out (the consumer's offset is out of range) or
    the partition now ends before the range does (its end-of-partition comes first).

    ``pooling`` (capacity, idle timeout in seconds): take the consumer from this worker's
    pool (``kafka.pool``) and give it back, unassigned, when the read ends well."""
    from confluent_kafka import KafkaError, TopicPartition as KTP  # noqa: N814 - not offsets.TopicPartition (a tuple)
    pending = {(r.topic, r.partition): [r.start, r.until] for r in ranges if r.size > 0}
    if not pending:
        return
    columns = {tp: _Columns(tp[0], tp[1], include_headers) for tp in pending}
    settings = {**config, "enable.partition.eof": True}
    key = (settings_key(settings), tuple(sorted(pending)))
    consumer = (CONSUMERS.take(key, lambda: _new_consumer(settings), *pooling) if pooling
                else _new_consumer(settings))
    finished = False

    def lost(tp, now: str) -> None:
        position, until = pending[tp]
        reason = (f"Could not read records in offset [{position}, {until}) for topic partition "
                  f"{tp[0]}-{tp[1]}: {now}.")
        if fail_on_data_loss:
            raise KafkaDataLoss("COULD_NOT_READ_OFFSET_RANGE", reason)
        log.warning("%s %s", reason, INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE)

    try:
        consumer.assign([KTP(t, p, start) for (t, p), (start, _) in pending.items()])
        deadline = time.monotonic() + poll_timeout_ms / 1000
        while pending:
            wanted = sum(until - position for position, until in pending.values())
            messages = consumer.consume(min(batch_rows, wanted), timeout=0.5)
            got: dict[tuple, list] = {}
            for m in messages:
                tp = (m.topic(), m.partition())
                if tp not in pending:
                    continue
                error = m.error()
                position, until = pending[tp]
                if error is None:
                    if m.offset() >= until:
                        del pending[tp]
                    else:
                        got.setdefault(tp, []).append(m)
                        pending[tp][0] = m.offset() + 1
                        if m.offset() + 1 >= until:
                            del pending[tp]
                elif error.code() == KafkaError._PARTITION_EOF:
                    if m.offset() < until:          # the partition now ends before the range
                        lost(tp, f"the partition now ends at offset {m.offset()}")
                    del pending[tp]
                elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    low, _ = consumer.get_watermark_offsets(KTP(*tp), timeout=poll_timeout_ms / 1000)
                    lost(tp, f"the partition now starts at offset {low}")
                    pending[tp][0] = max(position, low)
                    if pending[tp][0] >= until:
                        del pending[tp]
                    else:
                        consumer.seek(KTP(tp[0], tp[1], pending[tp][0]))
                else:
                    raise RuntimeError(f"Kafka error reading {tp[0]}-{tp[1]} at offset {position}: "
                                       f"{error}")
            for tp, records in got.items():
                columns[tp].add(records)
                if columns[tp].rows >= batch_rows:
                    yield columns[tp].batch()
            if messages:
                deadline = time.monotonic() + poll_timeout_ms / 1000
            elif pending and time.monotonic() > deadline:
                tp, (position, _) = next(iter(pending.items()))
                raise TimeoutError(
                    f"Cannot fetch record for offset {position} of {tp[0]}-{tp[1]} in "
                    f"{poll_timeout_ms} milliseconds (kafkaConsumer.pollTimeoutMs).")
        for c in columns.values():
            if c.rows:
                yield c.batch()
        finished = True
    finally:
        if pooling and finished:
            consumer.unassign()     # no fetching while idle; the next read assigns its start
            CONSUMERS.give_back(key, consumer, *pooling)
        elif pooling:
            CONSUMERS.discard(consumer)
        else:
            consumer.close()


def task_groups(ranges: list[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """Ranges packed into at most ``tasks`` Spark tasks, largest first onto the lightest
    task, never two pieces of one partition in a task (each task is one consumer)."""
    groups: list[list[OffsetRange]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    sizes = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: -r.size):
        free = [i for i, g in enumerate(groups)
                if all((x.topic, x.partition) != (r.topic, r.partition) for x in g)]
        if not free:
            groups.append([])
            sizes.append(0)
            free = [len(groups) - 1]
        i = min(free, key=lambda j: sizes[j])
        groups[i].append(r)
        sizes[i] += r.size
    return [g for g in groups if g]


class _Columns:
    """A partition's records, gathered a consume() at a time, as the source's columns."""

    def __init__(self, topic: str, partition: int, include_headers: bool):
        self.topic, self.partition, self.include_headers = topic, partition, include_headers
        self._chunks: list[list] = []
        self.rows = 0

    def add(self, messages: list) -> None:
        self._chunks.append(messages)
        self.rows += len(messages)

    def batch(self) -> pa.RecordBatch:
        messages = [m for chunk in self._chunks for m in chunk]
        self._chunks, self.rows = [], 0
        n = len(messages)
        stamps = [m.timestamp() for m in messages]
        arrays = [pa.array([m.key() for m in messages], pa.binary()),
                  pa.array([m.value() for m in messages], pa.binary()),
                  pa.repeat(pa.scalar(self.topic, pa.string()), n),
                  pa.array([self.partition] * n, pa.int32()),
                  pa.array([m.offset() for m in messages], pa.int64()),
                  pa.array([ms * 1000 if kind else None for kind, ms in stamps],
                           pa.timestamp("us", tz="UTC")),
                  pa.array([_TIMESTAMP_TYPES.get(kind, -1) for kind, _ in stamps], pa.int32())]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.include_headers:
            arrays.append(pa.array(
                [[{"key": k, "value": v} for k, v in m.headers()] if m.headers() else None
                 for m in messages],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
            names.append("headers")
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _read_ranges_task(groups: list[list[OffsetRange]], config: dict, include_headers: bool,
                      fail_on_data_loss: bool, poll_timeout_ms: int,
                      pooling: tuple[int, float] | None = None):
    """The ``mapInArrow`` function: each input row is the index of the task's ranges,
    read one after another, a consumer each (one consumer assigned several partitions
    read them slower than this on the broker measured here, benchmarks/kafka.py)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for r in groups[index]:
                    yield from read_ranges(config, [r], include_headers, fail_on_data_loss,
                                           poll_timeout_ms, pooling=pooling)
    return run


def _read_bound_ranges_task(key: str, config: dict, include_headers: bool, fail_on_data_loss: bool,
                            poll_timeout_ms: int, pooling: tuple[int, float] | None, rows: Any):
    """The ``mapInArrow`` function of a kept batch plan: the task's ranges come from the
    local property ``key`` (each task's list, as JSON: ``[[topic, partition, start,
    until], ...]``), and the rows read go to the accumulator ``rows``."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext
        groups = json.loads(TaskContext.get().getLocalProperty(key))
        read = 0
        try:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    for topic, partition, start, until in groups[index]:
                        for records in read_ranges(config, [OffsetRange(topic, partition, start, until)],
                                                   include_headers, fail_on_data_loss, poll_timeout_ms,
                                                   pooling=pooling):
                            read += records.num_rows
                            yield records
        finally:        # (also when the plan above stops reading early, as a limit does)
            rows.add(read)
    return run
