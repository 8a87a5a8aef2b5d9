"""The file source: Spark's schema rules, listing, read limits, options, clean-up, bad input."""
from __future__ import annotations

import os

import pytest

from pyspark.errors import AnalysisException, IllegalArgumentException, StreamingQueryException

from file_inputs import BASE_MTIME, write_json_files
from helpers import confs
from microbatch.checkpoint.fs import FailingFileSystem
from microbatch.errors import UnsupportedOperationError
from microbatch.sinks.memory import MemorySink


def run(frame, ckpt, sink=None, fs=None, trigger=None):
    """Run ``frame`` with availableNow into a MemorySink; return the sink and the query."""
    sink = sink or MemorySink(frame._session.spark, frame.schema, "append")
    writer = frame.writeStream.sink(sink).option("checkpointLocation", str(ckpt))
    writer = writer.trigger(**(trigger or {"availableNow": True}))
    if fs is not None:
        writer = writer.fileSystem(fs)
    query = writer.start()
    query.awaitTermination(120)
    return sink, query


def ids(rows):
    return sorted(r["id"] for r in rows)


def write_lines(path, lines, mtime=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


# -- schema -----------------------------------------------------------------------
def test_schema_rules_match_sparks_own_file_stream(ss, spark, tmp_path):
    src = tmp_path / "in"
    write_lines(str(src / "k=1" / "a.json"), ['{"id": 1, "name": "a"}'])
    write_lines(str(src / "k=2" / "b.json"), ['{"id": 2, "name": "b"}'])
    cases = [("json", "id INT, name STRING"), ("json", "k STRING, id INT"), ("text", None)]
    for fmt, schema in cases:
        ours = ss.readStream.format(fmt)
        theirs = spark.readStream.format(fmt)
        if schema:
            ours, theirs = ours.schema(schema), theirs.schema(schema)
        assert ours.load(str(src)).schema == theirs.load(str(src)).schema, (fmt, schema)
    with pytest.raises(IllegalArgumentException, match="Schema must be specified when creating a streaming source"):
        ss.readStream.format("json").load(str(src))
    with confs(spark, {"spark.sql.streaming.schemaInference": "true"}):
        assert (ss.readStream.json(str(src)).schema
                == spark.readStream.json(str(src)).schema)


def test_parquet_takes_the_files_schema(ss, spark, tmp_path):
    src = tmp_path / "pq"
    spark.range(3).selectExpr("id", "CAST(id AS STRING) AS s").write.parquet(str(src))
    assert ss.readStream.parquet(str(src)).schema.simpleString() == "struct<id:bigint,s:string>"
    sink, _ = run(ss.readStream.parquet(str(src)), tmp_path / "ckpt")
    assert ids(sink.all_data()) == [0, 1, 2]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IllegalArgumentException, match="Schema must be specified"):
        ss.readStream.parquet(str(empty))


def test_missing_path_and_bad_options_fail_at_load(ss, tmp_path):
    with pytest.raises(AnalysisException, match=r"\[PATH_NOT_FOUND\] Path does not exist: .*nope"):
        ss.readStream.schema("id INT").json(str(tmp_path / "nope"))
    # A glob that matches nothing yet is fine, as in Spark.
    assert ss.readStream.schema("id INT").json(str(tmp_path / "later-*")).schema.fieldNames() == ["id"]
    bad = [({"maxFilesPerTrigger": "0"}, "Invalid value '0' for option 'maxFilesPerTrigger', must be a positive integer"),
           ({"maxBytesPerTrigger": "x"}, "Invalid value 'x' for option 'maxBytesPerTrigger'"),
           ({"maxFilesPerTrigger": "1", "maxBytesPerTrigger": "10"}, "can't be both set at the same time"),
           ({"cleanSource": "shred"}, "Invalid mode for clean source option"),
           ({"cleanSource": "archive"}, "Archive mode must be used with 'sourceArchiveDir' option"),
           ({"latestFirst": "yes"}, "Invalid value 'yes' for option 'latestFirst', must be 'true' or 'false'"),
           ({"modifiedBefore": "2020-01-01T00:00:00"}, "option 'modifiedBefore' is not allowed in file stream sources")]
    for options, message in bad:
        with pytest.raises(IllegalArgumentException, match=message.replace("(", r"\(").replace(")", r"\)")):
            ss.readStream.schema("id INT").options(**options).json(str(tmp_path))
    with pytest.raises(UnsupportedOperationError, match="hdfs://.*is on a file system microbatch cannot reach here"):
        ss.readStream.schema("id INT").json("hdfs://namenode/in")


# -- listing ----------------------------------------------------------------------
def test_hidden_files_globs_and_partition_columns(ss, tmp_path):
    src = tmp_path / "in"
    write_lines(str(src / "k=1" / "a.json"), ['{"id": 1}'])
    write_lines(str(src / "k=2" / "b.json"), ['{"id": 2}'])
    write_lines(str(src / "k=2" / "c[1] {x}.txt"), ['{"id": 3}'])  # glob characters in a name
    for hidden in ("_tmp.json", ".hidden.json", "k=1/_SUCCESS", "k=1/d.json._COPYING_", "_staging/e.json"):
        write_lines(str(src / hidden), ['{"id": 99}'])
    frame = ss.readStream.schema("id INT").json(str(src))
    assert frame.schema.simpleString() == "struct<id:int,k:int>"
    sink, _ = run(frame, tmp_path / "c1")
    assert sorted((r.id, r.k) for r in sink.all_data()) == [(1, 1), (2, 2), (3, 2)]
    sink, _ = run(ss.readStream.schema("id INT").json(str(src / "k=*" / "*.json")), tmp_path / "c2")
    assert ids(sink.all_data()) == [1, 2]
    sink, _ = run(ss.readStream.schema("id INT").option("pathGlobFilter", "*.txt").json(str(src)), tmp_path / "c3")
    assert ids(sink.all_data()) == [3]
    sink, _ = run(ss.readStream.schema("id INT").json(str(src / "k={1,3}")), tmp_path / "c4")
    assert ids(sink.all_data()) == [1]


def test_restart_never_rereads_nor_skips_a_file(ss, tmp_path):
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    rows = write_json_files(src, 0, 3)
    frame = ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(str(src))
    sink = MemorySink(ss.spark, frame.schema, "append")
    run(frame, ckpt, sink)
    assert sink.batch_ids() == [0, 1, 2]
    rows += write_json_files(src, 3, 2)
    # The offset log write of the next batch fails after the source logged its files...
    failing = FailingFileSystem(lambda op, path: path.endswith("/offsets/3"))
    with pytest.raises(StreamingQueryException, match="injected failure"):
        run(frame, ckpt, sink, fs=failing)
    assert os.path.exists(ckpt / "sources" / "0" / "3") and not os.path.exists(ckpt / "offsets" / "3")
    # ...and the next run takes those files, and the next one, exactly once.
    run(frame, ckpt, sink)
    assert ids(sink.all_data()) == sorted(r["id"] for r in rows)
    # Batch 3 reads source log batches 3 (logged by the failed run) and 4, as Spark would.
    assert sink.batch_ids() == [0, 1, 2, 3] and ids(sink.batch(3)) == [300, 301, 302, 400, 401, 402]


# -- read limits and options ----------------------------------------------------------
def test_max_bytes_per_trigger_takes_at_least_one_file(ss, tmp_path):
    src = tmp_path / "in"
    write_json_files(src, 0, 5, rows_per_file=2)  # f000 is the smallest file
    size = os.path.getsize(src / "f001.json")
    frame = ss.readStream.schema("id INT, name STRING").option("maxBytesPerTrigger", 2 * size).json(str(src))
    sink, query = run(frame, tmp_path / "ckpt")
    assert [len(sink.batch(b)) for b in sink.batch_ids()] == [4, 4, 2]
    frame = ss.readStream.schema("id INT, name STRING").option("maxBytesPerTrigger", 1).json(str(src))
    sink, _ = run(frame, tmp_path / "ckpt2")
    assert [len(sink.batch(b)) for b in sink.batch_ids()] == [2] * 5


def test_latest_first_and_max_file_age(ss, tmp_path):
    src = tmp_path / "in"
    write_json_files(src, 0, 3, rows_per_file=1)
    frame = ss.readStream.schema("id INT, name STRING").options(latestFirst=True, maxFilesPerTrigger=1).json(str(src))
    sink, _ = run(frame, tmp_path / "c1")
    assert [sink.batch(b)[0].id for b in sink.batch_ids()] == [200, 100, 0]

    # maxFileAge counts back from the newest file seen: an old file arriving later is ignored.
    frame = ss.readStream.schema("id INT, name STRING").option("maxFileAge", "2s").json(str(src))
    sink = MemorySink(ss.spark, frame.schema, "append")
    run(frame, tmp_path / "c2", sink)
    write_lines(str(src / "old.json"), ['{"id": 7}'], mtime=BASE_MTIME - 10)
    write_lines(str(src / "new.json"), ['{"id": 8}'], mtime=BASE_MTIME + 10)
    run(frame, tmp_path / "c2", sink)
    assert ids(sink.all_data()) == [0, 8, 100, 200]


def test_file_name_only(ss, tmp_path):
    src = tmp_path / "in"
    write_lines(str(src / "a" / "x.json"), ['{"id": 1}'], mtime=BASE_MTIME)
    frame = ss.readStream.schema("id INT").option("fileNameOnly", True).json(str(src / "*"))
    sink = MemorySink(ss.spark, frame.schema, "append")
    run(frame, tmp_path / "ckpt", sink)
    write_lines(str(src / "b" / "x.json"), ['{"id": 2}'], mtime=BASE_MTIME + 1)
    write_lines(str(src / "b" / "y.json"), ['{"id": 3}'], mtime=BASE_MTIME + 2)
    run(frame, tmp_path / "ckpt", sink)
    assert ids(sink.all_data()) == [1, 3]


@pytest.mark.parametrize("mode", ["delete", "archive"])
def test_clean_source_touches_only_committed_files(ss, tmp_path, mode):
    src, archive = tmp_path / "in", tmp_path / "archive"
    write_json_files(src, 0, 3, rows_per_file=1)
    options = {"cleanSource": mode, "maxFilesPerTrigger": 1}
    if mode == "archive":
        options["sourceArchiveDir"] = str(archive)
    frame = ss.readStream.schema("id INT, name STRING").options(**options).json(str(src))
    sink = MemorySink(ss.spark, frame.schema, "append")
    run(frame, tmp_path / "ckpt", sink)
    # Batches 0 and 1 were committed to the source when 1 and 2 were planned; batch 2
    # is committed to it only when the next batch is planned (as in Spark).
    assert sorted(os.listdir(src)) == ["f002.json"]
    write_json_files(src, 3, 1, rows_per_file=1)
    run(frame, tmp_path / "ckpt", sink)
    assert sorted(os.listdir(src)) == ["f003.json"]
    if mode == "archive":
        assert sorted(os.listdir(str(archive) + str(src))) == ["f000.json", "f001.json", "f002.json"]
    assert ids(sink.all_data()) == [0, 100, 200, 300]


def test_archive_dir_inside_the_source_pattern_is_refused(ss, tmp_path):
    src = tmp_path / "in"
    write_json_files(src, 0, 1)
    frame = (ss.readStream.schema("id INT, name STRING")
             .options(cleanSource="archive", sourceArchiveDir=str(src / "archived")).json(str(src / "*")))
    with pytest.raises(StreamingQueryException, match="Base archive path cannot be set to the path"):
        run(frame, tmp_path / "ckpt")


def test_reading_a_sink_output_sees_only_committed_files(ss, spark, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_json_files(src, 0, 2)
    query = (ss.readStream.schema("id INT, name STRING").json(str(src)).writeStream.format("parquet")
             .option("checkpointLocation", str(tmp_path / "c1")).trigger(availableNow=True).start(str(out)))
    query.awaitTermination(120)
    spark.range(1000, 1005).selectExpr("CAST(id AS INT) id", "'stray' name").coalesce(1) \
        .write.mode("append").parquet(str(out / "k=stray"))
    spark.range(2000, 2005).selectExpr("CAST(id AS INT) id", "'stray' name").coalesce(1) \
        .write.mode("append").parquet(str(tmp_path / "other"))
    stray = [f for f in os.listdir(tmp_path / "other") if f.endswith(".parquet")][0]
    os.rename(tmp_path / "other" / stray, out / stray)
    frame = ss.readStream.schema("id INT, name STRING").parquet(str(out))
    sink, _ = run(frame, tmp_path / "c2")
    assert ids(sink.all_data()) == [0, 1, 2, 100, 101, 102]
    with pytest.raises(StreamingQueryException, match="Cleaning up source files is not supported"):
        run(ss.readStream.schema("id INT, name STRING").option("cleanSource", "delete").parquet(str(out)),
            tmp_path / "c3")


# -- bad input --------------------------------------------------------------------
BAD_LINES = ['{"id": 1}', '{"id": "not a number"}', '{broken', '{"id": 4}']


def test_malformed_records_follow_the_reader_mode(ss, spark, tmp_path):
    src = tmp_path / "in"
    write_lines(str(src / "a.json"), BAD_LINES)
    schema = "id INT, _corrupt_record STRING"
    sink, _ = run(ss.readStream.schema(schema).json(str(src)), tmp_path / "c1")
    expected = spark.read.schema(schema).json(str(src)).collect()
    assert sorted(map(tuple, sink.all_data()), key=str) == sorted(map(tuple, expected), key=str)
    assert sum(r._corrupt_record is not None for r in sink.all_data()) == 2
    sink, _ = run(ss.readStream.schema("id INT").option("mode", "DROPMALFORMED").json(str(src)), tmp_path / "c2")
    assert ids(sink.all_data()) == [1, 4]


def test_failfast_names_the_file_and_a_retry_after_the_fix_succeeds(ss, tmp_path):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    write_lines(str(src / "good.json"), ['{"id": 1}'], mtime=BASE_MTIME)
    write_lines(str(src / "bad file.json"), BAD_LINES, mtime=BASE_MTIME + 1)

    def start():
        return (ss.readStream.schema("id INT").option("mode", "FAILFAST").json(str(src))
                .writeStream.format("parquet").option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True).start(str(out)))

    query = start()
    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination(120)
    message = str(failure.value)
    assert "bad%20file.json" in message and "FAILFAST" in failure.value._stackTrace, message
    assert os.listdir(ckpt / "offsets") == ["0"] and os.listdir(ckpt / "commits") == []
    assert os.listdir(out / "_spark_metadata") == []
    write_lines(str(src / "bad file.json"), ['{"id": 2}'], mtime=BASE_MTIME + 1)
    query = start()
    query.awaitTermination(120)
    assert query.exception() is None
    assert ids(ss.spark.read.parquet(str(out)).collect()) == [1, 2]


def test_vanished_file_is_a_clear_error_unless_ignore_missing_files(ss, tmp_path):
    src, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_json_files(src, 0, 2, rows_per_file=1)
    frame = ss.readStream.schema("id INT, name STRING").json(str(src))
    failing = FailingFileSystem(lambda op, path: path.endswith("/commits/0"))
    with pytest.raises(StreamingQueryException, match="injected failure"):
        run(frame, ckpt, fs=failing)
    os.remove(src / "f001.json")  # listed in sources/0/0, gone before batch 0 is re-run
    with pytest.raises(StreamingQueryException, match=r"FILE_SOURCE_MISSING_FILE.*f001.json.*ignoreMissingFiles=true"):
        run(frame, ckpt)
    assert os.listdir(ckpt / "commits") == []
    frame = ss.readStream.schema("id INT, name STRING").option("ignoreMissingFiles", True).json(str(src))
    sink, query = run(frame, ckpt)
    assert query.exception() is None and ids(sink.all_data()) == [0]


def test_parquet_file_with_another_schema_names_the_file(ss, spark, tmp_path):
    src = tmp_path / "pq"
    spark.range(2).selectExpr("CAST(id AS STRING) AS id").coalesce(1).write.parquet(str(src))
    with pytest.raises(StreamingQueryException) as failure:
        run(ss.readStream.schema("id INT").parquet(str(src)), tmp_path / "ckpt")
    message = str(failure.value)
    assert "pq/part-" in message and ".parquet" in message, message


def test_csv_and_text_sources_pass_reader_options(ss, tmp_path):
    src = tmp_path / "csv"
    write_lines(str(src / "a.csv"), ["id;name", "1;x", "2;y"])
    frame = ss.readStream.csv(str(src), schema="id INT, name STRING", header=True, sep=";")
    sink, _ = run(frame, tmp_path / "c1")
    assert sorted(map(tuple, sink.all_data())) == [(1, "x"), (2, "y")]
    text = tmp_path / "text"
    write_lines(str(text / "a.txt"), ["first line", "second line"])
    frame = ss.readStream.text(str(text))
    assert frame.schema.simpleString() == "struct<value:string>"
    sink, _ = run(frame, tmp_path / "c2")
    assert sorted(r.value for r in sink.all_data()) == ["first line", "second line"]


def test_parquet_input_rows_come_from_the_footers_and_match_sparks_count(ss, spark, tmp_path):
    """numInputRows of a parquet stream is read from the files' footers (no counting node
    in the batch plan, so the scan keeps filter pushdown and code generation) and is
    what Spark's own engine reports; a filter after the source does not change it."""
    src = tmp_path / "in"
    src.mkdir()
    for i, rows in enumerate([5, 1200, 0, 7]):
        tmp = tmp_path / f"tmp{i}"
        spark.range(rows).selectExpr("id", "id % 3 AS m").coalesce(1).write.parquet(str(tmp))
        part = next(p for p in os.listdir(tmp) if p.startswith("part-"))
        os.rename(tmp / part, src / f"f{i}.parquet")
        os.utime(src / f"f{i}.parquet", (BASE_MTIME + i, BASE_MTIME + i))

    def counts(session, ckpt):
        frame = session.readStream.schema("id BIGINT, m BIGINT").option("maxFilesPerTrigger", 1).parquet(str(src))
        query = (frame.filter("m = 0").writeStream.format("noop").option("checkpointLocation", str(ckpt))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return [p["numInputRows"] for p in query.recentProgress], query

    theirs, _ = counts(spark, tmp_path / "spark")
    ours, query = counts(ss, tmp_path / "ours")
    assert ours == theirs == [5, 1200, 0, 7]
    plan = query._execution.last_batch_df._jdf.queryExecution().optimizedPlan().toString()
    assert "CollectMetrics" not in plan, plan


def test_json_input_rows_come_from_the_sinks_scans_and_match_sparks_count(ss, spark, tmp_path):
    """numInputRows of a JSON stream is read from the scans of the sink's own Spark
    executions, as Spark reads it from its executed plan: the batch plan has no counting
    node for the file, noop and memory sinks; a static side reading the same directory is
    not counted; a batch the sink reads twice counts once; RDD actions (foreach,
    foreachPartition in foreachBatch) count from the batch's own plan."""
    src = tmp_path / "in"
    for i, rows in enumerate([4, 250, 1, 9]):
        write_json_files(str(src), i, 1, rows_per_file=rows)
    static = spark.read.schema("id BIGINT, name STRING").json(str(src)).selectExpr("name", "id AS sid")

    def counts(session, sink, name, transform=lambda frame: frame.filter("id % 2 = 0")):
        frame = session.readStream.schema("id BIGINT, name STRING").option("maxFilesPerTrigger", 1).json(str(src))
        writer = (transform(frame).writeStream.format(sink).option("checkpointLocation", str(tmp_path / f"c-{name}"))
                  .trigger(availableNow=True))
        if sink == "parquet":
            writer = writer.option("path", str(tmp_path / f"out-{name}"))
        elif sink == "memory":
            writer = writer.queryName("json_counts_" + name.replace("-", "_"))
        elif sink == "foreach":
            writer = writer.foreach(lambda row: None)
        elif callable(sink):
            writer = writer.foreachBatch(sink)
        query = writer.start()
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        return [p["numInputRows"] for p in query.recentProgress], query

    def plan(query):
        return query._execution.last_batch_df._jdf.queryExecution().optimizedPlan().toString()

    expected = [4, 250, 1, 9]
    for sink in ("noop", "parquet"):
        theirs, _ = counts(spark, sink, f"spark-{sink}")
        ours, query = counts(ss, sink, f"mb-{sink}")
        assert ours == theirs == expected
        assert "CollectMetrics" not in plan(query), plan(query)
    ours, query = counts(ss, "memory", "mb-memory")
    assert ours == expected and "CollectMetrics" not in plan(query)
    joined = lambda frame: frame.join(static, "name")   # noqa: E731
    theirs, _ = counts(spark, "noop", "spark-join", joined)
    ours, query = counts(ss, "noop", "mb-join", joined)
    assert ours == theirs == expected
    ours, query = counts(ss, "foreach", "mb-foreach")
    assert ours == expected and "CollectMetrics" not in plan(query)

    def write_twice(batch, batch_id):
        batch.write.format("noop").mode("append").save()
        batch.write.format("noop").mode("append").save()
    ours, query = counts(ss, write_twice, "mb-batch-sql")
    assert ours == expected and "CollectMetrics" not in plan(query)
    ours, query = counts(ss, lambda batch, batch_id: batch.foreachPartition(lambda rows: None), "mb-batch-rdd")
    assert ours == expected and "CollectMetrics" not in plan(query)

    def fail_then_write(batch, batch_id):
        try:   # an execution that fails reaches the listener too (onFailure)
            batch.selectExpr("raise_error('no') AS x").write.format("noop").mode("append").save()
        except Exception:  # noqa: BLE001
            pass
        batch.write.format("noop").mode("append").save()
    ours, query = counts(ss, fail_then_write, "mb-batch-failed")
    assert ours == expected
    ours, query = counts(ss, lambda batch, batch_id: None, "mb-batch-unread")
    assert ours == [0, 0, 0, 0]


def test_rdd_reading_sinks_report_event_time_and_move_the_watermark_like_spark(ss, spark, tmp_path):
    """A foreach sink (and foreachPartition in foreachBatch) reads the batch through an
    RDD action, which never fills an Observation: the event-time statistics of a
    watermark that no stateful operator computes come from the batch's own executed
    plan, so progress eventTime and the watermark match Spark's own engine."""
    import json
    src = tmp_path / "in"
    for i in range(3):
        write_lines(str(src / f"f{i}.json"),
                    [json.dumps({"id": i * 10 + j, "ts": f"2026-01-01T00:0{i}:{j * 10:02d}Z"}) for j in range(4)],
                    mtime=BASE_MTIME + i)

    def progress(session, name, foreach_batch=False):
        frame = (session.readStream.schema("id BIGINT, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
                 .json(str(src)).withWatermark("ts", "10 seconds").selectExpr("id * 2 AS doubled", "ts"))
        writer = frame.writeStream.option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True)
        if foreach_batch:
            writer = writer.foreachBatch(lambda batch, batch_id: batch.foreachPartition(lambda rows: None))
        else:
            writer = writer.foreach(lambda row: None)
        query = writer.start()
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        return [(p["numInputRows"], p.get("eventTime")) for p in query.recentProgress]

    theirs = progress(spark, "spark")
    assert [rows for rows, _ in theirs] == [4, 4, 4]
    assert theirs[-1][1]["watermark"] == "2026-01-01T00:01:20.000Z"
    assert progress(ss, "mb-foreach") == theirs
    assert progress(ss, "mb-foreach-batch", foreach_batch=True) == theirs


def test_a_filter_after_the_watermark_runs_before_it_as_in_spark(ss, spark, tmp_path):
    """Spark's optimizer moves a deterministic filter that does not refer to the event
    time below the watermark, so the watermark sees only the rows that pass it (also
    through a filter on the event time before it, which it combines with); a filter on
    the event time stays after it. Progress eventTime, and the rows a windowed count
    emits in append mode, are Spark's in every case."""
    import json
    from pyspark.sql import functions as F
    src = tmp_path / "in"
    for i in range(4):
        write_lines(str(src / f"f{i}.json"),
                    [json.dumps({"id": i * 10 + j, "ts": f"2026-01-01T00:0{i}:{j * 10:02d}Z"}) for j in range(4)],
                    mtime=BASE_MTIME + i)

    def run(session, name, condition, count=False):
        frame = (session.readStream.schema("id BIGINT, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
                 .json(str(src)).withWatermark("ts", "10 seconds"))
        for part in (condition if isinstance(condition, tuple) else (condition,)):
            frame = frame.filter(part)
        if count:
            frame = frame.groupBy(F.window("ts", "30 seconds")).count()
        query = (frame.writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        rows = sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {name}").collect()) if count else None
        return [p.get("eventTime") for p in query.recentProgress], rows

    for label, condition in [("other", "id % 2 = 0"), ("event_time", "ts < '2026-01-01 00:03:15'"),
                             ("both", ("ts < '2026-01-01 00:03:15'", "id % 2 = 0"))]:
        theirs = run(spark, f"spark_{label}", condition)
        assert run(ss, f"mb_{label}", condition) == theirs
    theirs = run(spark, "spark_count", "id % 2 = 0", count=True)
    assert theirs[0][-1]["watermark"] == "2026-01-01T00:03:10.000Z"   # 00:03:20 (the filter ran first) - 10 s
    assert [count for _, count in theirs[1]] == [2, 2, 2]   # the windows of minutes 0-2 closed
    assert run(ss, "mb_count", "id % 2 = 0", count=True) == theirs


def test_xml_source_reads_rows_by_row_tag(ss, tmp_path):
    src = tmp_path / "xml"
    write_lines(str(src / "a.xml"), ["<rows>", "<row><id>1</id><name>x</name></row>",
                                     "<row><id>2</id><name>y</name></row>", "</rows>"])
    frame = ss.readStream.xml(str(src), rowTag="row", schema="id INT, name STRING")
    sink, _ = run(frame, tmp_path / "ckpt")
    assert sorted(map(tuple, sink.all_data())) == [(1, "x"), (2, "y")]
