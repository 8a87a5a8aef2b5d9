"""The file sink: output that vanilla Spark reads exactly once, through ``_spark_metadata``."""
from __future__ import annotations

import glob
import logging
import os
import shutil

import pytest
from pyspark.sql import functions as F

from file_inputs import write_json_files
from helpers import confs
from microbatch.checkpoint.fs import FailingFileSystem, InjectedFailure
from microbatch.spark_internals import running_version
from pyspark.errors import AnalysisException, IllegalArgumentException, StreamingQueryException


def start_json_to_parquet(ss, src, out, ckpt, fs=None, max_files=2):
    frame = (ss.readStream.format("json").schema("id INT, name STRING")
             .option("maxFilesPerTrigger", max_files).load(str(src)))
    writer = (frame.where("id % 2 = 0").withColumn("double", F.col("id") * 2)
              .writeStream.format("parquet").option("checkpointLocation", str(ckpt))
              .trigger(availableNow=True))
    if fs is not None:
        writer = writer.fileSystem(fs)
    return writer.start(str(out))


def expected_rows(rows):
    return sorted((r["id"], r["name"], r["id"] * 2) for r in rows if r["id"] % 2 == 0)


def vanilla_rows(spark, out):
    return sorted(tuple(r) for r in spark.read.parquet(str(out)).select("id", "name", "double").collect())


def run_to_end(query):
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    assert not query.isActive


def test_json_to_parquet_exactly_once_for_vanilla_spark(ss, spark, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    rows = write_json_files(src, 0, 5)
    query = start_json_to_parquet(ss, src, out, ckpt)
    run_to_end(query)
    assert sorted(os.listdir(ckpt / "commits")) == ["0", "1", "2"], "5 files, 2 per batch"
    assert vanilla_rows(spark, out) == expected_rows(rows)
    assert [p["numInputRows"] for p in query.recentProgress] == [6, 6, 3]

    # A stray parquet file (say, from a crashed writer) in the output directory is not read...
    stray_dir = tmp_path / "stray"
    spark.range(7).selectExpr("CAST(id AS INT) AS id", "'stray' AS name", "0 AS double") \
        .coalesce(1).write.parquet(str(stray_dir))
    stray = glob.glob(str(stray_dir / "part-*.parquet"))[0]
    shutil.copy(stray, out / "part-00000-ffffffff-0000-0000-0000-000000000000-c000.snappy.parquet")
    assert spark.read.parquet(stray).count() == 7, "the stray file itself is readable"
    assert vanilla_rows(spark, out) == expected_rows(rows)

    # ...and new input after a restart is appended once.
    rows += write_json_files(src, 5, 3)
    query = start_json_to_parquet(ss, src, out, ckpt)
    run_to_end(query)
    assert sorted(os.listdir(ckpt / "commits"), key=int) == ["0", "1", "2", "3", "4"]
    assert vanilla_rows(spark, out) == expected_rows(rows)
    first = query.recentProgress[0]["sources"][0]
    # (PySpark before 4.2 gives a source's offsets in a progress's dict view as Python's repr)
    assert [str(first[k]).replace("'", '"') for k in ("startOffset", "endOffset")] == \
        ['{"logOffset": 2}', '{"logOffset": 3}']
    assert query.recentProgress[-1]["sink"]["description"] == f"FileSink[file:{out}]"


@pytest.mark.parametrize("fmt", ["json", "csv", "orc", "text"])
def test_formats_and_partition_by(ss, spark, tmp_path, fmt):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = write_json_files(src, 0, 2)
    frame = ss.readStream.format("json").schema("id INT, name STRING").load(str(src))
    if fmt == "text":
        frame = frame.select(F.col("id").cast("string").alias("value"), "name")
    query = (frame.writeStream.format(fmt).partitionBy("name").option("header", "true")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
             .start(str(out)))
    run_to_end(query)
    assert sorted(os.listdir(out)) == ["_spark_metadata", "name=n0", "name=n1"]
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").schema("id INT, name STRING")
    got = reader.load(str(out)).collect()
    first = "value" if fmt == "text" else "id"
    assert sorted((int(r[first]), r["name"]) for r in got) == sorted((r["id"], r["name"]) for r in rows)


def test_already_committed_batch_is_skipped(ss, spark, tmp_path, caplog):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    rows = write_json_files(src, 0, 4)
    run_to_end(start_json_to_parquet(ss, src, out, ckpt))
    log_files = sorted(os.listdir(out / "_spark_metadata"))
    os.remove(ckpt / "commits" / "1")  # as if the query died after the sink, before commits/1
    with caplog.at_level(logging.INFO, logger="microbatch.sinks.file"):
        run_to_end(start_json_to_parquet(ss, src, out, ckpt))
    assert "Skipping already committed batch 1" in caplog.text
    assert sorted(os.listdir(out / "_spark_metadata")) == log_files
    assert os.path.exists(ckpt / "commits" / "1")
    assert vanilla_rows(spark, out) == expected_rows(rows)


def test_failed_log_write_leaves_output_as_it_was_and_restart_resumes(ss, spark, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    rows = write_json_files(src, 0, 4)
    failing = FailingFileSystem(lambda op, path: path.endswith("/_spark_metadata/1"))
    query = start_json_to_parquet(ss, src, out, ckpt, fs=failing)
    with pytest.raises(StreamingQueryException, match="injected failure: create .*_spark_metadata/1"):
        query.awaitTermination(120)
    assert isinstance(query.exception().__cause__, InjectedFailure)
    # Batch 1's files were written and moved into place, but no log lists them.
    assert len(glob.glob(str(out / "part-*"))) > 2
    assert vanilla_rows(spark, out) == expected_rows(rows[:6])
    assert sorted(os.listdir(ckpt / "commits")) == ["0"]
    dead_attempt = out / "_microbatch_staging" / "batch-1-dead"  # as a SIGKILLed writer leaves it
    dead_attempt.mkdir(parents=True)
    (dead_attempt / "part-00000-dead.snappy.parquet").write_bytes(b"partial")
    run_to_end(start_json_to_parquet(ss, src, out, ckpt))
    assert vanilla_rows(spark, out) == expected_rows(rows)
    assert not os.path.exists(out / "_microbatch_staging")


def test_compaction_and_log_size_in_progress(ss, spark, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    rows = write_json_files(src, 0, 7)
    with confs(spark, {"spark.sql.streaming.fileSink.log.compactInterval": "3"}):
        query = start_json_to_parquet(ss, src, out, ckpt, max_files=1)
        run_to_end(query)
    assert sorted(os.listdir(out / "_spark_metadata"), key=lambda n: int(n.split(".")[0])) == [
        "0", "1", "2.compact", "3", "4", "5.compact", "6"]
    metrics = [p["sink"]["metrics"] for p in query.recentProgress]
    assert [m["metadataLogFiles"] for m in metrics] == [str(n) for n in range(1, 8)]
    sizes = [sum(os.path.getsize(out / "_spark_metadata" / n) for n in os.listdir(out / "_spark_metadata"))]
    assert metrics[-1]["metadataLogBytes"] == str(sizes[0])
    assert vanilla_rows(spark, out) == expected_rows(rows)


def test_retention_drops_expired_entries_at_compaction(ss, spark, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    write_json_files(src, 0, 3)
    with confs(spark, {"spark.sql.streaming.fileSink.log.compactInterval": "3"}):
        frame = ss.readStream.format("json").schema("id INT, name STRING").option("maxFilesPerTrigger", 1).load(str(src))
        query = (frame.writeStream.format("parquet").option("retention", "1ms")
                 .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start(str(out)))
        run_to_end(query)
    with open(out / "_spark_metadata" / "1") as f:
        assert f.read().count("\n") >= 1, "batch 1 listed its files"
    with open(out / "_spark_metadata" / "2.compact") as f:
        assert f.read() == "v1", "every entry was older than the retention at compaction"


def test_sink_configuration_errors(ss, tmp_path):
    src = tmp_path / "in"
    write_json_files(src, 0, 1)
    frame = ss.readStream.format("json").schema("id INT, name STRING").load(str(src))
    ckpt = str(tmp_path / "ckpt")
    unsupported = (r"STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE.*update" if running_version().at_least_4
                   else r"^Data source parquet does not support update output mode\.$")   # Spark 3.5's
    with pytest.raises(AnalysisException, match=unsupported):
        frame.writeStream.format("parquet").outputMode("update").option("checkpointLocation", ckpt).start(str(tmp_path / "o"))
    with pytest.raises(IllegalArgumentException, match="'path' is not specified"):
        frame.writeStream.format("parquet").option("checkpointLocation", ckpt).start()
    with pytest.raises(AnalysisException, match=r"Partition column zz not found in existing columns \(id, name\)"):
        frame.writeStream.format("parquet").partitionBy("zz").option("checkpointLocation", ckpt).start(str(tmp_path / "o"))
    with pytest.raises(AnalysisException, match="Text data source supports only a single column"):
        frame.writeStream.format("text").option("checkpointLocation", ckpt).start(str(tmp_path / "o"))
    with pytest.raises(AnalysisException, match="checkpointLocation must be specified"):
        frame.writeStream.format("parquet").start(str(tmp_path / "o"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(AnalysisException, match="Cannot write to the output directory"):
        frame.writeStream.format("parquet").option("checkpointLocation", ckpt).start(str(blocker / "out"))
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(AnalysisException, match="Permission denied"):
            frame.writeStream.format("parquet").option("checkpointLocation", ckpt).start(str(locked / "out"))
    assert not ss.streams.active
