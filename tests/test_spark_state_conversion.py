"""A query microbatch ran moves to Spark's engine with its state
(``microbatch checkpoint convert CKPT --to spark``, ops/spark_conversion.py): some batches
run on microbatch; the checkpoint is copied; the copy continues on microbatch and the
original, converted, on Spark's engine, over the same new files. Every later batch's rows,
progress (watermark, state rows) and the logs' watermarks are equal; Spark's own
``statestore`` and ``state-metadata`` readers read the converted checkpoint and agree with
microbatch's reader."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import collect_batches, confs, json_stream
from stream_events import comparable, watermarks
from test_spark_state_adoption import BEFORE, CASES, SCHEMA, arrive, events, recorded_provider  # noqa: F401 - the events fixture

from microbatch.errors import CheckpointError
from microbatch.ops.spark_conversion import convert_to_spark

#: a separate bounded step (make test-porting): moving state between the engines
pytestmark = pytest.mark.porting

SPARK_HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def state_files(ckpt) -> dict:
    return {str(p): p.read_bytes() for p in (ckpt / "state").rglob("*") if p.is_file()}


def shifted(progress: list, by: int) -> list:
    """``comparable`` progress with batch ids moved by ``by`` (the conversion adds a batch)."""
    return [(batch + by, *rest) for batch, *rest in progress]


def spark_reader_rows(spark, ckpt, **options) -> list:
    """Spark's statestore reader: (key, value, partition) as plain tuples."""
    reader = spark.read.format("statestore")
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted(((tuple(r.key), tuple(r.value), r.partition_id) for r in reader.load(str(ckpt)).collect()),
                  key=repr)


def our_reader_rows(ss, ckpt) -> list:
    return sorted(((tuple(r.key), tuple(r.value), r.partition_id)
                   for r in ss.read.format("statestore").load(str(ckpt)).collect()), key=repr)


def as_sparks(case: str, rows: list) -> list:
    """microbatch's reader's rows as Spark keeps the state."""
    if case.startswith("dropDuplicates with"):     # Spark's value of a deduplication: one null column
        return [(k, (None,), p) for k, _, p in rows]
    if case == "applyInPandasWithState without a timeout":      # no timeout timestamp
        return [(k, v[:1], p) for k, v, p in rows]
    if case.startswith("session windows"):     # (microbatch's reader shows Spark's row per session already)
        return sorted(rows, key=repr)
    return rows


#: the cases also converted for Spark's RocksDB provider (a query microbatch ran on its own)
ON_ROCKSDB = ("a window count in append mode", "dropDuplicates with a watermark", "session windows in append mode",
              "applyInPandasWithState with an event-time timeout")


@pytest.mark.parametrize("case, provider", [(case, "hdfs") for case in CASES] +
                         [(case, "rocksdb") for case in ON_ROCKSDB])
def test_spark_continues_a_checkpoint_microbatch_wrote_after_the_conversion(spark, ss, events, tmp_path, case,
                                                                            provider):
    from test_spark_state_adoption import PROVIDERS, SPARK_ROCKSDB
    transform, mode = CASES[case]
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:BEFORE])
    with confs(spark, PROVIDERS[provider]):     # (microbatch's counterpart of Spark's provider)
        first, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), moved, mode)
    assert len(first) >= BEFORE and recorded_provider(moved).startswith("microbatch.")
    shutil.copytree(moved, stayed)
    ours_before = state_files(moved)

    result = convert_to_spark(spark, str(moved))   # (for Spark's provider matching microbatch's)
    last = first[-1][0]
    assert (result.batch, result.done_before) == (last + 1, False) and result.stores > 0
    assert recorded_provider(moved) == result.provider == {"hdfs": SPARK_HDFS, "rocksdb": SPARK_ROCKSDB}[provider]
    # files are added, none rewritten
    assert all(state_files(moved)[path] == data for path, data in ours_before.items())
    # Spark's readers read the converted checkpoint as microbatch's reader reads it
    theirs_state = spark_reader_rows(spark, moved)
    ours_state = our_reader_rows(ss, stayed)
    assert theirs_state == as_sparks(case, ours_state) and theirs_state
    metadata = spark.read.format("state-metadata").load(str(moved)).collect()
    assert [(m.operatorId, m.stateStoreName, m.numPartitions) for m in metadata] == [(0, "default", 2)]
    assert metadata[0].operatorName == json.loads((moved / "state/0/_metadata/schema").read_text())["operatorName"]
    # a second conversion finds Spark's state and writes nothing
    again = state_files(moved)
    assert convert_to_spark(spark, str(moved)).done_before and state_files(moved) == again

    arrive(events, live, names[BEFORE:])
    theirs, their_progress = collect_batches(transform(json_stream(spark, live, SCHEMA)), moved, mode)
    ours, our_progress = collect_batches(transform(json_stream(ss, live, SCHEMA)), stayed, mode)
    assert [rows for _, rows in theirs] == [rows for _, rows in ours] and any(rows for _, rows in ours)
    assert [b for b, _ in theirs] == [b + 1 for b, _ in ours]
    assert comparable([json.loads(p.json) for p in their_progress]) == \
        shifted(comparable([json.loads(p.json) for p in our_progress]), 1)
    # the logs' watermarks: the conversion batch repeats the last batch's
    theirs_marks = [(log, int(b), mark) for log, b, mark in watermarks(moved)]
    ours_marks = [(log, int(b), mark) for log, b, mark in watermarks(stayed)]
    assert [m for m in theirs_marks if m[1] != last + 1] == \
        [(log, b if b <= last else b + 1, mark) for log, b, mark in ours_marks]


def test_a_checkpoint_that_moved_from_spark_to_microbatch_and_back_continues_on_spark(spark, ss, events, tmp_path):
    transform, mode = CASES["sums, averages and maxima per key in update mode"]
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:2])
    collect_batches(transform(json_stream(spark, live, SCHEMA)), moved, mode)
    arrive(events, live, names[2:4])
    collect_batches(transform(json_stream(ss, live, SCHEMA)), moved, mode)     # adopted, then microbatch's
    shutil.copytree(moved, stayed)
    assert subprocess.run([sys.executable, "-m", "microbatch.cli.main", "checkpoint", "convert", str(moved),
                           "--to", "spark"], capture_output=True, text=True, env={
                               **os.environ, "PYSPARK_PYTHON": sys.executable}).returncode == 0
    arrive(events, live, names[4:])
    theirs, _ = collect_batches(transform(json_stream(spark, live, SCHEMA)), moved, mode)
    ours, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), stayed, mode)
    assert [rows for _, rows in theirs] == [rows for _, rows in ours] and theirs


def checkpoint_files(ckpt) -> dict:
    return {str(p): p.read_bytes() for d in ("state", "offsets", "commits", "sources")
            for p in (ckpt / d).rglob("*") if p.is_file()}


def test_a_conversion_is_refused_before_anything_is_written_and_finished_when_cut_short(spark, ss, events,
                                                                                        tmp_path):
    from pyspark.sql import functions as F
    live = tmp_path / "live"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:2])

    def sessions(f):
        return f.withWatermark("ts", "10 seconds").groupBy(F.session_window("ts", "5 seconds"), "id").count()
    collect_batches(sessions(json_stream(ss, live, SCHEMA)), tmp_path / "sessions", "append")
    # a schema file an earlier microbatch wrote, without the session window's place
    schema_file = tmp_path / "sessions" / "state" / "0" / "_metadata" / "schema"
    schema_file.write_text(json.dumps({k: v for k, v in json.loads(schema_file.read_text()).items()
                                       if k != "sessionIndex"}))
    before = checkpoint_files(tmp_path / "sessions")
    with pytest.raises(CheckpointError, match="earlier microbatch.*session window's place.*Nothing was written"):
        convert_to_spark(spark, str(tmp_path / "sessions"))
    assert checkpoint_files(tmp_path / "sessions") == before

    # a batch planned and not committed: refused, with the fix named
    ckpt = tmp_path / "counts"
    transform, mode = CASES["sums, averages and maxima per key in update mode"]
    collect_batches(transform(json_stream(ss, live, SCHEMA)), ckpt, mode)
    last = max(int(n) for n in os.listdir(ckpt / "commits") if n.isdigit())
    shutil.copy(ckpt / "offsets" / str(last), ckpt / "offsets" / str(last + 1))
    before = checkpoint_files(ckpt)
    with pytest.raises(CheckpointError, match=f"batch {last + 1} was planned and not committed.*rollback"):
        convert_to_spark(spark, str(ckpt))
    assert checkpoint_files(ckpt) == before
    os.remove(ckpt / "offsets" / str(last + 1))

    # cut short after the conversion batch was planned: a second run finishes it
    shutil.copytree(ckpt, tmp_path / "plain")
    done = convert_to_spark(spark, str(ckpt))
    os.remove(ckpt / "commits" / str(done.batch))
    for path in (ckpt / "state").rglob(f"{done.batch + 1}.snapshot*"):     # both engines' files
        path.unlink()
    half = tmp_path / "half"
    shutil.copytree(ckpt, half)
    again = convert_to_spark(spark, str(ckpt))
    assert (again.batch, again.stores, again.done_before) == (done.batch, done.stores, False)
    state = spark_reader_rows(spark, ckpt)
    assert state and state == our_reader_rows(ss, ckpt)
    # microbatch, started on a conversion cut short, runs the planned batch on its own state
    # and goes on as on the checkpoint never converted
    arrive(events, live, names[2:])
    batches, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), half, mode)
    plain, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), tmp_path / "plain", mode)
    assert batches[0] == (done.batch, []) and batches[1:] == [(b + 1, rows) for b, rows in plain] and plain


def test_the_offline_repartition_refuses_state_spark_wrote_last(spark, ss, events, tmp_path):
    live, ckpt = tmp_path / "live", tmp_path / "ckpt"
    live.mkdir()
    arrive(events, live, sorted(os.listdir(events))[:2])
    collect_batches(json_stream(ss, live, SCHEMA).groupBy("id").count(), ckpt, "update")
    convert_to_spark(spark, str(ckpt))
    before = checkpoint_files(ckpt)
    with pytest.raises(CheckpointError, match="last written by Spark's engine.*Nothing was changed"):
        ss._streamingCheckpointManager.repartition(str(ckpt), 3)
    assert checkpoint_files(ckpt) == before


def transform_with_state_cases() -> dict:
    from test_spark_state_adoption import transform_with_state_cases as adopted
    from test_transform_with_state_differential import expiring_per_id
    return {**adopted(), "TTLs on value, list and map state, processing-time timers": (expiring_per_id, "update")}


def batch_per_file(session, transform, events, live, names, ckpt, mode) -> tuple[list, list]:
    """A run per file (``once``): a query in processing time runs a batch at every trigger
    (Spark's too), so ``availableNow`` would not end."""
    batches, progress = [], []
    for name in names:
        arrive(events, live, [name])
        query = (transform(json_stream(session, live, SCHEMA)).writeStream.outputMode(mode)
                 .foreachBatch(lambda df, i: batches.append((i, sorted(map(tuple, df.collect()), key=repr))))
                 .option("checkpointLocation", str(ckpt)).trigger(once=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        progress += query.recentProgress
    return batches, progress


def tws_readings(case: str) -> list[dict]:
    """Spark's statestore reader's options for every state variable and the timers."""
    names = {"value, list and map state with event-time timers": ("count", "times", "seen"),
             "value and map state, the Row API": ("state", "seen"),
             "value and list state, no time mode": ("count", "firsts"),
             "TTLs on value, list and map state, processing-time timers": ("last", "kept", "hist", "seen")}[case]
    readings = [{"stateVarName": name, "flattenCollectionTypes": flatten}
                for name in names for flatten in ("true", "false")]
    if "no time mode" not in case:
        readings.append({"readRegisteredTimers": "true"})
    return readings


@pytest.mark.parametrize("case", list(transform_with_state_cases()))
def test_spark_continues_a_transform_with_state_microbatch_ran(spark, ss, events, tmp_path, case):
    """transformWithState's stores (one per state variable, and the timers') become Spark's
    column families in RocksDB snapshots (Spark runs it on its RocksDB provider only)."""
    from test_spark_state_adoption import SPARK_ROCKSDB
    from test_transform_with_state_differential import unordered_maps
    transform, mode = transform_with_state_cases()[case]
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    processing_time = case.startswith("TTLs")
    if processing_time:
        first, _ = batch_per_file(ss, transform, events, live, names[:BEFORE], moved, mode)
    else:
        arrive(events, live, names[:BEFORE])
        first, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), moved, mode)
    assert len(first) >= BEFORE
    shutil.copytree(moved, stayed)
    ours_before = state_files(moved)

    with pytest.raises(CheckpointError, match="transformWithState.*RocksDB provider only.*Nothing was written"):
        convert_to_spark(spark, str(moved), state_provider="hdfs")
    assert state_files(moved) == ours_before
    result = convert_to_spark(spark, str(moved))
    assert (result.batch, result.provider, result.stores) == (first[-1][0] + 1, SPARK_ROCKSDB, 2)
    assert recorded_provider(moved) == SPARK_ROCKSDB
    assert all(state_files(moved)[path] == data for path, data in ours_before.items())
    # Spark's readers read every state variable and the timers as microbatch's reader does
    for options in tws_readings(case):
        theirs = spark.read.format("statestore").options(**options).load(str(moved))
        ours = ss.read.format("statestore").options(**options).load(str(stayed))
        assert theirs.schema == ours.schema, options
        assert sorted(map(unordered_maps, theirs.collect())) == sorted(map(unordered_maps, ours.collect())), options
    metadata = spark.read.format("state-metadata").load(str(moved)).collect()
    assert [(m.operatorId, m.stateStoreName, m.numPartitions) for m in metadata] == [(0, "default", 2)]

    rocksdb = {"spark.sql.streaming.stateStore.providerClass": SPARK_ROCKSDB}
    if processing_time:    # (the same files again for the second engine)
        again = tmp_path / "again"
        shutil.copytree(events, again)
        with confs(spark, rocksdb):
            theirs, their_progress = batch_per_file(spark, transform, events, live, names[BEFORE:], moved, mode)
        for name in names[BEFORE:]:
            os.remove(live / name)
        ours, our_progress = batch_per_file(ss, transform, again, live, names[BEFORE:], stayed, mode)
        their_progress = [json.loads(p.json) for p in their_progress]
        our_progress = [json.loads(p.json) for p in our_progress]
        assert any(p["stateOperators"][0]["customMetrics"]["numValuesRemovedDueToTTLExpiry"]
                   for p in their_progress)
    else:
        arrive(events, live, names[BEFORE:])
        with confs(spark, rocksdb):
            theirs, their_progress = collect_batches(transform(json_stream(spark, live, SCHEMA)), moved, mode)
        ours, our_progress = collect_batches(transform(json_stream(ss, live, SCHEMA)), stayed, mode)
        their_progress = [json.loads(p.json) for p in their_progress]
        our_progress = [json.loads(p.json) for p in our_progress]
    assert [rows for _, rows in theirs] == [rows for _, rows in ours] and any(rows for _, rows in ours)
    from test_transform_with_state_differential import TTL_METRICS
    custom = TTL_METRICS if processing_time else ()
    assert comparable(their_progress, custom) == shifted(comparable(our_progress, custom), 1)


def test_a_transform_with_state_conversion_cut_short_is_finished_and_microbatch_resumes_it(spark, ss, events,
                                                                                          tmp_path):
    from test_spark_state_adoption import SPARK_ROCKSDB
    from test_transform_with_state_differential import unordered_maps
    transform, mode = transform_with_state_cases()["value and list state, no time mode"]
    live, ckpt, plain = tmp_path / "live", tmp_path / "ckpt", tmp_path / "plain"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:BEFORE])
    collect_batches(transform(json_stream(ss, live, SCHEMA)), ckpt, mode)
    shutil.copytree(ckpt, plain)
    done = convert_to_spark(spark, str(ckpt))
    # cut short: the batch planned, some stores written, nothing committed
    os.remove(ckpt / "commits" / str(done.batch))
    for path in (ckpt / "state" / "0" / "1").rglob(f"{done.batch + 1}.*"):
        path.unlink()
    half = tmp_path / "half"
    shutil.copytree(ckpt, half)
    again = convert_to_spark(spark, str(ckpt))
    assert (again.batch, again.stores, again.provider, again.done_before) == (done.batch, 2, SPARK_ROCKSDB, False)
    for options in tws_readings("value and list state, no time mode"):
        theirs = spark.read.format("statestore").options(**options).load(str(ckpt)).collect()
        ours = ss.read.format("statestore").options(**options).load(str(plain)).collect()
        assert sorted(map(unordered_maps, theirs)) == sorted(map(unordered_maps, ours)) and theirs, options
    # microbatch, started on the conversion cut short, runs the planned batch on its own
    # state and goes on as on the checkpoint never converted
    arrive(events, live, names[BEFORE:])
    batches, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), half, mode)
    unconverted, _ = collect_batches(transform(json_stream(ss, live, SCHEMA)), plain, mode)
    assert batches[0] == (done.batch, []) and batches[1:] == [(b + 1, rows) for b, rows in unconverted]
    assert unconverted
