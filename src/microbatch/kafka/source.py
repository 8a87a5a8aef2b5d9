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
   ``failOnDataLoss``), split into pieces of at most ``maxRecordsPerPartition`` offsets
   and at least ``minPartitions`` pieces, and returns a
   DataFrame whose Spark tasks each fetch exactly one range with their own consumer.
   A replayed batch has the same offsets, so it reads the same ranges.

Rows never pass through the driver. Client settings (``kafka.*``) go to the consumers
as given and are never logged or printed: the source's description names only its
topics, and the checkpoint holds only offsets.

This module holds the source and its provider; its parts are modules beside it:
``options`` (validated), ``offsets`` (their JSON and where a query starts),
``offset_reader`` (the driver's client), ``rate_limit`` (``maxOffsetsPerTrigger``),
``tasks`` (the ranges and the Spark tasks that read them) and ``data_loss``
(``failOnDataLoss``).
"""
from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from microbatch import spark_internals
from microbatch.errors import AnalysisException, IllegalArgumentException, UnsupportedOperationError
from microbatch.kafka.client import HEADERS_TYPE, client_params
from microbatch.kafka.group_commits import GroupOffsetCommitter
from microbatch.kafka.data_loss import INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE, KafkaDataLoss
from microbatch.kafka.offset_reader import KafkaOffsetReader
from microbatch.kafka.offsets import (EARLIEST, LATEST, _partitions_text, offsets_json, parse_offsets,
                                      starting_limit)
from microbatch.kafka.options import validate_stream_options
from microbatch.kafka.pool import CONSUMER_CAPACITY, CONSUMER_TIMEOUT, pool_settings
from microbatch.kafka.rate_limit import rate_limit
from microbatch.kafka.real_time import RealTimeRead
from microbatch.kafka.tasks import (OffsetRange, _read_bound_ranges_task, _read_ranges_task, split_ranges,
                                    task_groups)
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
        self.max_records_per_partition = options.get_int("maxRecordsPerPartition", 0) or None
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
        group = options.get("commitOffsetsToGroup")
        self._group_commits = GroupOffsetCommitter(client_params(options), group) if group else None

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
        """Spark's getOffsetRangesFromResolvedOffsets, then the maxRecordsPerPartition and
        minPartitions splits."""
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
        return split_ranges(ranges, self.min_partitions, self.max_records_per_partition)

    def _task_groups(self, ranges: list[OffsetRange]) -> list[list[OffsetRange]]:
        # Spark runs a task per range; a Python task costs tens of ms more than a JVM one,
        # so ranges share tasks up to the cores (each task one consumer for its ranges),
        # unless minPartitions or maxRecordsPerPartition asks for more: then a task per range, as Spark
        if self.min_partitions or self.max_records_per_partition:
            return task_groups(ranges, max(self.min_partitions or 0, len(ranges)))
        return task_groups(ranges, spark_internals.default_parallelism(self._context.spark))

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


    def real_time_read(self, start: Any, max_tasks: int | None = None) -> RealTimeRead:
        """Real-time mode's batch from ``start``: every partition the strategy names now
        (one new since ``start`` from its earliest offset), packed into at most the
        cluster's cores (``max_tasks``: this source's share of them, in a union). The read
        limits make no sense where a batch ends by time: refused, as Spark's real-time
        Kafka stream refuses them."""
        limits = [name for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
                                    "minPartitions", "maxRecordsPerPartition") if name in self._options]
        if limits:
            raise UnsupportedOperationError(
                f"The Kafka source's {', '.join(limits)} cannot be used in real-time mode, whose batches end "
                "by time, not by a number of records. Remove the option(s), or use a processingTime trigger.")
        start_offsets = parse_offsets(start, "start offset")
        latest = self.reader.latest(known=start_offsets)
        self._latest = latest
        new = [tp for tp in latest if tp not in start_offsets]
        begin = {**(self.reader.earliest(new) if new else {}), **start_offsets}
        partitions = [(t, p, begin[(t, p)]) for t, p in sorted(latest)]
        cores = spark_internals.default_parallelism(self._context.spark) if max_tasks is None else max_tasks
        tasks = max(1, min(len(partitions), cores))
        # (every partition in a task of its own up to the cores; then round robin, so a batch
        # run again puts each partition in the task it had: the exactly-once sink's ids)
        groups = [partitions[i::tasks] for i in range(tasks)]
        return RealTimeRead(begin, [g for g in groups if g], self._executor_config, self.include_headers,
                            self.fail_on_data_loss, latest)

    def batch_committed(self, end: Any) -> None:
        if self._group_commits is not None:
            self._group_commits.commit(parse_offsets(end))

    def stop(self) -> None:
        if self._group_commits is not None:
            self._group_commits.stop()
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
