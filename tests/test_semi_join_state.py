"""A left semi join's right-side state holds what Spark's does: the columns its condition
reads, not those Spark's optimizer prunes from its input (nothing above a left semi join
can read its right side). A checkpoint an earlier microbatch wrote with every column of
the right side (``data/semi_join_before_pruning``, two batches, written by commit a8a34df)
resumes with its layout, and its next batch gives Spark's rows."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pyspark.sql import functions as F

from helpers import collect_batches, sorted_rows
from microbatch.spark_internals import running_version

FIXTURE = Path(__file__).parent / "data" / "semi_join_before_pruning"
#: per side, (key, time on 2026-01-01, ...) per file, one file a batch; the fixture holds
#: the first two of each
A = [[(1, "00:00:10"), (2, "00:00:20")], [(3, "00:00:40"), (1, "00:00:12")],
     [(5, "00:01:40"), (3, "00:00:41")]]
C = [[(1, "00:00:11", 7), (9, "00:00:15", 1)], [(3, "00:00:42", 2), (2, "00:00:50", 3)],
     [(5, "00:01:41", 4), (1, "00:00:09", 5)]]


def write_inputs(root: Path) -> None:
    """The files of both streams, with the modification times the fixture's log has."""
    for side, rows, names in (("a", A, ("id", "ts")), ("c", C, ("cid", "cts", "v"))):
        directory = root / "in" / side
        directory.mkdir(parents=True, exist_ok=True)
        for i, batch in enumerate(rows):
            path = directory / f"f{i}.json"
            path.write_text("".join(json.dumps(dict(zip(names, (r[0], f"2026-01-01 {r[1]}", *r[2:])))) + "\n"
                                    for r in batch))
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def semi_join(session, root: Path):
    def read(side: str, schema: str, time: str):
        return (session.readStream.format("json").schema(schema).option("maxFilesPerTrigger", 1)
                .load(str(root / "in" / side)).withWatermark(time, "10 seconds"))
    a, c = read("a", "id INT, ts TIMESTAMP", "ts"), read("c", "cid INT, cts TIMESTAMP, v INT", "cts")
    return a.join(c, F.expr("id = cid AND ts BETWEEN cts - INTERVAL 5 SECONDS AND cts + INTERVAL 5 SECONDS"),
                  "left_semi")


def right_state(session, ckpt: Path) -> tuple[list[str], list]:
    df = session.read.format("statestore").option("joinSide", "right").load(str(ckpt))
    return df.schema["value"].dataType.fieldNames(), sorted_rows(df.select("key", "value"))


def test_the_right_side_keeps_sparks_columns_and_an_earlier_layout_resumes(spark, ss, tmp_path):
    write_inputs(tmp_path)
    theirs = collect_batches(semi_join(spark, tmp_path), tmp_path / "spark", "append")[0]
    ours = collect_batches(semi_join(ss, tmp_path), tmp_path / "microbatch", "append")[0]
    assert ours == theirs and any(rows for _, rows in ours)
    if running_version().at_least_4:    # (Spark 3.5 has no state data source)
        assert right_state(ss, tmp_path / "microbatch") == right_state(spark, tmp_path / "spark")
        assert right_state(ss, tmp_path / "microbatch")[0] == ["cid", "cts"]    # (v pruned)

    earlier = tmp_path / "earlier"
    shutil.copytree(FIXTURE / "ckpt", earlier / "ckpt")
    for log in (earlier / "ckpt" / "sources").glob("*/*"):
        log.write_text(log.read_text().replace("@ROOT@", str(tmp_path)))
    resumed = collect_batches(semi_join(ss, tmp_path), earlier / "ckpt", "append")[0]
    # (its batches 0-2 ran before: batch 2 read no file; the third files are batch 3 here)
    assert resumed[0] == (3, dict(theirs)[2]) and resumed[0][1]
    if running_version().at_least_4:
        fields, rows = right_state(ss, earlier / "ckpt")
        assert fields == ["cid", "cts", "v"] and rows
