"""``kafka``: Spark's Kafka source, in Python on confluent-kafka (librdkafka).

Spark's Kafka connector is a JVM jar; this module reads the same options, gives the
same columns and writes the same offsets, so a job and its checkpoint read the same.

The batch protocol (Spark's KafkaMicroBatchStream, the Direct approach):

1. At a query's first start the driver resolves ``startingOffsets`` (or the timestamps)
   to an offset per topic-partition and writes them to ``sources/<id>/0`` as Spark does
   (a zero byte, ``v1``, the offsets JSON), so a restart before the first batch starts
   where the first run would have.
2. Each trigger the driver fetches the latest offset of every partition the strategy
   (``subscribe``, ``subscribePattern``, ``assign``) names now, and cuts the batch's end
   by the read limit (``maxOffsetsPerTrigger`` prorated over the partitions' lags,
   ``minOffsetsPerTrigger``/``maxTriggerDelay``). The end goes to ``offsets/N`` as
   ``{"topic":{"partition":offset}}``.
3. ``get_batch(start, end)`` turns the two offsets into ranges ``[from, until)`` per
   partition (a partition new since ``start`` from its earliest offset; data loss by
   ``failOnDataLoss``), split into at least ``minPartitions`` pieces, and returns a
   DataFrame whose Spark tasks each fetch exactly one range with their own consumer.
   A replayed batch has the same offsets, so it reads the same ranges.

Rows never pass through the driver. Client settings (``kafka.*``) go to the consumers
as given and are never logged or printed: the source's description names only its
topics, and the checkpoint holds only offsets.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from microbatch import spark_internals
from microbatch.errors import AnalysisException, IllegalArgumentException
from microbatch.kafka.client import HEADERS_TYPE, check_client_settings, client_params
from microbatch.kafka.pool import (CONSUMER_CAPACITY, CONSUMER_TIMEOUT, CONSUMERS, pool_settings,
                                   settings_key)
from microbatch.sources.base import (ALL_AVAILABLE, BoundBatch, CompositeReadLimit, ReadAllAvailable, RowsRead,
                                     ReadLimit, ReadMaxRows, ReadMinRows, Source, SourceContext,
                                     SourceProvider)
from microbatch.util import CaseInsensitiveOptions, time_string_as_ms

log = logging.getLogger(__name__)

def kafka_schema(include_headers: bool) -> StructType:
    """The columns of Spark's Kafka source (KafkaRecordToRowConverter)."""
    fields = [StructField("key", BinaryType(), True), StructField("value", BinaryType(), True),
              StructField("topic", StringType(), True), StructField("partition", IntegerType(), True),
              StructField("offset", LongType(), True), StructField("timestamp", TimestampType(), True),
              StructField("timestampType", IntegerType(), True)]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE, True))
    return StructType(fields)


# -- options ---------------------------------------------------------------------------
_STRATEGIES = ("subscribe", "subscribepattern", "assign")   # Spark's order in its messages

INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE = (
    "Some data may have been lost because they are not available in Kafka any more; either the "
    "data was aged out by Kafka or the topic may have been deleted before all the data in the "
    "topic was processed. If you want your streaming query to fail on such cases, set the source "
    'option "failOnDataLoss" to "true".')


def _has(options: CaseInsensitiveOptions, key: str) -> bool:
    return key in options


def validate_stream_options(options: CaseInsensitiveOptions) -> None:
    """Spark's KafkaSourceProvider.validateStreamOptions, with its messages."""
    if _has(options, "endingOffsets"):
        raise IllegalArgumentException("ending offset not valid in streaming queries")
    if _has(options, "endingOffsetsByTimestamp") or _has(options, "endingTimestamp"):
        raise IllegalArgumentException("ending timestamp not valid in streaming queries")
    specified = [k for k in _STRATEGIES if _has(options, k)]
    if not specified:
        raise IllegalArgumentException(
            "One of the following options must be specified for Kafka source: "
            + ", ".join(_STRATEGIES) + ". See the docs for more details.")
    if len(specified) > 1:
        raise IllegalArgumentException(
            "Only one of the following options can be specified for Kafka source: "
            + ", ".join(_STRATEGIES) + ". See the docs for more details.")
    value = options[specified[0]]
    if specified[0] == "assign" and not value.strip().startswith("{"):
        raise IllegalArgumentException(
            f"No topicpartitions to assign as specified value for option 'assign' is '{value}'")
    if specified[0] == "assign":
        assigned_partitions(value)
    if specified[0] == "subscribepattern" and value.strip():
        try:
            re.compile(value.strip())
        except re.error as e:
            raise IllegalArgumentException(
                f"Invalid pattern '{value}' for option 'subscribePattern': {e}") from None
    if specified[0] == "subscribe" and not [t for t in value.split(",") if t.strip()]:
        raise IllegalArgumentException(
            f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'")
    if specified[0] == "subscribepattern" and not value.strip():
        raise IllegalArgumentException(
            "Pattern to subscribe is empty as specified value for option "
            f"'subscribePattern' is '{value}'")
    if _has(options, "minPartitions") and _int(options, "minPartitions") <= 0:
        raise IllegalArgumentException("minPartitions must be positive")
    if _has(options, "kafka.group.id"):
        log.warning("Kafka option 'kafka.group.id' has been set on this query, it is not "
                    "recommended to set this option. This option is unsafe to use since multiple "
                    "concurrent queries or sources using the same group id will interfere with "
                    "each other as they are part of the same consumer group.")
    if _has(options, "kafka.auto.offset.reset"):
        raise IllegalArgumentException(
            "Kafka option 'auto.offset.reset' is not supported.\nInstead set the source option "
            "'startingoffsets' to 'earliest' or 'latest'\nto specify where to start. Structured "
            "Streaming manages which offsets are consumed\ninternally, rather than relying on the "
            "kafkaConsumer to do it. This will ensure that no\ndata is missed when new "
            "topics/partitions are dynamically subscribed. Note that\n'startingoffsets' only "
            "applies when a new Streaming query is started, and\nthat resuming will always pick "
            "up from where the query left off. See the docs for more\ndetails.")
    for what in ("key", "value"):
        if _has(options, f"kafka.{what}.deserializer"):
            raise IllegalArgumentException(
                f"Kafka option '{what}.deserializer' is not supported as {what}s are deserialized "
                "as byte arrays with ByteArrayDeserializer. Use DataFrame operations to "
                f"explicitly deserialize the {what}s.")
    for config in ("enable.auto.commit", "interceptor.classes"):
        if _has(options, f"kafka.{config}"):
            raise IllegalArgumentException(f"Kafka option '{config}' is not supported")
    if not _has(options, "kafka.bootstrap.servers"):
        raise IllegalArgumentException(
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer")
    if _has(options, "minOffsetsPerTrigger") and _has(options, "maxOffsetsPerTrigger"):
        low, high = _int(options, "minOffsetsPerTrigger"), _int(options, "maxOffsetsPerTrigger")
        if low > high:
            raise IllegalArgumentException(
                f"The value of minOffsetPerTrigger({low}) is higher than the "
                f"maxOffsetsPerTrigger({high}).")
    strategy = options.get("startingOffsetsByTimestampStrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise IllegalArgumentException(
            f"Invalid value '{strategy}' for option 'startingOffsetsByTimestampStrategy': "
            "use 'error' or 'latest'.")
    starting_limit(options)          # parse errors now, not at start
    check_client_settings(client_params(options), "consumer")


def _int(options: CaseInsensitiveOptions, key: str) -> int:
    text = str(options[key]).strip()
    try:
        return int(text)
    except ValueError:
        raise IllegalArgumentException(
            f"Invalid value '{text}' for option '{key}': it must be an integer.") from None


# -- offsets ---------------------------------------------------------------------------
TopicPartition = tuple  # (topic, partition)

EARLIEST, LATEST = -2, -1


def offsets_json(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Spark's KafkaSourceOffset JSON: ``{"topic":{"partition":offset}}``, sorted."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition) in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def parse_offsets(value: Any, what: str = "offset") -> dict[tuple[str, int], int]:
    """``{"topic":{"0":23}}`` (a dict or its JSON text) to ``{(topic, 0): 23}``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise IllegalArgumentException(
            f"Expected e.g. {{\"topicA\":{{\"0\":23,\"1\":-1}},\"topicB\":{{\"0\":-2}}}}, got "
            f"{json.dumps(value) if value is not None else 'text that is not JSON'} ({what})")
    try:
        return {(topic, int(p)): int(o) for topic, parts in value.items() for p, o in parts.items()}
    except (TypeError, ValueError):
        raise IllegalArgumentException(
            f"Expected e.g. {{\"topicA\":{{\"0\":23,\"1\":-1}},\"topicB\":{{\"0\":-2}}}}, got "
            f"{json.dumps(value)} ({what})") from None


def assigned_partitions(text: str) -> list[tuple[str, int]]:
    """The ``assign`` option, ``{"topicA":[0,1],"topicB":[2]}`` (Spark's JsonUtils.partitions)."""
    try:
        value = json.loads(text)
        return sorted((topic, int(p)) for topic, parts in value.items() for p in parts)
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise IllegalArgumentException(
            f'Expected e.g. {{"topicA":[0,1],"topicB":[0,1]}}, got {text}') from None


def _partitions_text(tps) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps))


@dataclass(frozen=True)
class StartingLimit:
    """Where a new query starts: ``kind`` is earliest, latest, offsets, timestamp or
    timestamps (Spark's KafkaOffsetRangeLimit)."""
    kind: str
    offsets: dict | None = None        # offsets: {tp: offset}; timestamps: {tp: ms}
    timestamp: int | None = None
    strategy: str = "error"            # no offset for a timestamp: error or latest


def starting_limit(options: CaseInsensitiveOptions) -> StartingLimit:
    strategy = options.get("startingOffsetsByTimestampStrategy", "error").lower()
    if "startingTimestamp" in options:
        text = str(options["startingTimestamp"]).strip()
        try:
            return StartingLimit("timestamp", timestamp=int(text), strategy=strategy)
        except ValueError:
            raise IllegalArgumentException(f"Expected a single long value, got {text}") from None
    if "startingOffsetsByTimestamp" in options:
        return StartingLimit("timestamps", parse_offsets(options["startingOffsetsByTimestamp"],
                                                         "startingOffsetsByTimestamp"),
                             strategy=strategy)
    text = str(options.get("startingOffsets", "latest")).strip()
    if text.lower() == "earliest":
        return StartingLimit("earliest")
    if text.lower() == "latest":
        return StartingLimit("latest")
    return StartingLimit("offsets", parse_offsets(text, "startingOffsets"))


# -- the driver's client -----------------------------------------------------------------
def _new_consumer(config: dict):
    from confluent_kafka import Consumer
    return Consumer(config)


class KafkaOffsetReader:
    """The driver's view of the topics: partitions the strategy names and their offsets
    (Spark's KafkaOffsetReader). Each call retries ``fetchOffset.numRetries`` times,
    ``fetchOffset.retryIntervalMs`` apart, then fails naming the servers and the cause.

    ``consumer_factory`` builds the librdkafka consumer; tests replace it at this
    boundary where the brokers here answer wrongly (timestamp lookups)."""

    consumer_factory = staticmethod(_new_consumer)

    def __init__(self, options: CaseInsensitiveOptions, group_id: str):
        self.params = client_params(options)
        self.bootstrap = self.params.get("bootstrap.servers", "")
        self.num_retries = options.get_int("fetchOffset.numRetries", 3)
        self.retry_interval_ms = options.get_int("fetchOffset.retryIntervalMs", 1000)
        self.timeout_s = max(1.0, options.get_int("kafkaConsumer.pollTimeoutMs", 10_000) / 1000)
        value = options.get("subscribePattern") if "subscribePattern" in options else None
        self.pattern = re.compile(value.strip()) if value is not None else None
        self.topics = ([t.strip() for t in options["subscribe"].split(",") if t.strip()]
                       if "subscribe" in options else None)
        self.assigned = assigned_partitions(options["assign"]) if "assign" in options else None
        config = {k: v for k, v in self.params.items() if k != "group.id"}
        config.update({"group.id": self.params.get("group.id", group_id),
                       "enable.auto.commit": False, "enable.partition.eof": False})
        self._config = config
        self._consumer = None
        self._admin = None

    @property
    def consumer(self):
        if self._consumer is None:
            self._consumer = self.consumer_factory(dict(self._config))
        return self._consumer

    def close(self) -> None:
        self._admin = None
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None

    def _retrying(self, what: str, call):
        attempt = 0
        while True:
            try:
                return call()
            except Exception as e:  # noqa: BLE001 (librdkafka's KafkaException and timeouts)
                attempt += 1
                if attempt > self.num_retries:
                    raise KafkaUnavailable(
                        f"Failed to {what} from Kafka at {self.bootstrap} after {attempt} "
                        f"attempts ({e}). Check that the brokers are up and reachable; the query "
                        "can be restarted from its checkpoint once they are.") from e
                log.warning("Error while trying to %s (attempt %d of %d), retrying in %d ms: %s",
                            what, attempt, self.num_retries + 1, self.retry_interval_ms, e)
                self.close()
                time.sleep(self.retry_interval_ms / 1000)

    def partitions(self) -> list[tuple[str, int]]:
        """The topic-partitions the strategy names now."""
        if self.assigned is not None:
            return list(self.assigned)

        def fetch():
            metadata = self.consumer.list_topics(timeout=self.timeout_s)
            found = []
            for name, topic in metadata.topics.items():
                if topic.error is not None:
                    continue
                if self.topics is not None and name not in self.topics:
                    continue
                if self.pattern is not None and (name.startswith("__") or not self.pattern.fullmatch(name)):
                    continue
                found += [(name, p) for p in topic.partitions]
            return sorted(found)
        return self._retrying("fetch topic metadata", fetch)

    def _list_offsets(self, tps, which: str) -> dict[tuple[str, int], int]:
        """Earliest or latest offsets of ``tps``: one ListOffsets request for all of them
        (the admin client), not a round trip per partition."""
        from confluent_kafka import TopicPartition as KTP
        from confluent_kafka.admin import AdminClient, OffsetSpec
        if not tps:
            return {}
        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()

        def fetch():
            if self._admin is None:
                self._admin = AdminClient({k: v for k, v in self._config.items()
                                           if k not in ("group.id", "enable.auto.commit",
                                                        "enable.partition.eof")})
            futures = self._admin.list_offsets({KTP(t, p): spec for t, p in tps},
                                               request_timeout=self.timeout_s)
            found = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            invalid = sorted(tp for tp, offset in found.items() if offset is None or offset < 0)
            if invalid:
                # a broker that went away under the request: librdkafka answers -1001
                # (OFFSET_INVALID) with no error; asked again, as Spark's reader asks again
                # for offsets it finds wrong (fetchOffset.numRetries)
                raise RuntimeError(f"the brokers answered no {which} offset for "
                                   f"{_partitions_text(invalid)}")
            return found
        return self._retrying("fetch offsets", fetch)

    def latest(self, tps=None, known: dict | None = None) -> dict[tuple[str, int], int]:
        """The latest offsets; with ``known`` (offsets already read to), a latest offset
        below its known one is fetched again, ``fetchOffset.numRetries`` times
        ``fetchOffset.retryIntervalMs`` apart, as Spark's ``fetchLatestOffsets`` does (a
        broker that just restarted may answer an older offset); what it still answers
        then is the source's to judge (data loss)."""
        tps = self.partitions() if tps is None else tps
        found = self._list_offsets(tps, "latest")
        for attempt in range(self.num_retries):
            behind = sorted(tp for tp, offset in found.items() if known and offset < known.get(tp, offset))
            if not behind:
                break
            log.warning("Latest offsets of %s are below the offsets already read (attempt %d of %d), "
                        "fetching them again in %d ms", _partitions_text(behind), attempt + 1,
                        self.num_retries, self.retry_interval_ms)
            time.sleep(self.retry_interval_ms / 1000)
            found = self._list_offsets(tps, "latest")
        return found

    def earliest(self, tps) -> dict[tuple[str, int], int]:
        return self._list_offsets(tps, "earliest")

    def for_times(self, times: dict[tuple[str, int], int], strategy: str) -> dict[tuple[str, int], int]:
        """The first offset at or after each timestamp; none: error or latest (``strategy``)."""
        from confluent_kafka import TopicPartition as KTP

        def fetch():
            answer = self.consumer.offsets_for_times(
                [KTP(t, p, int(ms)) for (t, p), ms in sorted(times.items())], timeout=self.timeout_s)
            return {(a.topic, a.partition): a.offset for a in answer}
        found = self._retrying("fetch offsets by timestamp", fetch)
        missing = [tp for tp, offset in found.items() if offset is None or offset < 0]
        if missing and strategy == "latest":
            found.update(self.latest(missing))
        elif missing:
            tp = sorted(missing)[0]
            raise IllegalArgumentException(
                f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} and timestamp "
                f"{times[tp]}. Set the source option 'startingOffsetsByTimestampStrategy' to "
                "'latest' to start such partitions at their latest offset.")
        return found


class KafkaUnavailable(RuntimeError):
    """The brokers did not answer within the retries."""


class KafkaDataLoss(AnalysisException):
    """Spark's ``KAFKA_DATA_LOSS`` (failOnDataLoss true): the message names the topic,
    partition and offsets, and how to carry on."""

    def __init__(self, subclass: str, reason: str):
        super().__init__(
            "Some data may have been lost because they are not "
            "available in Kafka any more; either the data was aged out by Kafka or the topic may "
            "have been deleted before all the data in the topic was processed. If you don't want "
            "your streaming query to fail on such cases, set the source option failOnDataLoss to "
            "false.\nReason: " + reason, "KAFKA_DATA_LOSS." + subclass, {"reason": reason})


# -- read limits -----------------------------------------------------------------------
def rate_limit(limit: int, start: dict, latest: dict, earliest_of_new) -> dict:
    """Spark's KafkaMicroBatchStream.rateLimit: ``limit`` offsets prorated over the
    partitions' lags; a partition with a lag always gets at least one."""
    new = [tp for tp in latest if tp not in start]
    from_new = earliest_of_new(new) if new else {}
    sizes = {}
    for tp, end in latest.items():
        begin = start.get(tp, from_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, from_new.get(tp))
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + share)
    return out


# -- ranges and the task that reads one --------------------------------------------------
@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int          # inclusive
    until: int          # exclusive

    @property
    def size(self) -> int:
        return self.until - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator: with ``minPartitions`` above the number of
    ranges, split the large ones in proportion to their size."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = max(1, round(r.size / total * min_partitions))
        step = r.size / parts
        bounds = [r.start + round(i * step) for i in range(parts)] + [r.until]
        out += [OffsetRange(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return out


_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}   # librdkafka's to Java's (CreateTime 0, LogAppendTime 1)


def read_ranges(config: dict, ranges: list[OffsetRange], include_headers: bool,
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
    from confluent_kafka import KafkaError, TopicPartition as KTP
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


# -- the source --------------------------------------------------------------------------
class KafkaSource(Source):
    supports_available_now = True

    def __init__(self, context: SourceContext, options: CaseInsensitiveOptions,
                 schema: StructType):
        self._context = context
        self._options = options
        self._schema = schema
        self.include_headers = options.get_bool("includeHeaders", False)
        self.fail_on_data_loss = options.get_bool("failOnDataLoss", True)
        self.min_partitions = options.get_int("minPartitions", 0) or None
        self.max_offsets = options.get_int("maxOffsetsPerTrigger", 0) or None
        self.min_offsets = options.get_int("minOffsetsPerTrigger", 0) or None
        self.max_trigger_delay_ms = time_string_as_ms(options.get("maxTriggerDelay", "15m"))
        self.poll_timeout_ms = options.get_int(
            "kafkaConsumer.pollTimeoutMs",
            time_string_as_ms(context.spark.conf.get("spark.network.timeout", "120s")))
        self.starting = starting_limit(options)
        # Each query its own group id, as Spark: spark-kafka-source-<uuid>-<hash of path>
        prefix = options.get("groupIdPrefix", "spark-kafka-source")
        group = f"{prefix}-{uuid.uuid4()}-{abs(hash(context.metadata_path)) % 10**9}"
        self.reader = KafkaOffsetReader(options, f"{group}-driver")
        self._executor_config = dict(client_params(options))
        self._executor_config.setdefault("group.id", f"{group}-executor")
        self._executor_config.update({"enable.auto.commit": False, "enable.partition.eof": False,
                                      "auto.offset.reset": "error"})
        # a pooled consumer's first fetch after a new assignment waits for the fetch still
        # in flight from its last read, up to this (librdkafka's default is 500 ms)
        self._executor_config.setdefault("fetch.wait.max.ms", "10")
        self._latest: dict | None = None
        self._bound_key = f"microbatch.kafka.{uuid.uuid4().hex}"   # (a kept plan's local property)
        self._bound_rows = RowsRead()
        self._available_now: dict | None = None
        self._last_trigger_ms = 0          # Spark's: the first batch is never delayed
        self._initial: dict | None = None

    @property
    def schema(self) -> StructType:
        return self._schema

    # offsets ---------------------------------------------------------------------------
    def initial_offset(self) -> Any:
        if self._initial is None:
            self._initial = offsets_json(self._initial_partition_offsets())
        return self._initial

    def _initial_partition_offsets(self) -> dict:
        """Spark's getOrCreateInitialPartitionOffsets: read ``sources/<id>/0`` or resolve
        the starting offsets and write them there."""
        fs, path = self._context.fs, f"{self._context.metadata_path}/0"
        if fs.exists(path):
            return self._read_initial(fs.read_text(path), path)
        start = self.starting
        if start.kind == "earliest":
            offsets = self.reader.earliest(self.reader.partitions())
        elif start.kind == "latest":
            offsets = self.reader.latest()
        elif start.kind == "offsets":
            offsets = self._specific(start.offsets)
        elif start.kind == "timestamp":
            offsets = self.reader.for_times({tp: start.timestamp for tp in self.reader.partitions()},
                                            start.strategy)
        else:
            self._check_assigned(start.offsets, "timestamp based starting")
            offsets = self.reader.for_times(start.offsets, start.strategy)
        fs.mkdirs(self._context.metadata_path)
        fs.create(path, "\x00v1\n" + json.dumps(offsets_json(offsets), separators=(",", ":")))
        log.info("Initial offsets: %s", offsets_json(offsets))
        return self._read_initial(fs.read_text(path), path)

    @staticmethod
    def _read_initial(text: str, path: str) -> dict:
        body = text.lstrip("\x00")
        version, _, content = body.partition("\n")
        if version != "v1":
            raise AnalysisException(
                f"The Kafka source's initial offsets file {path} has version '{version[:20]}'; "
                "this build reads v1. The file was written by a newer Spark or is damaged.")
        return parse_offsets(content.strip(), path)

    def _check_assigned(self, specified: dict, position: str) -> None:
        assigned = set(self.reader.partitions())
        if set(specified) != assigned:
            kind = "KAFKA_START_OFFSET_DOES_NOT_MATCH_ASSIGNED" if position == "starting" \
                else "KAFKA_TIMESTAMP_OFFSET_DOES_NOT_MATCH_ASSIGNED"
            raise AnalysisException(
                f"Partitions specified for Kafka {position} offsets don't match what are "
                "assigned. Maybe topic partitions are created or deleted while the query is "
                "running, or you didn't specify all the partitions. Use -1 for latest, -2 for "
                f"earliest.\nSpecified: {_partitions_text(specified)} Assigned: "
                f"{_partitions_text(assigned)}", kind)

    def _specific(self, specified: dict) -> dict:
        """Spark's fetchSpecificOffsets: -2 and -1 resolved; all partitions named."""
        self._check_assigned(specified, "starting")
        earliest = self.reader.earliest(list(specified))
        latest = self.reader.latest(list(specified))
        out = {}
        for tp, offset in specified.items():
            out[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
            if offset >= 0 and offset < earliest[tp]:
                self._report_data_loss(
                    "START_OFFSET_RESET",
                    f"Starting offset for {tp[0]}-{tp[1]} was {offset} but consumer reset to "
                    f"{earliest[tp]}.")
        return out

    def default_read_limit(self) -> ReadLimit:
        if self.min_offsets and self.max_offsets:
            return CompositeReadLimit((ReadMinRows(self.min_offsets, self.max_trigger_delay_ms),
                                       ReadMaxRows(self.max_offsets)))
        if self.min_offsets:
            return ReadMinRows(self.min_offsets, self.max_trigger_delay_ms)
        if self.max_offsets:
            return ReadMaxRows(self.max_offsets)
        return ALL_AVAILABLE

    def prepare_for_trigger_available_now(self) -> None:
        self._available_now = self.reader.latest()

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        start_offsets = parse_offsets(start, "start offset")
        latest = (dict(self._available_now) if self._available_now is not None
                  else self.reader.latest(known=start_offsets))
        self._latest = latest
        limits = limit.limits if isinstance(limit, CompositeReadLimit) else (limit,)
        if any(isinstance(x, ReadAllAvailable) for x in limits):
            return offsets_json(latest)
        lower = next((x for x in limits if isinstance(x, ReadMinRows)), None)
        upper = next((x for x in limits if isinstance(x, ReadMaxRows)), None)
        if lower is not None and self._delay_batch(lower, latest, start_offsets):
            return offsets_json(start_offsets)
        if upper is not None:
            return offsets_json(rate_limit(upper.rows, start_offsets, latest, self.reader.earliest))
        return offsets_json(latest)

    def _delay_batch(self, limit: "ReadMinRows", latest: dict, start: dict) -> bool:
        now = self._context.clock.get_time_millis()
        if now - self._last_trigger_ms >= limit.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        new_records = sum(offset - start.get(tp, 0) for tp, offset in latest.items())
        if new_records < limit.rows:
            return True
        self._last_trigger_ms = now
        return False

    def report_latest_offset(self, latest: Any) -> Any:
        return offsets_json(self._latest) if self._latest is not None else None

    def metrics(self, consumed: Any) -> dict[str, str]:
        """Spark's KafkaMicroBatchStream.metrics: how far the batch's end is behind latest."""
        if consumed is None or self._latest is None:
            return {}
        done = parse_offsets(consumed)
        behind = [offset - done.get(tp, 0) for tp, offset in self._latest.items()]
        if not behind:
            return {}
        return {"avgOffsetsBehindLatest": str(float(sum(behind)) / len(behind)),
                "maxOffsetsBehindLatest": str(max(behind)),
                "minOffsetsBehindLatest": str(min(behind))}

    # the batch -------------------------------------------------------------------------
    def _report_data_loss(self, subclass: str, reason: str) -> None:
        if self.fail_on_data_loss:
            raise KafkaDataLoss(subclass, reason)
        log.warning("%s %s", reason, INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE)

    def offset_ranges(self, start: Any, end: Any) -> list[OffsetRange]:
        """Spark's getOffsetRangesFromResolvedOffsets, then the minPartitions split."""
        start_offsets = parse_offsets(start, "start offset")
        end_offsets = parse_offsets(end, "end offset")
        new = [tp for tp in end_offsets if tp not in start_offsets]
        new_initial = self.reader.earliest(new) if new else {}
        if new:
            log.info("Partitions added: %s", {f"{t}-{p}": o for (t, p), o in new_initial.items()})
        for tp, offset in sorted(new_initial.items()):
            if offset != 0:
                self._report_data_loss(
                    "ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO",
                    f"Added partition {tp[0]}-{tp[1]} starts from {offset} instead of 0.")
        deleted = set(start_offsets) - set(end_offsets)
        if deleted:
            self._report_data_loss("PARTITIONS_DELETED",
                                   f"Partitions {_partitions_text(deleted)} have been deleted.")
        ranges = []
        for tp in sorted(end_offsets):
            begin = start_offsets.get(tp, new_initial.get(tp))
            until = end_offsets[tp]
            if until < begin:
                self._report_data_loss(
                    "PARTITION_OFFSET_CHANGED",
                    f"Partition {tp[0]}-{tp[1]} offset was changed from {begin} to {until}. This "
                    "could either be a user error that the start offset is set too high and this "
                    "is the first batch, or the kafka topic-partition is broken, and some data "
                    "may have been missed.")
                continue
            ranges.append(OffsetRange(tp[0], tp[1], begin, until))
        return split_ranges(ranges, self.min_partitions)

    def _task_groups(self, ranges: list[OffsetRange]) -> list[list[OffsetRange]]:
        # Spark runs a task per range; a Python task costs tens of ms more than a JVM one,
        # so ranges share tasks up to the cores (each task one consumer for its ranges),
        # unless minPartitions asks for more
        tasks = self.min_partitions or spark_internals.default_parallelism(self._context.spark)
        return task_groups(ranges, max(tasks, len(ranges)) if self.min_partitions else tasks)

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        spark = self._context.spark
        ranges = self.offset_ranges(start, end)
        if not ranges:
            return spark_internals.empty_batch(spark, self._schema)
        groups = self._task_groups(ranges)
        read = _read_ranges_task(groups, self._executor_config, self.include_headers,
                                 self.fail_on_data_loss, self.poll_timeout_ms,
                                 pool_settings(spark.conf.get, CONSUMER_CAPACITY, CONSUMER_TIMEOUT))
        return spark.range(0, len(groups), 1, len(groups)).mapInArrow(read, self._schema)

    def bound_batch(self, start: Any, end: Any) -> BoundBatch | None:
        """The batch as a kept frame: one task per group of ranges, each reading its
        ranges from the local property (the frame of a number of groups is the same for
        every batch of that many)."""
        spark = self._context.spark
        if spark_internals.is_connect(spark):
            return None
        ranges = self.offset_ranges(start, end)
        if not ranges:
            return None
        groups = self._task_groups(ranges)
        value = json.dumps([[[r.topic, r.partition, r.start, r.until] for r in group] for group in groups],
                           separators=(",", ":"))

        def frame() -> DataFrame:
            read = _read_bound_ranges_task(self._bound_key, self._executor_config, self.include_headers,
                                           self.fail_on_data_loss, self.poll_timeout_ms,
                                           pool_settings(spark.conf.get, CONSUMER_CAPACITY, CONSUMER_TIMEOUT),
                                           self._bound_rows.for_tasks(spark))
            return spark.range(0, len(groups), 1, len(groups)).mapInArrow(read, self._schema)
        return BoundBatch(("kafka", len(groups)), self._bound_key, value, frame, self._bound_rows.take)


    def stop(self) -> None:
        self.reader.close()

    def __str__(self) -> str:
        if "subscribe" in self._options:
            strategy = f"Subscribe[{self._options['subscribe']}]"
        elif "subscribePattern" in self._options:
            strategy = f"SubscribePattern[{self._options['subscribePattern']}]"
        else:
            strategy = f"Assign[{_partitions_text(self.reader.assigned or [])}]"
        return f"KafkaV2[{strategy}]"


class KafkaSourceProvider(SourceProvider):
    short_name = "kafka"

    def resolve_schema(self, spark, options, user_schema):
        if user_schema is not None:
            raise IllegalArgumentException(
                "requirement failed: Kafka source has a fixed schema and cannot be set with a "
                "custom one")
        validate_stream_options(options)
        return kafka_schema(options.get_bool("includeHeaders", False))

    def create(self, context, options, schema):
        return KafkaSource(context, options, schema)
