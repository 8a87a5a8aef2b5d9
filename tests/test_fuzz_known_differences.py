"""The differential fuzzer's seeds where Spark's engine itself was in question (issue 57),
each decided against Spark's engine here:

- A grouping that names a frame's column after a join (seed 586): Spark's engine refuses
  it (``_LEGACY_ERROR_TEMP_1182``, its ambiguous self-join check) where a batch plan's
  analysis accepts it; microbatch now makes the check as the analysis of a stream's plan
  makes it, and refuses alike.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from microbatch.testing import fuzz

# -- seed 586: Spark's ambiguous self-join check on a stream's plan ---------------------------

SLIDING = 'F.window("ts", "10 seconds", "5 seconds")'

#: seed 586's query (minimised) with its grouping varied; Spark's engine refuses the first
#: five, and a batch plan's analysis (microbatch's template) only the last two of them
GROUPINGS = {
    "rollup: a sliding window and the join's df['k'] (seed 586)": f'df.rollup({SLIDING}, df["k"], "s_1")',
    "cube: a sliding window and df['k']": f'df.cube({SLIDING}, df["k"], "s_1")',
    "rollup: a sliding window over the join's df.ts": 'df.rollup(F.window(df.ts, "10 seconds", "5 seconds"), "k")',
    "rollup: df['k'] alone": 'df.rollup(df["k"], "s_1")',
    "rollup: a tumbling window and df['k']": 'df.rollup(F.window("ts", "10 seconds"), df["k"])',
    "rollup by names": f'df.rollup({SLIDING}, "k", "s_1")',
    "groupBy: a sliding window and df['k']": f'df.groupBy({SLIDING}, df["k"], "s_1")',
}

QUERY_586 = """
df = src.select("ts", "k", "v", src.s.alias("s_1")).withWatermark("ts", "3 seconds")
right = src2.withWatermark("ts2", "10 seconds")
df = df.join(right, (df.k == right.k2) & (right.ts2 >= df.ts) & (right.ts2 <= df.ts + F.expr("INTERVAL 10 SECONDS")),
             "left_semi")
df = GROUPING.agg(F.sum(df["v"]).alias("su"))
"""


def _defined(session, tmp_path, grouping: str) -> str:
    """The query defined on ``session``'s streams: "runs", or the refusal's error class."""
    for name in ("src", "src2"):
        (tmp_path / name).mkdir(exist_ok=True)
    names = {"F": F,
             "src": session.readStream.schema(fuzz.SCHEMA1).json(str(tmp_path / "src")),
             "src2": session.readStream.schema(fuzz.SCHEMA2).json(str(tmp_path / "src2"))}
    try:
        exec(QUERY_586.replace("GROUPING", grouping), names)   # noqa: S102 - the test's own query
    except Exception as e:   # noqa: BLE001 - the refusal is the result
        return fuzz._error_kind(e)
    return "runs"


@pytest.mark.parametrize("shape", list(GROUPINGS))
def test_a_grouping_of_a_joins_column_is_refused_as_on_sparks_engine(spark, ss, tmp_path, shape):
    theirs = _defined(spark, tmp_path, GROUPINGS[shape])
    ours = _defined(ss, tmp_path, GROUPINGS[shape])
    assert ours == theirs
    refused = list(GROUPINGS).index(shape) < 5
    assert theirs == ("AnalysisException: _LEGACY_ERROR_TEMP_1182" if refused else "runs")
