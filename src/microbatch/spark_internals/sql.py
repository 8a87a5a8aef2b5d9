"""SQL text parsed by Spark's own parser, handed back as a tree of plain Python nodes whose
expressions are Spark's parsed expressions, opaque here; ``sql_column`` makes each a
PySpark Column (unresolved: it means what it means in the SQL, and Spark's analysis
resolves it where the engine applies it).

``StreamingSession.sql`` (``api/sql.py``) turns the tree into the stream's DataFrame calls;
nothing here knows streams. A node of the parsed plan this does not name is handed back
as ``SqlNode("unsupported", ...)`` with Spark's name for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from microbatch.spark_internals.jvm import jvm_class
from microbatch.spark_internals.versions import column_of_expression


@dataclass
class SqlNode:
    """One node of a parsed SQL query: ``kind`` (relation, project, filter, aggregate,
    having, alias, join, union, distinct, limit, sort, with, watermark, generate,
    unsupported), its
    children, and what the kind needs (``fields``)."""

    kind: str
    children: list["SqlNode"] = field(default_factory=list)
    fields: dict = field(default_factory=dict)

    def qualifiers(self) -> set[str]:
        """The (lower-case) relation names the query's columns are qualified with
        (``e.id``, ``e.*``)."""
        found = set(self.fields.get("qualifiers", ()))
        for child in self.children:
            found |= child.qualifiers()
        for _, cte in self.fields.get("ctes", ()):
            found |= cte.qualifiers()
        return found

    def positional_markers(self) -> set[int]:
        """Where the query's positional parameter markers (``?``) are in its text."""
        found = set(self.fields.get("markers", ()))
        for child in self.children:
            found |= child.positional_markers()
        for _, cte in self.fields.get("ctes", ()):
            found |= cte.positional_markers()
        return found

    def relations(self) -> list["SqlNode"]:
        """Every relation the query reads (CTEs' included)."""
        found = [self] if self.kind == "relation" else []
        for child in self.children:
            found += child.relations()
        for _, cte in self.fields.get("ctes", ()):
            found += cte.relations()
        return found


def _seq(scala_seq: Any) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _qualifiers(expression: Any, found: set, markers: set) -> None:
    """The qualifiers ``expression``'s columns name (into ``found``), and the positions of
    its positional parameter markers (into ``markers``)."""
    kind = expression.getClass().getSimpleName()
    if kind == "UnresolvedAttribute" and expression.nameParts().size() > 1:
        found.add(str(expression.nameParts().apply(0)).lower())
    elif kind == "UnresolvedStar" and expression.target().isDefined() and expression.target().get().size() > 0:
        found.add(str(expression.target().get().apply(0)).lower())
    elif kind == "PosParameter":
        markers.add(int(expression.pos()))
    for child in _seq(expression.children()):
        _qualifiers(child, found, markers)


def parse_sql(spark: Any, text: str) -> SqlNode:
    """``text`` parsed by the session's SQL parser (Spark's ``ParseException`` for bad SQL)."""
    from pyspark.errors.exceptions.captured import convert_exception
    from py4j.protocol import Py4JJavaError
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(text)
    except Py4JJavaError as e:
        raise convert_exception(e.java_exception) from None
    return _node(plan)


def sql_parameters(args: Any, markers: set[int] = frozenset()) -> dict:
    """PySpark's ``args``, each value as PySpark's ``sql`` takes it (a Python value or a
    Column) as Spark's literal expression: a dict names the markers (``:name``); a list
    gives the positional ones (``?``, at ``markers`` in the text) in their order, as
    Spark's BindParameters pairs them (keys: the markers' positions)."""
    from pyspark.sql import Column, SparkSession
    from pyspark.sql import functions as F
    session = SparkSession.active()._jsparkSession

    def literal(value):   # (the session's converter: a Literal, as PySpark's formatter gets it)
        return session.expression((value if isinstance(value, Column) else F.lit(value))._jc)
    if isinstance(args, dict):
        return {name: literal(value) for name, value in args.items()}
    values = list(args)
    return {position: literal(values[i]) for i, position in enumerate(sorted(markers)) if i < len(values)}


def sql_int(expression: Any, parameters: dict, clause: str) -> int:
    """A LIMIT's (or OFFSET's) expression, its parameter markers bound, as Spark evaluates
    it; Spark's INVALID_LIMIT_LIKE_EXPRESSION errors when it cannot be."""
    from microbatch.spark_internals.errors import spark_error
    expression = _rewritten(expression, parameters)
    if not expression.foldable():
        raise spark_error("AnalysisException", "INVALID_LIMIT_LIKE_EXPRESSION.IS_UNFOLDABLE",
                          name=clause, expr=f"\"{expression.sql()}\"")
    value = expression.eval(None)
    if value is None:
        raise spark_error("AnalysisException", "INVALID_LIMIT_LIKE_EXPRESSION.IS_NULL",
                          name=clause, expr=f"\"{expression.sql()}\"")
    if int(value) < 0:
        raise spark_error("AnalysisException", "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE",
                          name=clause, expr=f"\"{expression.sql()}\"", v=str(value))
    return int(value)


def _node(plan: Any) -> SqlNode:
    node = _plain_node(plan)
    found: set = set()
    markers: set = set()
    for expression in _seq(plan.expressions()):
        _qualifiers(expression, found, markers)
    node.fields["qualifiers"] = found
    node.fields["markers"] = markers
    return node


def _plain_node(plan: Any) -> SqlNode:  # noqa: C901 - one case per kind of Spark's parsed plan
    name = plan.getClass().getSimpleName()
    children = _seq(plan.children())
    if name == "UnresolvedRelation":
        return SqlNode("relation", fields={"name": list(_seq(plan.multipartIdentifier())),
                                           "streaming": bool(plan.isStreaming())})
    if name == "NamedStreamingRelation" and len(children) == 1:    # STREAM t / STREAM(t)
        inner = _node(children[0])
        if inner.kind == "relation":
            inner.fields["streaming"] = True
        return inner
    if name == "Project":
        return SqlNode("project", [_node(plan.child())], {"columns": _seq(plan.projectList())})
    if name == "Filter":
        return SqlNode("filter", [_node(plan.child())], {"condition": plan.condition()})
    if name == "UnresolvedHaving":
        return SqlNode("having", [_node(plan.child())], {"condition": plan.havingCondition()})
    if name == "Aggregate":
        grouping = []
        for e in _seq(plan.groupingExpressions()):
            kind = e.getClass().getSimpleName()
            if kind in ("Cube", "Rollup"):
                grouping.append((kind.lower(), _seq(e.children())))
            elif kind == "GroupingSets":
                sets = [_seq(s) for s in _seq(e.groupingSets())]
                given = []
                for c in _seq(e.userGivenGroupByExprs()) or _seq(e.children()):   # (every set's columns, once)
                    if not any(c.equals(g) for g in given):
                        given.append(c)
                grouping.append(("groupingSets", sets, given))
            else:
                grouping.append(("column", e))
        return SqlNode("aggregate", [_node(plan.child())],
                       {"grouping": grouping, "columns": _seq(plan.aggregateExpressions())})
    if name == "SubqueryAlias":
        return SqlNode("alias", [_node(plan.child())], {"name": plan.alias()})
    if name == "Join":
        join_type = plan.joinType()
        using = None
        if join_type.getClass().getSimpleName() == "UsingJoin":
            using = list(_seq(join_type.usingColumns()))
            join_type = join_type.tpe()
        condition = plan.condition()
        return SqlNode("join", [_node(plan.left()), _node(plan.right())], {
            "how": join_type.sql().lower().replace(" ", "_"), "using": using,
            "condition": condition.get() if condition.isDefined() else None})
    if name == "Union":
        return SqlNode("union", [_node(c) for c in children],
                       {"by_name": bool(plan.byName()), "allow_missing": bool(plan.allowMissingCol())})
    if name == "Generate" and plan.generator().getClass().getSimpleName() == "UnresolvedGenerator":
        # LATERAL VIEW [OUTER] f(args) [t] AS names: f's call among the child's columns
        generator = plan.generator()
        function = generator.name().funcName() + ("_outer" if plan.outer() else "")
        call = jvm_class("org.apache.spark.sql.catalyst.analysis.UnresolvedFunction$").apply(
            function, generator.children(), False)
        return SqlNode("generate", [_node(plan.child())], {
            "call": call, "names": [str(a.name()) for a in _seq(plan.generatorOutput())]})
    if name == "Distinct":
        return SqlNode("distinct", [_node(plan.child())])
    if name == "GlobalLimit":
        child = plan.child()
        if child.getClass().getSimpleName() == "LocalLimit":
            child = child.child()
        return SqlNode("limit", [_node(child)], {"n": plan.limitExpr()})
    if name == "Sort":
        return SqlNode("sort", [_node(plan.child())], {"columns": _seq(plan.order())})
    if name == "UnresolvedWith":
        ctes = [(pair._1(), _node(pair._2())) for pair in _seq(plan.cteRelations())]
        return SqlNode("with", [_node(plan.child())], {"ctes": ctes})
    if name == "UnresolvedEventTimeWatermark":
        delay = plan.delay()
        return SqlNode("watermark", [_node(plan.child())], {
            "column": plan.eventTimeColExpr(),
            "delay": delay.toString()})
    return SqlNode("unsupported", [_node(c) for c in children], {"name": plan.nodeName()})


def sql_column(expression: Any, parameters: dict | None = None) -> Any:
    """The PySpark Column of a parsed expression (a ``SqlNode``'s), its parameter markers
    replaced by ``parameters``' literals (``sql_parameters``)."""
    if parameters:
        expression = _rewritten(expression, parameters)
    return column_of_expression(expression)


def _rewritten(expression: Any, parameters: dict) -> Any:
    kind = expression.getClass().getSimpleName()
    if kind == "NamedParameter" and expression.name() in parameters:
        return parameters[expression.name()]
    if kind == "PosParameter" and int(expression.pos()) in parameters:
        return parameters[int(expression.pos())]
    children = _seq(expression.children())
    if not children:
        return expression
    return expression.withNewChildren(jvm_class("org.apache.spark.api.python.PythonUtils").toSeq(
        [_rewritten(c, parameters) for c in children]))


def grouping_position(expression: Any, grouping: list) -> tuple[int, str | None] | None:
    """Where a select-list expression is one of the GROUP BY expressions (itself, or under
    an alias): (its index in ``grouping``, the alias or None); None when it is not one."""
    alias = None
    kind = expression.getClass().getSimpleName()
    if kind == "Alias":
        alias, expression = expression.name(), expression.child()
    elif kind == "UnresolvedAlias":
        expression = expression.child()
    for index, candidate in enumerate(grouping):
        if expression.equals(candidate):
            return index, alias
    return None


def behind_a_view(df: Any) -> Any:
    """``df`` as Spark's SQL reads a temporary view of it (``df.createOrReplaceTempView(name)``
    then ``FROM name``): under Spark's ``View`` node, whose ``metadataOutput`` is empty, so
    the relation's hidden columns (a file source's ``_metadata``) do not resolve above it.
    ``df`` itself when it has no hidden columns. The ``View`` is made by Spark's catalog, as
    a temporary view of a name of its own, dropped at once. Not qualified by the view's
    name (Spark's SubqueryAlias over the View is dropped): a stream's template must say no
    more than the steps its plan replays over each batch, and an alias in the template
    alone has Spark's analysis qualify the columns it resolves (``sum(v)`` of an
    aggregation becomes ``sum(events.v)``), which the batch's plan, without the alias,
    cannot resolve. The SQL translation aliases the frame itself, as a step, where the
    query qualifies columns by the name (``api/sql.py``, ``_qualified``)."""
    import uuid
    from microbatch.spark_internals.versions import dataframe_of_plan
    spark = df.sparkSession
    plan = df._jdf.queryExecution().analyzed()
    if not plan.metadataOutput().nonEmpty():
        return df
    temporary = f"microbatch_view_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(temporary)
    try:
        viewed = spark.table(temporary)._jdf.queryExecution().analyzed()
    finally:
        spark.catalog.dropTempView(temporary)
    while viewed.getClass().getSimpleName() == "SubqueryAlias":
        viewed = viewed.child()
    return dataframe_of_plan(spark, viewed)
