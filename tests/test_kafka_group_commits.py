"""``commitOffsetsToGroup``: each committed batch's end offsets committed to a Kafka consumer
group, for the lag tools teams run (Spark's engine commits none: SPARK-27549 was never
merged), against a real Kafka-protocol broker (Tansu). The group follows the committed
batches, across a restart, and never moves the query: the checkpoint says where it reads.
"""
from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.errors import IllegalArgumentException

from helpers import wait_for
from microbatch.sinks.memory import MemorySink

GROUP = "lag-tools"


def group_offsets(broker, topic: str, partitions: int, group: str = GROUP) -> dict[int, int]:
    """The group's committed offsets, as a lag exporter reads them (OffsetFetch)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def set_group(broker, topic: str, offsets: dict[int, int], group: str = GROUP) -> None:
    """Move the group as an operator would (kafka-consumer-groups --reset-offsets)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def start(ss, broker, ckpt, topic="lag", **options):
    """The query and its memory sink."""
    reader = (ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("commitOffsetsToGroup", GROUP))
    for k, v in options.items():
        reader = reader.option(k, v)
    frame = reader.load()
    sink = MemorySink(frame._session.spark, frame.schema, "append")
    query = (frame.writeStream.sink(sink).option("checkpointLocation", str(ckpt))
             .trigger(processingTime="100 milliseconds").start())
    return query, sink


def batch_ends(ckpt, topic: str) -> list[dict[int, int]]:
    """Each logged batch's end offsets (offsets/N's source line)."""
    logged = sorted((f for f in (ckpt / "offsets").iterdir() if f.name.isdigit()), key=lambda f: int(f.name))
    return [{int(p): o for p, o in json.loads(f.read_text().splitlines()[-1])[topic].items()} for f in logged]


def test_the_group_follows_each_committed_batch_and_never_moves_the_query(ss, spark, broker, tmp_path):
    broker.create_topic("lag", 3)
    broker.produce("lag", [(b"a%d" % i, None, i % 3, [], None) for i in range(30)])
    ckpt = tmp_path / "ck"
    query, sink = start(ss, broker, ckpt, startingOffsets="earliest", maxOffsetsPerTrigger="6")
    try:
        seen: list[dict] = []
        deadline = time.monotonic() + 60
        while len(sink.all_data()) < 30 and time.monotonic() < deadline:
            offsets = group_offsets(broker, "lag", 3)
            if not seen or seen[-1] != offsets:
                seen.append(offsets)
            time.sleep(0.05)
        query.processAllAvailable()
        # the group ends at the last batch's end, and moved with the batches in between
        wait_for(lambda: group_offsets(broker, "lag", 3) == {0: 10, 1: 10, 2: 10}, 20, "the group at the last batch's end")
        assert len([s for s in seen if all(o >= 0 for o in s.values())]) >= 2, seen
        ends = batch_ends(ckpt, "lag")
        for s in seen:
            if all(o >= 0 for o in s.values()):
                assert s in ends, (s, ends)     # only ever a committed batch's end
    finally:
        query.stop()
    assert sorted(r["value"] for r in sink.all_data()) == sorted(b"a%d" % i for i in range(30))

    # an operator moves the group back to the start: the restarted query reads on from its
    # checkpoint, and on resuming puts the group back at its last committed batch's end
    set_group(broker, "lag", {0: 0, 1: 0, 2: 0})
    assert group_offsets(broker, "lag", 3) == {0: 0, 1: 0, 2: 0}
    broker.produce("lag", [(b"b%d" % i, None, i % 3, [], None) for i in range(6)])
    query, sink2 = start(ss, broker, ckpt, startingOffsets="earliest")
    try:
        query.processAllAvailable()
        wait_for(lambda: group_offsets(broker, "lag", 3) == {0: 12, 1: 12, 2: 12}, 20, "the group at the restarted run's end")
    finally:
        query.stop()
    assert sorted(r["value"] for r in sink2.all_data()) == sorted(b"b%d" % i for i in range(6))


def test_resuming_commits_the_last_committed_batch_again(ss, spark, broker, tmp_path):
    broker.create_topic("relag", 2)
    broker.produce("relag", [(b"c%d" % i, None, i % 2, [], None) for i in range(8)])
    ckpt = tmp_path / "ck"
    query, _ = start(ss, broker, ckpt, "relag", startingOffsets="earliest")
    query.processAllAvailable()
    query.stop()
    wait_for(lambda: group_offsets(broker, "relag", 2) == {0: 4, 1: 4}, 20, "the group at the last committed batch's end")
    set_group(broker, "relag", {0: 1, 1: 1})   # (as a crash between the commit log and the group's commit leaves it)
    query, sink = start(ss, broker, ckpt, "relag")
    try:
        wait_for(lambda: group_offsets(broker, "relag", 2) == {0: 4, 1: 4}, 20, "the group at the last committed batch's end")
        query.processAllAvailable()
    finally:
        query.stop()
    assert sink.all_data() == []


def test_an_empty_group_is_refused_naming_the_option(ss, broker):
    with pytest.raises(IllegalArgumentException, match="commitOffsetsToGroup"):
        (ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("subscribe", "lag").option("commitOffsetsToGroup", " ").load())


def test_the_consumer_lag_is_a_prometheus_gauge(spark, broker, tmp_path):
    """The source's lag behind the latest offsets (its progress metrics, as Spark reports
    them) is on the dashboard's ``/metrics`` beside Spark's gauges."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from microbatch import StreamingSession
    broker.create_topic("lagged", 3)
    broker.produce("lagged", [(b"d%d" % i, None, i % 3, [], None) for i in range(30)])
    session = StreamingSession(spark, ui_port=0)
    try:
        query = (session.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                 .option("subscribe", "lagged").option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", 3).load()
                 .writeStream.format("noop").queryName("lagging").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="1 hour").start())
        wait_for(lambda: query.lastProgress is not None, 60, "the first batch")
        metrics = (json.loads(query.lastProgress.json) if hasattr(query.lastProgress, "json")
                   else query.lastProgress)["sources"][0]["metrics"]

        def lag() -> dict:   # (the dashboard hears of the batch on the listener bus, a moment later)
            with urllib.request.urlopen(session.ui_url + "metrics", timeout=10) as response:
                families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
            return {s.labels["stat"]: s.value for s in families["microbatch_source_offsets_behind_latest"].samples
                    if s.labels["query_id"] == query.id}
        samples = wait_for(lag, 30, "the lag on /metrics")
        assert samples == {"min": 9.0, "avg": 9.0, "max": 9.0}
        assert samples["max"] == float(metrics["maxOffsetsBehindLatest"])
        query.stop()
    finally:
        session.stop()
