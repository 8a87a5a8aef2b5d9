"""Real-time mode (``trigger(realTime=...)``): the steps its tasks evaluate over Arrow
against Spark's answers for the same rows, a real-time query against a micro-batch query
of the same records through a real broker, its restart, and Spark's refusals."""
from __future__ import annotations

import collections
import datetime as dt
import json
import urllib.request

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from helpers import wait_for
from microbatch import StreamingSession
from microbatch.errors import UnsupportedOperationError
from prometheus_client.parser import text_string_to_metric_families
from microbatch.kafka.source import kafka_schema
from microbatch.plan.arrow_steps import ArrowSteps, java_double_text
from microbatch.runtime.real_time import steps_of

SCHEMA = ("id LONG, n INT, price DOUBLE, name STRING, ok BOOLEAN, at TIMESTAMP, "
          "amount DECIMAL(10,2), inner STRUCT<x: LONG, s: STRING>")
VALUES = [
    '{"id": 1, "n": 7, "price": 2.5, "name": "a\\"b", "ok": true, "at": "2026-12-05T10:00:00.123Z", '
    '"amount": 12.34, "inner": {"x": 3, "s": "é"}}',
    '{"id": 2, "n": -3, "price": 1e10, "name": "line\\nbreak", "ok": false, "at": "2026-12-05T11:00:00+01:00"}',
    '{"id": 3, "n": 2147483648, "price": "NaN", "name": 5, "at": "2026-12-05 09:30:00"}',
    '{"id": "4", "n": 1.5, "price": 0.001, "name": {"k": [1, 2.50]}, "ok": "yes", "at": 1764928800}',
    '{"id": 5, "price": 12345678.9, "amount": 1.234, "inner": [1]}',
    'not json at all',
    '[1, 2, 3]',
    '{"id": 6, "n": 0, "price": -0.0, "name": null, "at": "not a time", "amount": -0.5}',
    '{"id": 7, "n": 123, "price": 1.0E-5, "name": "x", "inner": {"x": null, "s": "y"}}',
    None,
]


def _records(values: list) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.array([None if v is None else str(i).encode() for i, v in enumerate(values)], pa.binary()),
         pa.array([None if v is None else v.encode() for v in values], pa.binary()),
         pa.array(["t"] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
         pa.array([dt.datetime(2026, 12, 5, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
         pa.array([0] * n, pa.int32())],
        schema=pa.schema([pa.field(f.name, t) for f, t in zip(kafka_schema(False).fields, [
            pa.binary(), pa.binary(), pa.string(), pa.int32(), pa.int64(), pa.timestamp("us", tz="UTC"), pa.int32()])]))


def _queries():
    parsed = F.from_json(F.col("value").cast("string"), SCHEMA).alias("e")
    return {
        "from_json and its fields": lambda df: df.select(parsed).select("e.*"),
        "to_json of what from_json read": lambda df: df.select(parsed).select(F.to_json("e").alias("j")),
        "filter, arithmetic and casts": lambda df: (
            df.select(parsed).select("e.*").where((F.col("id") % 2 == 1) | F.col("n").isNull())
            .select("id", (F.col("id") * 3 + 1).alias("a"), (F.col("price") / 4).alias("b"),
                    F.col("n").cast("long").alias("c"), F.col("id").cast("string").alias("d"),
                    (-F.col("id")).alias("neg"), F.expr("0.908 * id").alias("dec"),
                    F.expr("amount + 1.5").alias("dec_add"), F.col("ok").cast("string").alias("okt"))),
        "conditions": lambda df: (
            df.select(parsed).select("e.*")
            .select(F.when(F.col("n") > 0, "pos").when(F.col("n") < 0, "neg").otherwise("zero").alias("sign"),
                    F.coalesce("name", F.lit("none")).alias("name"), F.col("id").isin(1, 3, 5).alias("odd"),
                    F.col("id").eqNullSafe(F.lit(None).cast("long")).alias("nulls"),
                    F.upper("name").alias("up"), F.concat("name", F.lit("!")).alias("bang"),
                    (F.col("ok") & (F.col("id") > 1)).alias("both"), (~F.col("ok")).alias("nope"),
                    F.col("inner.s").alias("s"))),
        "kafka columns out": lambda df: (
            df.select(parsed).where(F.col("e.id").isNotNull())
            .select(F.col("e.id").cast("string").cast("binary").alias("key"),
                    F.to_json(F.struct("e.id", "e.name", "e.at", "e.price")).cast("binary").alias("value"))),
    }


QUERY_NAMES = ["from_json and its fields", "to_json of what from_json read", "filter, arithmetic and casts",
               "conditions", "kafka columns out"]


@pytest.mark.parametrize("name", QUERY_NAMES)
def test_the_tasks_steps_answer_as_spark(spark, name):
    """The steps a real-time task evaluates over Arrow (``plan.arrow_steps``) against
    Spark's own evaluation of the same rows, in both ANSI modes."""
    build = _queries()[name]
    records = _records(VALUES)
    for ansi in ("true", "false"):
        spark.conf.set("spark.sql.ansi.enabled", ansi)
        try:
            frame = spark.createDataFrame(records.to_pandas(), kafka_schema(False))
            template = build(spark.createDataFrame([], kafka_schema(False)))
            steps: ArrowSteps = steps_of(template, spark)
            expected = [r.asDict(recursive=True) for r in build(frame).collect()]
            got = steps(records).to_pylist()
            assert _comparable(got) == _comparable(expected), (ansi, name)
        finally:
            spark.conf.unset("spark.sql.ansi.enabled")


def _comparable(rows: list[dict]) -> list:
    def norm(v):
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, float) and v != v:
            return "NaN"
        if isinstance(v, dt.datetime):
            return v.astimezone(dt.timezone.utc).replace(tzinfo=None) if v.tzinfo else v
        if isinstance(v, (bytes, bytearray)):
            return bytes(v)
        return v
    return [norm(r) for r in rows]


def test_doubles_are_written_as_java_writes_them():
    cases = {0.1: "0.1", 100.0: "100.0", 1e7: "1.0E7", 1e-3: "0.001", 1e-4: "1.0E-4", 123456.789: "123456.789",
             -2.5e-10: "-2.5E-10", 1.0: "1.0", 9999999.0: "9999999.0", 12345678.9: "1.23456789E7"}
    assert {v: java_double_text(v) for v in cases} == cases


def test_a_step_the_tasks_cannot_evaluate_is_refused_by_name(spark):
    from microbatch.errors import UnsupportedOperationError
    empty = spark.createDataFrame([], kafka_schema(False))
    with pytest.raises(UnsupportedOperationError, match="Sha2.*processingTime"):
        steps_of(empty.select(F.sha2(F.col("value"), 256).alias("value")), spark)


# -- queries through a real broker -------------------------------------------------------------------
EVENT = "id LONG, kind STRING, amount DOUBLE, at TIMESTAMP"


def _produce(broker, topic: str, first: int, count: int, partitions: int) -> None:
    kinds = ["card", "wire", "cash"]
    broker.produce(topic, [(json.dumps(
        {"id": i, "kind": kinds[i % 3], "amount": i * 1.5, "at": f"2026-12-05T10:00:{i % 60:02d}.000Z"}).encode(),
        str(i).encode(), i % partitions) for i in range(first, first + count)])


def _query(frame):
    e = F.from_json(F.col("value").cast("string"), EVENT).alias("e")
    return (frame.select(e, "partition").where(F.col("e.kind") != "cash")
            .select(F.col("e.id").cast("string").alias("key"),
                    F.to_json(F.struct("e.id", "e.kind", (F.col("e.amount") * 2).alias("double"), "e.at",
                                       "partition")).alias("value")))


def _reader(ss, broker, topic: str):
    return (ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load())


def _writer(frame, broker, topic: str, ckpt: str):
    return (_query(frame).writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", topic).option("kafka.linger.ms", "1").option("checkpointLocation", ckpt)
            .option("kafka.batch.num.messages", 1))     # (Tansu's latest-offset quirk)


@pytest.fixture
def short_batches(spark):
    spark.conf.set("spark.sql.streaming.realTimeMode.minBatchDuration", "1000ms")
    yield
    spark.conf.unset("spark.sql.streaming.realTimeMode.minBatchDuration")


def test_a_real_time_query_writes_the_micro_batch_rows_and_resumes(ss, spark, broker, tmp_path, short_batches):
    """The same records through a real-time query and a micro-batch query of microbatch
    give the same records out; each real-time batch logs and commits the offsets its
    tasks reached; a restart goes on from the last commit without loss or repeat."""
    source, rt_out, mb_out = "rt-in", "rt-out", "rt-out-mb"
    for topic, parts in ((source, 3), (rt_out, 2), (mb_out, 2)):
        broker.create_topic(topic, parts)
    _produce(broker, source, 0, 300, 3)
    ckpt = str(tmp_path / "rt")
    query = _writer(_reader(ss, broker, source), broker, rt_out, ckpt).outputMode("update") \
        .trigger(realTime="2 seconds").start()
    try:
        wait_for(lambda: len(broker.read_all(rt_out)) >= 200, 60, "the first records out")
        _produce(broker, source, 300, 150, 3)      # (while a batch runs: read as they arrive)
        wait_for(lambda: len(broker.read_all(rt_out)) >= 300, 60, "the records produced later")
    finally:        # (in the middle of a batch: its tasks end early and it commits, Spark's would not)
        query.stop()
    assert query.exception() is None
    progress = [p for p in query.recentProgress if p.numInputRows]
    assert sum(p.numInputRows for p in query.recentProgress) == len(broker.read_all(source)) == 450
    assert {"e2eLatencyMs.P99", "processingLatencyMs.P50"} <= set(progress[-1].sink.metrics)
    offsets = json.loads(open(f"{ckpt}/offsets/{progress[-1].batchId}").read().splitlines()[-1])
    assert offsets == {source: {"0": 150, "1": 150, "2": 150}}

    _produce(broker, source, 450, 60, 3)
    with_ui = StreamingSession(spark, ui_port=0)    # (the restart on a session with the dashboard's /metrics)
    try:
        again = _writer(_reader(with_ui, broker, source), broker, rt_out, ckpt).outputMode("update") \
            .trigger(realTime="1 second").start()
        wait_for(lambda: len(broker.read_all(rt_out)) >= 340, 60, "the records after the restart")
        wait_for(lambda: sum(p.numInputRows for p in again.recentProgress) == 60, 60, "every record committed")

        def latencies() -> dict:
            with urllib.request.urlopen(with_ui.ui_url + "metrics", timeout=10) as response:
                families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
            return {(s.labels["kind"], s.labels["percentile"]): s.value
                    for s in families["microbatch_real_time_latency_ms"].samples if s.labels["query_id"] == again.id}
        gauges = wait_for(lambda: len(latencies()) == 15 and latencies(), 30, "the latencies on /metrics")
        assert 0 <= gauges[("processingLatencyMs", "P50")] <= gauges[("processingLatencyMs", "P99")]
        again.stop()
    finally:
        with_ui.stop()
    real_time = collections.Counter((r.key(), r.value()) for r in broker.read_all(rt_out))

    mb = _writer(_reader(ss, broker, source), broker, mb_out, str(tmp_path / "mb")).trigger(availableNow=True).start()
    mb.awaitTermination(120)
    assert mb.exception() is None
    micro_batch = collections.Counter((r.key(), r.value()) for r in broker.read_all(mb_out))
    assert len(micro_batch) == 340 and max(micro_batch.values()) == 1
    assert real_time == micro_batch


def _union_query(ss, broker, topics: tuple[str, str]):
    """Two Kafka sources, each with steps of its own, in a union; the second read twice
    (a branch of its own over each half of its records)."""
    cards, wires = (_query(_reader(ss, broker, topic)) for topic in topics)
    flagged = wires.select("key", F.concat(F.lit("w:"), F.col("value")).alias("value"))
    return cards.union(flagged.where(F.col("key").cast("int") % 2 == 0)).union(
        flagged.where(F.col("key").cast("int") % 2 == 1).select("key", F.upper("value").alias("value")))


def test_a_union_of_sources_in_real_time_mode_gives_the_micro_batch_rows(ss, broker, tmp_path, short_batches):
    """Spark's real-time mode runs a union of sources: each source's tasks read its
    partitions and run the branches that read it, all of the batch's tasks at once; each
    source's end offsets are logged and committed; a restart goes on from them. The rows
    are a micro-batch query's of the same records."""
    topics, rt_out, mb_out = ("rt-union-a", "rt-union-b"), "rt-union-out", "rt-union-out-mb"
    for topic, parts in ((topics[0], 2), (topics[1], 1), (rt_out, 2), (mb_out, 2)):
        broker.create_topic(topic, parts)
    _produce(broker, topics[0], 0, 60, 2)
    _produce(broker, topics[1], 1000, 40, 1)

    def start(out: str, ckpt: str, **trigger):
        return (_union_query(ss, broker, topics).writeStream.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", out)
                .option("kafka.linger.ms", "1").option("kafka.batch.num.messages", 1)
                .option("checkpointLocation", ckpt).outputMode("update").trigger(**trigger).start())
    ckpt = str(tmp_path / "rt")
    query = start(rt_out, ckpt, realTime="1 second")
    try:
        wait_for(lambda: len(broker.read_all(rt_out)) >= 67, 60, "the first records out")
    finally:
        query.stop()
    assert query.exception() is None
    committed = [p for p in query.recentProgress if p.numInputRows]
    assert sum(p.numInputRows for p in query.recentProgress) == 100
    assert [len(p.sources) for p in committed] == [2] * len(committed)
    logged = open(f"{ckpt}/offsets/{committed[-1].batchId}").read().splitlines()[-2:]
    assert [json.loads(line) for line in logged] == [{topics[0]: {"0": 30, "1": 30}}, {topics[1]: {"0": 40}}]
    _produce(broker, topics[0], 60, 20, 2)
    _produce(broker, topics[1], 1040, 10, 1)
    again = start(rt_out, ckpt, realTime="1 second")
    try:
        wait_for(lambda: sum(p.numInputRows for p in again.recentProgress) == 30, 60, "the records after the restart")
    finally:
        again.stop()
    assert again.exception() is None
    real_time = collections.Counter((r.key(), r.value()) for r in broker.read_all(rt_out))
    mb = start(mb_out, str(tmp_path / "mb"), availableNow=True)
    mb.awaitTermination(120)
    assert mb.exception() is None
    micro_batch = collections.Counter((r.key(), r.value()) for r in broker.read_all(mb_out))
    assert len(micro_batch) == 87 and max(micro_batch.values()) == 1     # (cash, a third of the cards, filtered)
    assert real_time == micro_batch
    assert {v[:2] for _, v in micro_batch} == {b'{"', b"w:", b"W:"}    # (each branch's rows)


def test_spark_refuses_what_real_time_mode_does_not_run(ss, spark, broker, tmp_path, short_batches):
    broker.create_topic("rt-refusals", 1)
    frame = _reader(ss, broker, "rt-refusals")

    def start(writer, **trigger):
        return writer.option("checkpointLocation", str(tmp_path / "c")).trigger(**trigger).start()

    kafka = _writer(frame, broker, "rt-refusals", str(tmp_path / "k"))
    with pytest.raises(AnalysisException) as e:
        start(kafka.outputMode("append"), realTime="1 second")
    assert e.value.getCondition() == "STREAMING_REAL_TIME_MODE.OUTPUT_MODE_NOT_SUPPORTED"
    with pytest.raises(Exception) as e:
        start(kafka.outputMode("update"), realTime="500 milliseconds")
    assert e.value.getCondition() == "INVALID_STREAMING_REAL_TIME_MODE_TRIGGER_INTERVAL"
    with pytest.raises(Exception) as e:
        start(_query(frame).writeStream.outputMode("update").foreachBatch(lambda df, i: None), realTime="1 second")
    assert e.value.getCondition() == "STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST"
    assert "ForeachBatchSink" in str(e.value)
    spark.conf.set("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
    try:
        with pytest.raises(Exception) as e:
            start(_query(frame).writeStream.outputMode("update").format("noop"), realTime="1 second")
        assert e.value.getCondition() == "STREAMING_REAL_TIME_MODE.SINK_NOT_SUPPORTED"
    finally:
        spark.conf.unset("spark.sql.streaming.realTimeMode.allowlistCheck")
    rate = ss.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS value")
    with pytest.raises(Exception) as e:
        start(rate.writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("topic", "x").outputMode("update"), realTime="1 second")
    assert e.value.getCondition() == "STREAMING_REAL_TIME_MODE.INPUT_STREAM_NOT_SUPPORTED"
    union = _query(frame).union(_query(frame))   # (microbatch's own: its exactly-once ids are input positions)
    with pytest.raises(UnsupportedOperationError, match="exactlyOnce does not take a union"):
        start(union.writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("topic", "x").option("microbatch.exactlyOnce", "true").outputMode("update"), realTime="1 second")
    counts = frame.groupBy("partition").count().selectExpr("CAST(count AS STRING) AS value")
    with pytest.raises(Exception) as e:
        start(counts.writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("topic", "x").outputMode("update"), realTime="1 second")
    assert e.value.getCondition() == "STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST"


def test_a_real_time_query_into_foreach_gives_the_micro_batch_rows(ss, broker, tmp_path, short_batches):
    """Spark's real-time mode writes to ``foreach`` too: the writer is opened once a task's
    batch and gets each row as its record arrives."""
    import glob
    class LinesWriter:     # (defined here: pickled by value to the workers)
        """Each opened partition's rows as JSON lines in a file of its own."""

        def __init__(self, directory: str):
            self.directory = directory

        def open(self, partition_id, epoch_id):
            import uuid
            self.file = open(f"{self.directory}/{epoch_id}-{partition_id}-{uuid.uuid4().hex}.jsonl", "w")
            return True

        def process(self, row):
            self.file.write(json.dumps(row.asDict(recursive=True), default=str) + "\n")

        def close(self, error):
            self.file.close()

    source = "rt-foreach"
    broker.create_topic(source, 2)
    _produce(broker, source, 0, 120, 2)

    def rows(directory) -> collections.Counter:
        return collections.Counter(line for path in glob.glob(f"{directory}/*.jsonl") for line in open(path))

    def frame():
        e = F.from_json(F.col("value").cast("string"), EVENT).alias("e")
        return _reader(ss, broker, source).select(e, "offset").where("e.kind <> 'wire'").select("e.*", "offset")
    rt, mb = tmp_path / "rt", tmp_path / "mb"
    rt.mkdir()
    mb.mkdir()
    query = frame().writeStream.foreach(LinesWriter(str(rt))).outputMode("update") \
        .option("checkpointLocation", str(tmp_path / "rt-ckpt")).trigger(realTime="1 second").start()
    try:
        wait_for(lambda: sum(rows(rt).values()) >= 80, 60, "the rows in the writer's files")
        assert query.exception() is None
    finally:
        query.stop()
    batch = frame().writeStream.foreach(LinesWriter(str(mb))).option("checkpointLocation", str(tmp_path / "mb-ckpt")) \
        .trigger(availableNow=True).start()
    batch.awaitTermination(120)
    assert rows(rt) == rows(mb) and sum(rows(mb).values()) == 80


def _shown_rows(printed: str) -> dict[int, collections.Counter]:
    """The rows the console sink printed, by batch: each table line but the header."""
    batches: dict[int, collections.Counter] = {}
    batch = None
    for line in printed.splitlines():
        if line.startswith("Batch: "):
            batch = int(line.split()[1])
            batches[batch] = collections.Counter()
            header = True
        elif batch is not None and line.startswith("|"):
            if header:
                header = False
                continue
            batches[batch][line] += 1
    return batches


def test_a_real_time_query_into_the_console_shows_the_micro_batch_rows(ss, broker, tmp_path, short_batches, capfd):
    """Spark's real-time mode writes to the console too: a batch's rows are shown when the
    batch ends, as the console sink shows a micro-batch's."""
    source = "rt-console"
    broker.create_topic(source, 2)
    _produce(broker, source, 0, 60, 2)

    def frame():
        e = F.from_json(F.col("value").cast("string"), EVENT).alias("e")
        return _reader(ss, broker, source).select(e, "partition", "offset").where("e.kind <> 'wire'") \
            .select("e.*", "partition", "offset")

    def writer(frame_, checkpoint):
        return frame_.writeStream.format("console").option("numRows", 1000).option("truncate", False) \
            .option("checkpointLocation", str(tmp_path / checkpoint))
    capfd.readouterr()
    query = writer(frame(), "rt").outputMode("update").trigger(realTime="1 second").start()
    try:
        wait_for(lambda: sum(p.numInputRows for p in query.recentProgress) >= 60, 60, "every record in a batch")
        assert query.exception() is None
    finally:
        query.stop()
    real_time = _shown_rows(capfd.readouterr().out)
    progress = {p.batchId: p.sink.numOutputRows for p in query.recentProgress}
    assert all(sum(real_time[b].values()) == n for b, n in progress.items()), (real_time, progress)
    batch = writer(frame(), "mb").trigger(availableNow=True).start()
    batch.awaitTermination(120)
    assert batch.exception() is None
    micro_batch = _shown_rows(capfd.readouterr().out)
    shown = sum(real_time.values(), collections.Counter())
    assert shown == sum(micro_batch.values(), collections.Counter()) and sum(shown.values()) == 40
