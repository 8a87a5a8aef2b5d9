"""A filter on a session-window aggregation's other key (issue 57, seed 6695), run on
Spark's engine and on microbatch by the fuzzer's own comparison.

``groupBy(session_window("ts", ..), "k").count().where("k IS NOT NULL")``: Spark's optimizer
pushes the part of the filter that reads only the grouping column ``k`` through the
aggregation (PushPredicateThroughNonJoin), so no session of a null key reaches the
aggregation's state. microbatch pushed nothing through a session window (its window is a
column the aggregation makes) and kept the null key's sessions: one state row more than
Spark's from the batch with a null key on. Now the parts that read back over the
aggregation's input go below it; a part that reads the session window stays above.
"""
from __future__ import annotations

import pytest

from microbatch.testing import fuzz


def _case(seed: int, lines: list[str], mode: str) -> fuzz.Case:
    generated = fuzz.generate(seed)
    return fuzz.Case(seed, fuzz.Query(lines, mode), generated.files1, generated.files2)


@pytest.mark.timeout(600)
def test_seed_6695_keeps_no_session_of_a_null_key(spark):
    result = fuzz.run_case(spark, fuzz.generate(6695))
    assert result.status == "ok", result.report()


@pytest.mark.timeout(600)
def test_a_part_on_the_session_window_stays_above_and_the_part_on_the_key_goes_down(spark):
    """With a watermark, in append mode: the part on ``k`` goes below the aggregation, the
    part on the session's end stays above it (it reads the merged session); the answers,
    the watermark and each batch's state rows equal Spark's engine's."""
    result = fuzz.run_case(spark, _case(6695, [
        "df = src",
        'df = df.withWatermark("ts", "5 seconds")',
        'df = df.groupBy(F.session_window("ts", "3 seconds"), "k").count()',
        'df = df.where("k IS NOT NULL AND session_window.end > TIMESTAMP \'1970-01-01 00:00:02\'")',
    ], "append"))
    assert result.status == "ok", result.report()
