"""Streams from and into catalog tables (readStream.table, writeStream.toTable) and
temporary views over streams, side by side with Spark's own engine."""
from __future__ import annotations

import os
import uuid

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from file_inputs import write_json_files

SCHEMA = "id INT, name STRING"


def source(session, src):
    return (session.readStream.format("json").schema(SCHEMA).option("maxFilesPerTrigger", 1).load(src)
            .withColumn("bucket", F.col("id") % 2))


def to_table(frame, table, ckpt, **kwargs):
    writer = frame.writeStream.option("checkpointLocation", str(ckpt)).trigger(availableNow=True)
    for method, args in kwargs.items():
        writer = getattr(writer, method)(*args)
    query = writer.toTable(table)
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def table_rows(spark, table):
    return sorted(tuple(r) for r in spark.table(table).collect())


def describe(spark, table) -> dict:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
    return {r.col_name: r.data_type for r in rows if r.col_name in ("Provider", "Type")}


@pytest.fixture
def names():
    suffix = uuid.uuid4().hex[:8]
    return lambda name: f"{name}_{suffix}"


def test_to_table_creates_the_table_as_spark_does(spark, ss, tmp_path, names):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 3)
    layouts = {"plain": {}, "partitioned": {"partitionBy": ("bucket",), "format": ("json",)},
               "clustered": {"clusterBy": ("bucket",)}}
    for layout, kwargs in layouts.items():
        for engine, session in (("spark", spark), ("microbatch", ss)):
            to_table(source(session, src), names(f"{layout}_{engine}"), tmp_path / layout / engine, **kwargs)
        theirs, ours = names(f"{layout}_spark"), names(f"{layout}_microbatch")
        assert table_rows(spark, ours) == table_rows(spark, theirs) and len(table_rows(spark, ours)) == 9
        assert describe(spark, ours) == describe(spark, theirs)
        shown = spark.sql(f"SHOW CREATE TABLE {ours}").collect()[0][0]
        assert shown.replace(ours, "T") == spark.sql(f"SHOW CREATE TABLE {theirs}").collect()[0][0].replace(theirs, "T")
    # a second run appends the new files' rows to the existing table
    write_json_files(src, 3, 1)
    to_table(source(ss, src), names("plain_microbatch"), tmp_path / "plain" / "microbatch")
    spark.catalog.refreshTable(names("plain_microbatch"))   # Spark caches a table's file list
    assert len(table_rows(spark, names("plain_microbatch"))) == 12


def test_to_table_refuses_what_spark_refuses(spark, ss, tmp_path, names):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 1)
    spark.range(1).createOrReplaceTempView(names("batch_view"))
    to_table(source(spark, src), names("existing"), tmp_path / "existing")
    for engine, session in (("spark", spark), ("microbatch", ss)):
        frame = source(session, src)
        cases = {
            "_LEGACY_ERROR_TEMP_1192": lambda frame=frame: frame.writeStream.format("json").toTable(names("existing")),
            "_LEGACY_ERROR_TEMP_1190": lambda frame=frame: frame.writeStream.toTable(names("batch_view")),
            "SPECIFY_CLUSTER_BY_WITH_PARTITIONED_BY_IS_NOT_ALLOWED":
                lambda frame=frame, engine=engine:
                    frame.writeStream.clusterBy("bucket").partitionBy("bucket").toTable(names(f"both_{engine}")),
        }
        for error_class, call in cases.items():
            with pytest.raises(AnalysisException) as raised:
                call()
            assert raised.value.getCondition() == error_class, (engine, str(raised.value))
            for query in session.streams.active:
                query.stop()


def test_read_stream_table_reads_new_files_batch_by_batch(spark, ss, tmp_path, names):
    spark.sql(f"CREATE TABLE {names('events')} (id INT, name STRING, bucket INT) USING json "
              "PARTITIONED BY (bucket)")
    for i in range(3):
        spark.createDataFrame([(i * 10 + j, f"n{i}", i % 2) for j in range(2)], "id INT, name STRING, bucket INT") \
            .write.insertInto(names("events"))
    location = spark.sql(f"DESCRIBE TABLE EXTENDED {names('events')}").where("col_name = 'Location'") \
        .collect()[0].data_type.removeprefix("file:")
    data_files = sorted(os.path.join(d, f) for d, _, fs in os.walk(location) for f in fs if f.endswith(".json"))
    for i, path in enumerate(data_files):   # distinct modification times: one order for both engines
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    batches = {}
    for engine, session in (("spark", spark), ("microbatch", ss)):
        frame = session.readStream.option("maxFilesPerTrigger", 2).table(names("events"))
        assert frame.isStreaming and frame.schema.simpleString() == spark.table(names("events")).schema.simpleString()
        collected = []
        query = (frame.writeStream.foreachBatch(lambda df, i, c=collected: c.append(sorted(map(tuple, df.collect()))))
                 .option("checkpointLocation", str(tmp_path / engine)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        batches[engine] = (collected, query.lastProgress.sources[0].description)
    assert batches["microbatch"][0] == batches["spark"][0]
    assert sum(len(b) for b in batches["spark"][0]) == 6 and len(batches["spark"][0]) > 1
    assert batches["microbatch"][1] == batches["spark"][1]


def test_a_table_streamed_is_read_whole_after_more_batches(spark, ss, tmp_path, names):
    """Defining ``readStream.table(t)`` leaves no relation of ``t`` in the session's cache
    with the files of that moment: ``spark.table(t)`` after later batches reads them all
    (Spark's streaming read of a table caches none)."""
    src = str(tmp_path / "in")
    write_json_files(src, 0, 3)
    to_table(source(ss, src), names("t"), tmp_path / "ckpt")
    # (no spark.table(t) here: a batch read caches the file list in Spark too)
    ss.readStream.table(names("t"))   # (defined, not started)
    write_json_files(src, 3, 2)
    to_table(source(ss, src), names("t"), tmp_path / "ckpt")
    assert len(table_rows(spark, names("t"))) == 15


def test_read_stream_table_errors_as_spark(spark, ss, names):
    spark.range(1).createOrReplaceTempView(names("batch_only"))
    for session in (spark, ss):
        for table, error_class in ((names("no_such_table"), "TABLE_OR_VIEW_NOT_FOUND"),
                                   (names("batch_only"), "_LEGACY_ERROR_TEMP_1008")):
            with pytest.raises(AnalysisException) as raised:
                session.readStream.table(table)
            assert raised.value.getCondition() == error_class


def test_temp_view_over_a_stream(ss, tmp_path, names):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 2)
    source(ss, src).where("id > 0").createOrReplaceTempView(names("live"))
    frame = ss.readStream.table(names("live")).select("id")
    query = (frame.writeStream.format("memory").queryName(names("sink"))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert sorted(r.id for r in ss.spark.table(names("sink")).collect()) == [1, 2, 100, 101, 102]
    with pytest.raises(AnalysisException) as raised:
        source(ss, src).createTempView(names("live"))
    assert raised.value.getCondition() == "TEMP_TABLE_OR_VIEW_ALREADY_EXISTS"
