"""An event-time timeout over a stream whose watermarked column was replaced (issue 57,
seed 5998), run on Spark's engine and on microbatch by the fuzzer's own comparison.

``withWatermark("ts", ...)`` then ``withColumn("ts", ts + 2 s)``: the new ``ts`` carries no
watermark's mark, and Spark's checker, which looks for a marked column in the input of
applyInPandasWithState, refuses the event-time timeout at start (``_LEGACY_ERROR_TEMP_3102``,
"Watermark must be specified ..."). microbatch looked for a ``withWatermark`` anywhere below
and ran the query. It now asks the input's columns in Spark's analysed plan, as Spark's
checker does (the operator's ``input_marked``; seed 6234 in
``tests/test_fuzz_found_second_watermark.py`` is why it is not ``late_rows_column``).
"""
from __future__ import annotations

import pytest

from microbatch.testing import fuzz


@pytest.mark.timeout(600)
def test_an_event_time_timeout_without_a_marked_column_is_refused_as_in_spark(spark):
    result = fuzz.run_case(spark, fuzz.generate(5998))
    assert result.status == "both-refused", result.report()
