"""The Delta Lake sink on real tables: what microbatch commits, read back by ``deltalake``
(delta-rs) and by DuckDB's delta extension; each batch one commit with Delta's streaming
sink's ``txn`` (app id = the query's id, version = the batch id); a batch re-run after a
crash between the table's commit and ``commits/N`` is skipped; bad input refused with
nothing committed."""
from __future__ import annotations

import datetime
import glob
import json
import os
import site

import pytest
from deltalake import DeltaTable
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F

from helpers import json_stream, s3_lake
from stream_events import write_event_files

SCHEMA = "id INT, name STRING, v DOUBLE, ts TIMESTAMP"
EVENTS = [
    [(1, "a", 1.5, "00:00:01"), (2, "b", None, "00:00:02"), (3, None, 3.0, "00:00:03")],
    [(4, "a", 4.5, "00:00:04"), (5, "c", 5.0, "00:00:05")],
    [(6, "b", 6.5, "00:00:06")],
]


def record(i, name, v, t):
    return {"id": i, "name": name, "v": v, "ts": f"2026-01-01 {t}"}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, record)


def expected_rows() -> list:
    return sorted((i, n, v) for batch in EVENTS for i, n, v, _ in batch)


def run(frame, table, ckpt, mode="append", **options):
    writer = frame.writeStream.format("delta").outputMode(mode).option("checkpointLocation", str(ckpt))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start(str(table))
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


def duckdb_rows(table, sql: str) -> list:
    """``sql`` over the table (``t``) read by DuckDB's own Delta reader (delta-kernel)."""
    import duckdb
    extension = glob.glob(os.path.join(site.getsitepackages()[0],
                                       "duckdb_ext/extensions/v*/linux_amd64/delta.duckdb_extension"))[0]
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{extension}'")
    con.execute(f"CREATE VIEW t AS SELECT * FROM delta_scan('{table}')")
    return con.execute(sql).fetchall()


def batch_commits(table) -> list:
    """Per Delta commit: (version, txn version, rows added), from the log's JSON."""
    found = []
    for path in sorted(glob.glob(f"{table}/_delta_log/*.json")):
        actions = [json.loads(line) for line in open(path) if line.strip()]
        txn = [a["txn"]["version"] for a in actions if "txn" in a]
        rows = sum(json.loads(a["add"]["stats"])["numRecords"] for a in actions if "add" in a)
        found.append((int(os.path.basename(path).split(".")[0]), txn[0] if txn else None, rows))
    return found


def test_each_batch_is_one_commit_read_back_by_deltalake_and_duckdb(ss, events, tmp_path):
    table = tmp_path / "table"
    query = run(json_stream(ss, events, SCHEMA), table, tmp_path / "ckpt")
    delta = DeltaTable(str(table))
    got = sorted((r["id"], r["name"], r["v"]) for r in delta.to_pyarrow_table().to_pylist())
    assert got == expected_rows()
    assert batch_commits(table) == [(b, b, len(rows)) for b, rows in enumerate(EVENTS)]
    first = [json.loads(line) for line in open(f"{table}/_delta_log/{0:020d}.json") if line.strip()]
    stats = [json.loads(a["add"]["stats"]) for a in first if "add" in a]
    assert len(stats) == 1 and stats[0]["minValues"]["id"] == 1 and stats[0]["maxValues"]["id"] == 3
    assert (stats[0]["minValues"]["name"], stats[0]["maxValues"]["name"], stats[0]["maxValues"]["v"]) == ("a", "b", 3.0)
    assert stats[0]["minValues"]["ts"].endswith(":01.000Z") and stats[0]["nullCount"] == {"id": 0, "name": 1, "v": 1,
                                                                                         "ts": 0}
    assert duckdb_rows(table, "SELECT id FROM t WHERE id > 5") == [(6,)]      # a reader pruning by the bounds
    assert delta.transaction_version(query.id) == len(EVENTS) - 1
    assert sorted(duckdb_rows(table, "SELECT id, name, v FROM t")) == expected_rows()
    assert duckdb_rows(table, "SELECT max(ts) FROM t")[0][0].isoformat().startswith("2026-01-01T00:00:06")
    assert [p.sink.numOutputRows for p in query.recentProgress] == [len(b) for b in EVENTS]


def test_a_batch_committed_to_the_table_but_not_to_the_checkpoint_is_not_written_twice(ss, events, tmp_path):
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    run(json_stream(ss, events, SCHEMA), table, ckpt)
    os.remove(ckpt / "commits" / "2")      # a crash after the table's commit, before commits/2
    versions = DeltaTable(str(table)).version()
    run(json_stream(ss, events, SCHEMA), table, ckpt)
    assert (ckpt / "commits" / "2").exists()
    assert DeltaTable(str(table)).version() == versions
    assert sorted((r["id"], r["name"], r["v"]) for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist()) \
        == expected_rows()


def test_files_of_an_uncommitted_attempt_are_not_read(ss, events, tmp_path):
    """Files a crashed attempt left (no log entry names them) are invisible to Delta's
    readers, and the re-run batch writes its own."""
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    run(json_stream(ss, events, SCHEMA), table, ckpt)
    stray = glob.glob(f"{table}/part-*.parquet")[0]
    os.link(stray, f"{table}/part-00000-crashedattempt-c000.snappy.parquet")
    assert sorted(r[0] for r in duckdb_rows(table, "SELECT id FROM t")) == [r[0] for r in expected_rows()]
    assert DeltaTable(str(table)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True,
                                         full=True) == ["part-00000-crashedattempt-c000.snappy.parquet"]


def test_complete_mode_replaces_the_table_each_batch(ss, events, tmp_path):
    table = tmp_path / "table"
    counts = json_stream(ss, events, SCHEMA).groupBy("name").agg(F.count("*").alias("n"))
    run(counts, table, tmp_path / "ckpt", mode="complete")
    got = sorted(((r["name"] or ""), r["n"]) for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist())
    assert got == [("", 1), ("a", 2), ("b", 2), ("c", 1)]
    assert [c[1] for c in batch_commits(table)] == [0, 1, 2]


def test_partition_by_writes_hive_directories_delta_readers_know(ss, events, tmp_path):
    table = tmp_path / "table"
    frame = json_stream(ss, events, SCHEMA)
    query = frame.writeStream.format("delta").partitionBy("name").option("checkpointLocation", str(tmp_path / "c")) \
        .trigger(availableNow=True).start(str(table))
    query.awaitTermination(300)
    assert query.exception() is None
    assert DeltaTable(str(table)).metadata().partition_columns == ["name"]
    assert {os.path.basename(d) for d in glob.glob(f"{table}/name=*")} == \
        {"name=a", "name=b", "name=c", "name=__HIVE_DEFAULT_PARTITION__"}
    assert sorted(duckdb_rows(table, "SELECT id, name, v FROM t")) == expected_rows()
    # and streamed back by the Delta source: the partition values from the directories
    back = []
    again = ss.readStream.format("delta").load(str(table)).writeStream \
        .foreachBatch(lambda df, _: back.extend((r.id, r.name, r.v) for r in df.collect())) \
        .option("checkpointLocation", str(tmp_path / "back")).trigger(availableNow=True).start()
    again.awaitTermination(300)
    assert again.exception() is None and sorted(back, key=str) == sorted(expected_rows(), key=str)


def test_a_schema_the_table_cannot_take_fails_the_batch_and_commits_nothing(ss, events, tmp_path):
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    run(json_stream(ss, events, SCHEMA).select("id", "name"), table, ckpt)
    version = DeltaTable(str(table)).version()
    wider = json_stream(ss, events, SCHEMA).select("id", "name", "v")
    query = wider.writeStream.format("delta").option("checkpointLocation", str(tmp_path / "other")) \
        .trigger(availableNow=True).start(str(table))
    with pytest.raises(StreamingQueryException, match=r"DELTA_METADATA_MISMATCH.*mergeSchema"):
        query.awaitTermination(300)
    assert DeltaTable(str(table)).version() == version
    assert not os.path.exists(tmp_path / "other" / "commits" / "0")
    run(wider, table, tmp_path / "merged", mergeSchema="true")
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert len(rows) == 2 * len(expected_rows()) and {r["v"] for r in rows} >= {1.5, None}


def test_what_delta_refuses_at_start(ss, events, tmp_path):
    frame = json_stream(ss, events, SCHEMA)
    with pytest.raises(AnalysisException, match="DELTA_UNSUPPORTED_OUTPUT_MODE.*Update"):
        frame.groupBy("name").count().writeStream.format("delta").outputMode("update") \
            .option("checkpointLocation", str(tmp_path / "c")).start(str(tmp_path / "t"))
    with pytest.raises(AnalysisException, match="DELTA_PARTITION_COLUMN_NOT_FOUND.*`nope`"):
        frame.writeStream.format("delta").partitionBy("nope").option("checkpointLocation", str(tmp_path / "c")) \
            .start(str(tmp_path / "t"))
    with pytest.raises(ValueError, match="'path' is not specified"):
        frame.writeStream.format("delta").option("checkpointLocation", str(tmp_path / "c")).start()
    run(frame, tmp_path / "t2", tmp_path / "c2")
    with pytest.raises(StreamingQueryException, match="DELTA_PARTITION_COLUMN_MISMATCH"):
        query = frame.writeStream.format("delta").partitionBy("name") \
            .option("checkpointLocation", str(tmp_path / "c3")).trigger(availableNow=True).start(str(tmp_path / "t2"))
        query.awaitTermination(300)


def test_to_table_writes_the_managed_location_and_read_stream_table_reads_it(ss, spark, events, tmp_path):
    """``toTable(name)`` with Delta: the table where Spark's catalog keeps a managed table of
    that name (as delta-spark's toTable), no catalog entry (one of provider delta would break
    listTables without the jar); ``readStream.table(name)`` streams it back; a catalog
    table of another provider is refused with Spark's error."""
    import shutil
    name = "delta_events_by_name"
    location = os.path.join(spark.conf.get("spark.sql.warehouse.dir"), name)
    try:
        query = json_stream(ss, events, SCHEMA).writeStream.format("delta").partitionBy("name") \
            .option("checkpointLocation", str(tmp_path / "c1")).trigger(availableNow=True).toTable(name)
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        table = DeltaTable(location)
        assert table.metadata().partition_columns == ["name"] and table.transaction_version(query.id) == 2
        assert sorted((r["id"], r["name"], r["v"]) for r in table.to_pyarrow_table().to_pylist()) == expected_rows()
        assert name not in [t.name for t in spark.catalog.listTables()]
        batches = []
        back = ss.readStream.table(name).writeStream.foreachBatch(
            lambda df, _: batches.append(sorted((r.id, r.name) for r in df.collect()))) \
            .option("checkpointLocation", str(tmp_path / "c2")).trigger(availableNow=True).start()
        back.awaitTermination(300)
        assert back.exception() is None, back.exception()
        assert batches == [sorted((i, n) for i, n, _ in expected_rows())]
        spark.sql("CREATE TABLE parquet_by_name (id INT) USING parquet")
        with pytest.raises(AnalysisException, match=r"input source\(delta\) is different from the table parquet_by_name's data source provider\(parquet\)") as refused:
            json_stream(ss, events, SCHEMA).select("id").writeStream.format("delta") \
                .option("checkpointLocation", str(tmp_path / "c3")).toTable("parquet_by_name")
        assert refused.value.getCondition() == "_LEGACY_ERROR_TEMP_1192"
    finally:
        spark.sql("DROP TABLE IF EXISTS parquet_by_name")
        shutil.rmtree(location, ignore_errors=True)


def _raise_protocol(table, reader_features: list[str]) -> None:
    """A commit, as a newer Delta writer would make it, that needs table features nobody here knows."""
    version = DeltaTable(str(table)).version() + 1
    protocol = {"minReaderVersion": 3 if reader_features else 1, "minWriterVersion": 7,
                "writerFeatures": ["futureFeatureX"], **({"readerFeatures": reader_features} if reader_features else {})}
    with open(f"{table}/_delta_log/{version:020d}.json", "w") as f:
        f.write(json.dumps({"protocol": protocol}) + "\n" + json.dumps({"commitInfo": {"operation": "UPGRADE"}}) + "\n")


def test_a_table_of_a_newer_protocol_fails_the_batch_and_commits_nothing(ss, events, tmp_path):
    for readers in ([], ["futureFeatureX"]):
        table, ckpt = tmp_path / f"table{len(readers)}", tmp_path / f"ckpt{len(readers)}"
        append(table, [(0, "x")])
        _raise_protocol(table, readers)
        query = json_stream(ss, events, "id BIGINT, name STRING").writeStream.format("delta") \
            .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start(str(table))
        with pytest.raises(StreamingQueryException, match="DELTA_UNSUPPORTED_FEATURES_FOR_WRITE.*futureFeatureX"):
            query.awaitTermination(300)
        assert not (ckpt / "commits" / "0").exists()
        assert sorted(os.listdir(table / "_delta_log")) == [f"{v:020d}.json" for v in (0, 1)]
    with pytest.raises(AnalysisException, match="DELTA_UNSUPPORTED_FEATURES_FOR_READ.*futureFeatureX"):
        ss.readStream.format("delta").load(str(tmp_path / "table1"))


# -- the source ----------------------------------------------------------------------------
def append(table, rows, **kwargs) -> None:
    """Another writer (delta-rs) appends ``rows`` ((id, name) pairs) as one commit."""
    import pyarrow as pa
    from deltalake import write_deltalake
    write_deltalake(str(table), pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                                          "name": [r[1] for r in rows]}), mode="append", **kwargs)


def read_stream(ss, table, ckpt, **options) -> list:
    """The rows of each batch of a Delta stream of ``table``, run ``availableNow`` to its end."""
    batches = []
    reader = ss.readStream.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = reader.load(str(table)).writeStream.foreachBatch(
        lambda df, batch_id: batches.append(sorted((r.id, r.name) for r in df.collect()))) \
        .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    query.awaitTermination(300)
    if query.exception() is not None:
        raise query.exception()
    return batches


def test_the_source_reads_the_table_then_what_another_writer_appends_and_resumes(ss, tmp_path):
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    append(table, [(1, "a"), (2, "b")])
    append(table, [(3, "c")])
    assert read_stream(ss, table, ckpt) == [[(1, "a"), (2, "b"), (3, "c")]]     # the snapshot, one batch
    append(table, [(4, "d")])
    append(table, [(5, "e"), (6, None)])
    assert read_stream(ss, table, ckpt) == [[(4, "d"), (5, "e"), (6, None)]]    # only what is new
    assert read_stream(ss, table, ckpt) == []
    offset = json.loads((ckpt / "offsets" / "1").read_text().splitlines()[2])
    assert offset == {"sourceVersion": 1, "reservoirId": DeltaTable(str(table)).metadata().id,
                      "reservoirVersion": 3, "index": 0, "isStartingVersion": False}


def test_max_files_per_trigger_and_starting_versions(ss, tmp_path):
    table = tmp_path / "table"
    for i in range(4):
        append(table, [(i, str(i))])
    assert read_stream(ss, table, tmp_path / "c1", maxFilesPerTrigger=1) == [[(i, str(i))] for i in range(4)]
    assert read_stream(ss, table, tmp_path / "c2", startingVersion=2) == [[(2, "2"), (3, "3")]]
    assert read_stream(ss, table, tmp_path / "c3", startingVersion="latest") == []
    append(table, [(9, "x")])
    assert read_stream(ss, table, tmp_path / "c3", startingVersion="latest") == [[(9, "x")]]
    with pytest.raises(StreamingQueryException, match="DELTA_VERSION_NOT_FOUND"):
        read_stream(ss, table, tmp_path / "c4", startingVersion=99)


def test_a_commit_that_rewrites_data_stops_the_stream_unless_skipped(ss, tmp_path):
    table = tmp_path / "table"
    append(table, [(1, "a"), (2, "b")])
    assert read_stream(ss, table, tmp_path / "strict") == [[(1, "a"), (2, "b")]]
    read_stream(ss, table, tmp_path / "skipping", skipChangeCommits="true")
    DeltaTable(str(table)).delete("id = 1")
    append(table, [(3, "c")])
    with pytest.raises(StreamingQueryException, match="DELTA_SOURCE_TABLE_IGNORE_CHANGES"):
        read_stream(ss, table, tmp_path / "strict")
    assert read_stream(ss, table, tmp_path / "skipping", skipChangeCommits="true") == [[(3, "c")]]


def test_a_compaction_changes_no_data_and_is_skipped(ss, tmp_path):
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    for i in range(3):
        append(table, [(i, "x")])
    assert read_stream(ss, table, ckpt) == [[(0, "x"), (1, "x"), (2, "x")]]
    DeltaTable(str(table)).optimize.compact()
    append(table, [(7, "y")])
    assert read_stream(ss, table, ckpt) == [[(7, "y")]]


def test_bronze_to_silver_microbatch_writes_and_reads_delta(ss, events, tmp_path):
    bronze, silver = tmp_path / "bronze", tmp_path / "silver"
    run(json_stream(ss, events, SCHEMA), bronze, tmp_path / "c1")
    cleaned = ss.readStream.format("delta").option("maxFilesPerTrigger", 1).load(str(bronze)) \
        .where("name IS NOT NULL").select("id", F.upper("name").alias("name"))
    run(cleaned, silver, tmp_path / "c2")
    rows = sorted((r["id"], r["name"]) for r in DeltaTable(str(silver)).to_pyarrow_table().to_pylist())
    assert rows == sorted((i, n.upper()) for i, n, _ in expected_rows() if n is not None)
    with pytest.raises(AnalysisException, match="DELTA_UNSUPPORTED_SCHEMA_DURING_READ"):
        ss.readStream.format("delta").schema("id INT").load(str(bronze))
    with pytest.raises(AnalysisException, match="DELTA_MISSING_DELTA_TABLE"):
        ss.readStream.format("delta").load(str(tmp_path))


def test_foreach_batch_merge_upserts_once_per_batch(ss, tmp_path):
    """The upsert pattern of docs/lakehouse.md: delta-rs's MERGE in foreachBatch, made
    idempotent by the batch id with the same txn the sink uses; a re-run batch is skipped."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake
    target = tmp_path / "customers"
    write_deltalake(str(target), pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["ann", "bob"],
                                           "visits": pa.array([1, 1], pa.int64())}))
    events = write_event_files(tmp_path / "events", [[(2, "bob", 1.0, "00:00:01"), (3, "cy", 1.0, "00:00:02")],
                                                     [(1, "ann", 1.0, "00:00:03")]], record)
    merges = []

    def upsert(df, batch_id):
        table = DeltaTable(str(target))
        done = table.transaction_version("customers-upsert")
        if done is not None and done >= batch_id:
            return
        merges.append(batch_id)
        updates = df.selectExpr("id", "name", "CAST(1 AS BIGINT) AS visits").toArrow()
        (table.merge(updates, "t.id = s.id", source_alias="s", target_alias="t",
                     commit_properties=CommitProperties(app_transactions=[Transaction("customers-upsert", batch_id)]))
         .when_matched_update({"visits": "t.visits + s.visits"}).when_not_matched_insert_all().execute())

    def run_upserts():
        query = json_stream(ss, events, SCHEMA).writeStream.foreachBatch(upsert) \
            .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
        query.awaitTermination(300)
        assert query.exception() is None

    run_upserts()
    os.remove(tmp_path / "ckpt" / "commits" / "1")      # as if killed after the MERGE, before commits/1
    run_upserts()
    assert merges == [0, 1]
    rows = sorted((r["id"], r["name"], r["visits"]) for r in DeltaTable(str(target)).to_pyarrow_table().to_pylist())
    assert rows == [(1, "ann", 2), (2, "bob", 2), (3, "cy", 1)]


def test_starting_timestamp_max_bytes_and_ignore_deletes(ss, tmp_path):
    table = tmp_path / "table"
    append(table, [(1, "a"), (2, "b")])
    append(table, [(3, "c")])
    append(table, [(4, "d")])
    commits = {e["version"]: e["timestamp"] for e in DeltaTable(str(table)).history()}
    since = datetime.datetime.fromtimestamp(commits[1] / 1000, datetime.timezone.utc).isoformat()
    assert read_stream(ss, table, tmp_path / "c1", startingTimestamp=since) == [[(3, "c"), (4, "d")]]
    assert read_stream(ss, table, tmp_path / "c2", maxBytesPerTrigger="1b") == [[(1, "a"), (2, "b")], [(3, "c")],
                                                                                [(4, "d")]]
    read_stream(ss, table, tmp_path / "c3", ignoreDeletes="true")
    read_stream(ss, table, tmp_path / "c4")
    DeltaTable(str(table)).delete("id >= 3")        # removes two whole files: a commit of removes only
    append(table, [(5, "e")])
    assert read_stream(ss, table, tmp_path / "c3", ignoreDeletes="true") == [[(5, "e")]]
    with pytest.raises(StreamingQueryException, match="DELTA_SOURCE_TABLE_IGNORE_CHANGES"):
        read_stream(ss, table, tmp_path / "c4")


def test_a_table_on_s3_with_the_checkpoints_credentials(ss, spark, events, tmp_path):
    """The table on a real S3 endpoint (moto's server): the tasks write the files at their
    keys, delta-rs commits with the endpoint and keys of ``spark.hadoop.fs.s3a.*``; a batch
    re-run is skipped there too."""
    with s3_lake(spark) as options:
        ckpt = tmp_path / "ckpt"
        query = run(json_stream(ss, events, SCHEMA), "s3a://lake/bronze/events", ckpt)
        table = DeltaTable("s3://lake/bronze/events", storage_options=options)
        assert sorted((r["id"], r["name"], r["v"]) for r in table.to_pyarrow_table().to_pylist()) == \
            expected_rows()
        assert table.transaction_version(query.id) == len(EVENTS) - 1 and table.version() == len(EVENTS) - 1
        os.remove(ckpt / "commits" / "2")
        run(json_stream(ss, events, SCHEMA), "s3a://lake/bronze/events", ckpt)
        assert DeltaTable("s3://lake/bronze/events", storage_options=options).version() == len(EVENTS) - 1


def test_the_source_reads_a_partitioned_table_on_s3_and_resumes(ss, spark, tmp_path):
    """The source on S3 (read in Spark tasks through the storage layer: this Spark has no
    hadoop-aws): the snapshot, then what delta-rs appends, partition values from the log,
    resumed after a restart with nothing lost or read twice; then a microbatch-written S3
    table streamed on into a local one (bronze on S3 → silver)."""
    import pyarrow as pa
    from deltalake import write_deltalake
    with s3_lake(spark) as options:
        def add(rows):
            write_deltalake("s3://lake/orders", pa.table({
                "id": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows],
                "day": pa.array([datetime.date.fromisoformat(r[2]) for r in rows], pa.date32())}),
                mode="append", partition_by=["day"], storage_options=options)

        def stream(ckpt):
            batches = []
            query = ss.readStream.format("delta").load("s3a://lake/orders").writeStream.foreachBatch(
                lambda df, _: batches.append(sorted((r.id, r.name, str(r.day)) for r in df.collect()))) \
                .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
            query.awaitTermination(300)
            assert query.exception() is None, query.exception()
            return batches

        add([(1, "a", "2026-01-01"), (2, None, "2026-01-02")])
        add([(3, "c", "2026-01-01")])
        ckpt = tmp_path / "ckpt"
        assert stream(ckpt) == [[(1, "a", "2026-01-01"), (2, None, "2026-01-02"), (3, "c", "2026-01-01")]]
        add([(4, "d", "2026-01-03")])
        add([(5, "e", "2026-01-01"), (6, "f", "2026-01-04")])
        assert stream(ckpt) == [[(4, "d", "2026-01-03"), (5, "e", "2026-01-01"), (6, "f", "2026-01-04")]]
        assert stream(ckpt) == []
        assert ss.readStream.format("delta").load("s3a://lake/orders").schema.simpleString() == \
            "struct<id:bigint,name:string,day:date>"

        silver = tmp_path / "silver"
        run(ss.readStream.format("delta").option("maxFilesPerTrigger", 2).load("s3a://lake/orders")
            .where("name IS NOT NULL"), silver, tmp_path / "c2")
        assert sorted((r["id"], r["name"]) for r in DeltaTable(str(silver)).to_pyarrow_table().to_pylist()) == \
            [(1, "a"), (3, "c"), (4, "d"), (5, "e"), (6, "f")]
