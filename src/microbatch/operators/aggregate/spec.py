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

#: The functions a streaming aggregation supports (Spark class name -> SQL name).
SUPPORTED = {
    "Count": "count", "Sum": "sum", "Min": "min", "Max": "max", "Average": "avg",
    "First": "first", "Last": "last", "CollectList": "collect_list", "CollectSet": "collect_set",
    "HyperLogLogPlusPlus": "approx_count_distinct", "StddevSamp": "stddev_samp",
    "StddevPop": "stddev_pop", "VarianceSamp": "var_samp", "VariancePop": "var_pop",
}

#: How two buffers of one function merge, by the number of buffer columns they use.
MERGES = {"sum": 1, "min": 1, "max": 1, "first": 2, "last": 2, "concat": 1, "union": 1,
          "moments": 3, "hll": 1}

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


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _call(found: spark_internals.AggregateCall) -> AggCall:
    name, pretty = found.function, found.pretty_name
    if found.distinct:
        raise AnalysisException("Distinct aggregations are not supported on streaming "
                                "DataFrames/Datasets. Consider using approx_count_distinct() instead.;")
    if name not in SUPPORTED:
        raise UnsupportedOperationError(
            f"The aggregate function {pretty} (in {found.sql}) is not supported in a streaming "
            "aggregation by microbatch yet. Supported: " + ", ".join(sorted(set(SUPPORTED.values())))
            + " (and avg's alias mean, stddev's alias std, variance).")
    args = list(found.arguments)
    where = f" FILTER (WHERE {found.filter})" if found.filter is not None else ""
    a = args[0] if args else "1"

    def agg(sql: str) -> str:
        return sql + where

    if name == "Count":
        return AggCall(name, found.sql, (agg(f"count({', '.join(args)})"),), "sum", "{0}")
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
    hll_buffers = {names[0] for call, names in zip(calls, buffer_names) if call.merge == "hll"}
    merged = StructType([StructField(f.name, LongType(), False) if f.name in hll_buffers else f
                         for f in partial.fields])
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
    return grouping.of(df, keys).agg(*columns, *extra)


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
