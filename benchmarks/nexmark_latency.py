"""Nexmark latency: from an event's creation to its row in the sink, on both engines.

``python -m benchmarks.nexmark_latency [--rates 10000] [--seconds 40] [--queries q0,q5,q7] [--io kafka,files]``

An event's creation time is its Nexmark event time: a producer process writes each event
when the wall clock reaches it (``microbatch.nexmark.kafka.produce_paced``: Nexmark's
generator, ``eventsPerSecond`` the rate). A row's latency is the time a consumer in
another process sees it in the output minus the time it was due:

- q0 (a projection of the bids): the bid's ``dateTime`` -- its creation;
- q5 and q7 (windows, append mode): the window's end plus the 4-second watermark delay --
  the moment the event that lets the watermark pass the window was created, before which
  no engine can emit the row. The queries are ``microbatch.nexmark.queries``' with the
  window's end added to the output (nothing else changes).

The first ``--warmup`` seconds of events are left out. Each run gets new topics or
directories and a new checkpoint.

**Kafka in, Kafka out** (the Tansu broker the tests use). Input: one topic of
``--partitions`` partitions, the events as JSON (``microbatch.nexmark.kafka``); output:
one topic, each row as JSON. microbatch reads with its ``kafka`` source and writes with
its ``kafka`` sink. Spark's Kafka connector is a JVM jar that cannot be installed here, so
Spark's engine reads the topic through a PySpark Python streaming data source on the same
client library (confluent-kafka), ``KafkaStreamReader`` below, and writes through
``foreachBatch`` (``mapInArrow`` tasks that produce with confluent-kafka, as microbatch's
sink does). Both keep their Kafka clients in each Python worker between tasks, as Spark's
connector keeps its executors' (consumer pool, cached producers) and microbatch's
``kafka.pool`` does. Tansu costs about 100 us of CPU a request when each request holds one record,
so both sides produce in batches; Tansu then reports a latest offset that lags the last
request's records, which both engines see the same way. Tansu's in-memory storage keeps
each record batch as an object and lists a partition's objects on each fetch, so a fetch
slows as the partition's batches grow: past about 13,000 batches in a partition, reading
the newest 2,000 records took seconds, then minutes (both engines stalled alike). The
paced producer therefore lingers ``INPUT_LINGER_MS`` (10 ms: about 100 batches a second
a partition, so a run stays far below that), which every event's latency includes on both
engines; the sinks' batches are each a batch's rows, a few a second.

**Files in, files out.** The producer writes a JSON-lines file of the events due in each
``--file-interval`` (written aside and renamed in, as a file source expects); both engines
read it with the file source and write parquet with the file sink. A row's commit time
is the modification time of the sink's log entry for its batch (``_spark_metadata``),
which both engines write last: a consumer that lists the log sees the row then.

Spark's engine runs with each trigger of ``--spark-triggers`` (0 is "as fast as
possible"), microbatch with each of ``--mb-triggers``; the table gives p50/p95/p99 of each
and the ratio of microbatch's best p99 to Spark's best. A row that never came (within
``MAX_WAIT_S`` after the last event) counts as later than every other: an engine that
falls behind shows ``inf``. Writes ``benchmarks/results/nexmark_latency.json``. With
``NEXMARK_LATENCY_DEBUG=<file>`` the Kafka measurer also writes each row's due time,
partition and offset there, and each run its batches' ``durationMs`` to ``<file>.batches``.
"""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
WATERMARK_DELAY_MS = 4000
OUTPUT_LINGER_MS = 2
INPUT_LINGER_MS = 10
TAIL_S = 8.0
MAX_WAIT_S = 60.0
DEBUG_DUES = [] if os.environ.get("NEXMARK_LATENCY_DEBUG") else None


# -- Spark's engine's Kafka reader: a PySpark Python streaming data source ------------------------------


def _python_data_source():
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class OffsetRange(InputPartition):
        def __init__(self, topic: str, partition: int, start: int, end: int, bootstrap: str):
            self.topic, self.partition, self.start, self.end, self.bootstrap = topic, partition, start, end, bootstrap

    class KafkaStreamReader(DataSourceStreamReader):
        """Spark's Kafka source's micro-batch reader, the least of it: subscribe to one topic,
        start at the earliest offsets, each batch reads every partition to its latest offset,
        one task a partition."""

        def __init__(self, options):
            self.bootstrap, self.topic = options["kafka.bootstrap.servers"], options["subscribe"]
            self._consumer = None

        def _client(self):
            if self._consumer is None:
                from confluent_kafka import Consumer
                self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-spark-driver",
                                           "enable.auto.commit": False})
            return self._consumer

        def _partitions(self) -> list[int]:
            return sorted(self._client().list_topics(self.topic, timeout=10).topics[self.topic].partitions)

        def initialOffset(self):
            return {str(p): 0 for p in self._partitions()}

        def latestOffset(self, start=None, limit=None):
            from confluent_kafka import TopicPartition
            client = self._client()
            return {str(p): client.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                    for p in self._partitions()}

        def partitions(self, start, end):
            return [OffsetRange(self.topic, int(p), int(start.get(p, 0)), int(end[p]), self.bootstrap)
                    for p in sorted(end, key=int) if int(end[p]) > int(start.get(p, 0))]

        def read(self, partition):
            import pyarrow as pa
            from confluent_kafka import Consumer, TopicPartition
            # Spark's Kafka connector keeps its executors' consumers between tasks
            # (KafkaDataConsumer's pool), as microbatch's workers do: so does this reader
            import confluent_kafka    # idle clients kept on a module every worker imports
            pool = confluent_kafka.__dict__.setdefault("_bench_idle", {})
            idle = pool.setdefault(("consumer", partition.bootstrap, partition.topic, partition.partition), [])
            consumer = idle.pop() if idle else Consumer({
                "bootstrap.servers": partition.bootstrap, "group.id": "bench-spark-task",
                "enable.auto.commit": False, "fetch.wait.max.ms": 5})
            keys, values, offsets = [], [], []
            ok = False
            try:
                consumer.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
                next_offset = partition.start
                while next_offset < partition.end:
                    # (ask for what is left: consume(n) waits until n records or the timeout)
                    for m in consumer.consume(min(10_000, partition.end - next_offset), timeout=1.0):
                        if m.error() is not None or m.offset() < next_offset or m.offset() >= partition.end:
                            continue
                        keys.append(m.key())
                        values.append(m.value())
                        offsets.append(m.offset())
                        next_offset = m.offset() + 1
                ok = True
            finally:
                if ok:
                    consumer.unassign()
                    idle.append(consumer)
                else:
                    consumer.close()
            yield pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                                              "partition": pa.array([partition.partition] * len(offsets), pa.int32()),
                                              "offset": pa.array(offsets, pa.int64())})

        def commit(self, end):
            pass

    class BenchKafka(DataSource):
        @classmethod
        def name(cls):
            return "bench_kafka"

        def schema(self):
            return "key BINARY, value BINARY, partition INT, offset BIGINT"

        def streamReader(self, schema):
            return KafkaStreamReader(self.options)

    return BenchKafka


def _produce_task(bootstrap: str, topic: str):
    """A mapInArrow function producing each row's ``value`` (foreachBatch on Spark's engine)."""
    def produce(batches):
        import pyarrow as pa
        from confluent_kafka import Producer
        # kept between tasks, as Spark's CachedKafkaProducer (and microbatch's sink) keep theirs
        import confluent_kafka    # idle clients kept on a module every worker imports
        idle = confluent_kafka.__dict__.setdefault("_bench_idle", {}).setdefault(("producer", bootstrap), [])
        producer = idle.pop() if idle else Producer({"bootstrap.servers": bootstrap, "linger.ms": OUTPUT_LINGER_MS})
        sent = 0
        for batch in batches:
            for value in batch.column(0).to_pylist():
                while True:
                    try:
                        producer.produce(topic, value=value.encode() if isinstance(value, str) else value)
                        break
                    except BufferError:
                        producer.poll(0.005)
                sent += 1
        if producer.flush(60) != 0:
            raise RuntimeError("output records not delivered")
        idle.append(producer)
        yield pa.RecordBatch.from_pydict({"n": pa.array([sent], pa.int64())})
    return produce



# -- the measuring side, in processes of their own --------------------------------------------------------


def _due_ms(value: bytes, due_field: str) -> int:
    row = json.loads(value)
    due = round(datetime.fromisoformat(row[due_field]).timestamp() * 1000)
    return due + (WATERMARK_DELAY_MS if due_field == "window_end" else 0)


def _done(now_ms: float, until_ms: int, quiet_s: float, last: float, got: int, expected: int | None) -> bool:
    """Whether a measurer stops: every row expected is in; or, past the events' end, no row
    came for ``quiet_s`` (rows expected: ``MAX_WAIT_S`` after the end at most)."""
    if expected is not None and got >= expected:
        return True
    past = now_ms - (until_ms + TAIL_S * 1000)
    if past <= 0:
        return False
    if expected is not None:
        return past > MAX_WAIT_S * 1000
    return time.time() - last > quiet_s


def consume_latencies(bootstrap: str, topic: str, due_field: str, from_ms: int, until_ms: int,
                      quiet_s: float, expected: int | None, results) -> None:
    """Read ``topic`` from the start; for each row due in [from_ms, until_ms) its latency,
    until ``_done``."""
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    consumer.subscribe([topic])
    latencies, last = [], time.time()
    # Tansu's fetch once in a while answers a live consumer past a record batch written by
    # two producers at once (offsets 52,484-53,996 of a partition never came, though a
    # consumer reading the topic afterwards got every offset): a gap in a partition's
    # offsets is read again from its start, each record counted when it arrives (so a
    # row read again counts as late as it came, never earlier)
    next_offset: dict[int, int] = {}
    counted: dict[int, set] = {}
    while True:
        # (a short wait: a record is stamped when consume returns, which waits this long for
        # fewer records than asked for; 50 ms here once added 25 ms to every engine's mean)
        messages = consumer.consume(10_000, timeout=0.005)
        now_ms = time.time() * 1000
        gaps: dict[int, int] = {}
        for m in messages:
            if m.error() is not None:
                continue
            partition, offset = m.partition(), m.offset()
            if offset > next_offset.get(partition, offset) and partition not in gaps:
                gaps[partition] = next_offset[partition]
            next_offset[partition] = max(next_offset.get(partition, 0), offset + 1)
            if offset in counted.setdefault(partition, set()):
                continue
            counted[partition].add(offset)
            due = _due_ms(m.value(), due_field)
            if from_ms <= due < until_ms:
                latencies.append(now_ms - due)
                if DEBUG_DUES is not None:
                    DEBUG_DUES.append((due, partition, offset))
        for partition, offset in gaps.items():
            from confluent_kafka import TopicPartition
            consumer.seek(TopicPartition(topic, partition, offset))
            next_offset[partition] = offset
        if messages:
            last = time.time()
        if _done(now_ms, until_ms, quiet_s, last, len(latencies), expected):
            break
    consumer.close()
    if DEBUG_DUES is not None:
        with open(os.environ["NEXMARK_LATENCY_DEBUG"], "w") as f:
            json.dump(DEBUG_DUES, f)
    results.put(("latency", latencies))


def watch_file_sink(directory: str, due_field: str, from_ms: int, until_ms: int, quiet_s: float,
                    expected: int | None, results) -> None:
    """Poll the file sink's log; when a batch's entry appears, read its files' rows: the
    entry's appearance is their commit."""
    import pyarrow.parquet as pq
    log = os.path.join(directory, "_spark_metadata")
    seen, files, latencies, last = set(), set(), [], time.time()
    while True:
        entries = [p for p in glob.glob(os.path.join(log, "*")) if os.path.basename(p).split(".")[0].isdigit()]
        fresh = [p for p in entries if p not in seen]
        now_ms = time.time() * 1000
        for entry in fresh:
            seen.add(entry)
            committed_ms = os.stat(entry).st_mtime * 1000
            with open(entry) as f:
                lines = f.read().splitlines()[1:]
            for line in lines:
                path = json.loads(line)["path"].removeprefix("file://")
                if path in files:          # a compacted entry repeats the earlier batches' files
                    continue
                files.add(path)
                for due in pq.read_table(path, columns=[due_field]).column(0).to_pylist():
                    due_ms = int(due.timestamp() * 1000) + (WATERMARK_DELAY_MS if due_field == "window_end" else 0)
                    if from_ms <= due_ms < until_ms:
                        latencies.append(committed_ms - due_ms)
        if fresh:
            last = time.time()
        if _done(now_ms, until_ms, quiet_s, last, len(latencies), expected):
            break
        time.sleep(0.005)
    results.put(("latency", latencies))


def produce_kafka(bootstrap: str, topic: str, base_ms: int, rate: float, events: int, partitions: int, results) -> None:
    from microbatch.nexmark.kafka import produce_paced
    from microbatch.sources.nexmark.generator import NexmarkConfig
    lateness = produce_paced(bootstrap, topic, NexmarkConfig(base_ms, rate), events, partitions,
                             **{"linger.ms": INPUT_LINGER_MS})
    results.put(("lateness", lateness))


def produce_files(directory: str, base_ms: int, rate: float, events: int, interval_ms: int, results) -> None:
    """Each ``interval_ms`` of event time, one JSON-lines file of the events due in it,
    written when its last event is due."""
    from microbatch.nexmark.kafka import event_records
    from microbatch.sources.nexmark.generator import NexmarkConfig
    config = NexmarkConfig(base_ms, rate)
    records = event_records(config, 0, events, 1)
    staging = os.path.join(directory, "..", os.path.basename(directory) + "-staging")
    os.makedirs(staging, exist_ok=True)
    lateness, index, start = [], 0, 0
    while start < len(records):
        window_end = records[start].timestamp_ms - (records[start].timestamp_ms - base_ms) % interval_ms + interval_ms
        end = start
        while end < len(records) and records[end].timestamp_ms < window_end:
            end += 1
        wait_s = records[end - 1].timestamp_ms / 1000.0 - time.time()
        if wait_s > 0:
            time.sleep(wait_s)
        path = os.path.join(staging, f"events-{index:06d}.json")
        with open(path, "wb") as f:
            f.write(b"\n".join(r.value for r in records[start:end]) + b"\n")
        os.replace(path, os.path.join(directory, f"events-{index:06d}.json"))
        now_ms = int(time.time() * 1000)
        lateness += [max(0, now_ms - r.timestamp_ms) for r in records[start:end]]
        index, start = index + 1, end
    results.put(("lateness", lateness))


# -- the queries ------------------------------------------------------------------------------------------


def latency_query(name: str, views):
    """(DataFrame, the column a row is due by): Nexmark's query with the window's end added."""
    from pyspark.sql import functions as F

    from microbatch.nexmark.queries import QUERIES
    if name == "q0":
        return QUERIES["q0"].build(views), "dateTime"
    if name == "q1":
        return QUERIES["q1"].build(views), "dateTime"
    if name == "q2":      # (the bid's time added to Nexmark's columns)
        return views.bid.where(F.col("auction") % 123 == 0).select("auction", "price", "dateTime"), "dateTime"
    if name == "q7":
        highest = (views.bid.groupBy(F.window("dateTime", "10 seconds"))
                   .agg(F.max(F.struct("price", "auction", "bidder", "dateTime", "extra")).alias("top")))
        return highest.select("top.auction", "top.price", "top.bidder", "top.dateTime", "top.extra",
                              F.col("window.end").alias("window_end")), "window_end"
    if name == "q5":
        window = F.window("dateTime", "10 seconds", "2 seconds")
        auction_bids = views.bid.groupBy("auction", window).agg(F.count(F.lit(1)).alias("num"))
        counts = views.bid.groupBy("auction", window).agg(F.count(F.lit(1)).alias("num"))
        max_bids = counts.groupBy(F.col("window").alias("max_window")).agg(F.max("num").alias("maxn"))
        return (auction_bids.join(max_bids, F.col("window") == F.col("max_window"))
                .where(F.col("num") >= F.col("maxn"))
                .select("auction", "num", F.col("window.end").alias("window_end"))), "window_end"
    raise ValueError(f"no latency form of {name}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_once(session, engine: str, io: str, name: str, trigger_ms: int, rate: float, seconds: float,
             warmup_s: float, partitions: int, file_interval_ms: int, root: str, real_time_s: float = 0) -> dict:
    """``real_time_s``: microbatch's real-time mode with batches that long (``trigger_ms`` unused)."""
    from pyspark.sql import functions as F

    from microbatch.nexmark.kafka import EVENT_JSON_SCHEMA
    from microbatch.nexmark.queries import NexmarkViews
    from microbatch.testing.kafka_broker import KafkaBroker

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    run = uuid.uuid4().hex[:8]
    # events go on TAIL_S past the measured span: the watermark must pass its last windows, and
    # the broker's latest offset must pass its last records
    events = int(rate * (seconds + TAIL_S))
    lead_s = 8 + events * 30e-6              # the producer prepares every record before the first is due
    base_ms = int((time.time() + lead_s) * 1000)
    from_ms, until_ms = base_ms + int(warmup_s * 1000), base_ms + int(seconds * 1000)
    checkpoint = os.path.join(root, f"ckpt-{run}")
    expected = _expected_rows(name, base_ms, rate, from_ms, until_ms)
    broker = None
    processes = []
    try:
        if io == "kafka":
            broker = KafkaBroker()
            broker.create_topic("events", partitions)
            broker.create_topic("out", partitions)
            processes.append(ctx.Process(target=produce_kafka, args=(broker.bootstrap, "events", base_ms, rate, events,
                                                                     partitions, results)))
            if engine == "spark":
                raw = session.readStream.format("bench_kafka").option("kafka.bootstrap.servers", broker.bootstrap) \
                    .option("subscribe", "events").load()
            else:
                raw = session.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap) \
                    .option("subscribe", "events").option("startingOffsets", "earliest").load()

            def events_frame():
                return raw.select(F.from_json(F.col("value").cast("string"), EVENT_JSON_SCHEMA).alias("e")) \
                    .select("e.*")
        else:
            source_dir = os.path.join(root, f"in-{run}")
            os.makedirs(source_dir)
            processes.append(ctx.Process(target=produce_files, args=(source_dir, base_ms, rate, events,
                                                                     file_interval_ms, results)))

            def events_frame():
                return session.readStream.schema(EVENT_JSON_SCHEMA).json(source_dir)
        frame, due_field = latency_query(name, NexmarkViews(events_frame))
        mode = "append"
        if io == "kafka":
            processes.append(ctx.Process(target=consume_latencies, args=(broker.bootstrap, "out", due_field, from_ms,
                                                                         until_ms, 10.0, expected, results)))
            out = frame.select(F.to_json(F.struct("*")).alias("value"))
            if engine == "spark":
                produce = _produce_task(broker.bootstrap, "out")
                writer = out.writeStream.foreachBatch(
                    lambda df, _id: df.mapInArrow(produce, "n LONG").collect())
            else:
                writer = out.writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap) \
                    .option("topic", "out").option("kafka.linger.ms", OUTPUT_LINGER_MS)
        else:
            sink_dir = os.path.join(root, f"out-{run}")
            processes.append(ctx.Process(target=watch_file_sink, args=(sink_dir, due_field, from_ms, until_ms, 10.0,
                                                                       expected, results)))
            writer = frame.writeStream.format("parquet").option("path", sink_dir)
        for p in processes:
            p.start()
        writer = writer.outputMode("update" if real_time_s else mode).option("checkpointLocation", checkpoint)
        if real_time_s:
            writer = writer.trigger(realTime=f"{real_time_s} seconds")
        elif trigger_ms:
            writer = writer.trigger(processingTime=f"{trigger_ms} milliseconds")
        query = writer.start()
        gathered = [results.get(timeout=lead_s + seconds + TAIL_S + MAX_WAIT_S + 120) for _ in processes]
        phases = _phases(query.recentProgress)
        # (a real-time batch's own latencies, Kafka timestamp to the sink's producer: medians over batches)
        engine_latencies = _engine_latencies(query.recentProgress) if real_time_s else {}
        if os.environ.get("NEXMARK_LATENCY_DEBUG"):
            with open(os.environ["NEXMARK_LATENCY_DEBUG"] + ".batches", "w") as f:
                json.dump([(p.batchId, p.numInputRows, dict(p.durationMs)) for p in query.recentProgress], f)
        query.stop()
        if query.exception() is not None:
            raise query.exception()
        for p in processes:
            p.join(30)
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
        if broker is not None:
            broker.close()
    lateness, latencies = dict(gathered)["lateness"], dict(gathered)["latency"]
    if not latencies:
        raise RuntimeError(f"{engine} {io} {name}: no output row was measured")
    # rows that never came count as later than any that did
    measured = latencies + [float("inf")] * max(0, (expected or 0) - len(latencies))
    return {"engine": engine + ("-rt" if real_time_s else ""), "io": io, "query": name, "trigger_ms": trigger_ms,
            "real_time_s": real_time_s, "rate": rate, "rows": len(latencies),
            "p50_ms": percentile(measured, 0.50), "p95_ms": percentile(measured, 0.95),
            "p99_ms": percentile(measured, 0.99), "max_ms": max(measured),
            "producer_late_p99_ms": percentile(lateness, 0.99), "expected_rows": expected,
            "batch_phases_median_ms": phases, "engine_latencies_median_ms": engine_latencies}


def _engine_latencies(progress: list) -> dict:
    """The median over batches with rows of each latency percentile a real-time batch reports."""
    values: dict[str, list] = {}
    for p in progress:
        if p.numInputRows:
            for key, value in (p.sink.metrics or {}).items():
                if "LatencyMs." in key:
                    values.setdefault(key, []).append(float(value))
    return {key: statistics.median(v) for key, v in sorted(values.items())}


def _phases(progress: list) -> dict:
    """The median of each ``durationMs`` phase over the batches that read rows."""
    batches = [p for p in progress if (p.get("numInputRows") if isinstance(p, dict) else p.numInputRows)]
    phases: dict[str, list] = {}
    for p in batches:
        durations = p["durationMs"] if isinstance(p, dict) else p.durationMs
        for key, value in durations.items():
            phases.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in phases.items()}


def _expected_rows(name: str, base_ms: int, rate: float, from_ms: int, until_ms: int) -> int | None:
    """q0's and q1's rows due in [from_ms, until_ms): the bids created then (None for the others)."""
    if name not in ("q0", "q1"):
        return None
    import numpy as np

    from microbatch.sources.nexmark.generator import BID, NexmarkConfig, event_types
    config = NexmarkConfig(base_ms, rate)
    count = int(rate * (until_ms - base_ms) / 1000) + 10
    times = config.timestamp_ms(config.first_event_number + np.arange(count))
    bids = event_types(config, 0, count) == BID
    return int((bids & (times >= from_ms) & (times < until_ms)).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nexmark_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10000")
    parser.add_argument("--seconds", type=float, default=40.0, help="events' span of event time a run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of events left out at the start")
    parser.add_argument("--queries", default="q0,q5,q7")
    parser.add_argument("--io", default="kafka,files")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--file-interval", type=int, default=200, help="ms of events a file holds (files)")
    parser.add_argument("--spark-triggers", default="0,200,1000", help="processing-time triggers, ms (0: none)")
    parser.add_argument("--mb-triggers", default="0", help="microbatch's processing-time triggers, ms")
    parser.add_argument("--mb-real-time", default="", help="microbatch's real-time batch durations, s (kafka; "
                        "stateless queries only)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "nexmark_latency.json"))
    args = parser.parse_args(argv)

    from microbatch import StreamingSession, embedded_spark

    # Spark's engine reading through the Python data source dies here after some hundred
    # batches with a StackOverflowError in its stream execution thread (the default 1 MB
    # thread stack); a larger stack lets it run the whole measurement.
    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": str(args.partitions),
                                 "spark.sql.session.timeZone": "UTC",
                                 "spark.driver.extraJavaOptions": "-Xss256m",
                                 **dict(c.split("=", 1) for c in args.spark_conf)})
    spark.dataSource.register(_python_data_source())
    ss = StreamingSession(spark)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for rate in [float(r) for r in args.rates.split(",")]:
            for io in args.io.split(","):
                for name in args.queries.split(","):
                    runs = [("spark", spark, int(t), 0) for t in args.spark_triggers.split(",") if t] + \
                           [("microbatch", ss, int(t), 0) for t in args.mb_triggers.split(",") if t] + \
                           [("microbatch", ss, 0, float(d)) for d in args.mb_real_time.split(",")
                            if d and io == "kafka"]
                    for engine, session, trigger_ms, real_time_s in runs:
                        row = run_once(session, engine, io, name, trigger_ms, rate, args.seconds, args.warmup,
                                       args.partitions, args.file_interval, root, real_time_s)
                        rows.append(row)
                        shown = f"real-time {real_time_s:g} s" if real_time_s else f"trigger {trigger_ms:>4} ms"
                        print(f"{rate:>8,.0f} ev/s {io:5} {name:3} {row['engine']:13} {shown}: "
                              f"p50 {row['p50_ms']:>7,.0f}  p95 {row['p95_ms']:>7,.0f}  p99 {row['p99_ms']:>7,.0f} ms "
                              f"({row['rows']:,} rows{'' if row['expected_rows'] in (None, row['rows']) else ' OF ' + format(row['expected_rows'], ',')}; "
                              f"producer late p99 {row['producer_late_p99_ms']:.0f} ms; batch "
                              f"{row['batch_phases_median_ms'].get('triggerExecution', 0):.0f} ms)"
                              + ("" if not real_time_s else " engine: " + ", ".join(
                                  f"{k} {v:.0f}" for k, v in row["engine_latencies_median_ms"].items()
                                  if k.endswith((".P50", ".P99")))),
                              flush=True)
                    best = {e: min((r["p99_ms"] for r in rows if r["engine"] == e and r["io"] == io
                                    and r["query"] == name and r["rate"] == rate), default=float("nan"))
                            for e in ("spark", "microbatch", "microbatch-rt")}
                    print(f"{rate:>8,.0f} ev/s {io:5} {name:3} best p99: microbatch / Spark = "
                          f"{best['microbatch'] / best['spark']:.2f}, microbatch real-time / Spark = "
                          f"{best['microbatch-rt'] / best['spark']:.2f}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"seconds": args.seconds, "warmup": args.warmup, "partitions": args.partitions, "results": rows},
                  f, indent=1)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
