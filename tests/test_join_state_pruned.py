"""A stream-stream join's state holds what Spark's does: each side's columns that the join's
condition or a step above reads, not those Spark's optimizer prunes from the join's input
(ColumnPruning), in inner, outer and semi joins. Compared batch by batch with Spark's
engine: the rows, the progress's state rows, and each side's state as the state data
source reads it (its columns and rows). A checkpoint an earlier microbatch wrote with
every column of both sides (``data/join_before_pruning``, written by commit 80ce43d with
``python tests/test_join_state_pruned.py``) resumes with that layout, and its next batch
gives Spark's rows."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, sorted_rows
from microbatch.spark_internals import running_version

FIXTURE = Path(__file__).parent / "data" / "join_before_pruning"
#: per side, (key, time on 2026-01-01, then the side's other columns) per file, one file a
#: batch; the fixture holds the first two of each
A = [[(1, "00:00:10", "a1", 10), (2, "00:00:20", "a2", 20)],
     [(3, "00:00:40", "a3", 30), (1, "00:00:12", "a4", 40)],
     [(5, "00:01:40", "a5", 50), (3, "00:00:41", "a6", 60), (7, "00:01:45", "a7", 70)]]
C = [[(1, "00:00:11", 7, "c1"), (9, "00:00:15", 1, "c2")],
     [(3, "00:00:42", 2, "c3"), (2, "00:00:50", 3, "c4")],
     [(5, "00:01:41", 4, "c5"), (1, "00:00:09", 5, "c6"), (8, "00:01:50", 6, "c7")]]
NAMES = {"a": ("id", "ts", "s", "x"), "c": ("cid", "cts", "v", "w")}


def write_inputs(root: Path, files: int = 3) -> None:
    """The first ``files`` files of both streams, with the modification times the
    fixture's log has."""
    for side, rows in (("a", A), ("c", C)):
        directory = root / "in" / side
        directory.mkdir(parents=True, exist_ok=True)
        for i, batch in enumerate(rows[:files]):
            path = directory / f"f{i}.json"
            path.write_text("".join(json.dumps(dict(zip(NAMES[side], (r[0], f"2026-01-01 {r[1]}", *r[2:])))) + "\n"
                                    for r in batch))
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def joined(session, root: Path, how: str):
    """The two streams joined on a key and a time range, with a step above that reads a
    column of each side: Spark's optimizer prunes ``s``, ``x`` (the left side's) and ``w``
    from the join's input."""
    def read(side: str, schema: str, time: str):
        return (session.readStream.format("json").schema(schema).option("maxFilesPerTrigger", 1)
                .load(str(root / "in" / side)).withWatermark(time, "10 seconds"))
    a = read("a", "id INT, ts TIMESTAMP, s STRING, x INT", "ts")
    c = read("c", "cid INT, cts TIMESTAMP, v INT, w STRING", "cts")
    df = a.join(c, F.expr("id = cid AND ts BETWEEN cts - INTERVAL 5 SECONDS AND cts + INTERVAL 5 SECONDS"), how)
    return df.select("id", "cid", "v") if how != "left_semi" else df.select("id")


def side_state(session, ckpt: Path, side: str) -> tuple[list[str], list]:
    df = session.read.format("statestore").option("joinSide", side).load(str(ckpt))
    return df.schema["value"].dataType.fieldNames(), sorted_rows(df.select("key", "value"))


def state_rows(progress) -> list:
    return [[op.numRowsTotal for op in p.stateOperators] for p in progress]


KEPT = {"inner": (["id", "ts"], ["cid", "cts", "v"]), "left_outer": (["id", "ts"], ["cid", "cts", "v"]),
        "full_outer": (["id", "ts"], ["cid", "cts", "v"]), "left_semi": (["id", "ts"], ["cid", "cts"])}


@pytest.mark.parametrize("how", ci_share(list(KEPT)))   # half in CI's run (helpers.ci_share)
def test_each_side_keeps_the_columns_sparks_join_keeps(spark, ss, tmp_path, how):
    write_inputs(tmp_path)
    theirs, their_progress = collect_batches(joined(spark, tmp_path, how), tmp_path / "spark", "append")
    ours, our_progress = collect_batches(joined(ss, tmp_path, how), tmp_path / "microbatch", "append")
    assert ours == theirs and any(rows for _, rows in ours)
    assert state_rows(our_progress) == state_rows(their_progress)
    if running_version().at_least_4:    # (Spark 3.5 has no state data source)
        for side, kept in zip(("left", "right"), KEPT[how]):
            assert side_state(ss, tmp_path / "microbatch", side) == side_state(spark, tmp_path / "spark", side)
            assert side_state(ss, tmp_path / "microbatch", side)[0] == kept


def test_an_earlier_layout_with_every_column_resumes(spark, ss, tmp_path):
    # Spark's engine on the fixture's timeline: two files a side (batches 0-2: batch 2
    # read no file), then the third files
    write_inputs(tmp_path, files=2)
    collect_batches(joined(spark, tmp_path, "inner"), tmp_path / "spark", "append")
    write_inputs(tmp_path)
    theirs = collect_batches(joined(spark, tmp_path, "inner"), tmp_path / "spark", "append")[0]
    earlier = tmp_path / "earlier"
    shutil.copytree(FIXTURE / "ckpt", earlier / "ckpt")
    for log in (earlier / "ckpt" / "sources").glob("*/*"):
        log.write_text(log.read_text().replace("@ROOT@", str(tmp_path)))
    resumed = collect_batches(joined(ss, tmp_path, "inner"), earlier / "ckpt", "append")[0]
    assert resumed == theirs and theirs[0][0] == 3 and theirs[0][1]
    if running_version().at_least_4:
        for side, names in (("left", list(NAMES["a"])), ("right", list(NAMES["c"]))):
            fields, rows = side_state(ss, earlier / "ckpt", side)
            assert fields == names and rows


def write_fixture(root: Path) -> None:
    """The fixture: two files a side through an inner join, as microbatch at the time
    writes its checkpoint; the paths in its source logs are ``@ROOT@``."""
    from microbatch import StreamingSession, embedded_spark
    shutil.rmtree(root, ignore_errors=True)
    write_inputs(root, files=2)
    ss = StreamingSession(embedded_spark())
    collect_batches(joined(ss, root, "inner"), root / "ckpt", "append")
    for log in (root / "ckpt" / "sources").glob("*/*"):
        log.write_text(log.read_text().replace(str(root), "@ROOT@"))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    write_fixture(FIXTURE)
