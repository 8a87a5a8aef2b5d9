"""What the engine reads from Spark's analysed plans classically, read from a Connect
client's plan instead (no JVM): the calls of an aggregation, a column's text, whether a
plan reads the current time. The filter and projection checks answer conservatively
(a filter stays above a watermark, the watermark's statistics are observed there)."""
from __future__ import annotations

import re
from typing import Any

from microbatch.spark_internals.connect.support import AGGREGATES, refuse
from microbatch.spark_internals.java_text import java_double_text

#: Spark's class of each aggregate function the translation knows
_CLASSES = {"count": "Count", "sum": "Sum", "min": "Min", "max": "Max", "avg": "Average", "mean": "Average",
            "max_by": "MaxBy", "min_by": "MinBy", "first": "First", "last": "Last",
            "collect_list": "CollectList", "collect_set": "CollectSet",
            "stddev": "StddevSamp", "std": "StddevSamp", "stddev_samp": "StddevSamp", "stddev_pop": "StddevPop",
            "variance": "VarianceSamp", "var_samp": "VarianceSamp", "var_pop": "VariancePop",
            "first_value": "First", "last_value": "Last", "any_value": "First",
            "count_if": "Count", "bool_and": "Min", "every": "Min", "bool_or": "Max", "some": "Max", "any": "Max",
            "try_sum": "Sum", "try_avg": "Average",
            "bit_and": "BitAndAgg", "bit_or": "BitOrAgg", "bit_xor": "BitXorAgg",
            "approx_count_distinct": "HyperLogLogPlusPlus", "percentile": "Percentile", "median": "Percentile",
            "percentile_approx": "ApproximatePercentile", "approx_percentile": "ApproximatePercentile",
            "mode": "Mode"}
#: The functions over central moments and co-moments: Spark's class, the class its optimizer
#: replaces, and Spark 4.3's final expression over the buffers ({0}, {1}...), without and
#: with ``spark.sql.legacy.statisticalAggregate`` (NaN where a division has no value). A
#: classic session reads them from Spark's classes (``AggregateCall.final``); a Connect
#: client has no JVM, and the server's line is the client's, 4.3 (``session.check_supported``), so the
#: table is Spark 4.3's, checked against the JVM's in tests/test_connect_moments_table.py.
_MOMENTS = {
    'corr': ('Corr', None,
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({0} = 1.0D), CAST(NULL AS DOUBLE), (IF((({4} = 0.0D) OR ({5} = 0.0D)), CAST(NULL AS DOUBLE), ({3} / SQRT(({4} * {5})))))))))',
        "(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({0} = 1.0D), CAST('NaN' AS DOUBLE), (IF((({4} = 0.0D) OR ({5} = 0.0D)), CAST(NULL AS DOUBLE), ({3} / SQRT(({4} * {5})))))))))"),
    'covar_pop': ('CovPopulation', None,
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), ({3} / {0})))',
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), ({3} / {0})))'),
    'covar_samp': ('CovSample', None,
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({0} = 1.0D), CAST(NULL AS DOUBLE), ({3} / ({0} - 1.0D))))))',
        "(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({0} = 1.0D), CAST('NaN' AS DOUBLE), ({3} / ({0} - 1.0D))))))"),
    'skewness': ('Skewness', None,
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({2} = 0.0D), CAST(NULL AS DOUBLE), ((SQRT({0}) * {3}) / SQRT((({2} * {2}) * {2})))))))',
        "(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({2} = 0.0D), CAST('NaN' AS DOUBLE), ((SQRT({0}) * {3}) / SQRT((({2} * {2}) * {2})))))))"),
    'kurtosis': ('Kurtosis', None,
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({2} = 0.0D), CAST(NULL AS DOUBLE), ((({0} * {4}) / ({2} * {2})) - 3.0D)))))',
        "(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), (IF(({2} = 0.0D), CAST('NaN' AS DOUBLE), ((({0} * {4}) / ({2} * {2})) - 3.0D)))))"),
    'regr_sxy': ('RegrSXY', None,
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), {3}))',
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), {3}))'),
    'regr_r2': ('RegrR2', None,
        '(IF(({5} = 0.0D), CAST(NULL AS DOUBLE), (IF(({4} = 0.0D), 1.0D, (({3} / SQRT(({4} * {5}))) * ({3} / SQRT(({4} * {5}))))))))',
        '(IF(({5} = 0.0D), CAST(NULL AS DOUBLE), (IF(({4} = 0.0D), 1.0D, (({3} / SQRT(({4} * {5}))) * ({3} / SQRT(({4} * {5}))))))))'),
    'regr_slope': ('RegrSlope', None,
        '(IF(({6} = 0.0D), CAST(NULL AS DOUBLE), ({3} / {6})))',
        '(IF(({6} = 0.0D), CAST(NULL AS DOUBLE), ({3} / {6})))'),
    'regr_intercept': ('RegrIntercept', None,
        '(IF(({6} = 0.0D), CAST(NULL AS DOUBLE), ({2} - (({3} / {6}) * {1}))))',
        '(IF(({6} = 0.0D), CAST(NULL AS DOUBLE), ({2} - (({3} / {6}) * {1}))))'),
    'regr_sxx': ('RegrReplacement', 'RegrSXX',
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), {2}))',
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), {2}))'),
    'regr_syy': ('RegrReplacement', 'RegrSYY',
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), {2}))',
        '(IF(({0} = 0.0D), CAST(NULL AS DOUBLE), {2}))'),
}
_CLASSES.update({name: entry[0] for name, entry in _MOMENTS.items()})
_CLASSES.update({"regr_count": "Count", "regr_avgx": "Average", "regr_avgy": "Average"})
#: Spark's RuntimeReplaceableAggregate functions among them: the class Spark's optimizer
#: replaces (``AggregateCall.replaced``; the call is planned as ``_CLASSES``' one)
_REPLACED = {"count_if": "CountIf", "bool_and": "BoolAnd", "every": "BoolAnd", "bool_or": "BoolOr",
             "some": "BoolOr", "any": "BoolOr", "any_value": "AnyValue", "regr_count": "RegrCount",
             "regr_avgx": "RegrAvgX", "regr_avgy": "RegrAvgY", "regr_sxx": "RegrSXX", "regr_syy": "RegrSYY",
             "median": "Median"}
#: approx_count_distinct's relative standard deviation when the call gives none (Spark's)
_DEFAULT_RELATIVE_SD = 0.05
#: percentile_approx's accuracy when the call gives none (Spark's ``DEFAULT_PERCENTILE_ACCURACY``)
_DEFAULT_ACCURACY = 10000
#: the functions whose last argument is a literal flag, not a column: first/last(x, ignoreNulls)
_FLAGGED = frozenset({"first", "last", "first_value", "last_value", "any_value"})
#: functions printed infix, as Spark prints them
_INFIX = {"+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "and", "or"}
#: functions that read the current time
_CURRENT_TIME = ("current_timestamp", "now", "current_date", "localtimestamp", "curdate", "current_time")
#: the plain ``fn(`column`)`` text of ``F.expr`` (what ``agg({column: fn})`` makes)
_PLAIN_CALL = re.compile(r"^\s*(\w+)\(\s*(`[^`]+`|[A-Za-z_]\w*|\*)\s*\)\s*$")


def _expressions():
    from pyspark.sql.connect import expressions
    return expressions


def column_sql(column: Any) -> str:
    """A Connect Column's expression as Spark prints it (``window(ts, 10 seconds)``)."""
    return str(column._expr)


def sql_of(expression: Any) -> str:
    """Spark SQL text of a Connect expression (the kinds an aggregation uses so far)."""
    E = _expressions()
    if isinstance(expression, E.ColumnAlias):
        return sql_of(expression._child)
    if isinstance(expression, E.ColumnReference):
        name = expression._unparsed_identifier
        return f"`{name}`" if re.match(r"^[A-Za-z_]\w*$", name) else name
    if isinstance(expression, E.LiteralExpression):
        value = expression._value
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return repr(value)
        if isinstance(value, str):
            return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        refuse(f"A literal {value!r} in an aggregation")
    if isinstance(expression, E.UnresolvedFunction) and expression._name in _PRINTED_WITH_CONSTANTS:
        return _printed_with_constants(expression)
    if isinstance(expression, E.UnresolvedFunction):
        args = [sql_of(a) for a in expression._args]
        if expression._name in _INFIX and len(args) == 2:
            op = {"==": "=", "and": "AND", "or": "OR"}.get(expression._name, expression._name)
            return f"({args[0]} {op} {args[1]})"
        return f"{expression._name}({'DISTINCT ' if expression._is_distinct else ''}{', '.join(args)})"
    if isinstance(expression, E.CastExpression):
        data_type = expression._data_type
        text = data_type.simpleString().upper() if hasattr(data_type, "simpleString") else str(data_type)
        return f"CAST({sql_of(expression._expr)} AS {text})"
    if isinstance(expression, E.SQLExpression):
        return f"({expression._expr})"
    if isinstance(expression, E.CaseWhen):   # (as Spark's CaseWhen.sql prints it)
        branches = "".join(f" WHEN {sql_of(c)} THEN {sql_of(v)}" for c, v in expression._branches)
        otherwise = f" ELSE {sql_of(expression._else_value)}" if expression._else_value is not None else ""
        return f"CASE{branches}{otherwise} END"
    refuse(f"The expression {expression} in an aggregation")


#: the aggregate functions with constant arguments, printed as Spark's analysed plan prints
#: them (a checkpoint's schema file records the calls' text, and moves between the two)
_PRINTED_WITH_CONSTANTS = frozenset({"approx_count_distinct", "percentile", "median", "percentile_approx",
                                     "approx_percentile", "mode"})


def _printed_with_constants(call: Any) -> str:
    """``call`` as Spark prints it: a double literal with ``D`` (Java's digits), an array of
    them as ``array(..)``, approx_count_distinct without its relative standard deviation,
    ``mode(x, true)`` as ``mode() WITHIN GROUP (ORDER BY x DESC)``."""
    name, args = call._name, list(call._args)
    first = sql_of(args[0])

    def constant(expression: Any) -> str:
        value = _literal_value(expression, f"{name}'s percentage")
        if isinstance(value, list):
            return f"array({', '.join(java_double_text(float(v)) + 'D' for v in value)})"
        return java_double_text(float(value)) + "D" if isinstance(value, float) else sql_of(expression)

    if name in ("approx_count_distinct", "median"):
        return f"{name}({first})"
    if name == "percentile":
        return f"percentile({first}, {constant(args[1])}, {sql_of(args[2]) if len(args) > 2 else '1L'})"
    if name in ("percentile_approx", "approx_percentile"):
        accuracy = sql_of(args[2]) if len(args) > 2 else str(_DEFAULT_ACCURACY)
        return f"{name}({first}, {constant(args[1])}, {accuracy})"
    if len(args) > 1 and _literal_value(args[1], "mode's deterministic flag") is True:
        return f"mode() WITHIN GROUP (ORDER BY {first} DESC)"
    return f"mode({first})"


def _plain_sql_call(expression: Any) -> Any:
    """``F.expr("fn(`c`)")`` as the UnresolvedFunction it means, if it is that plain."""
    E = _expressions()
    found = _PLAIN_CALL.match(expression._expr)
    if found is None or found.group(1).lower() not in _CLASSES:
        refuse(f"The aggregate expression {expression._expr!r} (as SQL text)")
    name, argument = found.group(1).lower(), found.group(2)
    arg = (E.LiteralExpression(1, E.LiteralExpression._infer_type(1)) if argument == "*"
           else E.ColumnReference(argument.strip("`")))
    return E.UnresolvedFunction(name, [arg])


def _calls(expression: Any) -> list:
    E = _expressions()
    if isinstance(expression, E.UnresolvedFunction) and expression._name in _CLASSES:
        return [expression]
    if isinstance(expression, E.UnresolvedFunction) and _looks_aggregate(expression._name):
        refuse(f"The aggregate function {expression._name}")
    return [c for child in getattr(expression, "children", []) for c in _calls(child)]


def _looks_aggregate(name: str) -> bool:
    return name in {"first", "last", "first_value", "last_value", "collect_list", "collect_set", "array_agg",
                    "approx_count_distinct", "count_distinct", "stddev", "std", "stddev_samp", "stddev_pop",
                    "variance", "var_samp", "var_pop", "percentile_approx", "any_value", "count_if",
                    "bool_and", "bool_or", "every", "some", "corr", "covar_pop", "covar_samp", "kurtosis",
                    "skewness", "median", "mode", "percentile", "max_by", "min_by", "product", "sum_distinct"}


def aggregation_parts(grouped: Any) -> tuple[str, int, list]:
    """What Spark's analysed Aggregate says (see the classic ``aggregation_parts``), read
    from the Connect plan of ``grouped`` (``template.groupBy(keys).agg(...)``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.connect import plan as P
    from pyspark.sql.connect.dataframe import DataFrame

    from microbatch.spark_internals.analysis import AggregateCall, AggregateOutput
    E = _expressions()
    node = grouped._plan
    if not isinstance(node, P.Aggregate):
        return type(node).__name__, 0, []
    if node._group_type != "groupby" or getattr(node, "_pivot_col", None) is not None:
        refuse(f"An aggregation by {node._group_type}")
    child = DataFrame(node._child, grouped._session)
    # (sum's and avg's evaluation mode, as the server's analysis gives it: an overflow fails
    # the batch in ANSI mode)
    ansi = str(grouped._session.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true"
    legacy = str(grouped._session.conf.get("spark.sql.legacy.statisticalAggregate", "false")).lower() == "true"
    outputs = []
    keys = len(node._grouping_cols)
    for position, column in enumerate(list(node._grouping_cols) + list(node._aggregate_cols)):
        expression = column._expr
        while isinstance(expression, E.ColumnAlias):
            expression = expression._child
        if isinstance(expression, E.SQLExpression) and position >= keys:
            expression = _plain_sql_call(expression)
        calls = []
        for call in _calls(expression):
            kind = _CLASSES[call._name]
            if call._is_distinct:
                refuse(f"{call._name}(DISTINCT ...)")
            args, ignore_nulls = list(call._args), False
            if call._name in _FLAGGED and len(args) == 2:
                flag = args.pop()
                if not isinstance(flag, E.LiteralExpression) or not isinstance(flag._value, bool):
                    refuse(f"{call._name} with a second argument that is not true or false")
                ignore_nulls = flag._value
            args, relative_sd, parameters = _constant_parameters(call._name, args)
            arguments = tuple(sql_of(a) for a in args)
            arguments, final = _as_planned(call._name, arguments, legacy)
            types = () if kind == "Count" else tuple(   # (one schema request: what the state's buffers hold)
                f.dataType.simpleString() for f in child.select(*[F.expr(a) for a in arguments]).schema.fields)
            decimal = kind == "Average" and types[0].startswith("decimal")
            eval_mode = None
            if kind in ("Sum", "Average"):
                eval_mode = "TRY" if call._name.startswith("try_") else "ANSI" if ansi else "LEGACY"
            calls.append(AggregateCall(kind, call._name, sql_of(call), False, arguments, None, decimal,
                                       ignore_nulls, relative_sd, eval_mode, argument_types=types,
                                       replaced=_REPLACED.get(call._name), final=final, parameters=parameters))
        outputs.append(AggregateOutput(sql_of(expression), tuple(calls)))
    assert AGGREGATES >= set(_CLASSES)
    return "Aggregate", len(node._grouping_cols), outputs


def _literal_value(expression: Any, what: str) -> Any:
    """A constant argument's value: a literal, or ``array`` of literals (``lit([0.25, 0.75])``)
    as a list; refused, naming ``what``, otherwise (Spark requires it foldable)."""
    E = _expressions()
    if isinstance(expression, E.LiteralExpression):
        return expression._value
    if isinstance(expression, E.UnresolvedFunction) and expression._name == "array" \
            and all(isinstance(a, E.LiteralExpression) for a in expression._args):
        return [a._value for a in expression._args]
    if isinstance(expression, E.CastExpression):
        return _literal_value(expression._expr, what)
    refuse(f"{what} that is not a literal ({expression})")


def _constant_parameters(name: str, args: list) -> tuple[list, float | None, tuple]:
    """A call's arguments without its constant parameters, its relative standard deviation
    (approx_count_distinct's) and its ``AggregateCall.parameters``, as Spark's analysis
    gives them classically (``analysis._call_parameters``)."""
    if name == "approx_count_distinct":
        rsd = float(_literal_value(args[1], "approx_count_distinct's relative standard deviation")) \
            if len(args) > 1 else _DEFAULT_RELATIVE_SD
        return args[:1], rsd, ()
    if name in ("percentile", "median"):
        if name == "median":   # (Spark's replacement: percentile(x, 0.5) with a frequency of 1L)
            return [args[0], _expressions().SQLExpression("1L")], None, ((0.5,), False, False, False)
        found = _literal_value(args[1], "percentile's percentage")
        percentages = tuple(float(p) for p in found) if isinstance(found, list) else (float(found),)
        return args[:1] + args[2:], None, (percentages, isinstance(found, list), False, False)
    if name in ("percentile_approx", "approx_percentile"):
        found = _literal_value(args[1], f"{name}'s percentage")
        percentages = tuple(float(p) for p in found) if isinstance(found, list) else (float(found),)
        accuracy = int(_literal_value(args[2], f"{name}'s accuracy")) if len(args) > 2 else _DEFAULT_ACCURACY
        return args[:1], None, (percentages, isinstance(found, list), accuracy)
    if name == "mode":   # mode(x, deterministic): the smallest of the most frequent (reverse), or any
        deterministic = bool(_literal_value(args[1], "mode's deterministic flag")) if len(args) > 1 else False
        return args[:1], None, (True if deterministic else None,)
    return args, None, ()


def _as_planned(name: str, arguments: tuple, legacy: bool) -> tuple[tuple, str | None]:
    """A call's arguments as Spark's analysis and optimizer plan them (``count_if`` as a
    count of the true rows, the moment functions' arguments as doubles, a regression's
    replacements over the rows where both are set), and its final expression (the moment
    functions', ``_MOMENTS``)."""
    if name == "count_if":
        return (f"nullif({arguments[0]}, false)",), None
    if name in ("regr_count", "regr_avgx", "regr_avgy"):
        y, x = arguments
        both = f"(({y}) IS NOT NULL AND ({x}) IS NOT NULL)"
        return ((y, x) if name == "regr_count" else (f"IF({both}, {x if name == 'regr_avgx' else y}, NULL)",)), None
    if name not in _MOMENTS:
        return arguments, None
    doubles = tuple(f"CAST({a} AS DOUBLE)" for a in arguments)
    if name in ("regr_sxx", "regr_syy"):
        y, x = doubles
        doubles = (f"IF(({y}) IS NULL OR ({x}) IS NULL, NULL, {x if name == 'regr_sxx' else y})",)
    return doubles, _MOMENTS[name][3 if legacy else 2]


def uses_current_time(df: Any) -> bool:
    """Whether ``df``'s plan calls a current-time function (also inside SQL text)."""
    text = str(df._plan.to_proto(df._session.client)).lower()
    return any(f'"{name}"' in text or f"{name}(" in text for name in _CURRENT_TIME)


def never(*args: Any, **kwargs: Any) -> bool:
    """A filter/projection check over Connect: not proven, so the filter stays where it
    is and the watermark's statistics are observed (correct, a little slower)."""
    return False


def no_conjuncts(*args: Any, **kwargs: Any) -> None:
    return None


def parse_schema_ddl(ddl: str) -> Any:
    """A DDL schema string, parsed by the Connect client (no JVM)."""
    from pyspark.sql.types import StructType
    return StructType.fromDDL(ddl)


def schema_tree(df: Any, level: int | None = None) -> str:
    return df.schema.treeString(level) if level else df.schema.treeString()


def grouping_columns(grouped: Any) -> list[str | None]:
    """What a Connect ``GroupedData`` groups by, key by key (the classic
    ``grouping_columns``): a top-level column's name, or None for anything else."""
    E = _expressions()
    names: list[str | None] = []
    for column in grouped._grouping_cols:
        expression = column._expr
        name = expression._unparsed_identifier if isinstance(expression, E.ColumnReference) else None
        if name is not None and re.match(r"^`[^`]+`$", name):
            name = name[1:-1]
        names.append(name if name is not None and "." not in name.strip("`") else None)
    return names


def grouping_column_names(grouped: Any) -> list[str]:
    """The column names a Connect ``GroupedData`` groups by; a ValueError for anything else."""
    names = grouping_columns(grouped)
    if None in names:
        raise ValueError("The initial state must be grouped by columns, not by "
                         f"{grouped._grouping_cols[names.index(None)]._expr}")
    return names  # type: ignore[return-value]


def grouped_dataframe(grouped: Any) -> Any:
    """The DataFrame a Connect ``GroupedData`` groups."""
    return grouped._df


def hyperloglog_tables(p: int) -> tuple:
    """Spark's HyperLogLog++ bias tables at precision ``p`` (as the classic
    ``hyperloglog_tables`` reads them from the JVM), from the copy of Spark 4.3's beside this
    module: (threshold, raw estimates, biases); empty from 19 on, where Spark uses none."""
    import json
    from pathlib import Path
    if p >= 19:
        return 0.0, (), ()
    tables = json.loads(Path(__file__).with_name("hyperloglog_tables.json").read_text())["tables"][str(p)]
    return float(tables["threshold"]), tuple(tables["raw_estimates"]), tuple(tables["biases"])


#: the steps of a query Spark runs on each batch as it runs them on the stream (no state
#: across batches), as its analysed plan names them; the common table expressions and
#: their references stand for the stream's view
_PER_BATCH_STEPS = frozenset({"WithCTE", "CTERelationDef", "CTERelationRef", "SubqueryAlias", "Project",
                              "Filter", "Generate"})
_NODE = re.compile(r"^([\s:|+-]*)(\w+)")
_SUBQUERY = re.compile(r"\b(list|scalar-subquery|exists|lateral-subquery)#\d+")
_REFERENCE = re.compile(r"CTERelationRef (\d+),")


def per_batch_sql_refusal(template: Any, query: str, args: Any, name: str) -> str | None:
    """Why the SQL ``query`` (a common table expression over ``template`` named ``name``
    in it, then the user's query) does not give Spark's rows when run on each batch of a
    stream alone, read from the server's analysed plan (``EXPLAIN EXTENDED``, which runs
    nothing): the first step that is no projection, filter or generator, or a subquery;
    "reads no stream" where nothing reads the expression; None where it runs per batch.
    SQL that Spark's analysis refuses raises Spark's error."""
    from microbatch.spark_internals.connect.relations import sql_over
    text = sql_over(template, f"EXPLAIN EXTENDED {query}", args, name).collect()[0][0]
    lines = text.split("== Analyzed Logical Plan ==", 1)[-1].split("== Optimized Logical Plan ==", 1)[0]
    if "Exception" in lines.strip().split("\n", 1)[0]:    # (EXPLAIN prints the analysis's error)
        _ = sql_over(template, query, args, name).schema   # (which raises it)
    lines = [line for line in lines.splitlines()[2:] if line.strip()]   # (after the schema line)
    ours, skip_deeper, refusal = None, None, None
    references: list[str] = []
    for line in lines:
        found = _NODE.match(line)
        if found is None:
            continue
        depth, node = len(found.group(1)), found.group(2)
        if skip_deeper is not None:
            if depth > skip_deeper:
                continue
            skip_deeper = None
        if node == "CTERelationDef" and ours is None:    # (the first: the stream's, over its batch)
            ours = line.split("CTERelationDef", 1)[1].split(",", 1)[0].strip()
            skip_deeper = depth
            continue
        if refusal is None and node not in _PER_BATCH_STEPS:
            refusal = f"a step that is no projection or filter of each row ({node})"
        if refusal is None and _SUBQUERY.search(line):
            refusal = "a subquery"
        references.extend(_REFERENCE.findall(line))
    # (a second read of the stream needs a union or a join: refused above)
    return refusal if ours in references else "reads no stream"


def join_condition(joined: Any, others: list | None = None) -> tuple[list[tuple[int, int]], list]:
    """The equality keys (left index, right index) of ``left.join(right, condition)``, read
    from the Connect plan of ``joined`` (see the classic ``join_condition``): a condition of
    equalities between a column of each side, each column named alone (``F.col("k")``) or
    through its side's DataFrame (``df["k"]``). ValueError names anything else (a join on
    column names, an expression of a column, a time comparison, a name both sides have), as
    the classic's does for a part it does not read; the caller then infers nothing from
    the condition. A stream-stream join's planning (``others`` given) needs more of the
    plan: refused over Connect, as before."""
    from pyspark.sql.connect import plan as P
    from pyspark.sql.connect.column import Column
    from pyspark.sql.connect.dataframe import DataFrame
    E = _expressions()
    if others is not None:   # (a stream-stream join's planning reads its other parts too)
        refuse("A join")
    node = joined._plan
    if not isinstance(node, P.Join) or not isinstance(node.on, Column):
        raise ValueError("the join has no condition over columns")
    session = joined._session
    sides = [{c.lower(): i for i, c in enumerate(DataFrame(child, session).columns)} for child in (node.left, node.right)]
    plan_ids = [_plan_ids(node.left), _plan_ids(node.right)]

    def side_and_index(expression: Any) -> tuple[int, int]:
        if not isinstance(expression, E.ColumnReference) or not re.match(r"^[A-Za-z_]\w*$",
                                                                          expression._unparsed_identifier):
            raise ValueError(f"the condition reads {expression}, not a column")
        name = expression._unparsed_identifier.lower()
        plan_id = getattr(expression, "_plan_id", None)
        found = [side for side in (0, 1) if name in sides[side]
                 and (plan_id is None or plan_id in plan_ids[side])]
        if len(found) != 1:
            raise ValueError(f"the column {expression} is not one side's alone")
        return found[0], sides[found[0]][name]

    pairs = []
    pending = [node.on._expr]
    while pending:
        expression = pending.pop(0)
        if isinstance(expression, E.UnresolvedFunction) and expression._name == "and" and len(expression._args) == 2:
            pending[:0] = list(expression._args)
            continue
        if not (isinstance(expression, E.UnresolvedFunction) and expression._name == "=="
                and len(expression._args) == 2):
            raise ValueError(f"the condition part {expression} is not an equality")
        (side_a, a), (side_b, b) = (side_and_index(e) for e in expression._args)
        if side_a == side_b:
            raise ValueError(f"the condition part {expression} compares one side's columns")
        pairs.append((a, b) if side_a == 0 else (b, a))
    return pairs, []


def _plan_ids(plan: Any) -> set:
    """The plan ids of ``plan`` and every plan below it (a column ``df["k"]`` names its
    DataFrame's plan id)."""
    from pyspark.sql.connect import plan as P
    found, pending = set(), [plan]
    while pending:
        node = pending.pop()
        found.add(getattr(node, "_plan_id", None))
        pending.extend(v for v in vars(node).values() if isinstance(v, P.LogicalPlan))
    found.discard(None)
    return found
