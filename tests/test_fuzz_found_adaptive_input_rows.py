"""``numInputRows`` of a stateless query whose batch runs adaptively (issue 57, seeds 5719,
5744, 5788, 5793, 5800: found the hour after e60aaaf), run on Spark's engine and on
microbatch by the fuzzer's own comparison (rows, watermarks, ``numInputRows``, batch by
batch).

Spark 4.1+ runs a stateless query's batches with adaptive query execution
(``spark.sql.adaptive.streaming.stateless.enabled``), and microbatch now does too. Spark 4's
adaptive plan ends in a ``ResultQueryStageExec`` wrapping the final plan; microbatch's scan
counter (``spark_internals.ScanRowCounter``) looked into the adaptive plan's query stages
but not into that one, found no file scan, and reported 0 input rows for every batch of a
stream-static join. It now looks into it as into the other stages.
"""
from __future__ import annotations

import pytest

from microbatch.testing import fuzz


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [5719, 5744])
def test_a_stateless_batch_run_adaptively_counts_its_input_rows(spark, seed):
    result = fuzz.run_case(spark, fuzz.generate(seed))
    assert result.status == "ok", result.report()
