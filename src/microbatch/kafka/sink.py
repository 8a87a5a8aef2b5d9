"""``kafka``: Spark's Kafka sink in Python on confluent-kafka, and an exactly-once mode.

Spark's semantics (the default): every row of a batch becomes one record — ``value``
(string or binary, required), ``key``, ``headers``, ``partition`` and ``topic`` columns,
or the ``topic`` option, which wins over the column — written by a producer in each Spark
task; the batch ends when every task's producer has flushed. A batch run again after a
crash writes its records again: at least once, as Spark's sink.

With ``.option("microbatch.exactlyOnce", "true")`` a batch run again is not written twice,
on any broker (no transactions needed). The protocol, per batch N of query Q:

1. Before any record of N is produced the driver records the topic's end offsets in
   ``<checkpoint>/sinks/kafka/N`` (create-if-absent). If the file was already there,
   this is a re-run of N and every task checks before it writes.
2. Each task t numbers its rows by content: a record's id is ``Q:N:t:<digest>:<k>``, the
   k-th row of task t whose topic, partition, key, value and headers hash to <digest>,
   sent in the header ``microbatch.record``. Spark sends a batch's rows to the same tasks
   when it runs the batch again (same offsets, same plan), in any order; the ids do not
   depend on the order.
3. A task that checks (a re-run, or a retried attempt) first reads the topic from the
   recorded offsets to its end and skips every row whose id it finds there.
4. Producers are idempotent (``enable.idempotence``): librdkafka's own retries do not
   duplicate either.

What holds: after a crash at any moment and a restart, each row of each batch is in the
topic once — provided the batch's output is deterministic (the same rows in the same
tasks when re-run; no ``rand()``, no ``current_timestamp()`` outside the batch time) and
no run of the query is still writing (microbatch refuses a second run on a checkpoint at
its first log write, but a task of a dead driver that is still producing is not fenced).
Records carry the extra header; consumers that compare headers see it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, StringType

from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import IllegalArgumentException
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider
from microbatch.kafka.client import HEADERS_TYPE, check_client_settings, client_params
from microbatch.kafka.pool import PRODUCER_TIMEOUT, PRODUCERS, pool_settings, settings_key
from microbatch import crash_points, spark_internals

log = logging.getLogger(__name__)

EXACTLY_ONCE_OPTION = "microbatch.exactlyOnce"
#: a real-time task's column of each row's input record (``topic:partition:offset``), the
#: exactly-once id of the record it becomes; never written
SOURCE_POSITION = "__microbatch_source_position"
RECORD_HEADER = "microbatch.record"
_RESULT_SCHEMA = "task INT, rows LONG, skipped LONG"


def validate_query(schema, topic: str | None) -> None:
    """Spark's KafkaWriter.validateQuery, with its messages (``_LEGACY_ERROR_TEMP_3080``)."""
    fields = {f.name: f.dataType for f in schema.fields}

    def check(name: str, desired: tuple, missing: str | None) -> None:
        if name not in fields:
            if missing is not None:
                fail(missing)
            return
        if not any(fields[name].simpleString() == d.simpleString() for d in desired):  # nullability aside
            fail(f"{name} attribute unsupported type {fields[name].simpleString()}. {name} must "
                 f"be a(n) {' or '.join(d.simpleString() for d in desired)}")

    if topic is None:
        check("topic", (StringType(),), "topic option required when no 'topic' attribute is "
              "present. Use the topic option for setting a topic.")
    check("key", (StringType(), BinaryType()), None)
    check("value", (StringType(), BinaryType()), "Required attribute 'value' not found")
    check("headers", (HEADERS_TYPE,), None)
    check("partition", (IntegerType(),), None)


def fail(message: str) -> None:
    raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_3080", msg=message)


def producer_params(options) -> dict[str, str]:
    params = client_params(options)
    for what in ("key", "value"):
        if f"{what}.serializer" in params:
            raise IllegalArgumentException(
                f"Kafka option '{what}.serializer' is not supported as {what}s are serialized with "
                "ByteArraySerializer. Use DataFrame operations to explicitly serialize the "
                f"{what}s into either strings or byte arrays.")
    if "bootstrap.servers" not in params:
        raise IllegalArgumentException(
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka producer")
    # Java's default partitioner (murmur2 of the key), so keys land where Spark puts them
    params.setdefault("partitioner", "murmur2_random")
    check_client_settings(params, "producer")
    return params


def _record_digest(topic: str, partition, key, value, headers) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in (topic.encode(), str(partition).encode(), key or b"\x00none", value or b"\x00none"):
        h.update(len(part).to_bytes(4, "little"))
        h.update(part)
    for k, v in headers or ():
        h.update(b"\x01" + (k or "").encode() + b"\x02" + (v or b""))
    return h.hexdigest()


def _written_ids(config: dict, topic: str, start: dict[str, int], prefix: str,
                 timeout_s: float) -> set[str]:
    """The ids with ``prefix`` already in ``topic`` since the recorded offsets (every
    partition at once, each followed to the end it has now)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    consumer = Consumer({**{k: v for k, v in config.items() if k not in _PRODUCER_ONLY},
                         "group.id": f"microbatch-sink-check-{prefix}", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    found: set[str] = set()
    try:
        parts = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in parts}
        pending = {p: int(start.get(str(p), 0)) for p in parts if ends[p] > int(start.get(str(p), 0))}
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in pending.items()])
        deadline = time.monotonic() + timeout_s
        while pending:
            messages = consumer.consume(10_000, timeout=0.5)
            for m in messages:
                partition, error = m.partition(), m.error()
                if partition not in pending:
                    continue
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and m.offset() >= ends[partition]:
                        del pending[partition]
                    continue
                for k, v in m.headers() or ():
                    if k == RECORD_HEADER and v is not None and v.decode().startswith(prefix):
                        found.add(v.decode())
                if m.offset() + 1 >= ends[partition]:
                    del pending[partition]
            if messages:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise TimeoutError(f"Could not read back {topic} partitions {sorted(pending)} to "
                                   f"their ends within {timeout_s} s to check a re-run batch")
    finally:
        consumer.close()
    return found


_PRODUCER_ONLY = {"partitioner", "acks", "enable.idempotence", "linger.ms", "batch.num.messages",
                  "compression.type", "retries", "batch.size", "queue.buffering.max.messages",
                  "queue.buffering.max.ms", "message.timeout.ms", "delivery.timeout.ms",
                  "max.in.flight.requests.per.connection", "transactional.id"}


def _write_task(config: dict, topic_option: str | None, exactly_once: dict | None,
                flush_timeout_s: float, pooling: tuple[int, float] | None = None):
    """The ``mapInArrow`` function of each task: produce its rows, flush, report counts.
    ``pooling`` (capacity, idle timeout in seconds): the producer comes from this worker's
    pool (``kafka.pool``) and goes back once every record is delivered."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # module-level functions: cloudpickle sends them by name, and the worker's pool
        # is the worker's own (a closure's globals would be pickled by value)
        yield from _write(batches, config, topic_option, exactly_once, flush_timeout_s, pooling)
    return run


def _write(batches, config: dict, topic_option: str | None, exactly_once: dict | None,
           flush_timeout_s: float, pooling: tuple[int, float] | None) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import Producer
    key = settings_key(config)
    producer = PRODUCERS.take(key, lambda: Producer(config), *pooling) if pooling else Producer(config)
    delivered_all = False
    try:
        yield from _produce(batches, producer, config, topic_option, exactly_once, flush_timeout_s)
        delivered_all = True
    finally:
        if pooling and delivered_all:
            PRODUCERS.give_back(key, producer, *pooling)
        elif pooling:
            PRODUCERS.discard(producer)


def _produce(batches, producer, config: dict, topic_option: str | None, exactly_once: dict | None,
             flush_timeout_s: float) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext
    context = TaskContext.get()
    task = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    errors: list = []

    def delivered(error, message):
        if error is not None and not errors:
            errors.append(error)
        elif error is None:
            crash_points.reached("kafka-sink-record")
    record_by_record = crash_points.armed("kafka-sink-record")

    skip: set[str] = set()
    prefix = None
    sources = None      # (real-time mode: each record's id is its input record's position)
    if exactly_once is not None:
        if exactly_once.get("real_time"):
            prefix, skip = f"{exactly_once['query']}:{exactly_once['batch']}:", exactly_once["skip"]
        else:
            prefix = f"{exactly_once['query']}:{exactly_once['batch']}:{task}:"
            if exactly_once["rerun"] or attempt > 0:
                skip = _written_ids(config, exactly_once["topic"], exactly_once["start"], prefix,
                                    flush_timeout_s)
    seen: dict[str, int] = {}
    rows = skipped = 0
    for batch in batches:
        columns = batch.to_pydict()
        sources = columns.get(SOURCE_POSITION)
        n = batch.num_rows
        topics = columns.get("topic") or [None] * n
        for i in range(n):
            topic = topic_option if topic_option is not None else topics[i]
            if topic is None:
                raise ValueError(
                    "[KAFKA_NULL_TOPIC_IN_DATA] The Kafka message data sent to the producer "
                    "contains a null topic. Use the `topic` option for setting a default topic.")
            key = columns["key"][i] if "key" in columns else None
            value = columns["value"][i]
            partition = columns["partition"][i] if "partition" in columns else None
            headers = [(h["key"], h["value"]) for h in (columns["headers"][i] or [])] \
                if "headers" in columns else []
            if prefix is not None:
                if sources is not None:
                    record_id = f"{prefix}{sources[i]}"
                else:
                    digest = _record_digest(topic, partition, key, value, headers)
                    occurrence = seen.get(digest, 0)
                    seen[digest] = occurrence + 1
                    record_id = f"{prefix}{digest}:{occurrence}"
                if record_id in skip:
                    skipped += 1
                    continue
                headers = headers + [(RECORD_HEADER, record_id.encode())]
            extra = {"partition": partition} if partition is not None else {}
            while True:
                try:
                    producer.produce(topic, value=value, key=key, headers=headers or None,
                                     on_delivery=delivered, **extra)
                    break
                except BufferError:
                    producer.poll(0.05)
            rows += 1
            if record_by_record:
                producer.flush(flush_timeout_s)
            if errors:
                break
        producer.poll(0)
        if errors:
            break
    remaining = producer.flush(flush_timeout_s)
    crash_points.reached("kafka-sink-flushed")
    if errors:
        raise RuntimeError(f"Kafka sink: a record of task {task} was not written: {errors[0]}")
    if remaining:
        raise RuntimeError(f"Kafka sink: {remaining} records of task {task} were not "
                           f"delivered within {flush_timeout_s} s")
    yield pa.RecordBatch.from_pydict({"task": pa.array([task], pa.int32()),
                                      "rows": pa.array([rows], pa.int64()),
                                      "skipped": pa.array([skipped], pa.int64())})


@dataclass(frozen=True)
class RealTimeWrite:
    """The Kafka sink's writer in a real-time task (``Sink.real_time_writer``).

    Exactly once there: batch N's tasks decide its end, so a run of N again after a crash
    may stop before offsets its crashed run had read and written, which batch N+1 would
    then write again. Each record's id is therefore its input record's position
    (``Q:N:topic:partition:offset``, from the task's ``SOURCE_POSITION`` column), and a task
    of a batch run again first reads what the crashed run wrote (the topic from the
    offsets recorded before N): those ids are skipped, and the task reads each of its
    input partitions at least past the last one written (``written_before``)."""

    config: dict
    topic: str | None
    exactly_once: dict | None
    flush_timeout_s: float
    pooling: tuple[int, float] | None
    wants_positions: bool = False

    def written_before(self) -> tuple[set[str], dict[str, int]]:
        """(the ids a crashed run of this batch wrote, and per input ``topic:partition`` the
        offset past its last one); nothing when the batch runs for the first time."""
        eo = self.exactly_once
        if eo is None or not eo["rerun"]:
            return set(), {}
        ids = _written_ids(self.config, eo["topic"], eo["start"], f"{eo['query']}:{eo['batch']}:", self.flush_timeout_s)
        past: dict[str, int] = {}
        for record_id in ids:
            source, _, offset = record_id[len(f"{eo['query']}:{eo['batch']}:"):].rpartition(":")
            past[source] = max(past.get(source, 0), int(offset) + 1)
        return ids, past

    def __call__(self, batches: Iterator[pa.RecordBatch], skip: set[str] = frozenset()) -> tuple[int, int]:
        exactly_once = None if self.exactly_once is None else {**self.exactly_once, "real_time": True, "skip": skip}
        rows = skipped = 0
        for result in _write(batches, self.config, self.topic, exactly_once, self.flush_timeout_s, self.pooling):
            rows += sum(result.column(1).to_pylist())
            skipped += sum(result.column(2).to_pylist())
        return rows, skipped


class KafkaSink(Sink):
    reads_batch_through = READS_SQL
    #: a kept batch DataFrame gets its producing DataFrame once (``_writing``)
    runs_kept_plans = True

    def __init__(self, context: SinkContext):
        options = context.options
        topic = options.get("topic")
        self.topic = topic.strip() if topic is not None else None
        validate_query(context.schema, self.topic)
        self.params = producer_params(options)
        self.exactly_once = options.get_bool(EXACTLY_ONCE_OPTION, False)
        self.fs = context.fs
        self.checkpoint_root = context.checkpoint_root
        self.flush_timeout_s = max(1.0, float(self.params.get("delivery.timeout.ms", 120_000)) / 1000)
        if self.exactly_once:
            if self.topic is None:
                raise IllegalArgumentException(
                    f"The Kafka sink's '{EXACTLY_ONCE_OPTION}' needs the 'topic' option: the "
                    "offsets it records before each batch are those of one topic. Set "
                    ".option('topic', ...) (it wins over a 'topic' column).")
            self.params.setdefault("enable.idempotence", "true")
            self.params.setdefault("acks", "all")
        self._names = [f.name for f in context.schema.fields]
        self._kept: tuple[DataFrame, DataFrame] | None = None   # (batch DataFrame, its writing)
        self._id: str | None = None

    def _columns(self, df: DataFrame) -> DataFrame:
        cols = []
        if self.topic is None:
            cols.append(F.col("topic").cast("string"))
        for name in ("key", "value"):
            if name in self._names:
                cols.append(F.col(name).cast("binary").alias(name))
        for name in ("headers", "partition"):
            if name in self._names:
                cols.append(F.col(name))
        return df.select(*cols)

    def _batch_record(self, batch_id: int) -> dict:
        """``sinks/kafka/N``: the topic's end offsets before batch N wrote anything."""
        directory = f"{self.checkpoint_root}/sinks/kafka"
        path = f"{directory}/{batch_id}"
        rerun = self.fs.exists(path)
        if not rerun:
            from confluent_kafka import Consumer, TopicPartition
            consumer = Consumer({**{k: v for k, v in self.params.items() if k not in _PRODUCER_ONLY},
                                 "group.id": "microbatch-sink-offsets"})
            try:
                metadata = consumer.list_topics(self.topic, timeout=30).topics[self.topic]
                start = {str(p): consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                                timeout=30)[1]
                         for p in sorted(metadata.partitions)}
            finally:
                consumer.close()
            self.fs.mkdirs(directory)
            if not self.fs.create(path, json.dumps({"topic": self.topic, "startOffsets": start})):
                rerun = True
            old = f"{directory}/{batch_id - 100}"
            if batch_id >= 100 and self.fs.exists(old):
                self.fs.delete(old)
        recorded = json.loads(self.fs.read_text(path))
        return {"topic": recorded["topic"], "start": recorded["startOffsets"], "rerun": rerun}

    def _query_id(self) -> str:
        """The query's id, which its records name: the checkpoint's (``metadata``), the id
        Spark's engine gives its tasks as ``sql.streaming.queryId``; read from the checkpoint,
        so a classic session and a Spark Connect client (no SparkContext) name it alike."""
        if self._id is None:
            self._id = StreamMetadata.read_or_create(self.fs, self.checkpoint_root).id
        return self._id

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        exactly_once = None
        if self.exactly_once:
            exactly_once = self._batch_record(batch_id)
            exactly_once.update(batch=batch_id, query=self._query_id())
            if exactly_once["rerun"]:
                log.info("Batch %d of the Kafka sink runs again: records already in %s since "
                         "offsets %s are skipped", batch_id, self.topic, exactly_once["start"])
        results = self._writing(df, exactly_once).collect()
        self.last_num_output_rows = sum(r["rows"] for r in results)
        self.last_skipped = sum(r["skipped"] for r in results)

    def real_time_writer(self, df: DataFrame, batch_id: int, query_id: str) -> tuple[DataFrame, "RealTimeWrite"]:
        """A real-time batch's writer: each task's producer writes records as the task hands
        them over (``linger.ms`` is the only wait) and flushes at the batch's end; with
        ``microbatch.exactlyOnce`` a batch run again skips the records its crashed run wrote,
        as a micro-batch does (its record ids are by content, so they hold for a batch
        whose end the tasks decide)."""
        exactly_once = None
        if self.exactly_once:
            exactly_once = {**self._batch_record(batch_id), "batch": batch_id, "query": query_id}
        return self._columns(df), RealTimeWrite(self.params, self.topic, exactly_once, self.flush_timeout_s,
                                                pool_settings(df.sparkSession.conf.get, None, PRODUCER_TIMEOUT),
                                                wants_positions=self.exactly_once)

    def _writing(self, df: DataFrame, exactly_once: dict | None) -> DataFrame:
        """The DataFrame whose tasks produce ``df``'s rows. A batch's task carries its
        exactly-once record, so it is made for each batch; otherwise the one made for a
        kept batch DataFrame (the same object again) is kept with it, planned once."""
        if exactly_once is None and self._kept is not None and self._kept[0] is df:
            spark_internals.reset_observations(self._kept[1])
            return self._kept[1]
        task = _write_task(self.params, self.topic, exactly_once, self.flush_timeout_s,
                           pool_settings(df.sparkSession.conf.get, None, PRODUCER_TIMEOUT))
        writing = self._columns(df).mapInArrow(task, _RESULT_SCHEMA)
        self._kept = (df, writing) if exactly_once is None else None
        return writing

    def progress_metrics(self) -> dict[str, str]:
        if not self.exactly_once:
            return {}
        return {"recordsSkippedAsWritten": str(getattr(self, "last_skipped", 0))}

    def __str__(self) -> str:
        return "KafkaTable"


class KafkaSinkProvider(SinkProvider):
    short_name = "kafka"

    def create(self, context: SinkContext) -> Sink:
        return KafkaSink(context)
