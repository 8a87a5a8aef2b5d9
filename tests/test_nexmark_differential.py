"""Nexmark's queries on microbatch and on Spark's own engine over the same events, batch
by batch (issue 39): the events are written to parquet files once (as the ``nexmark``
source generates them), both engines read one file a batch, and every query's batches
and input rows must be equal. Then the ``nexmark`` source itself must give the batches
the files give. Run with ``make test-nexmark`` (marker ``nexmark``)."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import collect_batches
from microbatch.nexmark.files import write_event_files
from microbatch.nexmark.queries import NOT_EXPRESSIBLE, QUERIES, NexmarkViews, register_views
from microbatch.sources.nexmark.generator import NexmarkConfig
from microbatch.sources.nexmark.source import spark_schema

pytestmark = pytest.mark.nexmark

BASE_TIME = 1_700_000_000_000
RATE = 200.0                  # events a second of event time: 24000 events span 2 minutes
NUM_EVENTS = 24_000
EVENTS_PER_FILE = 4_000       # six batches
CONFIG = NexmarkConfig(base_time_ms=BASE_TIME, events_per_second=RATE)


@pytest.fixture(scope="module")
def event_files(spark, tmp_path_factory):
    directory = tmp_path_factory.mktemp("nexmark") / "events"
    files = write_event_files(spark, directory, CONFIG, NUM_EVENTS, EVENTS_PER_FILE)
    assert len(files) == NUM_EVENTS // EVENTS_PER_FILE
    return directory


@pytest.fixture(scope="module")
def side_input(spark):
    return spark.range(0, 10_000).select(F.col("id").alias("key"), F.concat(F.lit("value-"), F.col("id")).alias("value"))


def file_views(session, directory, side_input) -> NexmarkViews:
    def read_events():
        return (session.readStream.schema(spark_schema("events")).option("maxFilesPerTrigger", 1)
                .parquet(str(directory)))
    return NexmarkViews(read_events, side_input)


def _progress(progress) -> list[tuple]:
    return [(p.batchId, p.numInputRows) for p in progress]


def test_every_query_is_listed_once():
    listed = set(QUERIES) | set(NOT_EXPRESSIBLE)
    assert listed == {f"q{i}" for i in range(23)}
    assert not set(QUERIES) & set(NOT_EXPRESSIBLE)


@pytest.mark.parametrize("name", sorted(QUERIES, key=lambda q: int(q[1:])))
def test_query_and_its_sql_equal_sparks_engine_batch_by_batch(spark, ss, event_files, side_input, tmp_path, name):
    """The query as DataFrame code and as SQL over temporary views of the streams
    (``register_views``) on microbatch, each against the DataFrame code's run on Spark's
    engine (one run of Spark's engine for both: its SQL and DataFrame forms give the same
    batches, except q5's, below)."""
    query = QUERIES[name]
    theirs, their_progress = collect_batches(query.build(file_views(spark, event_files, side_input)),
                                             tmp_path / "spark", query.output_mode)
    assert sum(len(rows) for _, rows in theirs) > 0, f"{name} emitted nothing: the test input proves nothing"
    ours, our_progress = collect_batches(query.build(file_views(ss, event_files, side_input)),
                                         tmp_path / "mb", query.output_mode)
    assert _progress(our_progress) == _progress(their_progress)
    assert ours == theirs
    views = file_views(ss, event_files, side_input)
    register_views(ss, views)
    frame = ss.sql(query.sql)
    assert frame.isStreaming
    ours, our_progress = collect_batches(frame, tmp_path / "mb-sql", query.output_mode)
    # Spark's engine emits no row from q5's SQL, where one view is read twice (its DataFrame
    # form, two reads, emits rows); microbatch emits the DataFrame form's rows for both
    # (docs/nexmark.md). q5's SQL reads one source where the DataFrame form reads two, so its
    # input rows differ.
    if name != "q5":
        assert _progress(our_progress) == _progress(their_progress)
    assert ours == theirs


def test_the_nexmark_source_gives_the_events_the_files_hold(ss, event_files, tmp_path):
    """q0 and q7 over the source (4000 events a trigger) equal them over the files, both on
    microbatch (the files' runs equal Spark's engine's: the test above)."""
    def source_events():
        return (ss.readStream.format("nexmark").option("baseTime", BASE_TIME).option("eventsPerSecond", RATE)
                .option("numEvents", NUM_EVENTS).option("maxEventsPerTrigger", EVENTS_PER_FILE).load())
    for name in ("q0", "q7"):
        query = QUERIES[name]
        from_source, source_progress = collect_batches(query.build(NexmarkViews(source_events)),
                                                       tmp_path / f"source-{name}", query.output_mode)
        from_files, _ = collect_batches(query.build(file_views(ss, event_files, None)),
                                        tmp_path / f"files-{name}", query.output_mode)
        assert from_source == from_files
        # each view reads its own stream: numInputRows counts the events of every read
        assert [p.numInputRows for p in source_progress][:6] == [EVENTS_PER_FILE] * 6


def test_an_endless_source_without_a_pace_or_limit_is_refused_naming_the_fix(ss, tmp_path):
    query = (ss.readStream.format("nexmark").load().writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="numEvents' or 'pacing'='wallClock'"):
        query.awaitTermination(60)


def test_wall_clock_pacing_gives_the_events_whose_time_has_come(ss, tmp_path):
    """At 1000 events/s from a base time 3 s ago, a run takes about 3000 events, none of
    them later than the wall clock; the next run, from the checkpoint, goes on from there."""
    import time
    base = int(time.time() * 1000) - 3000
    counts, latest = [], []

    def run():
        batches, _ = collect_batches(
            ss.readStream.format("nexmark").option("pacing", "wallClock").option("eventsPerSecond", 1000)
            .option("baseTime", base).load().select("dateTime"), tmp_path / "c",
            rows=lambda df: (df.count(), df.agg(F.max("dateTime")).first()[0]))
        counts.append(sum(n for _, (n, _) in batches))
        latest.append(max(t for _, (_, t) in batches))
        return time.time()
    ended = run()
    assert 3000 <= counts[0] <= ended * 1000 - base     # (one event a millisecond since the base time)
    assert latest[0].timestamp() <= ended
    time.sleep(1.0)     # (deliberate: a second of wall clock, the events it paces)
    run()
    assert counts[1] >= 900     # a second's worth more, continuing the stream


def test_events_written_to_kafka_are_the_events_the_files_hold(ss, event_files, broker, tmp_path):
    """``microbatch.nexmark.kafka``: the same events as JSON records (key: the event's
    number, partition: number modulo partitions, timestamp: the event's time), read back
    by the kafka source with ``EVENT_JSON_SCHEMA``, give q0's and q7's rows the files give."""
    from microbatch.nexmark.kafka import EVENT_JSON_SCHEMA, produce_events
    broker.create_topic("nexmark", 2)
    produce_events(broker.bootstrap, "nexmark", CONFIG, NUM_EVENTS, 2, **{"batch.num.messages": 1})
    assert broker.latest_offsets("nexmark") == {0: NUM_EVENTS // 2, 1: NUM_EVENTS // 2}
    first = [m for m in broker.read_all("nexmark") if m.partition() == 1][0]
    assert first.key() == b"1" and first.timestamp()[1] == CONFIG.event_time_ms(1)

    def kafka_events():
        raw = (ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
               .option("subscribe", "nexmark").option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", EVENTS_PER_FILE).load())
        return raw.select(F.from_json(F.col("value").cast("string"), EVENT_JSON_SCHEMA).alias("e")).select("e.*")
    for name in ("q0", "q7"):
        query = QUERIES[name]
        from_kafka, _ = collect_batches(query.build(NexmarkViews(kafka_events)), tmp_path / f"kafka-{name}",
                                        query.output_mode)
        from_files, _ = collect_batches(query.build(file_views(ss, event_files, None)),
                                        tmp_path / f"files-{name}", query.output_mode)
        ours = sorted(row for _, rows in from_kafka for row in rows)
        assert ours == sorted(row for _, rows in from_files for row in rows)
        assert ours, f"{name} emitted nothing"
