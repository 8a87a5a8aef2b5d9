"""The Kafka source in real-time mode: tasks that read their partitions until the batch's
deadline, hand each read's records through the query's steps to the sink at once, and
report the offsets they reached (Spark's KafkaBatchPartitionReader ``nextWithTimeout`` and
its ``PartitionOffsetWithIndex`` accumulator, here the task's one result row).

A task holds one consumer assigned to its partitions (Spark runs a task per partition;
microbatch packs them into at most the cluster's cores, as every task of a real-time batch
must run at once) and loops: ``consume`` what has arrived (waiting at most
``POLL_WAIT_S``), evaluate the steps on it (``plan.arrow_steps``), give the rows to the
sink's writer, until the deadline; then the writer flushes and the task answers each
partition's next offset and the latencies it saw.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from microbatch.kafka.client import _new_consumer
from microbatch.kafka.data_loss import INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE, KafkaDataLoss
from microbatch.kafka.offsets import offsets_json
from microbatch.kafka.sink import SOURCE_POSITION
from microbatch.kafka.tasks import _Columns

#: the longest a task waits in one read for records to arrive (its reads are back to back)
POLL_WAIT_S = 0.005
#: the most records a task hands on at once (what one read returns, at most)
MAX_RECORDS_PER_READ = 2_000
#: how often a task looks for the end marker of a stopped query, in seconds
END_CHECK_S = 0.1
#: latencies a task keeps for the batch's percentiles (a uniform sample beyond that)
LATENCY_SAMPLE = 20_000
#: the schema of a task's answer
RESULT_SCHEMA = ("task INT, offsets STRING, rows_in LONG, rows_out LONG, skipped LONG, latencies STRING, "
                 "rows BINARY")


@dataclass(frozen=True)
class RealTimeRead:
    """One real-time batch of the Kafka source: each task's partitions and the offsets
    they start from (``Source.real_time_read``)."""

    start: dict           # (topic, partition) -> offset: where the batch starts
    groups: list          # [[(topic, partition, start), ...], ...], one list a task
    config: dict
    include_headers: bool
    fail_on_data_loss: bool
    latest: dict          # (topic, partition) -> latest offset when the batch started (lag)
    #: the schema of a task's answer
    result_schema: str = RESULT_SCHEMA

    def task(self, steps: Callable[[pa.RecordBatch], pa.RecordBatch], write: Callable, deadline_ms: int,
             end_marker: tuple | None = None):
        """The ``mapInArrow`` function of the batch's tasks (input: each task's index).
        ``end_marker`` (a checkpoint store's ``spec()``, a path): the batch ends early once
        that file exists (a query stopped: ``runtime.real_time``)."""
        return _RealTimeTask(self.groups, self.config, self.include_headers, self.fail_on_data_loss,
                             steps, write, deadline_ms, end_marker)

    def end_offset(self, reached: list[dict]) -> Any:
        """The batch's end (Spark's ``mergeOffsets``) from each task's answer: each
        partition where its task got, the start's for a partition no task read."""
        end = dict(self.start)
        for offsets in reached:
            for key, offset in offsets.items():
                topic, _, partition = key.rpartition(":")
                end[(topic, int(partition))] = offset
        return offsets_json(end)


@dataclass(frozen=True)
class _RealTimeTask:
    groups: list
    config: dict
    include_headers: bool
    fail_on_data_loss: bool
    steps: Callable
    write: Callable
    deadline_ms: int
    end_marker: tuple | None = None

    def _ended_early(self, now: float, checked: list) -> bool:
        """Whether the end marker exists (looked for every ``END_CHECK_S``)."""
        if self.end_marker is None or now - checked[0] < END_CHECK_S:
            return False
        checked[0] = now
        from microbatch.checkpoint.stores import storage_from_spec
        spec, path = self.end_marker
        return storage_from_spec(spec).exists(path)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext
        context = TaskContext.get()
        task = context.partitionId() if context else 0
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield self._run(task, self.groups[index])

    def _run(self, task: int, group: list) -> pa.RecordBatch:
        positions = {(topic, partition): start for topic, partition, start in group}
        counts = {"in": 0, "out": 0}
        latencies: dict[str, list] = {"sourceQueuingLatencyMs": [], "processingLatencyMs": [], "e2eLatencyMs": []}
        seen = [0]
        # (a batch run again reads its partitions at least past what its crashed run wrote:
        # the exactly-once sink's ids, kafka.sink.RealTimeWrite)
        skip, past = self.write.written_before()
        outputs = self._outputs(positions, counts, latencies, seen, past)
        # (a sink that shows the batch's rows at its end, the console's, answers them too)
        written, skipped, *rows = self.write(outputs, skip)
        reached = {f"{t}:{p}": offset for (t, p), offset in positions.items()}
        return pa.RecordBatch.from_pydict({
            "task": pa.array([task], pa.int32()), "offsets": [json.dumps(reached)],
            "rows_in": pa.array([counts["in"]], pa.int64()), "rows_out": pa.array([written], pa.int64()),
            "skipped": pa.array([skipped], pa.int64()), "latencies": [json.dumps(latencies)],
            "rows": pa.array(rows[:1] or [None], pa.binary())})

    def _outputs(self, positions: dict, counts: dict, latencies: dict, seen: list,
                 past: dict) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import KafkaError, TopicPartition as KTP  # noqa: N814 - not offsets.TopicPartition
        if not positions:
            return
        consumer = _new_consumer({**self.config, "enable.partition.eof": False})
        checked = [time.time()]
        ended = False
        try:
            consumer.assign([KTP(t, p, start) for (t, p), start in positions.items()])
            while True:
                left_s = self.deadline_ms / 1000 - time.time()
                ended = ended or self._ended_early(time.time(), checked)
                if left_s <= 0 or ended:
                    if all(offset >= past.get(f"{t}:{p}", 0) for (t, p), offset in positions.items()):
                        return
                    left_s = POLL_WAIT_S
                messages = consumer.consume(MAX_RECORDS_PER_READ, timeout=min(POLL_WAIT_S, left_s))
                if not messages:
                    continue
                read_ms = time.time() * 1000
                got: dict[tuple, list] = {}
                for m in messages:
                    error = m.error()
                    tp = (m.topic(), m.partition())
                    if error is None:
                        if tp in positions:
                            got.setdefault(tp, []).append(m)
                            positions[tp] = m.offset() + 1
                        continue
                    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        low, _ = consumer.get_watermark_offsets(KTP(*tp), timeout=10)
                        reason = (f"Could not read records from offset {positions[tp]} of topic partition "
                                  f"{tp[0]}-{tp[1]}: the partition now starts at offset {low}.")
                        if self.fail_on_data_loss:
                            raise KafkaDataLoss("COULD_NOT_READ_OFFSET_RANGE", reason)
                        import logging
                        logging.getLogger(__name__).warning("%s %s", reason, INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE)
                        positions[tp] = low
                        consumer.seek(KTP(tp[0], tp[1], low))
                    elif error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"Kafka error reading {tp[0]}-{tp[1]} at offset {positions.get(tp)}: "
                                           f"{error}")
                for tp, records in got.items():
                    columns = _Columns(tp[0], tp[1], self.include_headers)
                    columns.add(records)
                    arrived = columns.batch()
                    counts["in"] += arrived.num_rows
                    out, rows = self.steps.rows(arrived)
                    if out.num_rows and self.write.wants_positions:
                        out = out.append_column(SOURCE_POSITION, pa.array(
                            [f"{tp[0]}:{tp[1]}:{records[r].offset()}" for r in rows.to_pylist()], pa.string()))
                    if out.num_rows:
                        yield out
                    written_ms = time.time() * 1000
                    _sample(latencies, seen, [m.timestamp()[1] for m in records], read_ms, written_ms)
        finally:
            consumer.close()


def _sample(latencies: dict, seen: list, created_ms: list, read_ms: float, written_ms: float) -> None:
    """Each record's latencies (from its Kafka timestamp to the read, from the read to its
    hand-over to the sink, and the two together), a uniform sample of at most
    ``LATENCY_SAMPLE`` a task."""
    for created in created_ms:
        seen[0] += 1
        values = (max(0.0, read_ms - created), written_ms - read_ms, max(0.0, written_ms - created))
        if len(latencies["e2eLatencyMs"]) < LATENCY_SAMPLE:
            for name, value in zip(("sourceQueuingLatencyMs", "processingLatencyMs", "e2eLatencyMs"), values):
                latencies[name].append(round(value, 2))
        else:
            slot = random.randrange(seen[0])
            if slot < LATENCY_SAMPLE:
                for name, value in zip(("sourceQueuingLatencyMs", "processingLatencyMs", "e2eLatencyMs"), values):
                    latencies[name][slot] = round(value, 2)
