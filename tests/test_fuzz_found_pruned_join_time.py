"""Two stream-stream join shapes the fuzzer found (seeds 7332 and 7339), run on Spark's
engine and on microbatch by the fuzzer's own comparison.

Seed 7332 is an inner join on ``k`` alone of two watermarked streams, then a windowed
count over the left side's event time. Nothing above the join reads the right side's event
time, so its state rows leave it out, as Spark's do (``StreamJoin.pruned``). The join's
task reported each side's watermark statistics from the event time in the side's state
row; with the right's pruned it reported none, and the tracker had left that watermark to
the task (no ``Observation``): the right watermark never saw rows, stayed at 0, and held
the query's (the smallest) at 0. The aggregation above never closed a window. The task now
reads a pruned event time beside the state row (``__e<side>``) and reports from it.

Seed 7339 is a limit below a left semi join. In the batch where the limit's stream has no
data Spark's optimizer drops the limit (ConvertToLocalRelation, or EliminateLimits when that
one is excluded: an empty relation has fewer rows than the limit), so Spark's engine runs
no limit operator in that batch; in the next batch with data it fails to load the limit's
state version that was never written. microbatch runs the limit in every batch; Spark's
engine with both rules excluded gives its results (``fuzz.LIMIT_ELIMINATED``).
"""
from __future__ import annotations

import pytest

from microbatch.testing import fuzz


def _case(seed: int, lines: list[str], mode: str = "append", restart_after: int | None = None) -> fuzz.Case:
    generated = fuzz.generate(seed)
    return fuzz.Case(seed, fuzz.Query(lines, mode, restart_after), generated.files1, generated.files2)


#: seed 7332's join and aggregation over either side's event time (the other side's pruned)
PRUNED = {
    "the right side's time pruned": 'df = df.groupBy(F.window("ts", "5 seconds"), "k").count()',
    "the left side's time pruned": 'df = df.groupBy(F.window("ts2", "5 seconds"), "k2").count()',
}


@pytest.mark.timeout(600)
def test_seed_7332_an_aggregation_above_a_join_closes_windows_as_on_sparks_engine(spark):
    result = fuzz.run_case(spark, fuzz.generate(7332))
    assert result.status == "ok", result.report()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", list(PRUNED))
def test_a_sides_watermark_moves_with_its_event_time_pruned_from_the_join_state(spark, shape):
    """Across a restart after the second file, so the watermark the task reported is the
    one the checkpoint gives the next run."""
    case = _case(7332, [
        "df = src",
        'df = df.withWatermark("ts", "0 seconds")',
        "right = src2",
        'right = right.withWatermark("ts2", "5 seconds")',
        'df = df.join(right, F.expr("k = k2"), "inner")',
        PRUNED[shape],
    ], restart_after=2)
    result = fuzz.run_case(spark, case)
    assert result.status == "ok", result.report()


@pytest.mark.timeout(600)
def test_seed_7339_sparks_engine_drops_the_limit_of_an_empty_batch_a_known_difference(spark):
    result = fuzz.run_case(spark, fuzz.generate(7339))
    assert result.status == "known-difference", result.report()
    assert fuzz.KNOWN_DIFFERENCES[result.kind] == fuzz.LIMIT_ELIMINATED
    assert result.aspect == "state operators" and result.batch == 5 and result.state_compared > 0
