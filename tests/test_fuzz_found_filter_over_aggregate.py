"""A filter over a streaming aggregation the differential fuzzer found microbatch ran
unlike Spark's engine (issue 57, seed 3526), each run on Spark's engine and on microbatch
by the fuzzer's own comparison (rows, watermarks, ``numInputRows``, state rows and the state
per partition, batch by batch).

- ``dropDuplicatesWithinWatermark(["k"])``, then ``groupBy("k").agg(...)`` and
  ``where("k IS NOT NULL")`` in update mode (seed 3526): Spark's optimizer pushes the parts of
  a filter over an aggregation that read only its grouping columns through it
  (PushPredicateThroughNonJoin), down to the streaming Deduplicate, which stops it
  (``Filter isnotnull(k)`` between the deduplication and the aggregation in its plan of each
  batch): the deduplication keeps the null key, the aggregation never sees it. microbatch
  filtered the aggregation's output: one state row more for the null key. Without the
  deduplication, the filter goes on into the scan, which microbatch got right already
  (``runtime.scan_filters``); a deduplication stops it there.

The same with ``dropDuplicates(["k"])``, with and without a watermark, with a filter on the
key that is not a null check, and with a conjunction one part of which reads an aggregate
(that part stays above, the other goes down). The rule lives with the aggregation
(``operators.aggregate.node.filters_pushed_through_aggregations``), its Spark side in
``spark_internals.conjuncts_through_aggregation``.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import ci_share
from microbatch import spark_internals
from microbatch.testing import fuzz


def _files(*files) -> list[list[dict]]:
    return [[{"ts": fuzz._stamp(t), "k": k, "v": v, "s": s} for t, k, v, s in rows] for rows in files]


_FILES = _files(
    [(5, 0, 2, "a"), (9, 3, 4, "a")],
    [(18, 2, 1, "c"), (13, 3, 2, "a"), (0, 0, 3, "a"), (12, 3, 1, "a")],
    [(33, 1, 9, "a"), (31, 3, 7, "c")],
    [(45, 2, 3, "a"), (40, 2, 9, "a"), (43, None, 3, "c"), (44, 0, 6, "c"), (40, 1, 2, "b"), (39, None, 0, "a")],
    [(50, 1, 1, "b"), (47, None, 8, "c"), (52, 4, 2, "a")],
)

_AGGREGATE = 'df = df.groupBy(F.col("k")).agg(F.count("*").alias("co_2"), F.max(df["v_1"]).alias("ma_3"))'


def _case(dedup: list[str], where: str, watermark: bool = True) -> fuzz.Case:
    lines = ["df = src", 'df = df.withColumnRenamed("v", "v_1")']
    if watermark:
        lines.append('df = df.withWatermark("ts", "0 seconds")')
    return fuzz.Case(3526, fuzz.Query([*lines, *dedup, _AGGREGATE, where], "update"), _FILES, [])


SEED_3526 = _case(['df = df.dropDuplicatesWithinWatermark(["k"])'], 'df = df.where("k IS NOT NULL")')

SHAPES = {
    "seed 3526": SEED_3526,
    "dropDuplicates with a watermark": _case(['df = df.dropDuplicates(["k"])'], 'df = df.where("k IS NOT NULL")'),
    "dropDuplicates without watermark": _case(['df = df.dropDuplicates(["k"])'], 'df = df.where("k IS NOT NULL")',
                                              watermark=False),
    "no deduplication": _case([], 'df = df.where("k IS NOT NULL")'),
    "a key filter not on nulls": _case(['df = df.dropDuplicatesWithinWatermark(["k"])'],
                                       'df = df.filter(df["k"] != 1)'),
    "a part on an aggregate stays above": _case(['df = df.dropDuplicates(["k"])'],
                                                'df = df.where("k IS NOT NULL AND ma_3 > 2")'),
    "through a projection": _case(['df = df.dropDuplicates(["k"])'],
                                  'df = df.select("k", "co_2")\ndf = df.where("k IS NOT NULL")'),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ci_share(list(SHAPES.values())), ids=list(SHAPES))   # half in CI's run (helpers.ci_share)
def test_a_filter_over_an_aggregation_filters_its_input_as_in_sparks_engine(spark, case):
    result = fuzz.run_case(spark, case)
    assert result.status == "ok", result.report()
    assert result.state_compared > 0


def _pushed_by_spark(df) -> bool:
    """Whether Spark's optimizer has a filter right under the aggregation of batch ``df``."""
    plan = df._jdf.queryExecution().optimizedPlan()
    while plan.getClass().getSimpleName() != "Aggregate":
        plan = plan.children().apply(0)
    return plan.child().getClass().getSimpleName() == "Filter"


def test_the_parts_spark_pushes_through_an_aggregation(spark):
    """``conjuncts_through_aggregation`` splits a filter as Spark's optimizer does with a
    batch: the parts on grouping columns (an alias of a grouping expression read as the
    expression) go below (``first`` and ``any_value`` are deterministic), none through a
    global aggregation."""
    rows = spark.createDataFrame([], "k INT, v INT").limit(2147483647)   # (it stops the filter under it)
    grouped = rows.groupBy("k")
    counted = grouped.agg(F.count("*").alias("n"))
    pushed, kept = spark_internals.conjuncts_through_aggregation(counted.where("k IS NOT NULL AND n > 1"))
    assert pushed == ["(k IS NOT NULL)"] and len(kept) == 1 and kept[0].startswith("(n > ")
    assert _pushed_by_spark(counted.where("k IS NOT NULL AND n > 1"))
    shifted = rows.groupBy((F.col("k") + 1).alias("k1")).agg(F.max("v").alias("m"))
    assert spark_internals.conjuncts_through_aggregation(shifted.where("k1 > 2")) == (["((k + 1) > 2)"], [])
    assert _pushed_by_spark(shifted.where("k1 > 2"))
    for aggregated in (grouped.agg(F.first("v").alias("f")), grouped.agg(F.any_value("v").alias("f"))):
        assert spark_internals.conjuncts_through_aggregation(aggregated.where("k IS NOT NULL")) == \
            (["(k IS NOT NULL)"], [])
        assert _pushed_by_spark(aggregated.where("k IS NOT NULL"))
    assert spark_internals.conjuncts_through_aggregation(rows.agg(F.max("v").alias("m")).where("m > 1")) is None
