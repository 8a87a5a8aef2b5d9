"""Nexmark's events into a Kafka topic, so that any engine (Spark's own through any Kafka
reader, microbatch's ``kafka`` source, another system) reads exactly the events the
``nexmark`` source generates.

Each event of the ``events`` view becomes one record: the value is the event as JSON
(``EVENT_JSON_SCHEMA`` reads it back with ``from_json``; timestamps as ISO-8601 text in
UTC with milliseconds), the key is the event's number, the record's timestamp is the
event's time, and the partition is the event's number modulo the topic's partitions, so
two writes of the same events give the same topic.

``produce_events`` writes a range as fast as the broker takes it. ``produce_paced``
writes each event when the wall clock reaches its event time (Nexmark's event time is its
creation time): the input of a latency measurement. It reports how late each record left.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from microbatch.sources.nexmark.generator import NexmarkConfig, generate
from microbatch.sources.nexmark.source import spark_schema

#: The Spark schema of one event's JSON: the ``events`` view's (Flink's ``datagen`` row).
EVENT_JSON_SCHEMA = spark_schema("events")


def _iso_text(timestamps: pa.Array) -> pa.Array:
    """Timestamps as ISO-8601 text in UTC with milliseconds (``2023-11-14T22:13:20.000Z``)."""
    ms = pc.cast(timestamps, pa.int64()).to_numpy(zero_copy_only=False) // 1000
    text = np.char.add(np.datetime_as_string(ms.astype("datetime64[ms]"), unit="ms"), "Z")
    return pa.array(text, pa.string(), mask=timestamps.is_null().to_numpy(zero_copy_only=False))


def _with_text_times(struct: pa.StructArray) -> pa.StructArray:
    fields = [_iso_text(struct.field(f.name)) if pa.types.is_timestamp(f.type) else struct.field(f.name)
              for f in struct.type]
    return pa.StructArray.from_arrays(fields, names=[f.name for f in struct.type], mask=struct.is_null())


@dataclass(frozen=True)
class EventRecord:
    number: int            #: 0-based count of the stream
    partition: int
    timestamp_ms: int      #: the event's time
    key: bytes
    value: bytes


def event_records(config: NexmarkConfig, first: int, end: int, partitions: int) -> list[EventRecord]:
    """Events ``first`` .. ``end - 1`` as Kafka records, in order."""
    batch: pa.RecordBatch = generate(config, first, end, "events")
    columns = {"event_type": batch.column(0)}
    for name in ("person", "auction", "bid"):
        columns[name] = _with_text_times(batch.column(batch.schema.get_field_index(name)))
    columns["dateTime"] = _iso_text(batch.column(batch.schema.get_field_index("dateTime")))
    rows = pa.RecordBatch.from_pydict(columns).to_pylist()
    times = config.timestamp_ms(config.first_event_number + np.arange(first, end, dtype=np.int64)).tolist()
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    return [EventRecord(number, number % partitions, times[i], str(number).encode(),
                        dumps({k: v for k, v in row.items() if v is not None}).encode())
            for i, (number, row) in enumerate(zip(range(first, end), rows))]


def _producers(bootstrap: str, partitions: int, config: dict) -> list:
    from confluent_kafka import Producer
    settings = {"bootstrap.servers": bootstrap, "linger.ms": 0}
    settings.update(config)
    # One producer a partition: a broker that wants one record per request (Tansu) is
    # then fed by as many connections as the topic has partitions.
    return [Producer(settings) for _ in range(partitions)]


def _send(producer, topic: str, record: EventRecord) -> None:
    while True:
        try:
            producer.produce(topic, value=record.value, key=record.key, partition=record.partition,
                             timestamp=record.timestamp_ms)
            return
        except BufferError:
            producer.poll(0.005)


def _flush(producers: list, timeout_s: float) -> None:
    for producer in producers:
        if producer.flush(timeout_s) != 0:
            raise RuntimeError(f"Nexmark records were not delivered within {timeout_s} s: is the broker up?")


def produce_events(bootstrap: str, topic: str, config: NexmarkConfig, num_events: int, partitions: int,
                   chunk: int = 10_000, **producer_config) -> None:
    """Write events ``0 .. num_events - 1`` to ``topic`` (which has ``partitions``
    partitions) as fast as the broker takes them; flushed before return."""
    producers = _producers(bootstrap, partitions, producer_config)
    for first in range(0, num_events, chunk):
        for record in event_records(config, first, min(first + chunk, num_events), partitions):
            _send(producers[record.partition], topic, record)
        for producer in producers:
            producer.poll(0)
    _flush(producers, 120)


def produce_paced(bootstrap: str, topic: str, config: NexmarkConfig, num_events: int, partitions: int,
                  chunk: int = 20_000, **producer_config) -> list[int]:
    """Write events ``0 .. num_events - 1``, each when the wall clock reaches its event
    time. Every record is prepared before the first is due, so that preparing does not
    delay sending: ``config.base_time_ms`` should lie far enough ahead (about 25 us an
    event). Returns how late each record was handed to the producer, in milliseconds, in
    event order (a producer that keeps up gives 0s and 1s)."""
    records: list[EventRecord] = []
    for first in range(0, num_events, chunk):
        records += event_records(config, first, min(first + chunk, num_events), partitions)
    producers = _producers(bootstrap, partitions, producer_config)
    lateness: list[int] = []
    for record in records:
        wait_s = record.timestamp_ms / 1000.0 - time.time()
        if wait_s > 0:
            for producer in producers:
                producer.poll(0)
            time.sleep(wait_s)
        lateness.append(max(0, int(time.time() * 1000) - record.timestamp_ms))
        _send(producers[record.partition], topic, record)
    _flush(producers, 120)
    return lateness
