"""The checkpoint toolkit: ``microbatch checkpoint verify | explain | diff | rollback``.

One healthy run of a stateful query (json files -> event-time window count with a
watermark -> parquet, append: offsets, commits, the file source's log, state deltas and
snapshots, the sink's ``_spark_metadata``, leases, progress) is the checkpoint the cases
start from; each case copies it, damages or changes it, and runs the command as a user
does (``microbatch.cli.main``), checking its output, its exit code and the files.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from file_inputs import write_json_files
from helpers import confs
from microbatch.cli.main import main
from test_damage_catalogue import tree_digest, truncate, window_counts


def cli(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def run_to_end(ss, root, *, start=None):
    query = window_counts(ss, root / "in", root / "out", root / "ckpt").start()
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return query


def output_rows(spark, out) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.parquet(str(out)).collect())


@pytest.fixture(scope="module")
def healthy(ss, tmp_path_factory):
    """Input, checkpoint and output after batches 0..4 (the damage catalogue's query, with
    snapshots every 2 versions), and a pristine copy."""
    root = tmp_path_factory.mktemp("toolkit")
    write_json_files(root / "live/in", 0, 4, rows_per_file=5)
    with confs(ss, {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "2"}):
        run_to_end(ss, root / "live")
    shutil.copytree(root / "live", root / "pristine")
    return root


@pytest.fixture
def live(healthy):
    """The healthy run at its own paths (its logs hold absolute paths), restored per case."""
    shutil.rmtree(healthy / "live")
    shutil.copytree(healthy / "pristine", healthy / "live")
    return healthy / "live"


def test_verify_passes_healthy_checkpoints_of_microbatch_and_of_sparks_engine(ss, spark, live, tmp_path, capsys):
    code, out = cli(capsys, "checkpoint", "verify", live / "ckpt")
    assert code == 0 and "no damage found" in out, out
    assert "NOTE" not in out and "DAMAGE" not in out
    files_read = int(out.split(" files read")[0].rsplit(" ", 1)[1])
    assert files_read > 30, out   # logs, source log, state files, sink log, leases, progress

    # The same query on Spark's own engine: its checkpoint (with .crc files, Spark's state
    # files) and its output's _spark_metadata
    src = live / "in"
    counts = (spark.readStream.format("json").schema("id INT, name STRING").option("maxFilesPerTrigger", 1)
              .load(str(src)).withColumn("ts", F.timestamp_seconds("id")).withWatermark("ts", "0 seconds")
              .groupBy(F.window("ts", "100 seconds")).count().select(F.col("window.start").alias("start"), "count"))
    query = (counts.writeStream.format("parquet").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "spark/ckpt")).option("path", str(tmp_path / "spark/out"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    code, out = cli(capsys, "checkpoint", "verify", tmp_path / "spark/ckpt", "--output", tmp_path / "spark/out")
    assert code == 0 and "no damage found" in out, out
    assert any(name.endswith(".crc") for _, _, names in os.walk(tmp_path / "spark/ckpt") for name in names)

    # ... and a checksum that no longer holds is damage
    delta = tmp_path / "spark/ckpt/state/0/0/1.delta"
    truncate(delta, os.path.getsize(delta) - 2)
    code, out = cli(capsys, "checkpoint", "verify", tmp_path / "spark/ckpt")
    assert code == 1 and f"DAMAGE: {delta}:" in out and "checksum" in out, out


def _write(path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _state_file(ckpt, version, kind, partition=0):
    return ckpt / f"state/0/{partition}/{version}.{kind}.arrow"


# (case, damage, the damaged file relative to the run's root, words of the finding)
DAMAGE = [
    ("truncated offsets entry", lambda r: truncate(r / "ckpt/offsets/2", 10), "ckpt/offsets/2", "malformed"),
    ("truncated commits entry", lambda r: truncate(r / "ckpt/commits/3", 10), "ckpt/commits/3", "malformed"),
    ("garbage commits entry", lambda r: _write(r / "ckpt/commits/1", "\x00\x17garbage"), "ckpt/commits/1",
     "version"),
    ("wrong version header", lambda r: _write(r / "ckpt/offsets/4", open(r / "ckpt/offsets/4").read()
                                              .replace("v1", "v99", 1)), "ckpt/offsets/4", "v99"),
    ("commit without offsets", lambda r: shutil.copy(r / "ckpt/commits/4", r / "ckpt/commits/5"),
     "ckpt/commits/5", "no offsets/5"),
    ("missing offsets entry", lambda r: os.remove(r / "ckpt/offsets/2"), "ckpt/offsets/2", "gap"),
    ("missing metadata", lambda r: os.remove(r / "ckpt/metadata"), "ckpt/metadata", "query's id is lost"),
    ("missing state delta", lambda r: os.remove(_state_file(r / "ckpt", 5, "delta")),
     "ckpt/state/0/0/5.delta.arrow", "state version 5"),
    ("missing state partition", lambda r: shutil.rmtree(r / "ckpt/state/0/1"), "ckpt/state/0/1",
     "2 state partitions"),
    ("corrupted state snapshot", lambda r: _write(_state_file(r / "ckpt", 3, "snapshot"), "not arrow"),
     "ckpt/state/0/0/3.snapshot.arrow", "cannot be read"),
    ("state schema file that disagrees", lambda r: _write(
        r / "ckpt/state/0/_metadata/schema", open(r / "ckpt/state/0/_metadata/schema").read()
        .replace('"type": "long"', '"type": "double"')), "ckpt/state/0/0/5.delta.arrow", "disagrees with the schema file"),
    ("garbage file source log entry", lambda r: _write(r / "ckpt/sources/0/1", "v1\n{not json"),
     "ckpt/sources/0/1", "damaged at line 2"),
    ("damaged sink log entry", lambda r: _write(r / "out/_spark_metadata/2", "v1\n{\"path\":"),
     "out/_spark_metadata/2", "damaged at line 2"),
    ("missing sink data file", lambda r: os.remove(next(
        p for p in (r / "out").iterdir() if p.name.endswith(".parquet"))), "out/part-", "file sink's log lists it"),
]


@pytest.mark.parametrize("case, damage, damaged, words", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_verify_finds_each_damage_and_changes_nothing(live, capsys, case, damage, damaged, words):
    damage(live)
    before = tree_digest(live)
    code, out = cli(capsys, "checkpoint", "verify", live / "ckpt")
    assert code == 1, out
    findings = [line for line in out.splitlines() if line.startswith("DAMAGE: ")]
    assert any(f"DAMAGE: {live / damaged}" in line and words in line for line in findings), out
    assert tree_digest(live) == before


def test_verify_finds_a_foreign_checkpoint(ss, live, tmp_path, capsys):
    """Files of another query's checkpoint copied in, and a directory that is no checkpoint."""
    other = tmp_path / "other"
    write_json_files(other / "in", 0, 1, rows_per_file=2)
    run_to_end(ss, other)
    shutil.copy(other / "ckpt/progress/0", live / "ckpt/progress/0")
    code, out = cli(capsys, "checkpoint", "verify", live / "ckpt")
    assert code == 1 and f"DAMAGE: {live / 'ckpt/progress/0'}: is the progress of query" in out, out
    code, out = cli(capsys, "checkpoint", "verify", live / "in")
    assert code == 1 and "is not a streaming checkpoint" in out, out
    assert not (live / "in/offsets").exists()   # verify reads, never writes


def test_explain_shows_what_a_batch_read_and_how_it_ran(live, capsys):
    code, out = cli(capsys, "checkpoint", "explain", live / "ckpt", 2)
    assert code == 0, out
    lines = out.splitlines()
    assert "batch 2: committed; the next batch's watermark" in out
    assert any(line.startswith("    0 FileStreamSource[file:") and '{"logOffset":1} -> {"logOffset":2}' in line
               for line in lines), out
    assert "    spark.sql.shuffle.partitions = 2" in lines
    assert "watermark  " in out and "progress: 5 input rows" in out
    assert any("Aggregate [window]" in line for line in lines) and "EventTimeWatermark ts" in out
    assert "operator 0 (stateStoreSave): 2 partition(s); version 3" in out
    code, out = cli(capsys, "checkpoint", "explain", live / "ckpt", 9)
    assert code == 1 and "Batch 9 is not in checkpoint" in out and "batches 0..4" in out


def test_diff_of_two_checkpoints(live, tmp_path, capsys):
    shutil.copytree(live, tmp_path / "copy")
    # (the copy's logs name the same input paths: the same batches)
    code, out = cli(capsys, "checkpoint", "diff", live / "ckpt", tmp_path / "copy/ckpt")
    assert code == 0 and "the two checkpoints' batches are the same" in out, out
    os.remove(tmp_path / "copy/ckpt/commits/4")
    os.remove(tmp_path / "copy/ckpt/offsets/4")
    seq = open(tmp_path / "copy/ckpt/offsets/3").read().replace('"logOffset":3', '"logOffset":7')
    _write(tmp_path / "copy/ckpt/offsets/3", seq)
    code, out = cli(capsys, "checkpoint", "diff", live / "ckpt", tmp_path / "copy/ckpt")
    assert code == 1, out
    assert "batches only in A: 4" in out
    assert 'batch 3: source 0 offsets {"logOffset":3} | {"logOffset":7}' in out


def test_rollback_then_restart_writes_the_rolled_back_batches_once(ss, spark, live, capsys):
    everything = output_rows(spark, live / "out")
    code, out = cli(capsys, "checkpoint", "rollback", live / "ckpt", "--to-batch", 1)
    assert code == 0, out
    assert "removed 3 commits" in out and "removed 3 offsets entries" in out
    assert "file sink log entries" in out and "state files of later versions" in out
    assert sorted(int(n) for n in os.listdir(live / "ckpt/commits")) == [0, 1]
    assert sorted(int(n) for n in os.listdir(live / "out/_spark_metadata")) == [0, 1]
    code, out = cli(capsys, "checkpoint", "verify", live / "ckpt")
    assert code == 0, out
    rolled_back = output_rows(spark, live / "out")
    assert len(rolled_back) < len(everything) and set(rolled_back) <= set(everything)

    query = run_to_end(ss, live)
    assert [p.batchId for p in query.recentProgress][0] == 2   # batch 2 runs again
    assert output_rows(spark, live / "out") == everything      # each row once


def test_rollback_refuses_what_it_cannot_restore_and_an_unfinished_one_blocks_a_start(ss, live, capsys):
    # the state of batch 0 is gone (a snapshot at version 3, older files cleaned up? no:
    # remove the files version 1 needs) -> refused, nothing changed
    os.remove(_state_file(live / "ckpt", 1, "delta"))
    before = tree_digest(live)
    code, out = cli(capsys, "checkpoint", "rollback", live / "ckpt", "--to-batch", 0)
    assert code == 1 and "no longer there" in out and "Nothing was changed" in out, out
    assert tree_digest(live) == before
    code, out = cli(capsys, "checkpoint", "rollback", live / "ckpt", "--to-batch", 7)
    assert code == 1 and "not a committed batch" in out, out

    # a rollback cut short leaves its marker: a start is refused until it is finished
    _write(live / "ckpt/rollback", json.dumps({"toBatch": 3}))
    with pytest.raises(Exception) as refused:
        window_counts(ss, live / "in", live / "out", live / "ckpt").start()
    assert "unfinished rollback to batch 3" in str(refused.value)
    assert f"microbatch checkpoint rollback {live / 'ckpt'} --to-batch 3" in str(refused.value)
    code, out = cli(capsys, "checkpoint", "rollback", live / "ckpt", "--to-batch", 3)
    assert code == 0 and not (live / "ckpt/rollback").exists(), out
    run_to_end(ss, live)


def test_rollback_refuses_a_running_query(ss, live, capsys):
    query = window_counts(ss, live / "in", live / "out", live / "ckpt").trigger(processingTime="1 second").start()
    try:
        query.processAllAvailable()
        code, out = cli(capsys, "checkpoint", "rollback", live / "ckpt", "--to-batch", 1)
        assert code == 1 and "Another run of this query is active" in out, out
    finally:
        query.stop()
    assert sorted(int(n) for n in os.listdir(live / "ckpt/commits"))[-1] >= 4


def test_commands_say_when_a_path_is_no_checkpoint(tmp_path, capsys):
    for command in (["checkpoint", "show"], ["checkpoint", "explain"], ["checkpoint", "rollback"]):
        extra = {"explain": ["1"], "rollback": ["--to-batch", "1"]}.get(command[1], [])
        code, out = cli(capsys, *command, tmp_path, *extra)
        assert code == 2 and "is not a checkpoint" in out, (command, out)
    assert not (tmp_path / "offsets").exists()


def test_a_failed_query_leaves_its_error_in_its_lease(ss, tmp_path):
    write_json_files(tmp_path / "in", 0, 1)

    def fail(df, batch_id):
        raise ValueError("the table is gone")

    query = (ss.readStream.schema("id INT, name STRING").json(str(tmp_path / "in")).writeStream
             .foreachBatch(fail).option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(60)
    lease = json.loads(open(tmp_path / "ckpt/leases/1").read())
    assert lease["released"] is True and "the table is gone" in lease["failure"]


def test_rollback_deletes_only_inside_the_sinks_output(live, tmp_path, capsys):
    """A manifest entry naming a file elsewhere (a hand edit, or an output that is not this
    query's): the rollback deletes nothing; verify reports it."""
    bystander = tmp_path / "important.parquet"
    bystander.write_bytes(b"not the sink's")
    manifest = live / "out/_spark_metadata/4"
    entry = {"path": f"file://{bystander}", "size": 14, "isDir": False, "modificationTime": 0,
             "blockReplication": 1, "blockSize": 33554432, "action": "add"}
    _write(manifest, open(manifest).read() + "\n" + json.dumps(entry, separators=(",", ":")))
    before = tree_digest(live)
    code, out = cli(capsys, "checkpoint", "rollback", live / "ckpt", "--to-batch", 1)
    assert code == 1 and "is not inside the output" in out and "Nothing was changed" in out, out
    assert bystander.exists() and tree_digest(live) == before
    code, out = cli(capsys, "checkpoint", "verify", live / "ckpt")
    assert code == 1 and f"DAMAGE: {bystander}: the file sink's log lists it, but it is not inside" in out, out


def test_a_store_holding_both_engines_files_loads_from_either(tmp_path):
    """After a move between the engines (docs/porting.md) a store holds Spark's files beside
    microbatch's: a version either engine's files load is not missing, and a rollback
    takes both engines' later files."""
    from microbatch.ops.checkpoint_reader import CheckpointReader
    adopted = tmp_path / "state" / "0" / "0"            # Spark's versions 1-3, adopted at 3
    converted = tmp_path / "state" / "0" / "1"          # microbatch's 1-3, converted as 4, Spark's 5-6
    for directory, names in ((adopted, ["1.delta", "2.delta", "3.delta", "3.snapshot.arrow", "4.delta.arrow",
                                        "5.delta.arrow"]),
                             (converted, ["1.delta.arrow", "2.delta.arrow", "3.delta.arrow", "4.snapshot.arrow",
                                          "4.snapshot", "5.delta", "6.delta"])):
        directory.mkdir(parents=True)
        for name in names:
            (directory / name).write_bytes(b"")
    (tmp_path / "metadata").write_text('{"id":"q"}')
    first, second = CheckpointReader(str(tmp_path)).stores(0)
    assert (first.engine, second.engine) == ("microbatch", "spark")     # the engine that ran last
    assert first.missing_for(5) == [] and first.missing_for(6) == [f"{adopted}/6.delta.arrow"]
    assert second.missing_for(6) == [] and second.missing_for(4) == []
    assert second.missing_for(7) == [f"{converted}/7.delta"]
    assert sorted(path for v, path in second.all_files() if v > 4) == [f"{converted}/5.delta", f"{converted}/6.delta"]
    assert sorted(path for v, path in first.all_files() if v > 3) == [f"{adopted}/4.delta.arrow",
                                                                      f"{adopted}/5.delta.arrow"]
