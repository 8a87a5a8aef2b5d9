"""A stream-stream join whose side takes its event time from the frame before
``withWatermark`` (issue 57, seed 3326), run on Spark's engine and on microbatch by the
fuzzer's own comparison (rows, watermarks, ``numInputRows``, state rows, batch by batch).

``w = df; df = df.withWatermark("ts", ...).select(w.ts.alias("t_1"), ...)``: Spark's analysis
resolves ``w.ts`` to the attribute below the watermark, without its mark, so ``t_1`` carries
none in the frame's schema. But Spark's engine runs a file source's batch (a v1 source's)
under a projection aliasing each column of the batch's relation to the stream's attribute,
and its optimizer drops those aliases (RemoveRedundantAliases), giving every reference above
the relation's attribute as it comes out of the EventTimeWatermark: marked. Its join exec
then finds ``t_1`` marked in its left input and drops the left rows at or before the
previous batch's watermark (in the seed's last batch, a row at 00:00:00 under a watermark of
00:00:16: two output rows and one state row fewer). microbatch took the side as having no
event time and kept the row. The mark the join's exec sees is now Spark's optimizer's
(``spark_internals.engine_join_event_times``, the join's template made as Spark's engine
makes a batch), where the analysis shows none (``StreamJoin.engine_times``).

An event time computed before the watermark (``withColumn("e", ts + 1 s)``) is no source
column: no alias is dropped, and ``w.e`` stays unmarked in Spark's engine too.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from microbatch import StreamingSession, spark_internals
from microbatch.testing import fuzz


def _files1(*files) -> list[list[dict]]:
    return [[{"ts": fuzz._stamp(t), "k": k, "v": v, "s": s} for t, k, v, s in rows] for rows in files]


def _files2(*files) -> list[list[dict]]:
    return [[{"ts2": fuzz._stamp(t), "k2": k, "v2": v} for t, k, v in rows] for rows in files]


FILES1 = _files1(
    [(11, 2, None, "b")],
    [(0, 3, 7, "c"), (8, 0, 4, "b"), (0, 3, 1, "a"), (17, 3, 6, "c")],
    [(0, 0, 1, "b"), (16, 2, 7, "b"), (2, 0, 2, "a"), (23, 2, 5, "a")],
    [(24, 1, 2, "c")],
    # (the last row is late: 00:00:00 at or before the previous batch's watermark, 00:00:16)
    [(34, 1, 6, "a"), (30, 1, 4, "b"), (28, 3, 2, "b"), (0, 3, 4, "b")],
)
FILES2 = _files2(
    [(0, 2, 5), (0, 1, 3), (0, 3, 7), (0, 0, 3)],
    [(9, 0, 1), (10, 1, 5), (18, 0, 5), (11, 1, 5)],
    [(21, 2, 2), (13, 3, 4)],
    [(26, 0, 0), (26, 2, 8)],
)

SEED_3326 = fuzz.Case(3326, fuzz.Query([
    "df = src",
    "w = df",
    'df = df.withWatermark("ts", "5 seconds")',
    'df = df.select(w.ts.alias("t_1"), "k", "v", "s")',
    'df = df.withColumn("t_2", df.t_1 - F.expr("INTERVAL 1 SECOND"))',
    "right = src2",
    'right = right.withWatermark("ts2", "5 seconds")',
    "left = df",
    'df = left.join(right, F.expr("k = k2"), "inner").drop(left.s)',
], "append"), FILES1, FILES2)

#: the event time computed before the watermark: Spark's engine marks no column of the left side
COMPUTED = fuzz.Case(3326, fuzz.Query([
    "df = src",
    'df = df.withColumn("e", df.ts + F.expr("INTERVAL 1 SECOND"))',
    "w = df",
    'df = df.withWatermark("e", "5 seconds")',
    'df = df.select(w.e.alias("t_1"), "k", "v")',
    "right = src2",
    'right = right.withWatermark("ts2", "5 seconds")',
    'df = df.join(right, F.expr("k = k2"), "inner")',
], "append"), FILES1, FILES2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", [SEED_3326, COMPUTED], ids=["seed 3326", "computed event time"])
def test_a_join_drops_late_rows_as_sparks_engine_marks_its_side(spark, case):
    result = fuzz.run_case(spark, case)
    assert result.status == "ok", result.report()
    assert result.state_compared > 0


def test_the_event_time_sparks_join_exec_finds(spark):
    """What ``engine_join_event_times`` reads from Spark's optimizer, for joins defined on
    microbatch over file sources: the earlier frame's column marked, as the watermark's own
    column and a renamed one are; a column computed before the watermark not."""
    work = Path(tempfile.mkdtemp(prefix="earlier-frame-"))
    (work / "a").mkdir()
    (work / "b").mkdir()
    names = fuzz._namespace(StreamingSession(spark), work / "a", work / "b", None)
    src, src2 = names["src"], names["src2"]
    right = src2.withWatermark("ts2", "5 seconds")

    def found(left):
        return spark_internals.engine_join_event_times(left.join(right, F.expr("k = k2"))._template)

    w = src
    earlier = src.withWatermark("ts", "5 seconds").select(w.ts.alias("t_1"), "k")
    assert [f.metadata for f in earlier.schema.fields] == [{}, {}]   # (Spark's analysis: no mark)
    assert found(earlier) == ("t_1", "ts2")
    assert found(src.withWatermark("ts", "5 seconds")) == ("ts", "ts2")
    renamed = src.select(F.col("ts").alias("e"), "k").withWatermark("e", "1 second")
    assert found(renamed) == ("e", "ts2")
    w = src.withColumn("e", F.col("ts") + F.expr("INTERVAL 1 SECOND"))
    assert found(w.withWatermark("e", "5 seconds").select(w.e.alias("t_1"), "k")) == (None, "ts2")
