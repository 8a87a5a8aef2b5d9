"""The aggregate functions beyond the first fourteen (issue 59), on microbatch next to
Spark's own engine, batch by batch: one event file per batch (``maxFilesPerTrigger=1``,
AvailableNow), each test running many functions in one query, in update, complete and
append mode (windowed, with a watermark). Rows (floats to 9 digits: the buffers of the
moment-based functions merge in another order than Spark's, which moves their last bits),
watermarks and the state operators' counts must match; a function microbatch cannot
reproduce must be refused when the query is defined, naming it and why.
"""
from __future__ import annotations


import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream, plain_rows
from stream_events import comparable, watermarks, write_event_files
from microbatch.errors import UnsupportedOperationError

BIG = 2 ** 63 - 10
HUGE = 10 ** 37 * 6      # two of them overflow a decimal(38, 0) sum

# (key, time, v, d, b, s, big, dec) per file; the watermark delay is 5 seconds.
EVENTS = [
    [("a", "00:00:01", 1, 2.5, True, "x", 1, 1), ("b", "00:00:03", 2, -1.0, False, "y", BIG, HUGE),
     ("a", "00:00:07", 3, 4.0, True, None, 2, 2), ("c", "00:00:04", None, None, None, "z", None, None)],
    [("a", "00:00:12", 4, 0.5, False, "w", 3, 3), ("b", "00:00:02", 5, 3.0, True, "v", 20, HUGE),
     ("c", "00:00:14", 6, 6.0, True, "u", -5, 5), ("a", "00:00:13", 4, 1.5, True, "t", 4, 4)],
    [("a", "00:00:26", 7, 2.0, True, "s", 5, 5), ("b", "00:00:04", 8, 8.5, False, "r", -30, 1),
     ("c", "00:00:15", 9, None, None, None, 7, 7), ("d", "00:00:16", -7, 3.0, False, "q", None, None)],
    [("a", "00:00:31", -1, -2.0, True, "p", 6, 6), ("b", "00:00:11", 2, 2.0, True, "o", 1, 1),
     ("b", "00:00:27", 10, 1.0, False, "n", 2, 2), ("d", "00:00:40", 7, 7.0, True, "m", 1, 1)],
    [("c", "00:00:50", 3, 1.0, True, "l", 1, 1), ("a", "00:00:21", 4, 4.0, False, "k", 2, 2),
     ("b", "00:00:03", 1, 1.0, True, "j", 3, 3)],
]
SCHEMA = "k STRING, ts TIMESTAMP, v INT, d DOUBLE, b BOOLEAN, s STRING, big BIGINT, dec DECIMAL(38,0)"


def event_record(k, t, v, d, b, s, big, dec):
    return {"k": k, "ts": f"2026-01-01 {t}", "v": v, "d": d, "b": b, "s": s, "big": big, "dec": dec}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, event_record)


def run(session, events, ckpt, transform, mode):
    return collect_batches(transform(json_stream(session, events, SCHEMA)), ckpt, mode,
                           rows=lambda df: plain_rows(df, lists_ordered=True))


def compare(spark, ss, events, tmp_path, transform, mode):
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform, mode)
    assert [b for b, _ in ours] == [b for b, _ in theirs]
    for (batch, our_rows), (_, their_rows) in zip(ours, theirs):
        assert our_rows == their_rows, f"batch {batch}"
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    return ours


#: Functions whose answer does not depend on the order of a batch's rows.
ORDER_FREE = [
    "count_if(b)", "bool_and(b)", "every(b)", "bool_or(b)", "some(b)", "any(b)",
    "max_by(s, v)", "min_by(s, d)", "max_by(v, b)", "try_sum(v)", "try_sum(d)", "try_avg(v)",
    "try_avg(dec)", "bit_and(v)", "bit_or(v)", "bit_xor(big)", "count_if(v > 2) FILTER (WHERE d > 0)",
    "corr(v, d)", "covar_pop(v, d)", "covar_samp(d, v)", "regr_count(v, d)", "regr_avgx(v, d)",
    "regr_avgy(v, d)", "regr_sxx(v, d)", "regr_syy(v, d)", "regr_sxy(v, d)", "regr_r2(v, d)",
    "regr_slope(v, d)", "regr_intercept(d, v)", "skewness(v)", "kurtosis(d)", "skewness(d) + kurtosis(v)",
    "sum(v) + max_by(v, d)", "percentile(v, 0.5)", "percentile(d, array(0.25, 0.9))", "median(dec)",
    "percentile_cont(0.3) WITHIN GROUP (ORDER BY v DESC)", "percentile_disc(0.5) WITHIN GROUP (ORDER BY d)",
    "percentile(v, 0.5, IF(b, 2, 1))", "mode(v, true)", "mode(s, true)", "mode() WITHIN GROUP (ORDER BY v)",
    "mode() WITHIN GROUP (ORDER BY d DESC)", "listagg(s) WITHIN GROUP (ORDER BY s)",
    "string_agg(s, '-') WITHIN GROUP (ORDER BY s DESC)",
]


def keyed(functions):
    return lambda frame: frame.groupBy("k").agg(*[F.expr(f).alias(f"f{i}") for i, f in enumerate(functions)])


def test_order_free_functions_in_update_mode(spark, ss, events, tmp_path):
    ours = compare(spark, ss, events, tmp_path, keyed(ORDER_FREE), "update")
    assert any(None in row for _, rows in ours for row in rows)


def test_try_sum_overflow_is_null_for_good_across_batches(spark, ss, events, tmp_path):
    """b's bigint sum overflows in batch 1 (BIG + 20): try_sum is null from then on, though
    later rows bring it back in range; a decimal(38, 0) sum overflows alike."""
    ours = compare(spark, ss, events, tmp_path,
                   keyed(["try_sum(big)", "try_sum(dec)", "try_avg(dec)", "try_sum(big) FILTER (WHERE v > 4)"]),
                   "update")
    b_rows = [row for _, rows in ours for row in rows if row[0] == "b"]
    assert b_rows[0][1] == BIG and b_rows[-1][1] is None


def test_a_bigint_sum_that_overflows_fails_the_batch_in_ansi_mode(spark, ss, events, tmp_path):
    """sum(big): b's sum overflows when batch 1 merges with the state (BIG + 20). Spark's
    engine fails that batch with ARITHMETIC_OVERFLOW (ANSI mode, Spark 4's default);
    microbatch did too little: its sum wrapped around, silently."""
    failures = []
    for name, session in (("spark", spark), ("microbatch", ss)):
        queries: list = []
        batches, _ = collect_batches(keyed(["sum(big)"])(json_stream(session, events, SCHEMA)), tmp_path / name,
                                     "update", fail_on_error=False, queries=queries)
        failures.append(([b for b, _ in batches], "ARITHMETIC_OVERFLOW" in str(queries[0].exception())))
    assert failures[0] == failures[1] == ([0], True)


def test_first_values_and_moments_in_complete_mode(spark, ss, events, tmp_path):
    functions = ["any_value(v)", "any_value(s, true)", "first_value(s)", "last_value(s, true)",
                 "corr(d, v)", "kurtosis(v)", "max_by(k, v)", "bool_and(v > 0)", "bit_or(v)"]
    functions += ["percentile(v, array(0.1, 0.5))", "mode() WITHIN GROUP (ORDER BY s DESC)", "string_agg(k, '')"]
    compare(spark, ss, events, tmp_path, lambda frame: frame.agg(
        *[F.expr(f).alias(f"f{i}") for i, f in enumerate(functions)]), "complete")


def test_listagg_in_the_order_rows_came(spark, ss, events, tmp_path):
    """Without WITHIN GROUP, listagg joins the values in the order Spark's engine merged
    them: the state's, then each batch's (one file a batch: the file's order)."""
    compare(spark, ss, events, tmp_path, keyed(["listagg(s)", "string_agg(s, ', ')", "listagg(s, NULL)",
                                                "listagg(s) FILTER (WHERE b)"]), "update")


def test_windowed_append_mode_with_watermark(spark, ss, events, tmp_path):
    functions = ["count_if(b)", "max_by(s, v)", "min_by(s, v)", "covar_samp(v, d)", "skewness(d)",
                 "try_sum(big)", "bit_xor(v)", "regr_slope(d, v)", "bool_or(b)", "median(v)",
                 "mode(v, true)", "listagg(s, '/')"]
    compare(spark, ss, events, tmp_path, lambda frame: (
        frame.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "k")
        .agg(*[F.expr(f).alias(f"f{i}") for i, f in enumerate(functions)])), "append")


@pytest.mark.parametrize("function,why", [
    ("mode(v)", "hash map's order"),
    ("listagg(s) WITHIN GROUP (ORDER BY v)", "ORDER BY the value itself"),
    ("count_min_sketch(v, 0.1D, 0.9D, 1)", "yet. Supported: .*max_by")])
def test_functions_microbatch_cannot_reproduce_are_refused_with_the_reason(ss, events, function, why):
    """Refused when the query is defined, naming the function and why."""
    name = function.split("(")[0]
    with pytest.raises(UnsupportedOperationError, match=f"{name}.*not supported.*by microbatch.*{why}"):
        json_stream(ss, events, SCHEMA).groupBy("k").agg(F.expr(function))


def test_percentile_interpolates_to_the_last_bit_as_the_running_spark(spark):
    """percentile's interpolation between two values, against the running Spark's own batch
    ``percentile`` over the same values: Spark 4.3 adds the fraction of their difference to
    the lower one (SPARK-57982), Spark before it weighted the two, and the last bit differs
    (``percentile(60..69, 0.3)``: 62.7 on 4.3, 62.699999999999996 before). The rows above
    use percentages where both agree."""
    from microbatch.operators.aggregate.task import collected_result
    from microbatch.spark_internals import running_version
    percentages = (0.3, 0.7, 0.05, 0.45)
    for first in (0, 60, 1000, 123456):
        row = spark.range(first, first + 10).select(F.percentile("id", list(percentages))).first()
        ours = collected_result([(v, 1) for v in range(first, first + 10)],
                                ("percentile", percentages, True, False, False, running_version().at_least(4, 3)))
        assert ours == list(row[0]), first
