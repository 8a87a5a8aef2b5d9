"""What runs over Spark Connect so far, and the one refusal of everything else."""
from __future__ import annotations

from typing import NoReturn

#: what a Connect session runs, in the words of the refusal
WHAT_RUNS = (
    "over Spark Connect microbatch runs so far: the sources parquet, json and csv (files; orc and text too), rate, kafka, "
    "delta (by path), iceberg and Python data sources registered with StreamingSession.dataSource.register; "
    "the steps filter/where, select/selectExpr, withColumn(s), withColumnRenamed, drop, withWatermark, "
    "union, joins with a static DataFrame, mapInPandas/mapInArrow, "
    "groupBy(window(...) or session_window(...) and columns) with count, sum, min, max, avg, max_by, "
    "min_by, first, last (first_value, last_value, any_value), collect_list, collect_set, stddev and variance "
    "(and their _samp/_pop forms), count_if, bool_and/every, bool_or/some/any, try_sum, try_avg, bit_and, "
    "bit_or, bit_xor, corr, covar_pop, covar_samp, skewness, kurtosis, every regr_*, approx_count_distinct, "
    "percentile, median, percentile_approx/approx_percentile and mode(x, true) in append, update or complete mode, "
    "dropDuplicates/dropDuplicatesWithinWatermark, limit, applyInPandasWithState and "
    "transformWithStateInPandas (current_timestamp() and the other current-time "
    "functions are the batch's time); "
    "SQL over a stream's temporary view with projections, filters and generators (run on each batch); "
    "the sinks foreachBatch, the parquet file sink (json, csv, orc and text too), kafka, delta (by path), iceberg, memory, console, noop, "
    "foreach and Python data sources; "
    "readStream.table and toTable of the session catalog's file tables")

#: source formats that run over Connect
SOURCES = frozenset({"parquet", "json", "csv", "orc", "text", "rate", "kafka", "delta", "iceberg"})
#: sink formats that run over Connect
SINKS = frozenset({"parquet", "json", "csv", "orc", "text", "foreachbatch", "kafka", "delta", "iceberg", "memory", "console", "noop", "foreach"})
#: DataFrame methods (a ``Transform`` step) that run over Connect
STEPS = frozenset({"filter", "where", "select", "selectExpr", "withColumn", "withColumns",
                   "withColumnRenamed", "withColumnsRenamed", "drop", "alias", "toDF"})
#: aggregate functions the Connect translation knows
AGGREGATES = frozenset({"count", "sum", "min", "max", "avg", "mean", "max_by", "min_by", "first", "last",
                        "collect_list", "collect_set", "stddev", "std", "stddev_samp", "stddev_pop",
                        "variance", "var_samp", "var_pop", "first_value", "last_value", "any_value",
                        "count_if", "bool_and", "every", "bool_or", "some", "any", "try_sum", "try_avg",
                        "bit_and", "bit_or", "bit_xor", "corr", "covar_pop", "covar_samp", "skewness",
                        "kurtosis", "regr_sxy", "regr_r2", "regr_slope", "regr_intercept", "regr_sxx",
                        "regr_syy", "regr_count", "regr_avgx", "regr_avgy", "approx_count_distinct",
                        "percentile", "median", "percentile_approx", "approx_percentile", "mode"})


def refusal(feature: str):
    """The error that refuses ``feature`` over Spark Connect."""
    from microbatch.errors import UnsupportedOperationError
    return UnsupportedOperationError(
        f"{feature} does not run over Spark Connect in microbatch yet. {WHAT_RUNS[0].upper()}{WHAT_RUNS[1:]}. "
        "Everything else runs on a classic session (SparkSession.builder.master(...).getOrCreate()); "
        "see docs/spark-versions.md.")


def refuse(feature: str) -> NoReturn:
    raise refusal(feature)
