"""Streaming aggregation, planned: each aggregate function split into buffers, a merge
and a final expression.

A batch of ``groupBy(keys).agg(f(x), ...)`` runs in three steps (``operators.aggregate.step``):

1. Spark computes, per key, the *buffers* of each function over the batch's rows
   (e.g. ``avg(x)`` -> ``sum(CAST(x AS DOUBLE))``, ``count(x)``): a plain batch
   aggregation, with Spark's own types and null rules.
2. A task per state partition merges those buffers with the key's buffers in the
   state store (``MERGES``: add, min, max, first/last, concatenation, set union,
   Chan's formula for moments) and emits the rows the output mode asks for.
3. Spark evaluates the final expression of each output column over the merged
   buffers (``avg``: ``sum / count``), the user's expression around the aggregate
   included (``sum(v) + 1``), and casts it to the type a batch query would give.

The split is read from Spark's analysed plan of the same aggregation over the
stream's empty template, so names, types and argument expressions are Spark's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, StructField, StructType

from microbatch import spark_internals
from microbatch.errors import AnalysisException, UnsupportedOperationError

#: The functions a streaming aggregation supports (Spark class name -> SQL name). A
#: function Spark's optimizer replaces by another (``count_if`` by ``count``, ``bool_and``
#: by ``min``, ``any_value`` by ``first``, ``median`` by ``percentile``, ``regr_avgx`` by
#: ``avg``...) is planned as that one (``spark_internals.AggregateCall.replaced``).
SUPPORTED = {
    "Count": "count", "Sum": "sum", "Min": "min", "Max": "max", "Average": "avg",
    "First": "first", "Last": "last", "CollectList": "collect_list", "CollectSet": "collect_set",
    "HyperLogLogPlusPlus": "approx_count_distinct", "StddevSamp": "stddev_samp",
    "StddevPop": "stddev_pop", "VarianceSamp": "var_samp", "VariancePop": "var_pop",
    "MaxBy": "max_by", "MinBy": "min_by", "BitAndAgg": "bit_and", "BitOrAgg": "bit_or",
    "BitXorAgg": "bit_xor", "Corr": "corr", "CovPopulation": "covar_pop", "CovSample": "covar_samp",
    "RegrSXY": "regr_sxy", "RegrR2": "regr_r2", "RegrSlope": "regr_slope",
    "RegrIntercept": "regr_intercept", "RegrReplacement": "regr_sxx", "Skewness": "skewness",
    "Kurtosis": "kurtosis", "Percentile": "percentile", "PercentileDisc": "percentile_disc",
    "Mode": "mode", "ListAgg": "listagg", "ApproximatePercentile": "percentile_approx",
    "HistogramNumeric": "histogram_numeric",
}
#: The SQL names of the supported functions planned as another (their replacement, or an
#: eval mode of one: try_sum is Sum's TRY mode), for the refusal's list.
ALSO_SUPPORTED = ("count_if", "bool_and", "every", "bool_or", "some", "any", "any_value",
                  "first_value", "last_value", "regr_count", "regr_avgx", "regr_avgy", "regr_syy",
                  "try_sum", "try_avg", "median", "percentile_cont", "string_agg", "approx_percentile")

#: How two buffers of one function merge, by the number of buffer columns they use
#: (``moments``: 3 to 5, n, mean and the central moments to the 4th; ``comoments``: 4 or 6,
#: Spark's covariance buffers, with each side's m2 for corr and regr_r2; ``regression``:
#: a covariance's 4 and the independent variable's 3 moments).
MERGES = {"sum": 1, "min": 1, "max": 1, "first": 2, "last": 2, "concat": 1, "union": 1,
          "moments": 3, "hll": 1, "max_by": 2, "min_by": 2, "bit_and": 1, "bit_or": 1,
          "bit_xor": 1, "try_sum": 2, "try_avg": 2, "comoments": 4, "regression": 7, "counts": 1,
          "sum_checked": 1, "quantiles": 3, "histogram": 1}

_MOMENT_FINALS = {
    # n = {0}, mean = {1}, m2 = {2}; Spark 4 returns NULL where it divides by zero.
    "StddevSamp": "CASE WHEN {0} <= 1 THEN NULL ELSE sqrt({2} / ({0} - 1)) END",
    "StddevPop": "CASE WHEN {0} = 0 THEN NULL ELSE sqrt({2} / {0}) END",
    "VarianceSamp": "CASE WHEN {0} <= 1 THEN NULL ELSE {2} / ({0} - 1) END",
    "VariancePop": "CASE WHEN {0} = 0 THEN NULL ELSE {2} / {0} END",
}


@dataclass(frozen=True)
class AggCall:
    """One aggregate function call: its buffers over a batch, how they merge, its result."""

    function: str                 # Spark's class name, e.g. "Average"
    sql: str                      # the call as Spark prints it, e.g. "avg(v)"
    partial: tuple[str, ...]      # SQL of each buffer, aggregated over a batch's rows
    merge: str                    # a key of MERGES
    final: str                    # SQL over the buffers "{0}", "{1}", ... giving the result
    options: tuple = ()           # merge parameters (HyperLogLog++: precision)
    #: what the state task emits for the buffers, where not the buffers: the result (a
    #: percentile's double or array of doubles; "value": mode's, of the argument's type)
    merged_type: Any = None


#: The grouping key that tells a row's grouping set apart in a rollup, cube or grouping
#: sets (Spark's name: the analysed final expressions of ``grouping()`` refer to it).
GROUPING_ID = "spark_grouping_id"


@dataclass(frozen=True)
class Grouping:
    """How an aggregation groups its keys: ``groupBy``, ``rollup``, ``cube`` or
    ``groupingSets`` (with ``sets``). Spark runs the last three as an expansion of every
    row into one row per grouping set, keyed by the set's id too (``GROUPING_ID``): a
    batch's buffers come from the same call on the batch, the state keeps them per
    (keys, grouping id)."""

    kind: str = "groupBy"
    sets: tuple = ()

    @property
    def has_sets(self) -> bool:
        return self.kind != "groupBy"

    def of(self, df: DataFrame, keys: tuple):
        """``df`` grouped this way (PySpark's GroupedData)."""
        if self.kind == "groupingSets":
            return df.groupingSets([list(s) for s in self.sets], *keys)
        return getattr(df, self.kind)(*keys)

    def sets_with(self, keys: tuple, index: int) -> int:
        """How many of the grouping sets over ``keys`` hold the key at ``index`` (a row of the
        input becomes that many rows of the expansion where that key is not null): a
        rollup's prefixes that reach it, half a cube's subsets, the given sets naming it."""
        if self.kind == "rollup":
            return len(keys) - index
        if self.kind == "cube":
            return 2 ** (len(keys) - 1)
        if self.kind == "groupingSets":
            key = str(keys[index])
            return sum(any(item is keys[index] or str(item) == key for item in s) for s in self.sets)
        return 1


@dataclass(frozen=True)
class AggregateSpec:
    key_names: tuple[str, ...]                    # with GROUPING_ID last over grouping sets
    calls: tuple[AggCall, ...]
    buffer_names: tuple[tuple[str, ...], ...]     # per call, its buffer columns
    outputs: tuple[tuple[str, str], ...]          # per aggregate output column: name, final SQL
    output_schema: StructType                     # a batch query's result schema
    partial_schema: StructType                    # keys + buffer columns
    merged_schema: StructType                     # what the state step emits: an HLL
                                                  # buffer becomes its estimate (long)

    @property
    def num_buffers(self) -> int:
        return sum(len(b) for b in self.buffer_names)


#: Spark's aggregate function of a group aggregate pandas (or Arrow) UDF
PANDAS_UDAF = "PythonUDAF"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _call(found: spark_internals.AggregateCall) -> AggCall:
    name, pretty = found.function, found.pretty_name
    if found.distinct:
        raise AnalysisException("Distinct aggregations are not supported on streaming "
                                "DataFrames/Datasets. Consider using approx_count_distinct() instead.;")
    if name == PANDAS_UDAF:
        # a group aggregate pandas or Arrow UDF: Spark's engine refuses it when it plans the
        # query's first batch, and the aggregation refuses it at start (Aggregate's
        # output_mode_refusal); a stand-in that is never run meanwhile
        return AggCall(name, found.sql, ("count(1)",), "sum", "NULL")
    if name not in SUPPORTED:
        raise UnsupportedOperationError(
            f"The aggregate function {pretty} (in {found.sql}) is not supported in a streaming "
            "aggregation by microbatch yet. Supported: "
            + ", ".join(sorted(set(SUPPORTED.values()) | set(ALSO_SUPPORTED)))
            + " (and avg's alias mean, stddev's alias std, variance).")
    args = list(found.arguments)
    where = f" FILTER (WHERE {found.filter})" if found.filter is not None else ""
    a = args[0] if args else "1"

    def agg(sql: str) -> str:
        return sql + where

    if name == "Count":
        return AggCall(name, found.sql, (agg(f"count({', '.join(args)})"),), "sum", "{0}")
    if name == "Sum" and found.eval_mode == "TRY":
        return _try_sum(found, a, agg)
    if name == "Average" and found.eval_mode == "TRY" and found.decimal_argument:
        # try_avg of a decimal: its sum is null once it overflowed, its count goes on
        # (its quotient and its result type's cast are null where they overflow, too)
        precision, scale = (int(x) for x in found.argument_types[0][len("decimal("):-1].split(","))
        result = f"DECIMAL({min(38, precision + 4)},{min(38, scale + 4)})"
        return AggCall(name, found.sql, (agg(f"try_sum({a})"), agg(f"count({a})")), "try_avg",
                       "CASE WHEN {1} = 0 THEN NULL ELSE try_cast(try_divide({0}, CAST({1} AS DECIMAL(20,0))) AS "
                       + result + ") END", (_decimal_bound(found.argument_types[0], "try_avg"),))
    if name in ("MaxBy", "MinBy"):
        if len(args) != 2:
            raise UnsupportedOperationError(
                f"{pretty} with {len(args)} arguments (in {found.sql}) is not supported in a streaming "
                "aggregation by microbatch yet; max_by(x, y) and min_by(x, y) are.")
        extremum = "max" if name == "MaxBy" else "min"
        return AggCall(name, found.sql, (agg(f"{pretty}({args[0]}, {args[1]})"), agg(f"{extremum}({args[1]})")),
                       "max_by" if name == "MaxBy" else "min_by", "{0}")
    if name in ("BitAndAgg", "BitOrAgg", "BitXorAgg"):
        return AggCall(name, found.sql, (agg(f"{SUPPORTED[name]}({a})"),), SUPPORTED[name], "{0}")
    if found.final is not None:
        return _moments_call(found, args, agg)
    if name in ("Percentile", "PercentileDisc", "Mode", "ListAgg", "ApproximatePercentile"):
        return _collected_call(found, args, agg)
    if name == "HistogramNumeric":
        return _histogram_call(found, args, agg)
    if name == "Sum" and found.eval_mode == "ANSI" and found.argument_types[0] in ("tinyint", "smallint", "int",
                                                                                 "bigint"):
        # a bigint sum that overflows fails the batch in ANSI mode, in the merge as in Spark's
        return AggCall(name, found.sql, (agg(f"sum({a})"),), "sum_checked", "{0}")
    if name in ("Sum", "Min", "Max"):
        merge = {"Sum": "sum", "Min": "min", "Max": "max"}[name]
        return AggCall(name, found.sql, (agg(f"{merge}({a})"),), merge, "{0}")
    if name == "Average":
        is_decimal = found.decimal_argument
        total = agg(f"sum({a})") if is_decimal else agg(f"sum(CAST({a} AS DOUBLE))")
        count = agg(f"count({a})")
        divisor = "CAST({1} AS DECIMAL(20,0))" if is_decimal else "{1}"
        return AggCall(name, found.sql, (total, count), "sum",
                       "CASE WHEN {1} = 0 THEN NULL ELSE {0} / " + divisor + " END")
    if name in ("First", "Last"):
        ignore_nulls = found.ignore_nulls
        is_set = agg(f"max(({a}) IS NOT NULL)") if ignore_nulls else agg("max(true)")
        value = agg(f"{name.lower()}({a}, {'true' if ignore_nulls else 'false'})")
        return AggCall(name, found.sql, (value, is_set), name.lower(), "{0}")
    if name in ("CollectList", "CollectSet"):
        merge = "concat" if name == "CollectList" else "union"
        return AggCall(name, found.sql, (agg(f"{SUPPORTED[name]}({a})"),), merge, "{0}")
    if name in _MOMENT_FINALS:
        partial = (agg(f"CAST(count({a}) AS DOUBLE)"), agg(f"avg({a})"),
                   agg(f"var_pop({a}) * count({a})"))
        return AggCall(name, found.sql, partial, "moments", _MOMENT_FINALS[name])
    # HyperLogLogPlusPlus: the registers, merged by maximum, estimated in the merge task
    # with the bias tables of the running Spark (read here, on the driver).
    p = math.ceil(2.0 * math.log(1.106 / found.relative_sd) / math.log(2.0))
    tables = spark_internals.hyperloglog_tables(p)
    return AggCall(name, found.sql, (agg(_hll_registers_sql(a, p)),), "hll", "{0}", (p, *tables))


def _decimal_bound(type_name: str, function: str) -> int:
    """The bound (exclusive) of the absolute value of a sum of ``type_name``'s values
    (Spark's sum type: decimal(p + 10, s) up to 38 digits; a bigint's), unscaled for a
    decimal: a sum at or past it overflowed."""
    if type_name.startswith("decimal("):
        precision, scale = (int(x) for x in type_name[len("decimal("):-1].split(","))
        return 10 ** (min(38, precision + 10) - scale)
    if type_name in ("tinyint", "smallint", "int", "bigint"):
        return 2 ** 63
    raise UnsupportedOperationError(
        f"{function} of a {type_name} is not supported in a streaming aggregation by microbatch yet.")


def _try_sum(found: spark_internals.AggregateCall, a: str, agg) -> AggCall:
    """try_sum: null once the sum overflowed, for good (Spark's buffer: the sum and whether it
    is empty; the sum null in a buffer that is not empty means it overflowed). Over floating
    point it is sum."""
    if found.argument_types[0] in ("float", "double"):
        return AggCall("Sum", found.sql, (agg(f"sum({a})"),), "sum", "{0}")
    bound = _decimal_bound(found.argument_types[0], found.pretty_name)
    return AggCall("Sum", found.sql, (agg(f"try_sum({a})"), agg(f"count({a})") + " > 0"), "try_sum", "{0}",
                   (bound,))


_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double")


def _collected_call(found: spark_internals.AggregateCall, args: list[str], agg) -> AggCall:
    """percentile (median, percentile_cont, percentile_disc) and mode keep, as Spark's
    buffer does, each value's count (a list of (value, count), sorted by value: merged by
    adding counts; the task reads the result off it). listagg keeps the values in the order
    they came (Spark's buffer: the batches' lists, the state's first), joined at the end."""
    name, pretty, a = found.function, found.pretty_name, args[0]
    kind = found.argument_types[0]
    if name == "ApproximatePercentile":
        return _approx_percentile_call(found, args, agg)
    if name == "ListAgg":
        delimiter, order = found.parameters
        if kind != "string" or (order is not None and not order[0]):
            raise UnsupportedOperationError(
                f"{pretty} (in {found.sql}) is not supported in a streaming aggregation by microbatch yet: "
                "listagg and string_agg of strings are, in the order the rows came or WITHIN GROUP "
                "(ORDER BY the value itself).")
        values = "{0}" if order is None else ("array_sort({0})" if order[1] else "reverse(array_sort({0}))")
        return AggCall(name, found.sql, (agg(f"collect_list({a})"),), "concat",
                       f"CASE WHEN size({{0}}) = 0 THEN NULL ELSE array_join({values}, "
                       f"coalesce({delimiter.replace('{', '{{').replace('}', '}}')}, '')) END")
    if kind not in _NUMBERS and not kind.startswith("decimal") and (name != "Mode" or kind.startswith("interval")):
        raise UnsupportedOperationError(
            f"{pretty} of a {kind} (in {found.sql}) is not supported in a streaming aggregation by microbatch yet.")
    frequency = args[1] if name != "Mode" and len(args) > 1 else "1L"
    counted = agg(f"collect_list(IF(({a}) IS NULL OR ({frequency}) IS NULL OR ({frequency}) <= 0, NULL, "
                  f"named_struct('v', {a}, 'n', CAST({frequency} AS BIGINT))))")
    if name == "Mode":
        reverse, = found.parameters
        if reverse is None:
            raise UnsupportedOperationError(
                f"mode(x) (in {found.sql}) is not supported in a streaming aggregation by microbatch: among "
                "values as frequent, Spark's engine returns the first in its hash map's order, which "
                "microbatch's state cannot reproduce. mode(x, true) (the smallest of them) and mode() WITHIN "
                "GROUP (ORDER BY x [DESC]) are supported.")
        return AggCall(name, found.sql, (counted,), "counts", "{0}", ("mode", reverse), "value")
    from pyspark.sql.types import ArrayType, DoubleType
    percentages, is_array, reverse, discrete = found.parameters
    # (Spark 4.3 interpolates as lower + fraction * (higher - lower), SPARK-57982; before, as
    # the two ends weighted: the last bit of a result can differ)
    endpoint_delta = spark_internals.running_version().at_least(4, 3)
    return AggCall(name, found.sql, (counted,), "counts", "{0}",
                   ("percentile", percentages, is_array, reverse, discrete, endpoint_delta),
                   ArrayType(DoubleType(), False) if is_array else DoubleType())


#: percentile_approx's argument as Spark's update makes it a double (a date's days, a
#: timestamp's or day-time interval's microseconds, a year-month interval's months), and
#: the result back from the double as its eval does (``.toInt``, ``.toLong``: truncated).
_EPOCH_NTZ = "TIMESTAMP_NTZ'1970-01-01 00:00:00'"
_AS_DOUBLE = {
    "date": ("CAST(unix_date({0}) AS DOUBLE)", "date_from_unix_date(CAST({0} AS INT))"),
    "timestamp": ("CAST(unix_micros({0}) AS DOUBLE)", "timestamp_micros(CAST({0} AS BIGINT))"),
    "timestamp_ntz": (f"CAST(timestampdiff(MICROSECOND, {_EPOCH_NTZ}, {{0}}) AS DOUBLE)",
                      f"timestampadd(MICROSECOND, CAST({{0}} AS BIGINT), {_EPOCH_NTZ})"),
    "interval day": (f"CAST(timestampdiff(MICROSECOND, {_EPOCH_NTZ}, {_EPOCH_NTZ} + {{0}}) AS DOUBLE)",
                     "CAST({0} AS BIGINT) * INTERVAL '0.000001' SECOND"),
    "interval year": ("CAST(extract(YEAR FROM {0}) * 12 + extract(MONTH FROM {0}) AS DOUBLE)",
                      "CAST({0} AS INT) * INTERVAL '1' MONTH"),
}


def _double_kind(kind: str) -> str:
    """An argument type as ``_AS_DOUBLE`` names it: an interval's kind by its unit
    (year-month: of years or months; the rest day-time)."""
    if kind.startswith("interval"):
        return "interval year" if kind.startswith("interval year") or kind == "interval month" else "interval day"
    return kind


def _approx_percentile_call(found: spark_internals.AggregateCall, args: list[str], agg) -> AggCall:
    """percentile_approx (approx_percentile): the state keeps Spark's QuantileSummaries
    (``quantiles``: the samples' values, g and delta); a batch brings its values, as doubles
    (Spark's update's conversion), which the task inserts and merges as Spark's buffer does."""
    from pyspark.sql.types import ArrayType, DoubleType
    percentages, is_array, accuracy = found.parameters
    kind, a = found.argument_types[0], args[0]
    kind = _double_kind(kind)
    to_double, back = _AS_DOUBLE.get(kind, ("CAST({0} AS DOUBLE)", None))
    if back is None and kind not in _NUMBERS and not kind.startswith("decimal"):
        raise UnsupportedOperationError(
            f"{found.pretty_name} of a {kind} (in {found.sql}) is not supported in a streaming aggregation "
            "by microbatch yet.")
    values = agg(f"collect_list({to_double.format(a)})")
    final = "{0}"
    if back is not None:
        # (array_compact: an array of elements never null, as Spark types the result)
        final = f"array_compact(transform({{0}}, x_ -> {back.format('x_')}))" if is_array else back
    return AggCall(found.function, found.sql, (values, "CAST(NULL AS ARRAY<BIGINT>)", "CAST(NULL AS ARRAY<BIGINT>)"),
                   "quantiles", final, (1.0 / accuracy, percentages, is_array),
                   ArrayType(DoubleType(), False) if is_array else DoubleType())


#: histogram_numeric's x back in the argument's type, as its eval makes it from the double
#: (``.toInt``, ``.toLong``...: truncated) where it keeps the input's type (Spark's default)
_FROM_DOUBLE = {"tinyint": "CAST({0} AS TINYINT)", "smallint": "CAST({0} AS SMALLINT)",
                "int": "CAST({0} AS INT)", "bigint": "CAST({0} AS BIGINT)", "float": "CAST({0} AS FLOAT)",
                "double": "{0}"}


def _histogram_call(found: spark_internals.AggregateCall, args: list[str], agg) -> AggCall:
    """histogram_numeric(x, nb): the state keeps Spark's NumericHistogram (its bins, x and y
    as doubles); a batch brings Spark's own histogram of the batch's rows (its bins as
    doubles), which the task merges into the kept one as Spark's engine does
    (``operators.aggregate.histogram``)."""
    nb, x_type = found.parameters
    kind, a = found.argument_types[0], args[0]
    kind = _double_kind(kind)
    to_double, back = _AS_DOUBLE.get(kind, ("CAST({0} AS DOUBLE)", _FROM_DOUBLE.get(kind)))
    if back is None:
        raise UnsupportedOperationError(
            f"{found.pretty_name} of a {kind} (in {found.sql}) is not supported in a streaming aggregation "
            "by microbatch yet.")
    final = "{0}"
    if x_type != "double" and back != "{0}":
        final = f"transform({{0}}, b_ -> named_struct('x', {back.format('b_.x')}, 'y', b_.y))"
    return AggCall(found.function, found.sql, (agg(f"histogram_numeric({to_double.format(a)}, {nb})"),),
                   "histogram", final, (nb,))


def _moments_call(found: spark_internals.AggregateCall, args: list[str], agg) -> AggCall:
    """A function over central moments or co-moments (Spark's CentralMomentAgg, Covariance,
    PearsonCorrelation): the batch's buffers as Spark's (n, means, sums of squared
    deviations...; 0 where the batch had no value), merged pairwise by Spark's formulas,
    finalised by Spark's own final expression (``found.final``)."""
    name = found.function
    if name in ("Skewness", "Kurtosis", "RegrReplacement"):
        a = args[0]
        n = agg(f"count({a})")
        m2 = f"({agg(f'var_pop({a})')} * {n})"
        partial = [f"CAST({n} AS DOUBLE)", agg(f"avg({a})"), m2]
        if name in ("Skewness", "Kurtosis"):   # from Spark's own skewness and kurtosis of the batch
            partial.append(f"coalesce({agg(f'skewness({a})')} * sqrt({m2} * {m2} * {m2}) / sqrt({n}), 0D)")
        if name == "Kurtosis":
            partial.append(f"coalesce(({agg(f'kurtosis({a})')} + 3D) * {m2} * {m2} / {n}, 0D)")
        return AggCall(name, found.sql, tuple(partial), "moments", found.final)
    # regr_slope(y, x) and regr_intercept(y, x): the covariance of (x, y) and x's moments
    x, y = (args[1], args[0]) if name in ("RegrSlope", "RegrIntercept") else (args[0], args[1])
    both = f"({x}) IS NOT NULL AND ({y}) IS NOT NULL"
    xs, ys = f"IF({both}, {x}, NULL)", f"IF({both}, {y}, NULL)"
    n = agg(f"count({x}, {y})")
    partial = [f"CAST({n} AS DOUBLE)", f"coalesce({agg(f'avg({xs})')}, 0D)", f"coalesce({agg(f'avg({ys})')}, 0D)",
               f"coalesce({agg(f'covar_pop({x}, {y})')} * {n}, 0D)"]
    if name in ("Corr", "RegrR2"):
        partial += [f"coalesce({agg(f'var_pop({xs})')} * {n}, 0D)", f"coalesce({agg(f'var_pop({ys})')} * {n}, 0D)"]
    merge = "comoments"
    if name in ("RegrSlope", "RegrIntercept"):
        partial += [f"CAST({n} AS DOUBLE)", f"coalesce({agg(f'avg({xs})')}, 0D)",
                    f"coalesce({agg(f'var_pop({xs})')} * {n}, 0D)"]
        merge = "regression"
    return AggCall(name, found.sql, tuple(partial), merge, found.final)


def _hll_registers_sql(arg: str, p: int) -> str:
    """The HyperLogLog++ registers that Spark's ``approx_count_distinct`` would set for
    ``arg`` over a batch (XxHash64 with seed 42): the set of (register index, rank)
    pairs; the merge keeps each register's maximum rank."""
    h = f"xxhash64({arg})"
    index = f"CAST(shiftrightunsigned({h}, {64 - p}) AS INT)"
    # rank = the number of leading zeros of (h << p | 1 << (p - 1)), plus one
    rank = f"CAST(65 - length(bin(shiftleft({h}, {p}) | {1 << (p - 1)})) AS INT)"
    return f"collect_set(IF(({arg}) IS NULL, NULL, named_struct('i', {index}, 'r', {rank})))"


def plan_aggregation(grouped: DataFrame, input_template: DataFrame, keys: tuple,
                     buffer_prefix: str, grouping: Grouping = Grouping()) -> AggregateSpec:
    """Split the aggregation ``grouped`` (the batch query over the empty template)."""
    root, grouping_expressions, expressions = spark_internals.aggregation_parts(grouped)
    if root != "Aggregate":
        raise UnsupportedOperationError(
            f"microbatch cannot plan this aggregation (Spark planned it as {root}); "
            "write it as groupBy(columns).agg(aggregate functions).")
    names = grouped.columns
    # groupBy(...).agg lists the keys first; over grouping sets Spark groups by the
    # grouping id too, which is not an output column
    num_keys = grouping_expressions - int(grouping.has_sets)
    calls: list[AggCall] = []
    buffer_names: list[tuple[str, ...]] = []
    outputs: list[tuple[str, str]] = []
    for name, expression in zip(names[num_keys:], expressions[num_keys:]):
        body = expression.sql   # its calls: none for a constant, which Spark allows
        for found in sorted(expression.calls, key=lambda c: -len(c.sql)):
            call = _call(found)
            index = len(calls)
            buffers = tuple(f"{buffer_prefix}{index}_{i}" for i in range(len(call.partial)))
            calls.append(call)
            buffer_names.append(buffers)
            final = "(" + call.final.format(*[_quote(b) for b in buffers]) + ")"
            body = body.replace(call.sql, final)
        outputs.append((name, body))
    key_names = tuple(names[:num_keys]) + ((GROUPING_ID,) if grouping.has_sets else ())
    partial = grouped_partial(input_template, keys, calls, buffer_names, grouping=grouping).schema
    emitted = {names[0]: LongType() for call, names in zip(calls, buffer_names) if call.merge == "hll"}
    for call, names in zip(calls, buffer_names):
        if call.merged_type == "value":   # (a list of (value, count) -> a value)
            emitted[names[0]] = partial[names[0]].dataType.elementType["v"].dataType
        elif call.merged_type is not None:
            emitted[names[0]] = call.merged_type
    merged = StructType([StructField(f.name, emitted[f.name], not isinstance(emitted[f.name], LongType))
                         if f.name in emitted else f for f in partial.fields])
    return AggregateSpec(key_names, tuple(calls), tuple(buffer_names), tuple(outputs),
                         grouped.schema, partial, merged)


def partial_columns(calls, buffer_names) -> list:
    """The buffer columns of step 1 (Column objects, reusable across batches)."""
    from pyspark.sql import functions as F
    return [F.expr(sql).alias(name) for call, names in zip(calls, buffer_names)
            for sql, name in zip(call.partial, names)]


def grouped_partial(df: DataFrame, keys: tuple, calls, buffer_names, extra: tuple = (),
                    columns: list | None = None, grouping: Grouping = Grouping()) -> DataFrame:
    """Step 1: the buffers of every call, per key, over ``df`` (then ``extra`` aggregate
    columns, if any); ``columns``: ``partial_columns`` built before. Over grouping sets,
    the keys are followed by the grouping id."""
    from pyspark.sql import functions as F
    if columns is None:
        columns = partial_columns(calls, buffer_names)
    if grouping.has_sets:
        columns = [F.grouping_id().alias(GROUPING_ID), *columns]
    if not columns and not extra:
        # keys alone (``SELECT k ... GROUP BY k``: Spark's Aggregate with no aggregate
        # function keeps the keys, no buffer); PySpark's agg() takes at least one column
        return grouping.of(df, keys).agg(F.lit(0).alias(_NO_BUFFER)).drop(_NO_BUFFER)
    return grouping.of(df, keys).agg(*columns, *extra)


_NO_BUFFER = "__microbatch_no_buffer"


def final_columns(spec: AggregateSpec) -> list:
    """The result columns of step 3 (Column objects, reusable across batches)."""
    from pyspark.sql import functions as F
    keys = [k for k in spec.key_names if k != GROUPING_ID]
    columns: list[Any] = [F.col(_quote(k)) for k in keys]
    types = {f.name: f.dataType for f in spec.output_schema.fields}
    for name, sql in spec.outputs:
        key = next((k for k in keys if sql in (k, _quote(k))), None)
        if key is not None:   # a key again (``window AS w``): the column, with its metadata (a window's)
            columns.append(F.col(_quote(key)).alias(name))
        else:
            columns.append(F.expr(sql).cast(types[name]).alias(name))
    return columns


def finalize(df: DataFrame, spec: AggregateSpec, columns: list | None = None) -> DataFrame:
    """Step 3: the result columns from the merged buffers, with a batch query's types."""
    return df.select(*(columns if columns is not None else final_columns(spec)))
