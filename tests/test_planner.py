"""The planner (``runtime.incremental.IncrementalExecution``): what it decides once per run
(operator ids, state locations, numbers of state stores, rewrites) and per batch (each
operator's watermarks, whether another batch must run)."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.runtime.incremental import IncrementalExecution, PreparedSegment
from microbatch.runtime.watermarks import OperatorWatermarks, WatermarkTracker
from microbatch.operators.aggregate.node import Aggregate
from microbatch.operators.dedup import Deduplicate
from microbatch.operators.join import StreamJoin
from microbatch.plan.logical import Transform, Watermark


def planner(spark, frame, mode="append", partitions=4):
    empty = {r: spark.createDataFrame([], r.schema) for r in frame._plan.relations()}
    return IncrementalExecution(spark, frame._plan, checkpoint_root="/ckpt", shuffle_partitions=partitions,
                                output_mode=mode, empty_inputs=empty)


def tracker(plan: IncrementalExecution) -> WatermarkTracker:
    """The watermark of the run ``plan`` plans (as the batch runner makes it)."""
    watermarks = WatermarkTracker()
    watermarks.plan(plan.plan, plan.watermark_nodes, [op.node for op in plan.operators])
    return watermarks


@pytest.fixture
def events(ss, tmp_path):
    (tmp_path / "in").mkdir()
    return lambda: ss.readStream.schema("id INT, ts TIMESTAMP, v STRING").json(str(tmp_path / "in"))


def test_operators_get_spark_ids_top_down_with_their_state_and_stores(spark, events):
    frame = (events().withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"])
             .groupBy(F.window("ts", "10 seconds")).count()
             .groupBy(F.window(F.window_time("window"), "1 minute")).agg(F.sum("count")))
    plan = planner(spark, frame)
    assert [(op.id, op.name, type(op.node)) for op in plan.operators] == [
        (0, "stateStoreSave", Aggregate), (1, "stateStoreSave", Aggregate), (2, "dedupe", Deduplicate)]
    assert [op.state_location for op in plan.operators] == ["/ckpt/state/0", "/ckpt/state/1", "/ckpt/state/2"]
    assert [op.num_state_stores for op in plan.operators] == [4, 4, 4]
    limited = planner(spark, events().limit(3))
    assert [(op.name, op.num_state_stores) for op in limited.operators] == [("globalLimit", 1)]
    total = planner(spark, events().groupBy().count(), mode="complete")
    assert [(op.name, op.num_state_stores) for op in total.operators] == [("stateStoreSave", 1)]
    assert "opId = 2, ver = 7, numPartitions = 4]" in plan.explain_string("run", 7).splitlines()[-3]
    # printed once per run, each batch with its own version (and another run with its id)
    assert plan.explain_string("run", 8) == plan.explain_string("run", 7).replace("ver = 7", "ver = 8")
    assert "runId = other, opId = 2, ver = 0," in plan.explain_string("other", -1)


def test_each_operator_gets_its_own_watermarks(spark, events):
    """Above a join with a time range, an aggregation uses the join's output watermark
    (the smallest state watermark: the left rows wait 20 s for right rows); an operator
    with no watermark below it gets none."""
    left = events().withColumnRenamed("ts", "lts").withWatermark("lts", "10 seconds")
    right = events().select(F.col("id").alias("rid"), F.col("ts").alias("rts")).withWatermark("rts", "10 seconds")
    joined = left.join(right, F.expr("id = rid AND lts >= rts AND lts <= rts + interval 20 seconds"))
    counted = joined.groupBy(F.window("lts", "10 seconds")).count()
    plan = planner(spark, counted)
    aggregate, join = (op.node for op in plan.operators)
    assert isinstance(join, StreamJoin)
    second = 1_000
    watermarks = tracker(plan).operator_watermarks(late_ms=100 * second, eviction_ms=130 * second)
    assert watermarks[join] == OperatorWatermarks(100 * second, 130 * second)
    # the left side's state watermark: lts >= rts, so a left row can still meet right rows
    # down to the watermark; the right side's: rts >= lts - 20 s, 20 s behind
    assert watermarks[aggregate] == OperatorWatermarks(80 * second - 1, 110 * second - 1)
    plain = planner(spark, events().groupBy("id").count(), mode="update")
    assert tracker(plain).input_watermarks(5_000) == {plain.operators[0].node: None}


@pytest.mark.parametrize("build, mode, runs", [
    (lambda e: e.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count(), "append", True),
    (lambda e: e.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count(), "complete", False),
    (lambda e: e.withWatermark("ts", "10 seconds").dropDuplicates(["id"]), "append", True),
    (lambda e: e.groupBy("id").count(), "update", False),   # no watermark below it
    (lambda e: e.withWatermark("ts", "10 seconds").limit(2), "append", False),
    # a join that never evicts: no watermarked key, no time range
    (lambda e: e.withWatermark("ts", "10 seconds").join(e.withWatermark("ts", "10 seconds"), ["id"]),
     "append", False),
])
def test_another_batch_runs_by_each_operators_rule(spark, events, build, mode, runs):
    watermarks = tracker(planner(spark, build(events()), mode))
    assert watermarks.requires_another_batch(mode, new_watermark_ms=20_000, eviction_ms=10_000) is runs
    assert watermarks.requires_another_batch(mode, new_watermark_ms=10_000, eviction_ms=10_000) is False


def test_a_filter_that_skips_the_event_time_moves_below_the_watermark_once(spark, events, monkeypatch):
    calls = []
    decide = spark_internals.filter_can_skip_column
    monkeypatch.setattr(spark_internals, "filter_can_skip_column",
                        lambda df, column: calls.append(column) or decide(df, column))
    pushed = planner(spark, events().withWatermark("ts", "10 seconds").filter("id % 2 = 0"))
    # the stateless steps of a run are one prepared segment (analysed once, bound per batch)
    assert isinstance(pushed.plan, Watermark) and isinstance(pushed.plan.child, PreparedSegment)
    assert isinstance(pushed.plan.child.template, Transform)
    kept = planner(spark, events().withWatermark("ts", "10 seconds").filter("ts > '2026-01-01'"))
    assert isinstance(kept.plan, PreparedSegment) and isinstance(kept.plan.template, Transform)
    assert kept.plan.template.child is kept.plan.holes[0] and isinstance(kept.plan.holes[0], Watermark)
    assert calls == ["ts", "ts"]
    # a conjunction: the part without the event time runs below, the rest stays above
    split = planner(spark, events().withWatermark("ts", "10 seconds").filter("id % 2 = 0 AND ts > '2026-01-01'"))
    above, watermark = split.plan.template, split.plan.holes[0]
    assert isinstance(watermark, Watermark) and "ts" in str(above.args[0]) and "id" not in str(above.args[0])
    assert "id" in str(watermark.child.template.args[0]) and "ts" not in str(watermark.child.template.args[0])


def test_a_split_filter_moves_the_watermark_as_in_spark(spark, ss, tmp_path):
    """Rows that fail the part without the event time never reach the watermark, in
    both engines: the same watermarks in every offsets and commits entry, the same rows."""
    from test_chained_differential import same_as_spark
    from stream_events import EVENTS, id_and_time, write_event_files
    events = write_event_files(tmp_path / "events", EVENTS, id_and_time)   # (conftest's events: another here)
    same_as_spark(spark, ss, events, tmp_path, "a conjunction over a watermark", (
        "append", lambda f: f.withWatermark("ts", "10 seconds").where("id < 6 AND ts >= '2026-01-01 00:00:00'")
        .groupBy(F.window("ts", "10 seconds")).count()))


def test_the_run_is_planned_once_not_per_batch(ss, tmp_path, monkeypatch):
    """Three batches, a restart, two more batches: two plans, one per run."""
    import microbatch.runtime.micro_batch as micro_batch
    made = []
    real = micro_batch.IncrementalExecution

    class Counting(real):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(micro_batch, "IncrementalExecution", Counting)
    src = tmp_path / "in"
    src.mkdir()

    def run_with(files):
        for name in files:
            (src / name).write_text('{"id": 1, "ts": "2026-01-01 00:00:10"}\n')
        frame = (ss.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(str(src))
                 .withWatermark("ts", "10 seconds").filter("id > 0").groupBy("id").count())
        query = (frame.writeStream.format("noop").outputMode("update")
                 .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return [p["batchId"] for p in query.recentProgress]

    assert run_with(["a.json", "b.json", "c.json"]) == [0, 1, 2]
    assert len(made) == 1
    assert run_with(["d.json", "e.json"]) == [3, 4]
    assert len(made) == 2


def dataframes_made_per_batch(monkeypatch) -> list[int]:
    """Patch PySpark and the planner so that each batch's plan build appends the number
    of DataFrames it made (Spark analyses every DataFrame PySpark makes)."""
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
    import microbatch.runtime.micro_batch as micro_batch
    made: list[int] = []
    per_batch: list[int] = []
    real_init = ClassicDataFrame.__init__
    real_build = micro_batch.IncrementalExecution.batch

    def counting_init(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    def counting_build(self, *args, **kwargs):
        before = len(made)
        df = real_build(self, *args, **kwargs)
        per_batch.append(len(made) - before)
        return df

    monkeypatch.setattr(ClassicDataFrame, "__init__", counting_init)
    monkeypatch.setattr(micro_batch.IncrementalExecution, "batch", counting_build)
    return per_batch


def test_a_batch_binds_its_inputs_into_steps_analysed_once_per_run(ss, tmp_path, monkeypatch):
    """Spark analyses every DataFrame PySpark makes. A batch makes the same number of
    DataFrames whether the query has 1 or 40 stateless steps: the steps are analysed once
    per run (``PreparedSegment``) and a batch only binds its inputs into them."""
    per_batch = dataframes_made_per_batch(monkeypatch)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.json").write_text("".join(
            f'{{"id": {j}, "ts": "2026-01-01 00:00:{10 * i + j % 10:02d}"}}\n' for j in range(20)))

    def run(steps: int, name: str) -> tuple[list[int], list]:
        per_batch.clear()
        frame = ss.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(str(src))
        for i in range(steps):
            frame = frame.withColumn(f"c{i}", F.col("id") + i).filter(F.col("id") >= -i)
        frame = frame.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds")).agg(
            F.count("c0").alias("n")).select("window.start", "n")
        query = (frame.writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return list(per_batch), sorted(tuple(r) for r in ss.spark.table(name).collect())

    short_counts, short_rows = run(1, "short")
    long_counts, long_rows = run(40, "long")
    assert len(long_counts) == len(short_counts) >= 5   # 4 data batches and a no-data batch
    # every batch after the first (which may analyse the steps once more, if its input's
    # columns differ from the template's) makes as many as the short query's; replaying the
    # 80 steps would make 80 more
    assert long_counts[1:] == short_counts[1:]
    assert max(long_counts[1:]) < 40
    assert long_rows == short_rows and len(long_rows) == 3


def _count_per_key(frame):
    def count(key, pdfs, state):   # nested: the workers get it by value, not from this module
        import pandas as pd
        total = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
        state.update((total,))
        yield pd.DataFrame({"id": [key[0]], "n": [total]})
    return frame.groupBy("id").applyInPandasWithState(count, "id INT, n LONG", "n LONG", "update", "NoTimeout")


STATEFUL_QUERIES = {
    "window count": (1, "append", lambda f, g: f.withWatermark("ts", "5 seconds")
                     .groupBy(F.window("ts", "10 seconds")).count()),
    "dedup and a limit": (2, "append", lambda f, g: f.withWatermark("ts", "5 seconds")
                          .dropDuplicates(["id", "ts"]).limit(30)),
    "stream-stream join": (1, "append", lambda f, g: f.withWatermark("ts", "5 seconds").join(
        g.withWatermark("ts", "5 seconds").withColumnRenamed("ts", "ts2").withColumnRenamed("v", "v2"), "id")),
    "applyInPandasWithState": (1, "update", lambda f, g: _count_per_key(f)),
    "session window": (1, "append", lambda f, g: f.withWatermark("ts", "5 seconds")
                       .groupBy("id", F.session_window("ts", "3 seconds")).count()),
}


@pytest.mark.parametrize("name", list(STATEFUL_QUERIES))
def test_stateful_steps_are_analysed_once_per_run_and_bound_per_batch(ss, tmp_path, monkeypatch, name):
    """Each stateful step (its Spark steps around the task on the state store) is analysed
    once per run over a placeholder (``PreparedStep``); a batch binds its input and its
    task, which carries the batch's state version and watermarks. Five batches make no
    more analyses than one, and every batch after the first makes the same few DataFrames."""
    import microbatch.operators.base as stateful
    operators, mode, build = STATEFUL_QUERIES[name]
    prepared: list[int] = []

    class CountingStep(stateful.PreparedStep):
        def __init__(self, *args, **kwargs):
            prepared.append(1)
            super().__init__(*args, **kwargs)

    per_batch = dataframes_made_per_batch(monkeypatch)
    monkeypatch.setattr(stateful, "PreparedStep", CountingStep)
    for side in ("left", "right"):
        (tmp_path / side).mkdir()
        for i in range(4):
            (tmp_path / side / f"{i}.json").write_text("".join(
                f'{{"id": {j}, "ts": "2026-01-01 00:00:{10 * i + j % 10:02d}", "v": "{side}"}}\n'
                for j in range(20)))

    def source(side):
        return (ss.readStream.schema("id INT, ts TIMESTAMP, v STRING").option("maxFilesPerTrigger", 1)
                .json(str(tmp_path / side)))

    query = (build(source("left"), source("right")).writeStream.format("memory").queryName("prepared")
             .outputMode(mode).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert len(per_batch) >= 4
    assert ss.spark.table("prepared").count() > 0
    # one analysis per stateful operator in the run, not one per batch
    assert len(prepared) == operators
    # from the second batch on, a batch makes the same DataFrames (its sources', its
    # observations', one binding per prepared part of the plan), fewer than the first,
    # which analysed each operator's Spark steps
    assert len(set(per_batch[1:])) == 1, per_batch
    assert per_batch[1] < per_batch[0], per_batch


def test_a_rate_micro_batch_batch_comes_from_a_plan_made_once_with_the_same_columns(spark):
    """``rate-micro-batch`` makes each batch from a plan analysed once: the rows, types and
    partitions of ``spark.range`` under the source's projection, and the same output
    attributes every batch (what lets a prepared plan bind it without new aliases)."""
    batches = spark_internals.RangeBatches(spark, 3)
    first = spark_internals.analyzed_plan(batches.dataframe(0, 5, 0)).output()
    for start, end, timestamp_ms in [(5, 17, 1000), (17, 18, 1_767_225_600_123)]:
        made = batches.dataframe(start, end, timestamp_ms)
        expected = spark.range(start, end, 1, 3).selectExpr(f"timestamp_millis({timestamp_ms}) AS timestamp",
                                                             "id AS value")
        assert made.schema == expected.schema
        assert made.collect() == expected.collect()
        assert made.rdd.getNumPartitions() == 3
        assert spark_internals.analyzed_plan(made).output().equals(first)


def test_placeholders_are_local_relations_of_the_exact_schema_and_jvm_names_are_looked_up_once(spark):
    """A prepared plan's placeholders are empty local relations with the schema's exact
    types and nullability, as ``createDataFrame([], schema)`` gives them without its RDD;
    an empty batch is an RDD's, made in the JVM, which the optimizer keeps; ``jvm_class``
    resolves a JVM name once per JVM."""
    from pyspark.sql.types import (ArrayType, DecimalType, IntegerType, MapType, StringType, StructField,
                                   StructType, TimestampType)
    schema = StructType([StructField("a", IntegerType(), False), StructField("b", StringType(), True),
                         StructField("c", ArrayType(StructType([StructField("x", TimestampType())]), False)),
                         StructField("d", MapType(StringType(), DecimalType(10, 2)))])
    for wanted in (schema, StructType([])):
        empty = spark_internals.empty_dataframe(spark, wanted)
        assert empty.schema == wanted == spark.createDataFrame([], wanted).schema
        assert empty.collect() == []
        assert spark_internals.analyzed_plan(empty).getClass().getSimpleName() == "LocalRelation"
    # a batch without rows is an RDD's, as createDataFrame makes it: the steps above it stay
    batch = spark_internals.empty_batch(spark, schema)
    assert batch.schema == schema and batch.collect() == []
    assert batch.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    for empty, kept in ((batch, True), (spark_internals.empty_dataframe(spark, schema), False)):
        grouped = empty.groupBy("b").count()
        assert ("LogicalRDD" in grouped._jdf.queryExecution().optimizedPlan().toString()) is kept
        assert grouped.collect() == []
    project = spark_internals.jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project")
    assert spark_internals.jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project") is project
    assert spark_internals.jvm_class("scala.None$").isEmpty()


def test_steps_that_only_project_rows_and_keep_a_column_are_told_apart_by_their_plan(spark):
    """``projections_keep_column``: whether steps over a DataFrame (here a rate-micro-batch
    batch, itself a projection) leave each of its rows one row and its column as it is
    (the stateful operator above can then compute the watermark's statistics)."""
    below = spark_internals.RangeBatches(spark, 2).dataframe(0, 10, 1000)
    keeps = {
        "a new column": (below.withColumn("k", F.col("value") % 3), True),
        "renames, a drop and an alias": (below.withColumnRenamed("value", "v").drop("v").alias("a"), True),
        "a select of the column": (below.select("timestamp"), True),
        "the column recomputed": (below.withColumn("timestamp", F.col("timestamp") + F.expr("INTERVAL 1 SECOND")), False),
        "the column dropped": (below.drop("timestamp"), False),
        "another column renamed to it": (below.drop("timestamp").withColumnRenamed("value", "timestamp"), False),
        "a filter": (below.withColumn("k", F.lit(1)).filter("value > 3"), False),
        "rows exploded": (below.select("timestamp", F.explode(F.array("value", "value"))), False),
    }
    assert {name: spark_internals.projections_keep_column(df, below, "TimeStamp")
            for name, (df, _) in keeps.items()} == {name: keep for name, (_, keep) in keeps.items()}


def test_a_batch_whose_inputs_keep_their_columns_is_bound_without_new_projections(ss, tmp_path, monkeypatch):
    """A prepared plan binds each input under a projection that gives the input's columns
    the placeholder's attribute ids. When the input's attributes are those of the batch
    before (a bound plan's output, a ``rate-micro-batch`` batch), the projection's columns
    are not made again (a few py4j round trips per column): in a stream-stream join of two
    rate streams, every binding after the first batch reuses them, and the join is right."""
    per_batch = dataframes_made_per_batch(monkeypatch)
    made: list[tuple[int, int]] = []     # (batch, projections made by one binding)
    real_bind = spark_internals.BindablePlan.bind

    def counting_bind(self, inputs, functions=None):
        before = list(self._projections)
        df = real_bind(self, inputs, functions)
        made.append((len(per_batch), sum(1 for old, new in zip(before, self._projections) if old is not new)))
        return df

    monkeypatch.setattr(spark_internals.BindablePlan, "bind", counting_bind)

    def side(prefix):
        return (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 50).option("numPartitions", 2)
                .option("advanceMillisPerBatch", 1000).option("startTimestamp", 1_767_225_600_000).load()
                .withColumnRenamed("value", f"{prefix}value").withColumnRenamed("timestamp", f"{prefix}ts")
                .withWatermark(f"{prefix}ts", "2 seconds"))

    joined = side("l").join(side("r"), F.expr("lvalue = rvalue AND lts BETWEEN rts AND rts + INTERVAL 1 SECOND"))
    query = (joined.writeStream.format("memory").queryName("rate_join")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="0 seconds").start())
    try:
        while len(query.recentProgress) < 5 and query.exception() is None:
            query.awaitTermination(0.2)
    finally:
        query.stop()
    assert query.exception() is None
    first = [n for batch, n in made if batch == 0]
    second = [n for batch, n in made if batch == 1]
    later = [n for batch, n in made if batch >= 1]
    assert len(second) >= 3 and sum(first) > 0, made      # the sides, their watermarks, the join
    assert sum(later) == 0, made
    rows = ss.spark.table("rate_join").collect()
    assert len(rows) >= 4 * 50
    assert sorted(r.lvalue for r in rows) == list(range(len(rows)))   # every row met its twin once
    assert all(r.lvalue == r.rvalue and r.lts == r.rts for r in rows)
