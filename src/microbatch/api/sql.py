"""``StreamingSession.sql``: SQL over streams (temporary views of streams, ``STREAM t``).

Spark's parser reads the text (``spark_internals.parse_sql``); the parsed plan is turned
into the DataFrame calls it stands for, on the streams' StreamFrames and on Spark's static
tables: ``SELECT ... FROM v WHERE ... GROUP BY ...`` is ``v.filter(...).groupBy(...).agg(...)``.
So SQL and the DataFrame API are one front end: each call applies to the stream's
template as it does from Python (Spark's analysis and errors, where the SQL is
defined), and the stream's plan gets the same stateful operators. A query that reads no
stream is Spark's own ``spark.sql``: a plain DataFrame.
"""
from __future__ import annotations

import copy
import itertools
import re
import uuid
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.sql_formatter import SQLStringFormatter

from microbatch import spark_internals
from microbatch.api.frame import StreamFrame
from microbatch.plan.logical import Apply
from microbatch.errors import UnsupportedOperationError


def not_yet(what: str, fix: str = "write that part with the DataFrame API") -> UnsupportedOperationError:
    return UnsupportedOperationError(f"{what} is not supported by microbatch's SQL over streams yet: {fix}.")


def streaming_sql(session: Any, query: str, args: Any = None, **kwargs: Any) -> Any:
    """PySpark's ``SparkSession.sql(sqlQuery, args=None, **kwargs)`` where the query may read
    streams: a StreamFrame when it does, Spark's DataFrame when it does not."""
    spark = session.spark
    if kwargs and not any(isinstance(v, StreamFrame) for v in kwargs.values()):
        return spark.sql(query, args, **kwargs)
    formatter = _StreamFormatter(session)
    try:
        if kwargs:    # (PySpark's formatting: {df} is a temporary view for the query's time)
            query = formatter.format(query, **kwargs)
        if not _may_read_stream(session, query):    # (no parse: most SQL on a session reads no stream)
            return spark.sql(query, args)
        if spark_internals.is_connect(spark):     # (the client has no parser)
            return _per_batch_sql(session, query, args)
        tree = spark_internals.parse_sql(spark, query)
        if not any(_reads_stream(session, r) for r in tree.relations()):
            return spark.sql(query, args)
        parameters = spark_internals.sql_parameters(args or {}, tree.positional_markers())
        result = _Translation(session, tree.qualifiers(), parameters).frame(tree, {})
        if not isinstance(result, StreamFrame):    # (a stream read only in a CTE no one uses)
            return spark.sql(query, args)
        return result
    finally:
        formatter.clear()


def _per_batch_sql(session: Any, query: str, args: Any) -> Any:
    """SQL over a stream's temporary view on a Spark Connect client, which has no SQL parser
    to translate it with: the stream's steps, then the SQL run by Spark on each batch, the
    view's name bound to the batch (a common table expression over the batch's DataFrame,
    which shadows tables and views of that name as the view does). Where the server's
    analysis of the SQL over the stream's template shows a step that keeps state across
    batches (an aggregation, DISTINCT, a join, a union, a limit, a sort, a subquery) or
    reads anything but the stream, it is refused, named: per batch it would give other
    rows than Spark's engine. A query whose text names the view only where it reads no
    relation (in a string) is Spark's own ``spark.sql``."""
    spark = session.spark
    names = _stream_views_named(session, query)
    if not names:      # (the word STREAM: STREAM t, which parse_sql refuses over Connect, named)
        return spark_internals.parse_sql(spark, query)
    if len(names) > 1:
        raise spark_internals.connect_refusal(
            f"SQL over more than one stream ({', '.join(sorted(names))}: a join or union of streams)")
    name = names[0]
    frame = session._stream_view(name)
    batch = f"_microbatch_batch_{uuid.uuid4().hex}"
    text = _with_view(query, name, batch)
    refusal = spark_internals.per_batch_sql_refusal(frame._template, text, args, batch)
    if refusal == "reads no stream":
        return spark.sql(query, args)
    if refusal is not None:
        raise spark_internals.connect_refusal(
            f"SQL over a stream with {refusal} (over Spark Connect microbatch runs SQL over a stream's view as "
            "stateless steps on each batch: SELECT with projections, WHERE and generators over the stream; "
            "write the rest with the DataFrame API)")

    def on_the_batch(df: DataFrame) -> DataFrame:
        return spark_internals.sql_over(df, text, args, batch)
    return StreamFrame(session, Apply(frame._plan, on_the_batch, f"SQL over the batch: {query}"),
                       spark_internals.sql_over(frame._template, text, args, batch))


def _stream_views_named(session: Any, query: str) -> list[str]:
    """The stream views (local: a Connect session's) whose names the text says as whole words."""
    text = query.lower()
    return [name for name in session._stream_views
            if re.search(rf"(?<![\w$.`]){re.escape(name)}(?![\w$`])", text) or f"`{name}`" in text]


def _with_view(query: str, name: str, batch: str) -> str:
    """``query`` with a common table expression ``name`` over the relation ``batch``, first
    in the query's own WITH clause where it has one."""
    definition = f"`{name.replace('`', '``')}` AS (SELECT * FROM {batch})"
    lead = re.match(r"(\s|--[^\n]*\n|/\*.*?\*/)*with\s", query, re.IGNORECASE | re.DOTALL)
    if lead is not None:
        return f"{query[:lead.end()]}{definition}, {query[lead.end():]}"
    return f"WITH {definition} {query}"


def _one_grouping_sets(grouping: list) -> tuple:
    """``GROUP BY a, ROLLUP(b, c), GROUPING SETS (...)``: the one GROUPING SETS clause it
    means, as Spark's analyser makes it: every combination of one set of each part (the
    columns are a part of one set), over the distinct expressions in order of appearance."""
    given: list = []

    def index(expression) -> int:
        for i, known in enumerate(given):
            if known.equals(expression):
                return i
        given.append(expression)
        return len(given) - 1

    choices: list[list[list[int]]] = []
    for part in grouping:
        if part[0] == "column":
            choices.append([[index(part[1])]])
        elif part[0] == "rollup":
            ids = [index(e) for e in part[1]]
            choices.append([ids[:n] for n in range(len(ids), -1, -1)])
        elif part[0] == "cube":
            ids = [index(e) for e in part[1]]
            choices.append([[ids[j] for j in range(len(ids)) if mask >> (len(ids) - 1 - j) & 1]
                            for mask in range(2 ** len(ids) - 1, -1, -1)])
        else:
            for expression in part[2]:
                index(expression)
            choices.append([[index(e) for e in one] for one in part[1]])
    sets = [[given[i] for i in dict.fromkeys(i for one in combination for i in one)]
            for combination in itertools.product(*choices)]
    return "groupingSets", sets, list(given)


class _StreamFormatter(SQLStringFormatter):
    """PySpark's formatter of ``sql(query, **kwargs)``, for StreamFrames too: a stream given
    as ``{name}`` is a temporary view of it, dropped once the query is made, as PySpark
    does with a DataFrame (the stream's frame keeps what it read)."""

    def __init__(self, session: Any):
        super().__init__(session.spark)
        self._streaming_session = session
        self._stream_views: list[tuple[Any, str]] = []

    def _convert_value(self, val: Any, field_name: str) -> Any:
        if not isinstance(val, StreamFrame):
            return super()._convert_value(val, field_name)
        for frame, name in self._stream_views:
            if frame is val:
                return name
        name = "_pyspark_%s" % uuid.uuid4().hex
        self._stream_views.append((val, name))
        val.createOrReplaceTempView(name)
        return name

    def clear(self) -> None:
        super().clear()
        for _, name in self._stream_views:
            self._streaming_session._stream_views.pop(name.lower(), None)
        self._stream_views = []


def _may_read_stream(session: Any, query: str) -> bool:
    """Whether the text names a view of a stream, or says STREAM (parsing it and walking the
    parsed plan costs calls into Spark per node and expression)."""
    text = query.lower()
    names = list(session._stream_views) + [n.rsplit(".", 1)[-1] for n in session._global_stream_views()]
    # (whole words: a table named test_streaming_x neither says STREAM nor names a view x)
    return any(re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", text) for name in ["stream", *names])


def _name(relation) -> str:
    return ".".join(relation.fields["name"])


def _reads_stream(session: Any, relation) -> bool:
    return relation.fields["streaming"] or session._stream_view(_name(relation)) is not None


def _as_view(frame: StreamFrame) -> StreamFrame:
    """The stream as SQL reads its temporary view: the same steps, over a template under
    Spark's ``View``, which hides the relation's hidden columns as Spark's SQL does (``SELECT
    _metadata.file_name FROM v`` is Spark's UNRESOLVED_COLUMN where the SQL is defined,
    unless the view selects ``_metadata``). The view's name qualifies its columns only
    through ``_qualified``, a step of the stream's plan too (``spark_internals.behind_a_view``)."""
    template = spark_internals.behind_a_view(frame._template)
    if template is frame._template:
        return frame
    viewed = copy.copy(frame)
    viewed._template = template
    return viewed


class _Translation:
    """A parsed query as the DataFrame calls it stands for."""

    def __init__(self, session: Any, qualifiers: set[str], parameters: dict):
        self.session = session
        self.qualifiers = qualifiers     # the relation names the query qualifies columns with
        self.parameters = parameters     # named parameter markers' literals (spark_internals.sql_parameters)

    def frame(self, node, scope: dict) -> Any:
        method = getattr(self, f"_{node.kind}", None)
        if method is None or node.kind == "unsupported":
            raise not_yet(f"SQL's {node.fields.get('name', node.kind)} over a stream")
        return method(node, scope)

    def _child(self, node, scope: dict) -> Any:
        return self.frame(node.children[0], scope)

    def _columns(self, below: Any, expressions: list) -> list:
        return [spark_internals.sql_column(e, parameters=self.parameters) for e in expressions]

    def _relation(self, node, scope: dict) -> Any:
        name = _name(node)
        if len(node.fields["name"]) == 1 and name.lower() in scope:
            return self._qualified(scope[name.lower()], name)
        view = self.session._stream_view(name)
        if view is not None:
            return self._qualified(_as_view(view), node.fields["name"][-1])
        if node.fields["streaming"]:
            return self._qualified(self.session.readStream.table(name), node.fields["name"][-1])
        return self.session.spark.table(name)   # Spark's TABLE_OR_VIEW_NOT_FOUND for an unknown one

    def _qualified(self, frame: Any, qualifier: str) -> Any:
        """Spark qualifies a relation's columns by its name: the frame aliased so, when the
        query uses the name (an alias is a step of the stream's plan; a filter moves below
        the watermark through it only when it resolves there)."""
        return frame.alias(qualifier) if qualifier.lower() in self.qualifiers else frame

    def _project(self, node, scope: dict) -> Any:
        below = self._child(node, scope)
        return below.select(*self._columns(below, node.fields["columns"]))

    def _filter(self, node, scope: dict) -> Any:
        below = self._child(node, scope)
        return below.filter(*self._columns(below, [node.fields["condition"]]))

    def _having(self, node, scope: dict) -> Any:
        """``GROUP BY ... HAVING c``: the filter right over the aggregation, before its keys
        are dropped from PySpark's ``agg`` result, so that Spark's analysis resolves an
        aggregate function in ``c`` to the aggregation's output, or adds it there as a
        hidden column (ResolveAggregateFunctions), as for SQL's UnresolvedHaving."""
        child = node.children[0]
        if child.kind == "aggregate":
            return self._aggregate(child, scope, having=node.fields["condition"])
        return self._filter(node, scope)

    def _alias(self, node, scope: dict) -> Any:
        return self._qualified(self._child(node, scope), node.fields["name"])

    def _aggregate(self, node, scope: dict, having: Any = None) -> Any:
        """``GROUP BY g...`` with the select list ``e...``: ``groupBy(g...).agg(e...)`` (Spark's
        analysis keeps the grouping expressions among ``e`` as SQL does), filtered by the
        ``having`` condition if any, without the grouping columns PySpark's ``agg`` puts first."""
        frame = self._child(node, scope)

        def converted(g: tuple) -> tuple:
            if g[0] == "column":
                return "column", self._columns(frame, [g[1]])[0]
            if g[0] in ("cube", "rollup"):
                return g[0], self._columns(frame, g[1])
            return g[0], [self._columns(frame, part) for part in g[1]], self._columns(frame, g[2])
        parsed = node.fields["grouping"]
        if any(g[0] != "column" for g in parsed):
            one = parsed[0] if len(parsed) == 1 else _one_grouping_sets(parsed)
            return self._grouping_sets(frame, one, node.fields["columns"], converted(one), having)
        keys = [self._columns(frame, [g[1]])[0] for g in parsed]
        columns = self._columns(frame, node.fields["columns"])
        aggregated = frame.groupBy(*keys).agg(*columns)
        if having is not None:
            aggregated = aggregated.filter(*self._columns(aggregated, [having]))
        return self._without_keys(aggregated, len(keys))

    def _grouping_sets(self, frame: Any, parsed: tuple, select: list, converted: tuple, having: Any = None) -> Any:
        """ROLLUP, CUBE, GROUPING SETS: the aggregate expressions go to ``agg``; a select-list
        item that is a grouping expression is the key column PySpark's ``agg`` puts first.
        A ``having`` condition filters ``agg``'s result (``_having``)."""
        kind, *rest = converted
        grouping_exprs = parsed[1] if kind != "groupingSets" else parsed[2]
        keys = rest[0] if kind != "groupingSets" else rest[1]
        grouped = frame.groupingSets(rest[0], *keys) if kind == "groupingSets" else getattr(frame, kind)(*keys)
        items, aggregates = [], []
        for expression in select:
            found = spark_internals.grouping_position(expression, grouping_exprs)
            if found is None:
                items.append((None, len(aggregates)))
                aggregates.append(self._columns(frame, [expression])[0])
            else:
                items.append(found)
        aggregated = grouped.agg(*aggregates)
        late_having = None
        if having is not None:
            try:
                aggregated = aggregated.filter(*self._columns(aggregated, [having]))
            except AnalysisException:   # (a select-list alias of a key: over the select list)
                late_having = having
        names = aggregated.columns
        placeholders = [f"__microbatch_sql_{i}" for i in range(len(names))]
        out = []
        for key, where in items:
            if isinstance(key, int):   # (a key: its index, and the alias it is given)
                out.append(F.col(placeholders[key]).alias(where or names[key]))
            else:
                out.append(F.col(placeholders[len(keys) + where]).alias(names[len(keys) + where]))
        selected = aggregated.toDF(*placeholders).select(*out)
        return selected if late_having is None else selected.filter(*self._columns(selected, [late_having]))

    @staticmethod
    def _without_keys(aggregated: Any, count: int) -> Any:
        if count == 0:
            return aggregated
        names = aggregated.columns
        placeholders = [f"__microbatch_sql_{i}" for i in range(len(names))]
        return aggregated.toDF(*placeholders).select(
            *[F.col(placeholders[i]).alias(names[i]) for i in range(count, len(names))])

    def _join(self, node, scope: dict) -> Any:
        left, right = self.frame(node.children[0], scope), self.frame(node.children[1], scope)
        on = node.fields["using"] if node.fields["using"] is not None else (
            None if node.fields["condition"] is None
            else spark_internals.sql_column(node.fields["condition"], parameters=self.parameters))
        if isinstance(left, DataFrame) and isinstance(right, StreamFrame):
            return right._joined_by_static(left, on, node.fields["how"])
        return left.join(right, on, node.fields["how"])

    def _union(self, node, scope: dict) -> Any:
        frames = [self.frame(child, scope) for child in node.children]
        result = frames[0]
        for other in frames[1:]:
            if node.fields["by_name"]:
                result = result.unionByName(other, allowMissingColumns=node.fields["allow_missing"])
            else:
                result = result.union(other)
        return result

    def _distinct(self, node, scope: dict) -> Any:
        """SQL's DISTINCT is an aggregation on Spark's engine (its optimizer makes it one: a
        row is emitted in append mode when the watermark passes it), not a deduplication."""
        frame = self._child(node, scope)
        if isinstance(frame, DataFrame):
            return frame.distinct()
        counted = frame.groupBy(*[F.col(f"`{c}`") for c in frame.columns]).agg(
            F.count(F.lit(1)).alias("__microbatch_sql_rows"))
        return counted.select(*[F.col(f"`{c}`") for c in frame.columns])

    def _generate(self, node, scope: dict) -> Any:
        """``LATERAL VIEW f(args) AS names``: the child's columns and the generator's."""
        below = self._child(node, scope)
        call = self._columns(below, [node.fields["call"]])[0]
        names = node.fields["names"]
        return below.select("*", call.alias(*names) if names else call)

    def _limit(self, node, scope: dict) -> Any:
        return self._child(node, scope).limit(spark_internals.sql_int(node.fields["n"], self.parameters, "limit"))

    def _sort(self, node, scope: dict) -> Any:
        below = self._child(node, scope)
        return below.orderBy(*self._columns(below, node.fields["columns"]))

    def _with(self, node, scope: dict) -> Any:
        inner = dict(scope)
        for name, cte in node.fields["ctes"]:
            inner[name.lower()] = self.frame(cte, inner)
        return self._child(node, inner)

    def _watermark(self, node, scope: dict) -> Any:
        column = spark_internals.column_sql(spark_internals.sql_column(node.fields["column"])).lstrip("'").strip("`")
        return self._child(node, scope).withWatermark(column, node.fields["delay"])
