"""The Iceberg sink and source on real tables of a SQL catalog on SQLite (pyiceberg): each
batch one snapshot whose summary records the query id and batch id, read back by
pyiceberg and by DuckDB's iceberg extension; a batch re-run after a crash between the table's commit and ``commits/N`` is
skipped; the source reads what another writer appends and resumes after a restart."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from helpers import json_stream, s3_lake
from stream_events import write_event_files

from microbatch.lakehouse import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY, iceberg_catalog

SCHEMA = "id INT, name STRING, v DOUBLE"
EVENTS = [[(1, "a", 1.5), (2, "b", None), (3, None, 3.0)], [(4, "a", 4.5), (5, "c", 5.0)], [(6, "b", 6.5)]]


@pytest.fixture
def catalog_options(tmp_path):
    root = tmp_path / "warehouse"
    root.mkdir()
    return {"catalog.type": "sql", "catalog.uri": f"sqlite:///{root}/catalog.db", "catalog.warehouse": f"file://{root}"}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, lambda i, n, v: {"id": i, "name": n, "v": v})


def catalog(options):
    return iceberg_catalog("/nonexistent", options)


def write(ss, frame, name, ckpt, options, mode="append"):
    writer = frame.writeStream.format("iceberg").outputMode(mode).option("checkpointLocation", str(ckpt))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).toTable(name)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


def rows_of(options, name) -> list:
    return sorted(((r["id"], r["name"], r["v"]) for r in catalog(options).load_table(name).scan().to_arrow().to_pylist()),
                  key=str)


def duckdb_rows(metadata_location: str) -> list:
    """The table read by DuckDB's own Iceberg reader (its iceberg extension), a second reader."""
    import glob
    import site

    import duckdb
    found = glob.glob(os.path.join(site.getsitepackages()[0], "duckdb_ext/extensions/v*/linux_amd64"))[0]
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{found}/avro.duckdb_extension'")
    con.execute(f"LOAD '{found}/iceberg.duckdb_extension'")
    return con.execute(f"SELECT id, name, v FROM iceberg_scan('{metadata_location}')").fetchall()


def expected() -> list:
    return sorted((row for batch in EVENTS for row in batch), key=str)


def test_each_batch_is_one_snapshot_with_the_query_and_batch_ids(ss, events, tmp_path, catalog_options):
    query = write(ss, json_stream(ss, events, SCHEMA), "db.events", tmp_path / "ckpt", catalog_options)
    assert rows_of(catalog_options, "db.events") == expected()
    assert sorted(duckdb_rows(catalog(catalog_options).load_table("db.events").metadata_location),
                  key=str) == expected()
    snapshots = catalog(catalog_options).load_table("db.events").snapshots()
    summaries = [s.summary.additional_properties for s in snapshots]
    assert [(p[QUERY_ID_PROPERTY], p[EPOCH_ID_PROPERTY], p["added-records"]) for p in summaries] == \
        [(query.id, str(b), str(len(rows))) for b, rows in enumerate(EVENTS)]


def test_a_batch_in_the_table_but_not_in_the_checkpoint_is_not_written_twice(ss, events, tmp_path, catalog_options):
    ckpt = tmp_path / "ckpt"
    write(ss, json_stream(ss, events, SCHEMA), "db.events", ckpt, catalog_options)
    os.remove(ckpt / "commits" / "2")
    write(ss, json_stream(ss, events, SCHEMA), "db.events", ckpt, catalog_options)
    assert (ckpt / "commits" / "2").exists()
    assert len(catalog(catalog_options).load_table("db.events").snapshots()) == len(EVENTS)
    assert rows_of(catalog_options, "db.events") == expected()


def test_complete_mode_overwrites(ss, events, tmp_path, catalog_options):
    counts = json_stream(ss, events, SCHEMA).groupBy("name").count()
    write(ss, counts, "db.counts", tmp_path / "ckpt", catalog_options, mode="complete")
    table = catalog(catalog_options).load_table("db.counts")
    got = sorted(((r["name"] or ""), r["count"]) for r in table.scan().to_arrow().to_pylist())
    assert got == [("", 1), ("a", 2), ("b", 2), ("c", 1)]


def test_the_source_reads_appends_resumes_and_refuses_an_overwrite(ss, tmp_path, catalog_options):
    table = catalog(catalog_options)
    table.create_namespace_if_not_exists("db")
    made = table.create_table("db.src", schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))

    def append(rows):
        made.append(pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows]}))

    def read(ckpt, **options):
        batches = []
        reader = ss.readStream.format("iceberg")
        for key, value in {**catalog_options, **options}.items():
            reader = reader.option(key, value)
        query = reader.load("db.src").writeStream.foreachBatch(
            lambda df, _: batches.append(sorted((r.id, r.name) for r in df.collect()))) \
            .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
        query.awaitTermination(300)
        if query.exception() is not None:
            raise query.exception()
        return batches

    append([(1, "a"), (2, "b")])
    append([(3, "c")])
    assert read(tmp_path / "c1") == [[(1, "a"), (2, "b"), (3, "c")]]
    append([(4, "d")])
    assert read(tmp_path / "c1") == [[(4, "d")]]
    assert read(tmp_path / "c2", **{"streaming-max-files-per-micro-batch": "1"}) == \
        [[(1, "a"), (2, "b")], [(3, "c")], [(4, "d")]]
    made.overwrite(pa.table({"id": pa.array([9], pa.int64()), "name": ["z"]}))
    with pytest.raises(StreamingQueryException, match="Cannot process (overwrite|delete) snapshot"):
        read(tmp_path / "c1")
    append([(5, "e")])
    skipped = read(tmp_path / "c3", **{"streaming-skip-overwrite-snapshots": "true",
                                       "streaming-skip-delete-snapshots": "true",
                                       "streaming-max-files-per-micro-batch": "1"})
    assert skipped[-1] == [(5, "e")] and [(1, "a"), (2, "b")] in skipped


def test_a_table_on_s3_written_and_streamed_back(ss, spark, events, tmp_path):
    """A catalog whose warehouse is on S3 (moto's server), reached with the endpoint and keys
    of ``spark.hadoop.fs.s3a.*`` as the checkpoint takes them: the sink's tasks write the
    files at their keys and the snapshots name them; the source reads them in Spark tasks
    (this Spark has no hadoop-aws), then what pyiceberg appends, resuming."""
    from microbatch.spark_internals import session_settings
    with s3_lake(spark):
        options = {"catalog.type": "sql", "catalog.uri": f"sqlite:///{tmp_path}/catalog.db",
                   "catalog.warehouse": "s3://lake/warehouse"}
        write(ss, json_stream(ss, events, SCHEMA), "db.events", tmp_path / "ckpt", options)
        table = iceberg_catalog("/nonexistent", options, session_settings(spark)).load_table("db.events")
        assert table.location().startswith("s3://lake/warehouse/")
        assert sorted((tuple(r.values()) for r in table.scan().to_arrow().to_pylist()), key=str) == expected()
        assert [s.summary.additional_properties[EPOCH_ID_PROPERTY] for s in table.snapshots()] == ["0", "1", "2"]
        assert all(f.file.file_path.startswith("s3://lake/warehouse/") for f in table.scan().plan_files())
        os.remove(tmp_path / "ckpt" / "commits" / "2")
        write(ss, json_stream(ss, events, SCHEMA), "db.events", tmp_path / "ckpt", options)
        assert len(table.refresh().snapshots()) == len(EVENTS)

        def read(ckpt):
            batches = []
            reader = ss.readStream.format("iceberg")
            for key, value in options.items():
                reader = reader.option(key, value)
            running = reader.load("db.events").writeStream.foreachBatch(
                lambda df, _: batches.append(sorted((tuple(r) for r in df.collect()), key=str))) \
                .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
            running.awaitTermination(300)
            assert running.exception() is None, running.exception()
            return batches

        assert read(tmp_path / "read") == [sorted((row for batch in EVENTS for row in batch), key=str)]
        table.append(pa.table({"id": pa.array([7], pa.int32()), "name": ["g"], "v": [7.5]}))
        assert read(tmp_path / "read") == [[(7, "g", 7.5)]]


def test_a_table_that_cannot_take_the_streams_columns_fails_the_batch_and_commits_nothing(ss, events, tmp_path,
                                                                                         catalog_options):
    made = catalog(catalog_options)
    made.create_namespace_if_not_exists("db")
    made.create_table("db.typed", schema=pa.schema([("id", pa.int32()), ("name", pa.int64()), ("v", pa.float64())]))
    made.create_table("db.fewer", schema=pa.schema([("id", pa.int32())]))
    for name, expected_error in (("db.typed", "INCOMPATIBLE_DATA_FOR_TABLE.CANNOT_SAFELY_CAST.*`name` \"STRING\" to \"BIGINT\""),
                                 ("db.fewer", "INCOMPATIBLE_DATA_FOR_TABLE")):
        ckpt = tmp_path / name
        writer = json_stream(ss, events, SCHEMA).writeStream.format("iceberg").option("checkpointLocation", str(ckpt))
        for key, value in catalog_options.items():
            writer = writer.option(key, value)
        query = writer.trigger(availableNow=True).toTable(name)
        with pytest.raises(StreamingQueryException, match=expected_error):
            query.awaitTermination(300)
        assert not (ckpt / "commits" / "0").exists()
        assert catalog(catalog_options).load_table(name).current_snapshot() is None
    made.create_table("db.wider", schema=pa.schema([("v", pa.float64()), ("id", pa.int64()), ("name", pa.string())]))
    write(ss, json_stream(ss, events, SCHEMA), "db.wider", tmp_path / "wider", catalog_options)   # int → long
    assert rows_of(catalog_options, "db.wider") == expected()


def test_partitioned_tables_new_by_partition_by_and_existing_with_a_transform(ss, events, tmp_path, catalog_options):
    """``partitionBy`` makes a new table with identity partitions; an existing table keeps
    its own spec (here a bucket transform): pyiceberg's writer in the tasks writes a file
    per partition value, with the value in the manifest; DuckDB and pyiceberg read the rows."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import DoubleType, IntegerType, NestedField, StringType

    writer = json_stream(ss, events, SCHEMA).writeStream.format("iceberg").partitionBy("name") \
        .option("checkpointLocation", str(tmp_path / "c1"))
    for key, value in catalog_options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).toTable("db.by_name")
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    table = catalog(catalog_options).load_table("db.by_name")
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("name", "identity")]
    assert rows_of(catalog_options, "db.by_name") == expected()
    assert sorted(duckdb_rows(table.metadata_location), key=str) == expected()
    files = list(table.scan().plan_files())
    assert sorted({f.file.partition[0] for f in files}, key=str) == sorted({r[1] for r in expected()}, key=str)
    assert len(table.scan(row_filter="name == 'a'").plan_files()) == 2        # a file per batch with an 'a'

    made = catalog(catalog_options)
    schema = Schema(NestedField(1, "id", IntegerType()), NestedField(2, "name", StringType()),
                    NestedField(3, "v", DoubleType()))
    made.create_table("db.bucketed", schema=schema,
                      partition_spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket")))
    write(ss, json_stream(ss, events, SCHEMA), "db.bucketed", tmp_path / "c2", catalog_options)
    assert rows_of(catalog_options, "db.bucketed") == expected()
    bucketed = catalog(catalog_options).load_table("db.bucketed")
    assert {f.file.partition[0] for f in bucketed.scan().plan_files()} <= {0, 1, 2, 3}
    assert len(list(bucketed.scan().plan_files())) > len(EVENTS)
