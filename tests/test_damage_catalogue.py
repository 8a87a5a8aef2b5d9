"""The damage catalogue: a checkpoint (or its output, or its input) damaged the ways
real ones get damaged. Each damage gives a clear error naming the file and the problem,
and changes no file of the checkpoint or the sink's output.

One healthy run of a stateful query (json files -> event-time window count with a
watermark -> parquet, append) makes the checkpoint every case starts from: offsets,
commits, the file source's log, state deltas and schema files, and the file sink's
``_spark_metadata``. A case copies it, damages it, restarts the query and checks.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from file_inputs import write_json_files
from helpers import confs


def window_counts(ss, src, out, ckpt, trigger=None):
    frame = ss.readStream.format("json").schema("id INT, name STRING") \
        .option("maxFilesPerTrigger", 1).load(str(src))
    counts = (frame.withColumn("ts", F.timestamp_seconds("id"))
              .withWatermark("ts", "0 seconds")
              .groupBy(F.window("ts", "100 seconds")).count()
              .select(F.col("window.start").alias("start"), "count"))
    return (counts.writeStream.format("parquet").outputMode("append")
            .option("checkpointLocation", str(ckpt)).option("path", str(out))
            .trigger(availableNow=True))


def tree_digest(*roots) -> dict[str, str]:
    """Every file's digest, by path; ``leases/`` left out: each run that starts adds its
    lease there (checkpoint/run_lease.py), which is bookkeeping, not data of a batch."""
    found = {}
    for root in roots:
        for directory, _, names in os.walk(root):
            if os.path.basename(directory) == "leases":
                continue
            for name in names:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    found[path] = hashlib.sha256(f.read()).hexdigest()
    return found


SNAPSHOTS = "spark.sql.streaming.stateStore.minDeltasForSnapshot"


@pytest.fixture(scope="module")
def healthy(ss, tmp_path_factory):
    """Input, checkpoint and output after batches 0..4 (4 is a no-data batch that
    closes the last window; state versions 1..5), and a pristine copy of them."""
    root = tmp_path_factory.mktemp("damage")
    write_json_files(root / "live/in", 0, 4, rows_per_file=5)
    with confs(ss, {SNAPSHOTS: "2"}):   # a snapshot at version 3, so deltas 4 and 5 build on it
        query = window_counts(ss, root / "live/in", root / "live/out", root / "live/ckpt").start()
        query.awaitTermination(120)
        assert query.exception() is None
        shutil.copytree(root / "live", root / "pristine")
        yield root


@pytest.fixture
def damaged(healthy):
    """The healthy run at its own paths (the file source's log records absolute paths,
    so a copy elsewhere would be a different input), restored before each case."""
    shutil.rmtree(healthy / "live")
    shutil.copytree(healthy / "pristine", healthy / "live")
    return healthy / "live"


def truncate(path, keep: int):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep])


def overwrite(path, content: bytes):
    with open(path, "wb") as f:
        f.write(content)


def state_file(root, suffix):
    partition = root / "ckpt" / "state" / "0" / "0"
    names = sorted((n for n in os.listdir(partition) if n.endswith(suffix)),
                   key=lambda n: int(n.split(".")[0]))
    return partition / names[-1]


# (damage, what the error must say); {root} is the copy's directory
CASES = {
    "truncated offsets entry": (lambda r: truncate(r / "ckpt/offsets/4", 30),
                                ["ckpt/offsets/4", "malformed"]),
    "garbage offsets entry": (lambda r: overwrite(r / "ckpt/offsets/4", b"\x00\x13garbage"),
                              ["ckpt/offsets/4"]),
    "empty offsets entry": (lambda r: overwrite(r / "ckpt/offsets/4", b""),
                            ["ckpt/offsets/4", "is empty"]),
    "unknown offsets version": (lambda r: overwrite(r / "ckpt/offsets/4",
                                                    (r / "ckpt/offsets/4").read_bytes().replace(b"v1", b"v99", 1)),
                                ["ckpt/offsets/4", "UnsupportedLogVersion", "v99"]),
    "torn last offsets entry, never committed": (
        lambda r: (os.remove(r / "ckpt/commits/4"), os.remove(r / "out/_spark_metadata/4"),
                   truncate(r / "ckpt/offsets/4", 30)),
        ["ckpt/offsets/4", "malformed", "batch 4 was never committed", "deleting it is safe",
         "rm '"]),
    "truncated commit entry": (lambda r: truncate(r / "ckpt/commits/4", 12),
                               ["ckpt/commits/4", "malformed"]),
    "garbage commit entry": (lambda r: overwrite(r / "ckpt/commits/4", b"{not a log"),
                             ["ckpt/commits/4"]),
    "unknown commit version": (lambda r: overwrite(r / "ckpt/commits/4", b'v99\n{"nextBatchWatermarkMs":0}'),
                               ["ckpt/commits/4", "v99"]),
    "commit without its offsets": (lambda r: os.rename(r / "ckpt/commits/4", r / "ckpt/commits/5"),
                                   ["ckpt/commits/5", "no entry", "Nothing was run"]),
    "missing state delta": (lambda r: os.remove(state_file(r, ".delta.arrow")),
                            ["state/0/0/5.delta.arrow", "does not exist"]),
    "truncated state delta": (lambda r: truncate(state_file(r, ".delta.arrow"), 20),
                              ["state/0/0", ".delta"]),
    "corrupted state delta": (lambda r: overwrite(state_file(r, ".delta.arrow"), b"\x00" * 64),
                              ["state/0/0", ".delta"]),
    "truncated state snapshot": (lambda r: truncate(state_file(r, ".snapshot.arrow"), 40),
                                 ["state/0/0/", ".snapshot.arrow"]),
    "corrupted state snapshot": (lambda r: overwrite(state_file(r, ".snapshot.arrow"), b"ARROW1" * 9),
                                 ["state/0/0/", ".snapshot.arrow"]),
    "state schema file that disagrees": (
        lambda r: overwrite(r / "ckpt/state/0/_metadata/schema",
                            (r / "ckpt/state/0/_metadata/schema").read_bytes().replace(b'"long"', b'"string"')),
        ["state/0/_metadata/schema", "does not fit"]),
    "garbage source log entry": (lambda r: overwrite(r / "ckpt/sources/0/3", b"v1\n{garbage"),
                                 ["sources/0/3"]),
    "input file of a batch to re-run vanished": (
        lambda r: [os.remove(r / p) for p in ("ckpt/commits/4", "ckpt/offsets/4", "ckpt/commits/3", "in/f003.json")],
        ["f003.json"]),
    "corrupted sink log entry": (lambda r: overwrite(r / "out/_spark_metadata/4", b"v1\n{garbage"),
                                 ["_spark_metadata/4"]),
    "truncated sink log entry": (lambda r: truncate(r / "out/_spark_metadata/4", 10),
                                 ["_spark_metadata/4"]),
}


#: Files a failed batch may add: its write-ahead entries (``offsets/5``, the file
#: source's ``sources/0/4``) and state version 6 (delta, snapshot) of partitions whose task finished. A
#: restart re-runs batch 5 from them and writes the same state again. Damage that is only
#: found when a task reads the file (a state file's content) fails batch 5 after them.
WRITE_AHEAD = re.compile(r"/ckpt/(offsets/5|sources/0/4|state/\d+/\d+/6\.(delta|snapshot)\.arrow)$")


def run(ss, root):
    """Start the query on ``root``; its error, or None when it ran to the end."""
    try:
        query = window_counts(ss, root / "in", root / "out", root / "ckpt").start()
        query.awaitTermination(120)
        return query.exception()
    except Exception as e:  # noqa: BLE001 (refused at start is as good as failed at once)
        return e


@pytest.mark.parametrize("case", list(CASES))
def test_damage_gives_a_clear_error_and_changes_nothing(ss, spark, healthy, damaged, case):
    damage, expected = CASES[case]
    write_json_files(damaged / "in", 4, 1, rows_per_file=5)   # a batch to run after the damage
    healthy_files = tree_digest(damaged / "ckpt", damaged / "out")
    damage(damaged)
    before = tree_digest(damaged / "ckpt", damaged / "out")
    error = run(ss, damaged)
    assert error is not None, f"{case}: the query ran on a damaged checkpoint"
    text = str(error)
    first_line = text.strip().splitlines()[0]
    for part in expected:
        assert part in text, f"{case}: {part!r} not in {text[:600]}"
    assert "Python worker" not in first_line, f"{case}: the cause is not on the first line: {first_line}"
    after = tree_digest(damaged / "ckpt", damaged / "out")
    assert [p for p in before if after.get(p) != before[p]] == [], f"{case}: a file changed"
    added = [p for p in after if p not in before]
    assert all(WRITE_AHEAD.search(p) for p in added), f"{case}: more than the batch's write-ahead: {added}"

    # undo the damage (as a backup would), restart: nothing was lost
    for path, digest in healthy_files.items():
        if before.get(path) != digest:
            shutil.copyfile(str(path).replace("/live/", "/pristine/"), path)
    for path in before:
        if path not in healthy_files:
            os.remove(path)
    for name in os.listdir(healthy / "pristine/in"):
        if not (damaged / "in" / name).exists():
            shutil.copyfile(healthy / "pristine/in" / name, damaged / "in" / name)
    assert run(ss, damaged) is None, case
    got = sorted((r.start.timestamp(), r["count"]) for r in spark.read.parquet(str(damaged / "out")).collect())
    assert got == [(0.0, 5), (100.0, 5), (200.0, 5), (300.0, 5)], case


def test_a_missing_snapshot_is_rebuilt_from_the_deltas(ss, spark, damaged):
    """A snapshot is a shortcut: without it the deltas since version 0 give the same
    state (as in Spark's providers), so this damage is no error."""
    write_json_files(damaged / "in", 4, 1, rows_per_file=5)
    for partition in ("0", "1"):
        os.remove(damaged / "ckpt/state/0" / partition / "3.snapshot.arrow")
    assert run(ss, damaged) is None
    got = sorted((r.start.timestamp(), r["count"]) for r in spark.read.parquet(str(damaged / "out")).collect())
    assert got == [(0.0, 5), (100.0, 5), (200.0, 5), (300.0, 5)]


def test_an_aggregate_that_changed_meaning_is_refused(ss, tmp_path):
    """count(1) and sum(id) both keep one long per key: Spark's engine reuses the count's
    state as the sum's, silently. microbatch records each operator's aggregates in its
    state schema file and refuses the change, naming both and changing nothing."""
    write_json_files(tmp_path / "in", 0, 2, rows_per_file=3)
    frame = ss.readStream.format("json").schema("id INT, name STRING").load(str(tmp_path / "in"))

    def start(aggregate):
        return (frame.groupBy("name").agg(aggregate.alias("v")).writeStream.format("memory")
                .queryName(f"meaning_{len(os.listdir(tmp_path))}").outputMode("complete")
                .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    first = start(F.count(F.lit(1)))
    first.awaitTermination(60)
    assert first.exception() is None
    write_json_files(tmp_path / "in", 2, 1, rows_per_file=3)
    before = tree_digest(tmp_path / "ckpt")
    second = start(F.sum("id"))
    with pytest.raises(StreamingQueryException) as failed:
        second.awaitTermination(60)
    error = str(failed.value)
    assert "the aggregates were count(1) and are now sum(id)" in error, error
    assert "state/0/_metadata/schema" in error
    assert tree_digest(tmp_path / "ckpt") == before


def _run_engine(session, ckpt, out, calls):
    """rate-micro-batch -> foreachBatch that appends to parquet and records its batch ids."""
    def write(df, batch_id):
        calls.append(batch_id)
        df.write.mode("append").parquet(str(out))
    query = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", 3).load()
             .writeStream.foreachBatch(write).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except Exception as e:  # noqa: BLE001
        return e
    return query.exception()


def test_a_commit_without_its_offsets_spark_reruns_the_batch_microbatch_runs_nothing(ss, spark, tmp_path):
    """The same damage to both engines' checkpoints (commits/2 renamed to commits/3):
    Spark's engine hands the committed batch 2 to foreachBatch again, then fails on the
    commit log; microbatch refuses before anything runs, naming the files, and changes
    nothing."""
    outcomes = {}
    for engine, session in (("spark", spark), ("microbatch", ss)):
        ckpt, out = tmp_path / engine / "ckpt", tmp_path / engine / "out"
        for _ in range(3):                                  # batches 0, 1, 2
            assert _run_engine(session, ckpt, out, []) is None
        os.rename(ckpt / "commits/2", ckpt / "commits/3")
        for crc in (ckpt / "commits/.2.crc",):
            if crc.exists():
                os.rename(crc, ckpt / "commits/.3.crc")
        before = tree_digest(ckpt, out)
        calls: list[int] = []
        outcomes[engine] = (_run_engine(session, ckpt, out, calls), calls, tree_digest(ckpt, out) == before)
    spark_error, spark_calls, _ = outcomes["spark"]
    # Spark's engine gives the committed batch 2 to foreachBatch again (then plans batch 3,
    # whose commit it cannot write)
    assert spark_calls[:1] == [2] and spark_error is not None, outcomes["spark"]
    error, calls, unchanged = outcomes["microbatch"]
    assert calls == [] and unchanged, outcomes["microbatch"]
    assert "commits/3" in str(error) and "Nothing was run" in str(error)
