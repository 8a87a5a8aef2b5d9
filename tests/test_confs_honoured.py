"""Options and confs Spark documents for streaming that microbatch used to run as without
them (issue 59, tests/test_options_not_ignored.py's walk): each honoured as Spark's engine
honours it, side by side with Spark's engine where it shows an effect, or refused by name.
"""
from __future__ import annotations

import os

import pytest
from pyspark.errors import IllegalArgumentException

from microbatch.kafka.tasks import OffsetRange, split_ranges


# -- Kafka: maxRecordsPerPartition -------------------------------------------------------------
# Spark's Kafka connector is a JVM jar that is not installed here, so its engine cannot run
# beside these tests: Spark 4's KafkaOffsetRangeCalculator.getRanges is stated and checked.

def kafka(ss, broker, **options):
    reader = ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _pieces(ranges):
    return [(r.partition, r.start, r.until) for r in ranges]


def test_max_records_per_partition_splits_as_sparks_range_calculator():
    ranges = [OffsetRange("t", 0, 0, 25), OffsetRange("t", 1, 100, 106), OffsetRange("t", 2, 7, 7)]
    # ceil(25 / 10) = 3 pieces by integer division of what remains (8, 8, 9); 6 records stay whole;
    # the empty range is dropped
    assert _pieces(split_ranges(ranges, None, 10)) == [(0, 0, 8), (0, 8, 16), (0, 16, 25), (1, 100, 106)]
    # a range of exactly the maximum is one piece
    assert _pieces(split_ranges([OffsetRange("t", 0, 0, 10)], None, 10)) == [(0, 0, 10)]
    # then minPartitions, over the pieces: 4 pieces >= 3, nothing more
    assert len(split_ranges(ranges, 3, 10)) == 4
    # minPartitions above the pieces' number: the large ones split again in proportion
    # (round(8/31*8) = 2 parts each of partition 0's pieces, 9 -> 2, partition 1's 6 -> 2)
    assert _pieces(split_ranges(ranges, 8, 10)) == [
        (0, 0, 4), (0, 4, 8), (0, 8, 12), (0, 12, 16), (0, 16, 20), (0, 20, 25), (1, 100, 103), (1, 103, 106)]


def test_min_partitions_alone_leaves_small_ranges_whole_as_spark():
    """Spark's getRanges: a range worth one part of minPartitions stays whole, and the
    others share what is left of minPartitions in proportion to their size."""
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 5), OffsetRange("t", 2, 0, 5)]
    # round(5/110*4) = 0 -> 1: partitions 1 and 2 unsplit; partition 0 gets max(4 - 2, 1) = 2 parts
    assert _pieces(split_ranges(ranges, 4)) == [(0, 0, 50), (0, 50, 100), (1, 0, 5), (2, 0, 5)]


def test_max_records_per_partition_gives_a_task_per_piece(ss, broker, tmp_path):
    broker.create_topic("max-records", 2)
    broker.produce("max-records", [(b"%d" % i, None, 0) for i in range(25)] +
                   [(b"%d" % i, None, 1) for i in range(25, 31)])
    seen = []

    def batch(df, batch_id):
        seen.append((df.rdd.getNumPartitions(), sorted(int(r.value) for r in df.collect()),
                     df.groupBy("partition").count().orderBy("partition").collect()))
    q = (kafka(ss, broker, subscribe="max-records", startingOffsets="earliest", maxRecordsPerPartition=10)
         .writeStream.foreachBatch(batch).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    tasks, rows, per_partition = seen[0]
    assert tasks == 4                       # partition 0: 3 pieces of at most 10; partition 1: one
    assert rows == list(range(31))          # every record once
    assert [(r["partition"], r["count"]) for r in per_partition] == [(0, 25), (1, 6)]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_records_per_partition_must_be_positive(ss, broker, value):
    with pytest.raises(IllegalArgumentException, match="maxRecordsPerPartition must be positive"):
        kafka(ss, broker, subscribe="a", maxRecordsPerPartition=value)


# -- spark.sql.streaming.stateStore.rocksdb.* ----------------------------------------------------
# microbatch's RocksDB provider (rocksdict) takes Spark's RocksDB confs as Spark's RocksDB
# instance takes them: the database's own options (read back from the OPTIONS file RocksDB
# writes), the commit's compaction, the metrics, and Spark's messages for a bad value.

ROCKSDB = "spark.sql.streaming.stateStore.rocksdb."
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _provider(tmp_path, monkeypatch, **rocksdb):
    import pyarrow as pa

    from microbatch.state.rocksdb import RocksDBStateStoreProvider, database
    from microbatch.state.store import RocksDBConfs, StateStoreConf, StateStoreId
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    monkeypatch.setattr(database, "SHARED", {})
    conf = StateStoreConf(run_id="run", rocksdb=RocksDBConfs(**rocksdb))
    return RocksDBStateStoreProvider(StateStoreId(str(tmp_path / "state"), 0, 0), pa.schema([("k", pa.int64())]),
                                     pa.schema([("v", pa.int64())]), conf)


def _commit(provider, version, keys=range(50)):
    store = provider.get_store(version)
    for k in keys:
        current = store.get((k,))
        store.put((k,), ((current[0] if current else 0) + 1,))
    store.commit()
    return store.metrics()


def _options_file(provider) -> str:
    import os
    newest = max((f for f in os.listdir(provider.path) if f.startswith("OPTIONS-")), key=lambda f: int(f.split("-")[1]))
    return open(os.path.join(provider.path, newest)).read()


def test_rocksdb_confs_reach_the_database_options(tmp_path, monkeypatch):
    """blockSizeKB, maxOpenFiles, compression, allowFAllocate and the bounded memory's
    settings, as Spark's RocksDB sets them on its instance."""
    from microbatch.state.rocksdb import database
    provider = _provider(tmp_path, monkeypatch, block_size_kb=16, max_open_files=100, compression="zstd",
                         allow_fallocate=False, bounded_memory=True, max_memory_mb=64, write_buffer_cache_ratio=0.25)
    _commit(provider, 0)
    text = _options_file(provider)
    table = text.split('[TableOptions/BlockBasedTable "default"]')[1]
    assert "  block_size=16384\n" in table
    assert "  cache_index_and_filter_blocks=true\n" in table and "  pin_l0_filter_and_index_blocks_in_cache=true\n" in table
    assert "filter_policy=bloomfilter" in table               # microbatch's own tuning kept
    assert "  max_open_files=100\n" in text and "  allow_fallocate=false\n" in text
    assert "  compression=kZSTD\n" in text.split('[CFOptions "default"]')[1]
    cache, manager = database.SHARED[("bounded", 64, 0.25)]   # one cache of maxMemoryUsageMB for the worker's stores
    assert manager.get_buffer_size() == 16 << 20             # memtables capped at writeBufferCacheRatio of it
    provider.close()

    plain = _provider(tmp_path / "plain", monkeypatch)        # Spark's defaults
    _commit(plain, 0)
    text = _options_file(plain)
    assert "  block_size=4096\n" in text and "  allow_fallocate=true\n" in text and "  max_open_files=-1\n" in text
    assert "  compression=kLZ4Compression\n" in text.split('[CFOptions "default"]')[1]
    plain.close()


@pytest.mark.parametrize("name, expected", [("snappy", "kSnappyCompression"), ("z", "kZlibCompression"),
                                            ("bzip2", "kBZip2Compression"), ("lz4hc", "kLZ4HCCompression"),
                                            # RocksDB Java's getCompressionType: any other name is none
                                            ("zlib", "kNoCompression"), ("ZSTD", "kNoCompression")])
def test_compression_names_mean_what_rocksdb_java_reads_them_as(tmp_path, monkeypatch, name, expected):
    provider = _provider(tmp_path, monkeypatch, compression=name)
    _commit(provider, 0)
    assert f"  compression={expected}\n" in _options_file(provider).split('[CFOptions "default"]')[1]
    provider.close()


def test_compact_on_commit_compacts_the_database_at_every_commit(tmp_path, monkeypatch):
    """Spark's compactOnCommit: a full-range compaction after each commit's write, so the
    commit's memtable is in the last level's files; without it, the rows stay in the memtable."""
    compacting = _provider(tmp_path, monkeypatch, compact_on_commit=True)
    plain = _provider(tmp_path / "plain", monkeypatch)
    for version in range(3):
        metrics = _commit(compacting, version)
        _commit(plain, version)
        assert "rocksdbCommitCompactLatency" in metrics.custom
    assert compacting.db.property_int_value("rocksdb.num-files-at-level0") == 0
    assert compacting.sst_bytes() > 0 and compacting.db.property_int_value("rocksdb.num-entries-active-mem-table") == 0
    assert plain.sst_bytes() == 0 and plain.db.property_int_value("rocksdb.num-entries-active-mem-table") > 0
    assert compacting.get_store(3).get((7,)) == (3,)
    compacting.close()
    plain.close()


def test_reset_stats_on_load_false_counts_since_the_store_was_opened(tmp_path, monkeypatch):
    per_load = _provider(tmp_path, monkeypatch)
    kept = _provider(tmp_path / "kept", monkeypatch, reset_stats_on_load=False)
    for version in range(3):
        assert _commit(per_load, version).custom["rocksdbPutCount"] == 50
        assert _commit(kept, version).custom["rocksdbPutCount"] == 50 * (version + 1)
    per_load.close()
    kept.close()


def _rocksdb_query(session, files, ckpt, mode, transform, settings):
    from helpers import collect_batches, confs, json_stream
    with confs(session, {PROVIDER_CONF: SPARK_ROCKSDB, **settings}):
        return collect_batches(transform(json_stream(session, files, "id INT, ts TIMESTAMP")), ckpt, mode)


HONOURED_ROCKSDB = {ROCKSDB + "compactOnCommit": "true", ROCKSDB + "blockSizeKB": "16",
                    ROCKSDB + "maxOpenFiles": "100", ROCKSDB + "compression": "zstd",
                    ROCKSDB + "allowFAllocate": "false", ROCKSDB + "boundedMemoryUsage": "true",
                    ROCKSDB + "maxMemoryUsageMB": "64", ROCKSDB + "writeBufferCacheRatio": "0.25",
                    ROCKSDB + "resetStatsOnLoad": "false", ROCKSDB + "lockAcquireTimeoutMs": "30000",
                    ROCKSDB + "changelogCheckpointing.enabled": "true"}
ROCKSDB_QUERIES = {
    "count per id": ("update", lambda f: f.groupBy("id").count()),
    "dedup with watermark": ("append", lambda f: f.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"])),
}


@pytest.mark.parametrize("case", list(ROCKSDB_QUERIES))
@pytest.mark.parametrize("track", ["true", "false"])
def test_rocksdb_confs_run_with_sparks_answers_and_state_row_counts(spark, ss, tmp_path, case, track):
    """Spark's engine and microbatch with the confs set: the same rows, batch by batch, and
    the same state metrics; trackTotalNumberOfRows=false makes numRowsTotal Spark's 0."""
    from stream_events import comparable, id_and_time, write_event_files
    files = write_event_files(tmp_path / "events", [
        [(1, "00:00:10"), (2, "00:00:20"), (1, "00:00:10")],
        [(1, "00:00:10"), (3, "00:00:40"), (4, "00:00:35")],
        [(2, "00:00:20"), (5, "00:00:41"), (3, "00:00:45")]], id_and_time)
    mode, transform = ROCKSDB_QUERIES[case]
    settings = {**HONOURED_ROCKSDB, ROCKSDB + "trackTotalNumberOfRows": track}
    theirs, their_progress = _rocksdb_query(spark, files, tmp_path / "spark", mode, transform, settings)
    ours, our_progress = _rocksdb_query(ss, files, tmp_path / "microbatch", mode, transform, settings)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    totals = [p["stateOperators"][0]["numRowsTotal"] for p in our_progress]
    assert (max(totals) > 0) == (track == "true"), totals


@pytest.mark.parametrize("name, value, message", [
    ("blockSizeKB", "-1", "must be a positive integer"),   # (0 is taken, as by Spark)
    ("compactOnCommit", "yes", "must be boolean"),
    ("changelogCheckpointing.enabled", "on", "must be boolean"),
    ("writeBufferCacheRatio", "1.5", "must be a ratio between 0.0 and 1.0"),
    ("maxOpenFiles", "many", "must be an integer"),
])
def test_a_bad_rocksdb_conf_fails_with_sparks_message(spark, ss, tmp_path, name, value, message):
    from helpers import json_stream
    from stream_events import id_and_time, write_event_files
    files = write_event_files(tmp_path / "events", [[(1, "00:00:10")]], id_and_time)
    expected = f"Invalid value for '{(ROCKSDB + name).lower()}', {message}"   # (Spark's, in lower case)
    for session in (spark, ss):
        from helpers import confs
        with confs(session, {PROVIDER_CONF: SPARK_ROCKSDB, ROCKSDB + name: value}):
            query = (json_stream(session, files, "id INT, ts TIMESTAMP").groupBy("id").count().writeStream
                     .format("noop").outputMode("update").option("checkpointLocation", str(tmp_path / f"ck{id(session)}"))
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination(120)
            except Exception as e:   # noqa: BLE001 - both engines fail the query's first batch
                assert expected in str(e), (session, str(e)[:2000])
            else:
                pytest.fail(f"{session} ran with {name}={value}")
            finally:
                query.stop()


def test_high_priority_pool_ratio_under_bounded_memory_is_refused_by_name(ss, tmp_path):
    """rocksdict's block cache takes a capacity only: the share Spark reserves for index and
    filter blocks cannot be set, so a query that sets it (where Spark reads it: under
    boundedMemoryUsage) is refused; without the bound Spark does not read it either."""
    from helpers import collect_batches, confs, json_stream
    from stream_events import id_and_time, write_event_files
    from microbatch.errors import UnsupportedOperationError
    files = write_event_files(tmp_path / "events", [[(1, "00:00:10")]], id_and_time)
    frame = json_stream(ss, files, "id INT, ts TIMESTAMP").groupBy("id").count()
    with confs(ss, {PROVIDER_CONF: SPARK_ROCKSDB, ROCKSDB + "highPriorityPoolRatio": "0.2"}):
        rows, _ = collect_batches(frame, tmp_path / "unbounded", "update")
        assert rows
        with confs(ss, {ROCKSDB + "boundedMemoryUsage": "true"}):
            with pytest.raises(Exception, match="highPriorityPoolRatio cannot be honoured") as refused:
                collect_batches(frame, tmp_path / "bounded", "update")
    # (the query fails in its first batch, as Spark's engine fails a bad RocksDB conf)
    assert "UnsupportedOperationError" in str(refused.value) or isinstance(refused.value, UnsupportedOperationError)


# -- spark.sql.streaming.stopActiveRunOnRestart, stopTimeout ----------------------------------------

def _rate_like_stream(session, path):
    from stream_events import id_and_time, write_event_files
    files = write_event_files(path, [[(1, "00:00:10"), (2, "00:00:20")]], id_and_time)
    from helpers import json_stream
    return json_stream(session, files, "id INT, ts TIMESTAMP")


def _start(frame, ckpt, **trigger):
    # (a second's trigger: Spark's processAllAvailable() returns only after a trigger that
    # found no new data, a whole interval after the last batch)
    return (frame.writeStream.format("noop").option("checkpointLocation", str(ckpt))
            .trigger(**(trigger or {"processingTime": "1 second"})).start())


def test_a_new_run_of_an_active_query_stops_the_old_run_as_spark(spark, ss, tmp_path):
    """Spark's default (stopActiveRunOnRestart=true): starting a query from the checkpoint of
    a run still active stops that run and starts the new one."""
    for session in (spark, ss):
        frame = _rate_like_stream(session, tmp_path / f"in{id(session)}")
        ckpt = tmp_path / f"ck{id(session)}"
        first = _start(frame, ckpt)
        first.processAllAvailable()
        second = _start(frame, ckpt)
        try:
            assert first.id == second.id and first.runId != second.runId
            assert not first.isActive and second.isActive, session
            assert [q.runId for q in session.streams.active] == [second.runId]
        finally:
            second.stop()


def test_with_stop_active_run_on_restart_false_a_new_run_is_refused_as_spark(spark, ss, tmp_path):
    from helpers import confs
    said = []
    for session in (spark, ss):
        frame = _rate_like_stream(session, tmp_path / f"in{id(session)}")
        ckpt = tmp_path / f"ck{id(session)}"
        first = _start(frame, ckpt)
        try:
            first.processAllAvailable()
            with confs(session, {"spark.sql.streaming.stopActiveRunOnRestart": "false"}):
                with pytest.raises(Exception) as refused:
                    _start(frame, ckpt)
            assert first.isActive
            # (PySpark's start() lets py4j's Py4JJavaError through: its second line is Java's)
            said.append((type(refused.value).__name__, str(refused.value).split("\n")[1], str(first.id)))
        finally:
            first.stop()
    theirs, ours = said
    assert ours[0] == theirs[0] == "Py4JJavaError", said
    assert ours[1] == theirs[1].replace(theirs[2], ours[2]), said
    assert ours[1].startswith(": java.lang.IllegalStateException: Cannot start query with id ")
    assert "spark.sql.streaming.stopActiveRunOnRestart" in ours[1]


def test_stop_timeout_bounds_the_wait_for_a_stuck_batch(ss, tmp_path):
    """A foreachBatch function that does not return (here: until released) keeps the query
    thread; stop() waits for it at most stopTimeout, then fails with Spark's TimeoutException
    and words (StreamExecution.interruptAndAwaitExecutionThreadTermination). (Spark's engine
    cannot be run beside: its stop() of such a query blocks before that wait.)"""
    import threading

    from helpers import confs
    release, entered = threading.Event(), threading.Event()

    def stuck(df, batch_id):
        entered.set()
        release.wait()
    frame = _rate_like_stream(ss, tmp_path / "in")
    with confs(ss, {"spark.sql.streaming.stopTimeout": "300"}):
        query = (frame.writeStream.foreachBatch(stuck).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="10 seconds").start())
    entered.wait()
    try:
        with pytest.raises(Exception) as timed_out:
            query.stop()
    finally:
        release.set()
    query.awaitTermination(60)
    assert not query.isActive
    assert type(timed_out.value).__name__ == "UnknownException"   # PySpark's, for a Java TimeoutException
    assert str(timed_out.value).split("\n")[0] == (
        f"java.util.concurrent.TimeoutException: Stream Execution thread for stream [id = {query.id}, "
        f"runId = {query.runId}] failed to stop within 300 milliseconds (specified by "
        "spark.sql.streaming.stopTimeout). See the cause on what was being executed in the streaming query thread.")


# -- Spark 4.1's stateless queries: adaptive execution, shuffle partitions on restart ------------------
AQE_STATELESS = "spark.sql.adaptive.streaming.stateless.enabled"


def _partitions_per_batch(session, files, ckpt, transform, settings, mode="append"):
    """Each batch's DataFrame's number of partitions (as foreachBatch gets it) and rows."""
    from helpers import confs, json_stream
    seen = []

    def batch(df, batch_id):
        seen.append((batch_id, df.rdd.getNumPartitions(), sorted(tuple(r) for r in df.collect())))
    with confs(session, settings):
        query = (transform(json_stream(session, files, "id INT, ts TIMESTAMP")).writeStream.foreachBatch(batch)
                 .outputMode(mode).option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
    return seen


@pytest.mark.parametrize("aqe", ["true", "false"])
def test_a_stateless_querys_batches_run_with_adaptive_execution_as_spark(spark, ss, tmp_path, aqe):
    """Spark 4.1+: adaptive execution stays on for a stateless query (its internal conf, true
    by default): the 40 partitions of repartition(40, "id") are coalesced, as Spark's engine
    coalesces them; off, they stay 40. A stateful query runs without it either way."""
    from stream_events import id_and_time, write_event_files
    files = write_event_files(tmp_path / "events", [[(1, "00:00:10"), (2, "00:00:20")], [(3, "00:00:30")]],
                              id_and_time)
    settings = {AQE_STATELESS: aqe, "spark.sql.adaptive.enabled": "true", "spark.sql.shuffle.partitions": "40"}
    stateless = [(side, _partitions_per_batch(side_session, files, tmp_path / f"{side}-stateless",
                                              lambda f: f.repartition("id"), settings))
                 for side, side_session in (("spark", spark), ("microbatch", ss))]
    assert stateless[0][1] == stateless[1][1], stateless
    assert all((n < 40) == (aqe == "true") for _, n, _ in stateless[1][1]), stateless
    stateful = [_partitions_per_batch(s, files, tmp_path / f"{i}-stateful",
                                      lambda f: f.repartition("id").groupBy("id").count(), settings, "update")
                for i, s in enumerate((spark, ss))]
    assert stateful[0] == stateful[1] and all(n == 40 for _, n, _ in stateful[1]), stateful


def _offsets_conf(ckpt, batch):
    import json
    return json.loads((ckpt / "offsets" / str(batch)).read_text().split("\n")[1])["conf"]


@pytest.mark.parametrize("stateful", [False, True])
def test_shuffle_partitions_change_on_restart_for_stateless_shuffles_as_spark(spark, ss, tmp_path, stateful):
    """Spark 4.1+: the checkpoint's spark.sql.shuffle.partitions is the state's number of
    partitions (recorded again in every offsets/N); every other shuffle takes the
    session's, so a stateless query's shuffles follow a restart's new value, and a stateful
    query's state keeps its partitions."""
    import shutil
    from pathlib import Path

    from stream_events import id_and_time, write_event_files
    batches = [[(1, "00:00:10"), (2, "00:00:20")], [(3, "00:00:30"), (1, "00:00:40")]]
    if stateful:
        transform, mode = (lambda f: f.repartition("id").groupBy("id").count()), "update"
    else:
        transform, mode = (lambda f: f.repartition("id")), "append"
    results = []
    for side, session in (("spark", spark), ("microbatch", ss)):
        files = Path(write_event_files(tmp_path / f"events-{side}", batches[:1], id_and_time))
        ckpt = tmp_path / f"ck-{side}"
        first = _partitions_per_batch(session, files, ckpt, transform,
                                      {AQE_STATELESS: "false", "spark.sql.shuffle.partitions": "3"}, mode)
        more = Path(write_event_files(tmp_path / f"more-{side}", batches, id_and_time))
        for name in sorted(p.name for p in more.iterdir())[1:]:
            shutil.copy(more / name, files / name)
        second = _partitions_per_batch(session, files, ckpt, transform,
                                       {AQE_STATELESS: "false", "spark.sql.shuffle.partitions": "5"}, mode)
        state = sorted(p.name for p in (ckpt / "state" / "0").iterdir()) if stateful else []
        results.append((first, second, _offsets_conf(ckpt, 1)["spark.sql.shuffle.partitions"], state))
    theirs, ours = results
    assert ours == theirs, results
    assert ours[2] == "3"
    assert [n for _, n, _ in ours[1]] == ([3] if stateful else [5])


# -- spark.sql.streaming.fileSource.cleaner.numThreads -------------------------------------------------

@pytest.mark.parametrize("threads", ["0", "4"])
def test_the_cleaner_threads_archive_the_files_of_committed_batches_as_spark(spark, ss, tmp_path, threads):
    """Spark's cleaner hands a committed batch's files to numThreads threads (0: cleans them
    itself); microbatch cleans them on as many threads and waits. The same files are
    archived when the query ends, the same left, the same rows read."""
    from helpers import confs
    results = []
    for session in (spark, ss):
        root = tmp_path / f"s{id(session)}"
        source = root / "in"
        source.mkdir(parents=True)
        for i in range(6):
            (source / f"f{i}.json").write_text(f'{{"v": {i}}}\n')
            os.utime(source / f"f{i}.json", (1_700_000_000 + i, 1_700_000_000 + i))
        rows = []
        with confs(session, {"spark.sql.streaming.fileSource.cleaner.numThreads": threads}):
            query = (session.readStream.schema("v INT").option("cleanSource", "archive")
                     .option("sourceArchiveDir", str(root / "archive")).option("maxFilesPerTrigger", 2)
                     .json(str(source)).writeStream.foreachBatch(lambda df, _, rows=rows: rows.extend(r.v for r in df.collect()))
                     .option("checkpointLocation", str(root / "ck")).trigger(availableNow=True).start())
            query.awaitTermination(120)
        assert query.exception() is None
        archived = sorted(p.name for p in (root / "archive").rglob("*.json")) if (root / "archive").exists() else []
        results.append((sorted(rows), sorted(p.name for p in source.iterdir()), archived))
    assert results[0] == results[1], results
    assert results[1][0] == list(range(6)) and len(results[1][2]) >= 4, results


# -- spark.sql.streaming.disabledV2Writers, validateEventTimeWatermarkColumn ---------------------------

@pytest.mark.parametrize("fmt, provider, refused", [
    ("console", "org.apache.spark.sql.execution.streaming.ConsoleSinkProvider", True),
    ("noop", "org.apache.spark.sql.execution.datasources.noop.NoopDataSource", True),
    # another class (not console's provider): nothing disabled
    ("console", "org.apache.spark.sql.execution.streaming.sources.ConsoleSinkProvider", False),
])
def test_a_disabled_v2_writer_without_a_v1_sink_is_refused_as_spark(spark, ss, tmp_path, fmt, provider, refused):
    from helpers import confs
    said = []
    for session in (spark, ss):
        frame = _rate_like_stream(session, tmp_path / f"in{id(session)}")
        with confs(session, {"spark.sql.streaming.disabledV2Writers": f"some.Other, {provider}"}):
            try:
                query = (frame.writeStream.format(fmt).option("checkpointLocation", str(tmp_path / f"ck{id(session)}"))
                         .trigger(availableNow=True).start())
            except Exception as e:   # noqa: BLE001 - compared below
                said.append((type(e).__name__, str(e).split("\n")[0]))
                continue
            query.awaitTermination(120)
            said.append(("ran", query.exception() is None))
    assert said[0] == said[1], said
    assert (said[1][0] == "UnsupportedOperationException") == refused, said
    if refused:
        assert said[1][1] == f"Data source {fmt} does not support streamed writing."


@pytest.mark.parametrize("validate", ["true", "false"])
def test_a_nested_event_time_is_checked_as_sparks_analysis_checks_it(spark, ss, tmp_path, validate):
    """withWatermark's event time is checked by Spark's own analysis of the frame microbatch
    keeps beside the stream, under the session's validateEventTimeWatermarkColumn: a nested
    field fails with EVENT_TIME_MUST_BE_TOP_LEVEL_COLUMN, or (the check off) as Spark fails."""
    from helpers import confs
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.json").write_text('{"s": {"ts": "2024-01-01 00:00:01"}}\n')
    said = []
    for session in (spark, ss):
        frame = session.readStream.schema("s STRUCT<ts: TIMESTAMP>").json(str(tmp_path / "in"))
        with confs(session, {"spark.sql.streaming.validateEventTimeWatermarkColumn": validate}):
            with pytest.raises(Exception) as failed:
                frame.withWatermark("s.ts", "10 seconds")
        said.append((type(failed.value).__name__, str(failed.value).split("\n")[0]))
    assert said[0][0] == said[1][0], said
    if validate == "true":
        assert said[0] == said[1] and "EVENT_TIME_MUST_BE_TOP_LEVEL_COLUMN" in said[1][1], said


# -- spark.sql.streaming.transformWithState.stateSchemaVersion -------------------------------------------

def test_a_state_schema_version_other_than_3_is_refused_by_name(ss, tmp_path):
    """Spark 4.3's engine fails to plan a transformWithState under version 2 (INTERNAL_ERROR);
    microbatch refuses it by name when the query starts; 3 (the default) runs."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    from helpers import confs

    class Count(StatefulProcessor):
        def init(self, handle):
            self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))

        def handleInputRows(self, key, rows, timerValues):  # noqa: N802, N803 - PySpark's names
            yield pd.DataFrame({"k": [key[0]], "n": [sum(len(r) for r in rows)]})

        def close(self):
            pass
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.json").write_text('{"k": "a"}\n{"k": "b"}\n')
    frame = ss.readStream.schema("k STRING").json(str(tmp_path / "in")).groupBy("k").transformWithStateInPandas(
        Count(), "k STRING, n LONG", "update", "none")
    rocksdb = {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB}
    for version, fails in (("2", True), ("3", False)):
        with confs(ss, {**rocksdb, "spark.sql.streaming.transformWithState.stateSchemaVersion": version}):
            query = (frame.writeStream.format("noop").outputMode("update")
                     .option("checkpointLocation", str(tmp_path / f"ck{version}")).trigger(availableNow=True).start())
            try:
                query.awaitTermination(120)
            except Exception as e:   # noqa: BLE001
                assert fails and "transformWithState.stateSchemaVersion=2" in str(e), str(e)[:500]
            else:
                assert not fails and query.exception() is None
