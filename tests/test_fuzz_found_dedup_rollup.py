"""A deduplication whose event time Spark's optimizer prunes, found by the differential
fuzzer (issue 57, seed 4028), run on Spark's engine and on microbatch by the fuzzer's own
comparison (rows, watermarks, ``numInputRows``, state rows, batch by batch).

``dropDuplicates(["k"])`` over a stream watermarked on ``ts``, under ``rollup("k").count()``:
nothing above the deduplication reads ``ts`` and it is no key, so Spark's optimizer prunes it
from the Deduplicate's input (ColumnPruning: ``Project [k]`` between the EventTimeWatermark
and the Deduplicate in its plan of each batch). Spark's StreamingDeduplicateExec drops late
rows only by a watermarked column of its input: with none, a late row of a new key is kept
(and counted). microbatch dropped it as late (one group and one state row fewer). Where
something above reads the event time (``max("ts")``), Spark's exec has it and drops the late
row, as microbatch does.
"""
from __future__ import annotations

import pytest

from microbatch.testing import fuzz


def _files(*files) -> list[list[dict]]:
    return [[{"ts": fuzz._stamp(t), "k": k, "v": v, "s": s} for t, k, v, s in rows] for rows in files]


_FILES = _files(
    [(7, 1, 9, "b"), (0, 2, None, "c"), (11, 3, 3, "b"), (0, 1, 5, "a")],
    [(13, 1, 9, "c")],
    [(0, 0, 1, "c")],          # late (watermark 8s) and of a new key
    [(32, 2, 1, "b"), (27, 0, 5, "c"), (0, 4, 8, "b")],
)


def _case(last: str, mode: str = "complete") -> fuzz.Case:
    return fuzz.Case(4028, fuzz.Query([
        "df = src",
        'df = df.withWatermark("ts", "5 seconds")',
        "df = df.drop(df.s)",
        'df = df.dropDuplicates(["k"])',
        last,
    ], mode), _FILES, [])


@pytest.mark.parametrize("case", [
    _case('df = df.rollup("k").count()'),                          # seed 4028: ts pruned
    _case('df = df.groupBy("k").count()'),                         # ts pruned
    _case('df = df.groupBy("k").agg(F.max("ts").alias("m"))'),     # ts read above: late rows dropped
    _case('df = df.select("k", "v")', "append"),                   # ts pruned, no aggregation
], ids=["rollup", "groupBy", "max-ts", "select"])
def test_deduplication_drops_late_rows_only_with_its_event_time(spark, case):
    result = fuzz.run_case(spark, case)
    assert result.status == "ok", result.report()
    assert result.state_compared > 0
