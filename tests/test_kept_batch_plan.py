"""A plan kept across batches: a stateless query over the Kafka source, into the Kafka
or the noop sink, is planned by Spark once and run again for each batch, the batch's
offsets bound at run time; every batch still reads its own records, counts them, and
a plan that would not run again alike (an exchange) is planned anew each batch."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from helpers import confs, wait_for
from microbatch.runtime.kept_plans import KEEP_BATCH_PLAN_CONF
from test_kafka_source import kafka

pytestmark = pytest.mark.timeout(300)


def progress_of(query) -> list[dict]:
    """The query's recent progress as dicts (PySpark 3.5 gives dicts; 4.x its objects)."""
    return [json.loads(p.json) if hasattr(p, "json") else p for p in query.recentProgress]


def start(frame, ckpt, sink="kafka", **options):
    writer = frame.writeStream.format(sink).option("checkpointLocation", str(ckpt))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.trigger(processingTime="50 milliseconds").start()


def batch_rounds(broker, query, topic, rounds):
    """Each round's records produced, then processed; per round: the batch DataFrames the
    query ran at the end of each round so far, with the shape of that round's last batch
    (how many of the topic's partitions had new records: its tasks, with local[2]), and
    the batches' (numInputRows, sink numOutputRows) since the round before. (The query's
    trigger may take a round's records in more than one batch.)"""
    seen, frames = 0, []
    for records in rounds:
        broker.produce(topic, records)

        def round_read(seen=seen, wanted=records):
            # (the broker here may answer a latest offset below a record it has just
            # acknowledged: processAllAvailable can end before the round's records, as on
            # Spark's engine; the round ends when the batches read all of them)
            query.processAllAvailable()
            return sum(p["numInputRows"] for p in progress_of(query)[seen:]) >= len(wanted)
        wait_for(round_read, 60, f"the round's {len(records)} records read", every=0.2)
        progress = progress_of(query)[seen:]
        seen += len(progress)
        last = [p for p in progress if p["numInputRows"]][-1]["sources"][0]
        start = (last["startOffset"] or {}).get(topic, {})
        shape = sum(end > start.get(part, 0) for part, end in last["endOffset"][topic].items())
        frames.append((query._execution.last_batch_df, min(shape, 2)))
        yield frames, [(p["numInputRows"], p["sink"]["numOutputRows"]) for p in progress if p["numInputRows"]]


def assert_one_frame_a_shape(frames):
    """Batches of one shape ran the same DataFrame; of different shapes, different ones."""
    for frame, shape in frames:
        for other, other_shape in frames:
            assert (frame is other) == (shape == other_shape), [s for _, s in frames]


def test_kafka_to_kafka_runs_one_plan_for_every_batch_and_each_reads_its_own(ss, broker, tmp_path):
    broker.create_topic("kept-in", 2)
    broker.create_topic("kept-out", 2)
    frame = kafka(ss, broker, subscribe="kept-in", startingOffsets="earliest") \
        .selectExpr("key", "CONCAT(CAST(value AS STRING), '!') AS value")
    query = start(frame, tmp_path / "ck", topic="kept-out", **{"kafka.bootstrap.servers": broker.bootstrap,
                                                                "kafka.batch.num.messages": 1})
    try:
        rounds = [[(b"r%d-%d" % (r, i), b"k%d" % i, i % 2) for i in range(4 + r)] for r in range(4)]
        for r, (frames, counts) in enumerate(batch_rounds(broker, query, "kept-in", rounds)):  # noqa: B007 - frames is read after the loop (every round's)
            # every round's rows, counted in and out, whatever number of batches took them
            assert sum(n for n, _ in counts) == len(rounds[r]) and all(n == o for n, o in counts), counts
        # the first batch of a shape planned it; every later one ran that same DataFrame
        assert_one_frame_a_shape(frames)
        assert len({id(f) for f, _ in frames}) < len(frames)
    finally:
        query.stop()
    assert query.exception() is None
    out = sorted(m.value() for m in broker.read_all("kept-out"))
    assert out == sorted(v + b"!" for rnd in rounds for v, _, _ in rnd)


def test_a_batch_of_another_shape_gets_its_own_plan_and_the_noop_sink_runs_kept_plans(ss, broker, tmp_path):
    broker.create_topic("kept-shape", 2)
    frame = kafka(ss, broker, subscribe="kept-shape", startingOffsets="earliest").selectExpr("value")
    query = start(frame, tmp_path / "ck", sink="noop")
    try:
        # both partitions, then only partition 0 (one task: another shape), then both again
        rounds = [[(b"a", None, 0), (b"b", None, 1)], [(b"c", None, 0)] * 3, [(b"d", None, 0), (b"e", None, 1)] * 2]
        results = list(batch_rounds(broker, query, "kept-shape", rounds))
        for r, (_, counts) in enumerate(results):
            assert sum(n for n, _ in counts) == len(rounds[r]) and all(n == o for n, o in counts), counts
        frames = results[-1][0]
        assert frames[1][1] == 1             # (only partition 0 had records)
        assert_one_frame_a_shape(frames)
    finally:
        query.stop()
    assert query.exception() is None


def test_a_plan_with_an_exchange_is_planned_anew_each_batch(ss, broker, tmp_path):
    # a kept shuffle would hand batch 2 the map output of batch 1 again
    broker.create_topic("kept-exchange-in", 2)
    broker.create_topic("kept-exchange-out", 1)
    frame = kafka(ss, broker, subscribe="kept-exchange-in", startingOffsets="earliest") \
        .repartition(3).selectExpr("value")
    query = start(frame, tmp_path / "ck", topic="kept-exchange-out",
                  **{"kafka.bootstrap.servers": broker.bootstrap, "kafka.batch.num.messages": 1})
    try:
        rounds = [[(b"x%d-%d" % (r, i), None, i % 2) for i in range(3)] for r in range(3)]
        for _r, (frames, counts) in enumerate(batch_rounds(broker, query, "kept-exchange-in", rounds)):  # noqa: B007 - frames is read after the loop (every round's)
            assert sum(n for n, _ in counts) == 3 and all(n == o for n, o in counts), counts
        assert len({id(f) for f, _ in frames}) == len(frames)
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(m.value() for m in broker.read_all("kept-exchange-out")) == \
        sorted(v for rnd in rounds for v, _, _ in rnd)


def test_the_conf_turns_kept_plans_off(ss, broker, tmp_path):
    broker.create_topic("kept-off", 1)
    frame = kafka(ss, broker, subscribe="kept-off", startingOffsets="earliest").selectExpr("value")
    with confs(ss.spark, {KEEP_BATCH_PLAN_CONF: "false"}):
        query = start(frame, tmp_path / "ck", sink="noop")
        try:
            rounds = [[(b"v%d" % r, None, 0)] for r in range(3)]
            for _r, (frames, counts) in enumerate(batch_rounds(broker, query, "kept-off", rounds)):  # noqa: B007 - frames is read after the loop (every round's)
                assert counts == [(1, 1)]
            assert len({id(f) for f, _ in frames}) == len(frames)
        finally:
            query.stop()
    assert query.exception() is None


def test_a_watermark_reads_each_batchs_event_times_from_the_kept_plans_runs(ss, broker, tmp_path):
    broker.create_topic("kept-times", 2)
    frame = kafka(ss, broker, subscribe="kept-times", startingOffsets="earliest") \
        .withWatermark("timestamp", "5 seconds").selectExpr("value", "timestamp")
    query = start(frame, tmp_path / "ck", sink="noop")
    base = 1_700_000_040_000          # 2023-11-14T22:14:00Z

    def iso(ms):
        return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    try:
        rounds = [[(b"t%d-%d" % (r, i), None, i % 2, None, base + r * 60_000 + i * 1000) for i in range(3)]
                  for r in range(3)]
        seen = 0
        for r, (frames, counts) in enumerate(batch_rounds(broker, query, "kept-times", rounds)):  # noqa: B007 - frames is read after the loop (every round's)
            assert sum(n for n, _ in counts) == 3, counts
            progress = progress_of(query)[seen:]
            seen += len(progress)
            times = [p["eventTime"] for p in progress if p["numInputRows"]]
            # this round's rows only: 0, 1 and 2 seconds into the round's minute (in one batch or
            # more: a loaded machine may show the topic's two partitions' records apart)
            assert (min(t["min"] for t in times), max(t["max"] for t in times)) == \
                (iso(base + r * 60_000), iso(base + r * 60_000 + 2000))
        assert_one_frame_a_shape(frames)
        assert query._execution.watermarks.watermark_ms == base + 2 * 60_000 + 2000 - 5000
    finally:
        query.stop()
    assert query.exception() is None


def test_the_nexmark_source_binds_its_batches_and_each_counts_its_own_events(ss, tmp_path):
    from microbatch.sources.nexmark.generator import BID, NexmarkConfig, event_types
    frame = (ss.readStream.format("nexmark").option("view", "bid").option("numEvents", 2000)
             .option("maxEventsPerTrigger", 500).option("baseTime", 1_700_000_000_000).load())
    query = (frame.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    batches = [p for p in progress_of(query) if p["numInputRows"]]
    types = event_types(NexmarkConfig(1_700_000_000_000, 10_000.0), 0, 2000)
    expected = [int((types[i * 500:(i + 1) * 500] == BID).sum()) for i in range(4)]
    assert [(p["numInputRows"], p["sink"]["numOutputRows"]) for p in batches] == [(n, n) for n in expected]
    # four batches of one shape (500 events, two tasks): one plan, run four times
    kept = list(query._execution._kept_plans.plans.values())
    assert len(kept) == 1 and query._execution.last_batch_df is kept[0].df
