"""The file source and sink logs next to the ones Spark's own engine writes for the same input."""
from __future__ import annotations

import json
import os

from pyspark.sql import functions as F

from file_inputs import write_json_files

SCHEMA = "id INT, name STRING"


def transform(frame):
    return (frame.where("id % 2 = 0").withColumn("double", F.col("id") * 2)
            .withColumn("bucket", F.col("id") % 3))


def run_query(reader_session, src, out, ckpt):
    frame = (reader_session.readStream.format("json").schema(SCHEMA)
             .option("maxFilesPerTrigger", 2).load(str(src)))
    query = (transform(frame).writeStream.format("parquet").partitionBy("bucket")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start(str(out)))
    query.awaitTermination(300)
    assert query.exception() is None


def log_names(directory) -> list[str]:
    """Log file names in Spark's order of batches, without Hadoop's .crc files."""
    names = [n for n in os.listdir(directory) if not n.endswith(".crc") and not n.startswith(".")]
    return sorted(names, key=lambda n: int(n.split(".")[0]))


def read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_file_logs_match_sparks_own_engine(spark, ss, tmp_path):
    src = tmp_path / "in"
    write_json_files(src, 0, 22)  # 11 batches of 2 files: the logs compact at batch 9
    theirs, ours = tmp_path / "spark", tmp_path / "microbatch"
    run_query(spark, src, theirs / "out", theirs / "ckpt")
    run_query(ss, src, ours / "out", ours / "ckpt")

    # The offset log: the same batches, with the same file source offsets.
    assert log_names(ours / "ckpt" / "offsets") == log_names(theirs / "ckpt" / "offsets")
    for name in log_names(theirs / "ckpt" / "offsets"):
        assert (read(ours / "ckpt" / "offsets" / name).split("\n")[2]
                == read(theirs / "ckpt" / "offsets" / name).split("\n")[2] == f'{{"logOffset":{name}}}')

    # The file source log: the same files, and byte for byte the same text.
    source_logs = log_names(theirs / "ckpt" / "sources" / "0")
    assert source_logs == [str(n) for n in range(9)] + ["9.compact", "10"]
    assert log_names(ours / "ckpt" / "sources" / "0") == source_logs
    for name in source_logs:
        assert read(ours / "ckpt" / "sources" / "0" / name) == read(theirs / "ckpt" / "sources" / "0" / name), name

    # The file sink log: the same layout and line format; the paths, sizes and times
    # of course are those of each engine's own files.
    sink_logs = log_names(theirs / "out" / "_spark_metadata")
    assert log_names(ours / "out" / "_spark_metadata") == sink_logs == source_logs
    for name in sink_logs:
        their_lines = read(theirs / "out" / "_spark_metadata" / name).split("\n")
        our_lines = read(ours / "out" / "_spark_metadata" / name).split("\n")
        assert our_lines[0] == their_lines[0] == "v1"
        assert len(our_lines) == len(their_lines), name
        for engine, lines in ((ours, our_lines), (theirs, their_lines)):
            for line in lines[1:]:
                entry = json.loads(line)
                assert list(entry) == ["path", "size", "isDir", "modificationTime",
                                       "blockReplication", "blockSize", "action"]
                assert entry["path"].startswith(f"file://{engine / 'out'}/bucket=")
                assert os.path.getsize(entry["path"][len("file://"):]) == entry["size"]
                assert (entry["isDir"], entry["blockReplication"], entry["blockSize"], entry["action"]) == (
                    False, 1, 33554432, "add")
                assert line == json.dumps(entry, separators=(",", ":"))

    # And vanilla Spark reads the same rows from both outputs.
    def rows(out):
        return sorted(map(tuple, spark.read.parquet(str(out)).select("id", "name", "double", "bucket").collect()))

    assert rows(ours / "out") == rows(theirs / "out")
    assert len(rows(ours / "out")) == 44  # two even ids in each of 22 files

    # microbatch's file source reads Spark's sink output through its _spark_metadata log.
    with open(theirs / "out" / "part-00000-00000000-0000-0000-0000-000000000000-c000.snappy.parquet", "wb") as f:
        f.write(b"not parquet: a reader listing the directory would fail on this stray file")
    frame = ss.readStream.schema("id INT, name STRING, double INT, bucket INT").parquet(str(theirs / "out"))
    query = (frame.writeStream.format("memory").queryName("spark_sink_output")
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(map(tuple, spark.table("spark_sink_output").collect())) == rows(ours / "out")


def test_microbatch_continues_a_file_checkpoint_spark_wrote(spark, ss, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    rows = write_json_files(src, 0, 4)
    run_query(spark, src, out, ckpt)            # Spark: batches 0 and 1
    rows += write_json_files(src, 4, 3)
    run_query(ss, src, out, ckpt)               # microbatch: batches 2 and 3, the new files only
    assert log_names(ckpt / "commits") == ["0", "1", "2", "3"]
    assert log_names(out / "_spark_metadata") == ["0", "1", "2", "3"]
    assert read(ckpt / "sources" / "0" / "2").count("batchId") == 2
    got = sorted(map(tuple, spark.read.parquet(str(out)).select("id", "name", "double", "bucket").collect()))
    assert got == sorted((r["id"], r["name"], r["id"] * 2, r["id"] % 3) for r in rows if r["id"] % 2 == 0)
