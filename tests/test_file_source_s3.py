"""The file source with its input on S3 (moto's server): listed through s3fs, each batch's
files read in Spark tasks (this Spark has no hadoop-aws: parquet with pyarrow, json and
csv by Spark's own parser over the files' lines), the checkpoint on S3 too. Each query is
compared batch by batch with Spark's engine reading the same files copied to local disk,
with the copies' modification times set to the objects' (the order files are taken in)."""
from __future__ import annotations

import io
import os

import boto3
import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, s3_lake, sorted_rows
from stream_events import comparable

BUCKET = "lake"


@pytest.fixture
def lake(spark):
    with s3_lake(spark, BUCKET) as options:
        yield boto3.client("s3", endpoint_url=options["AWS_ENDPOINT_URL"], aws_access_key_id="moto",
                           aws_secret_access_key="moto-secret", region_name="us-east-1")


def put(client, local_root, key: str, data: bytes, order: int = 0) -> None:
    """The object ``s3a://lake/<key>``, and its copy at ``<local_root>/<key>`` with the
    object's modification time plus ``order`` seconds. S3 keeps whole seconds, so objects
    put in the same second tie, and microbatch takes tied files in path order (S3's
    listing order, which Spark's stable sort by time keeps too); Spark's engine here sees
    local modification times in whole seconds and takes tied files in the directory's
    order, so the copies are put ``order`` seconds apart to make that order the same."""
    client.put_object(Bucket=BUCKET, Key=key, Body=data)
    modified = client.head_object(Bucket=BUCKET, Key=key)["LastModified"].timestamp() + order
    local = os.path.join(local_root, key)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    with open(local, "wb") as f:
        f.write(data)
    os.utime(local, (modified, modified))


def json_lines(rows) -> bytes:
    return "".join(f'{{"id": {i}, "ts": "2026-01-01 00:00:{s:02d}"}}\n' for i, s in rows).encode()


def csv_text(rows) -> bytes:
    return ("id;ts\n" + "".join(f"{i};2026-01-01 00:00:{s:02d}\n" for i, s in rows)).encode()


def parquet_bytes(rows) -> bytes:
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"id": pa.array([i for i, _ in rows], pa.int32()),
                      "ts": pa.array([datetime.datetime(2026, 1, 1, 0, 0, s) for _, s in rows], pa.timestamp("us", tz="UTC"))})
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


#: per file, (id, second) events: windows of 10 s closing as the watermark (10 s) passes them
FILES = [[(1, 1), (2, 4)], [(3, 12), (4, 3)], [(5, 25)], [(6, 31), (7, 22)], [(8, 47)]]


def windowed(frame):
    return (frame.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()
            .select(F.col("window.start").cast("string").alias("start"), "count"))


def reader(session, fmt: str, **options):
    frame = session.readStream.format(fmt).option("maxFilesPerTrigger", 1).schema("id INT, ts TIMESTAMP")
    for key, value in options.items():
        frame = frame.option(key, value)
    return frame


def both(ss, spark, tmp_path, fmt: str, prefix: str, ckpt: str, **options):
    """(microbatch's batches and progress over s3a://lake/<prefix>, Spark's over the copy)."""
    ours = collect_batches(windowed(reader(ss, fmt, **options).load(f"s3a://{BUCKET}/{prefix}")),
                           ckpt, "append")
    theirs = collect_batches(windowed(reader(spark, fmt, **options).load(str(tmp_path / "copy" / prefix))),
                             tmp_path / f"spark-{prefix.replace('/', '-')}", "append")
    return ours, theirs


def metrics_of(progress) -> list:
    return [p["sources"][0].get("metrics") for p in progress]


@pytest.mark.parametrize("fmt, encode, options", [
    ("json", json_lines, {}),
    # (the slowest here, about 70 s: in make test-extended; CI's run reads csv with a header and
    # a separator from S3 in test_partition_directories_on_s3)
    pytest.param("csv", csv_text, {"header": "true", "sep": ";"}, marks=pytest.mark.extended),
    ("parquet", parquet_bytes, {}),
])
def test_files_on_s3_to_a_windowed_count_as_spark_reads_them(ss, spark, lake, tmp_path, fmt, encode, options):
    prefix = f"raw-{fmt}"
    for i, rows in enumerate(FILES):
        put(lake, tmp_path / "copy", f"{prefix}/f{i}.{fmt}", encode(rows), i)
    (ours, our_progress), (theirs, their_progress) = both(
        ss, spark, tmp_path, fmt, prefix, f"s3a://{BUCKET}/ckpt-{fmt}", **options)
    assert ours == theirs
    assert len([p for p in our_progress if p["numInputRows"]]) == len(FILES)    # maxFilesPerTrigger 1
    assert comparable(our_progress) == comparable(their_progress)
    assert {m["readPath"] for m in metrics_of(our_progress)} == {"pythonTasks"}
    assert our_progress[0]["sources"][0]["description"] == f"FileStreamSource[s3a://{BUCKET}/{prefix}]"


def test_partition_directories_on_s3(ss, spark, lake, tmp_path):
    """``day=N`` directories become a column (typed as Spark infers it), pathGlobFilter
    picks the files, hidden names are skipped."""
    for i, rows in enumerate(FILES):
        put(lake, tmp_path / "copy", f"parts/day={1 if i < 2 else 2}/f{i}.csv", csv_text(rows), i)
    put(lake, tmp_path / "copy", "parts/day=1/_ignored.csv", csv_text([(99, 1)]))
    put(lake, tmp_path / "copy", "parts/day=1/f9.txt", csv_text([(98, 1)]))

    def read(session, path):
        frame = (session.readStream.format("csv").schema("id INT, ts TIMESTAMP").option("header", "true")
                 .option("sep", ";").option("pathGlobFilter", "*.csv").option("maxFilesPerTrigger", 2).load(path))
        return frame.groupBy("day").agg(F.count("*").alias("n"), F.sum("id").alias("ids"))

    ours, _ = collect_batches(read(ss, f"s3a://{BUCKET}/parts"), f"s3a://{BUCKET}/ckpt-parts", "complete")
    theirs, _ = collect_batches(read(spark, str(tmp_path / "copy" / "parts")), tmp_path / "spark-parts", "complete")
    assert ours == theirs
    assert ours[-1][1] == [(1, 4, 10), (2, 4, 26)]


def test_a_restart_on_the_same_checkpoint_takes_only_new_files(ss, spark, lake, tmp_path):
    for i, rows in enumerate(FILES[:3]):
        put(lake, tmp_path / "copy", f"again/f{i}.json", json_lines(rows), i)
    ckpt = f"s3a://{BUCKET}/ckpt-again"
    first = both(ss, spark, tmp_path, "json", "again", ckpt)
    for i, rows in enumerate(FILES[3:], start=3):
        put(lake, tmp_path / "copy", f"again/f{i}.json", json_lines(rows), i)
    second = both(ss, spark, tmp_path, "json", "again", ckpt)
    assert first[0][0] == first[1][0] and second[0][0] == second[1][0]
    assert [p["batchId"] for p in second[0][1]][0] == first[0][1][-1]["batchId"] + 1
    assert sum(p["numInputRows"] for p in second[0][1]) == sum(len(rows) for rows in FILES[3:])


def test_incremental_listing_lists_only_keys_after_the_last_read(ss, spark, lake, tmp_path):
    """``useIncrementalListing``: after a restart the listing returns the new objects only
    (S3's StartAfter from the greatest key of the source's log), a hidden object among
    them is skipped, and the batches equal Spark's engine's full listings of the copies."""
    for i, rows in enumerate(FILES[:3]):
        put(lake, tmp_path / "copy", f"inc/f{i}.json", json_lines(rows), i)
    ckpt = f"s3a://{BUCKET}/ckpt-inc"
    first = both(ss, spark, tmp_path, "json", "inc", ckpt, useIncrementalListing="true")
    assert {m["filesListed"] for m in metrics_of(first[0][1])} == {"3"}
    for i, rows in enumerate(FILES[3:], start=3):
        put(lake, tmp_path / "copy", f"inc/f{i}.json", json_lines(rows), i)
    put(lake, tmp_path / "copy", "inc/_hidden.json", json_lines([(99, 1)]), 9)
    second = both(ss, spark, tmp_path, "json", "inc", ckpt, useIncrementalListing="true")
    assert first[0][0] == first[1][0] and second[0][0] == second[1][0]
    assert comparable(second[0][1]) == comparable(second[1][1])
    assert {m["filesListed"] for m in metrics_of(second[0][1])} == {"2"}    # f3, f4 (not _hidden: it sorts first)
    assert sum(p["numInputRows"] for p in second[0][1]) == sum(len(rows) for rows in FILES[3:])


def test_incremental_listing_is_refused_where_it_cannot_list_so(ss, lake, tmp_path):
    put(lake, tmp_path / "copy", "nested/day=1/f0.json", json_lines([(1, 1)]))
    (tmp_path / "local").mkdir()
    for path, named in ((f"s3a://{BUCKET}/raw-*", "a glob pattern"), (str(tmp_path / "local"), "not on such a store"),
                        (f"s3a://{BUCKET}/nested", "has subdirectories")):
        stream = reader(ss, "json", useIncrementalListing="true").load(path)
        with pytest.raises(Exception, match=named):
            collect_batches(stream, tmp_path / f"ckpt-{len(named)}")


def test_spark_parser_options_hold_for_json_on_s3(ss, spark, lake, tmp_path):
    """Spark's parser reads the lines: a malformed line lands in columnNameOfCorruptRecord
    as Spark's file reader puts it; DROPMALFORMED drops it."""
    data = b'{"id": 1, "ts": "2026-01-01 00:00:01"}\n{"id": oops\n\n{"id": 3}\r\n'
    put(lake, tmp_path / "copy", "odd/f0.json", data)
    for options in ({"columnNameOfCorruptRecord": "bad"}, {"mode": "DROPMALFORMED"}):
        def read(session, path, options=options):
            return session.readStream.schema("id INT, ts TIMESTAMP, bad STRING").options(**options).json(path)
        name = "-".join(options.values())
        ours, _ = collect_batches(read(ss, f"s3a://{BUCKET}/odd"), tmp_path / f"ours-{name}", rows=sorted_rows)
        theirs, _ = collect_batches(read(spark, str(tmp_path / "copy" / "odd")), tmp_path / f"spark-{name}",
                                    rows=sorted_rows)
        assert ours == theirs


def test_clean_source_on_s3_archives_and_deletes(ss, lake, tmp_path):
    """A batch's files are cleaned when the next batch starts (Spark's source.commit), so
    the last batch's file stays."""
    for i, rows in enumerate(FILES[:2]):
        put(lake, tmp_path / "copy", f"clean/f{i}.json", json_lines(rows))
        put(lake, tmp_path / "copy", f"gone/f{i}.json", json_lines(rows))

    def keys(prefix):
        return sorted(o["Key"] for o in lake.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))

    archived = reader(ss, "json", cleanSource="archive", sourceArchiveDir=f"s3a://{BUCKET}/archive")
    batches, _ = collect_batches(archived.load(f"s3a://{BUCKET}/clean"), tmp_path / "c1")
    assert sum(len(rows) for _, rows in batches) == 4
    assert keys("clean/") == ["clean/f1.json"] and keys("archive/") == ["archive/clean/f0.json"]
    batches, _ = collect_batches(reader(ss, "json", cleanSource="delete").load(f"s3a://{BUCKET}/gone"),
                                 tmp_path / "c2")
    assert sum(len(rows) for _, rows in batches) == 4 and keys("gone/") == ["gone/f1.json"]
    with pytest.raises(Exception, match="same file system"):
        reader(ss, "json", cleanSource="archive", sourceArchiveDir="s3a://elsewhere/archive") \
            .load(f"s3a://{BUCKET}/clean").writeStream.format("console") \
            .option("checkpointLocation", str(tmp_path / "c3")).start().awaitTermination(60)


@pytest.mark.parametrize("fmt, options, named", [
    ("orc", {}, "format 'orc'"),
    ("json", {"multiLine": "true"}, "multiLine=true"),
])
def test_what_tasks_cannot_read_is_refused_naming_it(ss, lake, fmt, options, named):
    lake.put_object(Bucket=BUCKET, Key="refused/f0.json", Body=b"{}\n")
    with pytest.raises(Exception, match=named):
        ss.readStream.format(fmt).schema("id INT").options(**options).load(f"s3a://{BUCKET}/refused")


def test_the_reader_is_chosen_by_whether_spark_has_a_connector_for_the_scheme(spark, lake):
    """This Spark has Hadoop's local file system but not hadoop-aws's S3A: the source on
    s3a:// reads in Python tasks (the test above sees ``readPath``); a missing path in
    the bucket fails as Spark's PATH_NOT_FOUND, naming it."""
    from microbatch.spark_internals.file_text import has_hadoop_file_system
    assert has_hadoop_file_system(spark, "file") and not has_hadoop_file_system(spark, "s3a")


def test_a_missing_path_on_s3_is_named(ss, lake):
    with pytest.raises(Exception, match="PATH_NOT_FOUND.*s3a://lake/nowhere"):
        ss.readStream.schema("id INT").json(f"s3a://{BUCKET}/nowhere")


def test_gzip_json_and_a_text_stream_on_s3(ss, spark, lake, tmp_path):
    """A .gz file is decompressed as Hadoop's codec does; the text format gives the lines."""
    import gzip
    put(lake, tmp_path / "copy", "gz/f0.json.gz", gzip.compress(json_lines(FILES[0] + FILES[1])))
    put(lake, tmp_path / "copy", "lines/f0.txt", b"one\r\ntwo\n\nthree")

    def read(session, fmt, path):
        frame = session.readStream.format(fmt)
        return (frame if fmt == "text" else frame.schema("id INT, ts TIMESTAMP")).load(path)
    for fmt, prefix in (("json", "gz"), ("text", "lines")):
        ours, _ = collect_batches(read(ss, fmt, f"s3a://{BUCKET}/{prefix}"), tmp_path / f"ours-{fmt}")
        theirs, _ = collect_batches(read(spark, fmt, str(tmp_path / "copy" / prefix)), tmp_path / f"spark-{fmt}")
        assert ours == theirs and len(ours[0][1]) == 4
