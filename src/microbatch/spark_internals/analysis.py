"""Spark's analysis of DataFrames the engine plans with: schemas, conditions, filters,
projections and groupings read from analysed plans."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from microbatch.spark_internals.jvm import _jvm, jvm_class
from microbatch.spark_internals.versions import (column_of_expression, dataframe_of_plan, expression_of_column,
                                                running_version)


def schema_string(schema: StructType) -> str:
    """A schema as Spark's messages print it (Scala's ``StructType.toString``:
    ``StructType(StructField(id,IntegerType,true),...)``)."""
    return jvm_class("org.apache.spark.sql.types.DataType").fromJson(schema.json()).toString()


def parse_schema_ddl(ddl: str) -> StructType:
    """A DDL schema string parsed by Spark (``StructType.fromDDL``); a bad one raises
    Spark's ``ParseException``, as ``readStream.schema(ddl)`` does in PySpark."""
    jschema = _jvm().org.apache.spark.sql.types.StructType.fromDDL(ddl)
    return StructType.fromJson(json.loads(jschema.json()))


def processing_time_ms(interval: str) -> int:
    """``Trigger.ProcessingTime(interval)`` as Spark parses it (``"5 seconds"``,
    ``"interval 1 minute"``, ...): its error for an interval it refuses."""
    return int(_jvm().org.apache.spark.sql.streaming.Trigger.ProcessingTime(interval).intervalMs())


# -- a stream-stream join's condition, from Spark's analyzed plan ------------------------
@dataclass(frozen=True)
class TimeTerm:
    """One side of a time comparison: ``side``'s column ``index`` (None: no column) plus
    ``offset_us`` microseconds (interval literals)."""

    side: int | None
    index: int | None
    offset_us: int


def join_condition(joined: Any, others: list | None = None) -> tuple[list[tuple[int, int]], list[tuple[str, TimeTerm, TimeTerm]]]:  # noqa: C901 - one walk of the condition; its helpers share the sides
    """The equality keys (left index, right index) and the time comparisons
    (op, lhs, rhs) of ``left.join(right, condition)``, read from Spark's analyzed ``Join``;
    ValueError naming the part of the condition that is neither, unless ``others`` is
    given: such parts are then appended to it (Spark's expressions, for
    ``join_condition_parts``)."""
    plan = joined._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "Join" or plan.condition().isEmpty():
        raise ValueError("the join has no condition")
    sides = []
    for child in (plan.left(), plan.right()):
        output = child.output()
        sides.append({output.apply(i).exprId().id(): i for i in range(output.size())})

    def attribute(e: Any) -> tuple[int, int] | None:
        if e.getClass().getSimpleName() != "AttributeReference":
            return None
        for side, ids in enumerate(sides):
            if e.exprId().id() in ids:
                return side, ids[e.exprId().id()]
        return None

    def term(e: Any) -> TimeTerm:
        name = e.getClass().getSimpleName()
        if name == "Cast":
            return term(e.child())
        if name == "DatetimeSub":
            return term(e.replacement())
        if name in ("TimestampAddInterval", "TimeAdd", "DatetimeAdd"):
            base, interval = term(e.children().apply(0)), term(e.children().apply(1))
            if interval.side is not None:
                raise ValueError(f"an interval that is a column ({e.toString()})")
            return TimeTerm(base.side, base.index, base.offset_us + interval.offset_us)
        if name == "UnaryMinus":
            inner = term(e.child())
            if inner.side is not None:
                raise ValueError(f"a negated time column ({e.toString()})")
            return TimeTerm(None, None, -inner.offset_us)
        if name == "Literal" and e.dataType().typeName().startswith("interval"):
            value = e.value()
            if e.dataType().getClass().getSimpleName().startswith("CalendarInterval"):
                if value.months != 0:
                    raise ValueError(f"an interval in months or years ({e.toString()})")
                return TimeTerm(None, None, value.days * 86_400_000_000 + value.microseconds)
            return TimeTerm(None, None, int(value))
        found = attribute(e)
        if found is not None and e.dataType().typeName() in ("timestamp", "timestamp_ntz"):
            return TimeTerm(found[0], found[1], 0)
        raise ValueError(f"'{e.toString()}'")

    keys: list[tuple[int, int]] = []
    comparisons: list[tuple[str, TimeTerm, TimeTerm]] = []
    operators = {"LessThan": "<", "LessThanOrEqual": "<=", "GreaterThan": ">", "GreaterThanOrEqual": ">="}

    def split(e: Any) -> None:
        name = e.getClass().getSimpleName()
        if name == "And":
            split(e.left())
            split(e.right())
            return
        if name == "Between":   # input BETWEEN lower AND upper: input >= lower AND input <= upper
            value, lower, upper = term(e.input()), term(e.lower()), term(e.upper())
            if value.side is not None and {lower.side, upper.side} == {1 - value.side}:
                comparisons.extend([(">=", value, lower), ("<=", value, upper)])
                return
        if name == "EqualTo":
            a, b = attribute(e.left()), attribute(e.right())
            if a and b and a[0] != b[0]:
                keys.append((a[1], b[1]) if a[0] == 0 else (b[1], a[1]))
                return
        if name in operators:
            lhs, rhs = term(e.left()), term(e.right())
            if lhs.side is not None and rhs.side is not None and lhs.side != rhs.side:
                comparisons.append((operators[name], lhs, rhs))
                return
        raise ValueError(f"'{e.toString()}'")

    def part(e: Any) -> None:
        if others is None:
            split(e)
            return
        try:
            split(e)
        except ValueError:
            others.append(e)

    for conjunct in _conjuncts(plan.condition().get()):
        part(conjunct)
    return keys, comparisons


def filter_can_skip_column(filtered: Any, column: str) -> bool:
    """Whether ``filtered`` (a DataFrame whose last step is a filter) filters on a
    deterministic condition that does not refer to the top-level ``column``: what Spark's
    optimizer needs to push such a filter below a watermark on ``column``."""
    analyzed = filtered._jdf.queryExecution().analyzed()
    if analyzed.getClass().getSimpleName() != "Filter":
        return False
    condition = analyzed.condition()
    if not condition.deterministic():
        return False
    output = analyzed.child().output()
    for i in range(output.size()):
        attribute = output.apply(i)
        if attribute.name().lower() == column.lower():
            return not condition.references().contains(attribute)
    return False   # a nested event time: keep the filter after the watermark


def filter_passes_projection(filtered: Any) -> bool:
    """Whether ``filtered`` (a DataFrame whose last step is a filter over a projection)
    can filter before the projection unchanged, as Spark's optimizer pushes it: the
    condition and the projection deterministic, and every column the condition uses
    passed through the projection as it was (not computed, not renamed)."""
    analyzed = filtered._jdf.queryExecution().analyzed()
    if analyzed.getClass().getSimpleName() != "Filter" or not analyzed.condition().deterministic():
        return False
    project = analyzed.child()
    if project.getClass().getSimpleName() != "Project":
        return False
    below = project.child()
    while below.getClass().getSimpleName() == "Generate":   # (select(*, explode(...)): its rows are new)
        below = below.child()
    below_ids = {below.output().apply(i).exprId().id() for i in range(below.output().size())}
    entries = project.projectList()
    passed = set()
    for i in range(entries.size()):
        entry = entries.apply(i)
        if not entry.deterministic():
            return False
        if entry.getClass().getSimpleName() == "AttributeReference":
            passed.add(entry.exprId().id())
    used = analyzed.condition().references().toSeq()
    return all(used.apply(i).exprId().id() in passed and used.apply(i).exprId().id() in below_ids
               for i in range(used.size()))


def filter_passes_filter(filtered: Any) -> bool:
    """Whether ``filtered`` (a DataFrame whose last step is a filter over another filter)
    can filter before that other filter, as Spark's optimizer combines the two (the lower
    condition deterministic: CombineFilters) and pushes the parts of the result on its
    own; the condition that moves must be deterministic too."""
    analyzed = filtered._jdf.queryExecution().analyzed()
    if analyzed.getClass().getSimpleName() != "Filter" or not analyzed.condition().deterministic():
        return False
    lower = analyzed.child()
    return lower.getClass().getSimpleName() == "Filter" and lower.condition().deterministic()


def projections_keep_column(projected: Any, below: Any, column: str) -> bool:
    """Whether ``projected`` is ``below`` under projections (and aliases) only, so that
    each of its rows is one of ``below``'s, and keeps ``below``'s ``column`` as it is (the
    same attribute, under the same name)."""
    base = analyzed_plan(below)
    base_output = base.output()
    wanted = column.lower()
    attribute = next((base_output.apply(i) for i in range(base_output.size())
                      if base_output.apply(i).name().lower() == wanted), None)
    plan = analyzed_plan(projected)
    output = plan.output()
    if attribute is None or not any(output.apply(i).name().lower() == wanted
                                    and output.apply(i).exprId().equals(attribute.exprId())
                                    for i in range(output.size())):
        return False
    while not plan.equals(base):
        if plan.getClass().getSimpleName() not in ("Project", "SubqueryAlias"):
            return False
        plan = plan.child()
    return True


def analyzed_plan(df: Any) -> Any:
    """``df``'s analysed logical plan (a JVM ``LogicalPlan``)."""
    return df._jdf.queryExecution().analyzed()


def grouping_columns(grouped: Any) -> list[str | None]:
    """What a PySpark ``GroupedData`` groups by, key by key: a top-level column's name
    (``df.groupBy("id")``, ``df.groupBy(df["id"])``), or None for anything else (an
    expression, a nested field)."""
    expressions = grouped._jgd.groupingExprs()
    names: list[str | None] = []
    for i in range(expressions.size()):
        expression = expressions.apply(i)
        kind = expression.getClass().getSimpleName()
        if kind == "AttributeReference" or (kind == "UnresolvedAttribute" and expression.nameParts().size() == 1):
            names.append(expression.name())
        else:
            names.append(None)
    return names


def grouping_column_names(grouped: Any) -> list[str]:
    """The column names a PySpark ``GroupedData`` groups by (``df.groupBy("id")``); a
    ValueError if it groups by something else than columns."""
    names = grouping_columns(grouped)
    if None in names:
        expressions = grouped._jgd.groupingExprs()
        raise ValueError("The initial state must be grouped by columns, not by "
                         f"{expressions.apply(names.index(None)).sql()}")
    return names  # type: ignore[return-value]


def _conjuncts(condition: Any) -> list:
    """The parts of a condition's top-level ANDs, in order."""
    if condition.getClass().getSimpleName() == "And":
        return _conjuncts(condition.left()) + _conjuncts(condition.right())
    return [condition]


def conjuncts_without_column(filtered: Any, column: str) -> tuple[list[str], list[str]] | None:
    """The conjuncts of the filter that is ``filtered``'s last step, as SQL text, split as
    Spark's optimizer splits a filter above a watermark on ``column``: those it pushes below
    (deterministic, not using the column) and those that stay. None when the last step is
    not a filter or ``column`` is not a top-level column of its input."""
    analyzed = analyzed_plan(filtered)
    if analyzed.getClass().getSimpleName() != "Filter":
        return None
    output = analyzed.child().output()
    target = next((output.apply(i) for i in range(output.size())
                   if output.apply(i).name().lower() == column.lower()), None)
    if target is None:
        return None
    parts = _conjuncts(analyzed.condition())
    pushed, kept = [], []
    for part in parts:
        movable = part.deterministic() and not part.references().contains(target)
        (pushed if movable else kept).append(part.sql())
    return pushed, kept


def _unqualified(jexpr: Any) -> Any:
    """The expression with its columns' qualifiers dropped (``e.id`` as ``id``)."""
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    kind = jexpr.getClass().getSimpleName()
    if kind == "AttributeReference":
        return jexpr.withQualifier(to_seq([])) if jexpr.qualifier().nonEmpty() else jexpr
    children = jexpr.children()
    children = [children.apply(i) for i in range(children.size())]
    references = jexpr.references().toSeq()
    if not children or not any(references.apply(i).getClass().getSimpleName() == "AttributeReference"
                                and references.apply(i).qualifier().nonEmpty() for i in range(references.size())):
        return jexpr
    return jexpr.withNewChildren(to_seq([_unqualified(c) for c in children]))


def conjunct_sides(filtered: Any, left_width: int) -> list[tuple[str, int | None]] | None:
    """The conjuncts of the filter that is ``filtered``'s last step, over a join whose first
    ``left_width`` columns are its left side's and the rest its right's: each as SQL text
    with the side it reads only (0, 1), or None when it reads both, none, or is not
    deterministic (Spark's PushPredicateThroughJoin moves the others into their side).
    None when the last step is not a filter."""
    analyzed = analyzed_plan(filtered)
    if analyzed.getClass().getSimpleName() != "Filter":
        return None
    output = analyzed.child().output()
    side_of = {output.apply(i).exprId().id(): int(i >= left_width) for i in range(output.size())}
    parts = _conjuncts(analyzed.condition())
    found = []
    for part in parts:
        references = part.references().toSeq()
        sides = {side_of.get(references.apply(i).exprId().id()) for i in range(references.size())}
        side = sides.pop() if part.deterministic() and len(sides) == 1 and None not in sides else None
        # (a part moved to a side is read there without its qualifier, so it can move on
        # below the side's alias and watermark, as Spark's optimizer moves it)
        found.append((_unqualified(part).sql() if side is not None else part.sql(), side))
    return found


def semi_join_branches(joined: Any) -> int:
    """How many joins Spark's optimizer makes of the left semi or anti join that is
    ``joined``'s last step: one per input of a union on its left side (through the
    projections and filters above the union, which move into its inputs first) when it
    pushes the join through the union (PushDownLeftSemiAntiJoin: the join's condition must
    not read the other side's attributes in the union's inputs, the steps between must be
    deterministic); else 1."""
    node = joined._jdf.queryExecution().optimizedPlan()

    def under_rows_steps(plan: Any) -> Any:
        while plan.getClass().getSimpleName() in ("Project", "Filter"):
            plan = plan.child()
        return plan

    node = under_rows_steps(node)
    if node.getClass().getSimpleName() != "Union":
        return 1
    inputs = _scala_list(node.children())
    joins = [under_rows_steps(i) for i in inputs]
    if all(j.getClass().getSimpleName() == "Join" and j.joinType().toString() in ("LeftSemi", "LeftAnti")
           for j in joins):
        return len(inputs)
    return 1


def semi_join_pushed_into_join(joined: Any) -> int | None:
    """Into which side of a join Spark's optimizer moves the left semi join that is
    ``joined``'s last step, where its left side is that join under deterministic
    projections and filters (PushDownLeftSemiAntiJoin through them, then
    PushLeftSemiLeftAntiThroughJoin: the condition reads that side's columns only, and
    the join is inner, or left (right) outer for its left (right) side): 0 its left side,
    1 its right side; None where the semi join stays above it. Found by counting the left
    semi joins in each side of the optimized plan's top join against the analysed one's."""
    def under(plan: Any, kinds: tuple[str, ...]) -> Any:
        while plan.getClass().getSimpleName() in kinds:
            plan = plan.child()
        return plan

    def semi_joins(plan: Any) -> int:
        own = int(plan.getClass().getSimpleName() == "Join" and plan.joinType().toString() == "LeftSemi")
        return own + sum(semi_joins(child) for child in _scala_list(plan.children()))

    rows_steps = ("Project", "Filter", "SubqueryAlias")
    analyzed = under(joined._jdf.queryExecution().analyzed(), rows_steps)
    if analyzed.getClass().getSimpleName() != "Join" or analyzed.joinType().toString() != "LeftSemi":
        return None
    lower = under(analyzed.left(), rows_steps)
    if lower.getClass().getSimpleName() != "Join" or lower.joinType().toString() in ("LeftSemi", "LeftAnti"):
        return None
    top = under(joined._jdf.queryExecution().optimizedPlan(), rows_steps)
    if top.getClass().getSimpleName() != "Join" or top.joinType().toString() in ("LeftSemi", "LeftAnti"):
        return None
    before = (semi_joins(lower.left()), semi_joins(lower.right()))
    after = (semi_joins(top.left()), semi_joins(top.right()))
    moved = [side for side in (0, 1) if after[side] > before[side]]
    return moved[0] if len(moved) == 1 else None


def pushed_semi_join_condition(joined: Any) -> str | None:
    """The condition of the left semi join that is ``joined``'s last step as Spark's
    optimizer left it once moved into a side of the join below
    (``semi_join_pushed_into_join``), as SQL text over that side's output columns: the
    steps between read back (a renamed column by its name in the side, a computed one as
    its expression), and where the optimizer moved the semi join further down, into the
    side's own projections, its columns named again as the side's output names them.
    None without a condition."""
    from py4j.java_collections import MapConverter

    def under(plan: Any) -> Any:
        while plan.getClass().getSimpleName() in ("Project", "Filter"):
            plan = plan.child()
        return plan

    def ids(plan: Any) -> set[int]:
        return {a.exprId().id() for a in _scala_list(plan.output())}

    written = joined._jdf.queryExecution().analyzed()
    while written.getClass().getSimpleName() in ("Project", "Filter", "SubqueryAlias"):
        written = written.child()
    others = ids(written.right())    # (the columns of the stream the semi join reads)
    top = under(joined._jdf.queryExecution().optimizedPlan())
    path, pending = [], [(top, [])]
    while pending:   # (the steps from the top join down to the moved semi join)
        node, above = pending.pop()
        if node.getClass().getSimpleName() == "Join" and node.joinType().toString() == "LeftSemi" \
                and ids(node.right()) & others:
            path = above
            break
        pending.extend((child, above + [node]) for child in _scala_list(node.children()))
    else:
        return None
    if not node.condition().isDefined():
        return None
    renamed = {}   # an attribute of the semi join's left side -> the one the side's output has
    for step in reversed(path):
        if step.getClass().getSimpleName() != "Project":
            continue
        for item in _scala_list(step.projectList()):
            if item.getClass().getSimpleName() == "Alias" and \
                    item.child().getClass().getSimpleName() == "AttributeReference":
                source = item.child()
                for old, new in list(renamed.items()):
                    if new.exprId().equals(source.exprId()):
                        renamed[old] = item.toAttribute()
                if not any(old.exprId().equals(source.exprId()) for old in renamed):
                    renamed[source] = item.toAttribute()
    gateway = joined.sparkSession.sparkContext._gateway
    replacements = jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap(
        MapConverter().convert(renamed, gateway._gateway_client))
    return node.condition().get().transform(replacements).sql()


def semi_join_below_aggregation(joined: Any) -> bool:
    """Whether Spark's optimizer moves the left semi join that is ``joined``'s last step
    below the aggregation on its left side (PushDownLeftSemiAntiJoin: through the
    deterministic projections and filters above the aggregation, and through the
    aggregation when each part of the condition reads only its grouping columns and the
    other side and the join can be planned as a broadcast join): the optimized plan's top,
    under its projections and filters, is then that aggregation, not the join."""
    def under(plan: Any, kinds: tuple[str, ...]) -> Any:
        while plan.getClass().getSimpleName() in kinds:
            plan = plan.child()
        return plan

    analyzed = under(joined._jdf.queryExecution().analyzed(), ("Project", "Filter", "SubqueryAlias"))
    if analyzed.getClass().getSimpleName() != "Join" or analyzed.joinType().toString() != "LeftSemi":
        return False
    if under(analyzed.left(), ("Project", "Filter", "SubqueryAlias")).getClass().getSimpleName() != "Aggregate":
        return False
    optimized = under(joined._jdf.queryExecution().optimizedPlan(), ("Project", "Filter"))
    return optimized.getClass().getSimpleName() == "Aggregate"


def sources_removed(df: Any) -> bool:
    """Whether Spark's optimizer removes every read of one of the relations ``df``'s
    analysed plan reads (a stream's template reads its source's files, or an RDD): an outer
    join whose other side is unique on the join keys and of which nothing above reads a
    column (EliminateOuterJoin, after a filter above made a full outer join a left one),
    where that side is the only reader of its source. Spark's engine then reads nothing of
    that source, though it stays one of the query's sources."""
    read_as: dict[int, int] = {}   # a file relation's output column (expression id) -> the analysed relation

    def relations(plan: Any) -> set[tuple[str, int]]:
        found, pending = set(), [plan]
        while pending:
            node = pending.pop()
            kind = node.getClass().getSimpleName()
            if kind == "LogicalRDD":
                found.add((kind, node.rdd().id()))
            elif kind == "LogicalRelation":     # (a file source's template: its files' relation, one
                found.add((kind, _relation_read(node, read_as)))   # hash however often it is read)
            pending.extend(_scala_list(node.children()))
        return found
    execution = df._jdf.queryExecution()
    return bool(relations(execution.analyzed()) - relations(execution.optimizedPlan()))


def _relation_read(node: Any, read_as: dict[int, int]) -> int:
    """The analysed relation a ``LogicalRelation`` of a plan reads, by its output columns'
    expression ids (``read_as``, filled from the analysed plan, read first): Spark's nested
    schema pruning (SchemaPruning) copies a file relation with a narrower ``dataSchema``, a
    relation of another hash over the same files, whose columns keep their ids."""
    ids = [a.exprId().id() for a in _scala_list(node.output())]
    known = [read_as[i] for i in ids if i in read_as]
    if known:
        return known[0]
    relation = node.relation().hashCode()
    read_as.update((i, relation) for i in ids)
    return relation


def grouping_set_filters(df: Any, key_names: list[tuple[str, ...]]) -> list[Any] | None:
    """What Spark's optimizer filters between each expansion into grouping sets (rollup,
    cube, groupingSets) and its aggregation in ``df``'s plan: a filter above an aggregation
    that reads only its keys is pushed through it (PushPredicateThroughNonJoin), but not
    through the Expand that makes the keys, so a grouping set's row it rejects never
    reaches the aggregation, or its state in a stream. The filter may be the user's or a
    step's (the ``isnotnull`` of a time window over a key of the aggregation below).

    ``key_names``: the grouping columns (the grouping id last) of each such aggregation, in
    plan order (top down, left first). Per aggregation, the filter as a Column over those
    names, or None; None when the optimized plan's aggregations over grouping sets do not
    pair with ``key_names`` one for one."""
    plan = df._jdf.queryExecution().optimizedPlan()
    found = []   # (aggregation, the conditions of the filters between it and its Expand)
    pending = [plan]
    while pending:
        node = pending.pop()
        if node.getClass().getSimpleName() == "Aggregate":
            below, conditions = node.child(), []
            while below.getClass().getSimpleName() == "Filter":
                conditions.append(below.condition())
                below = below.child()
            if below.getClass().getSimpleName() == "Expand" and _adds_grouping_id(below):
                found.append((node, conditions))
        children = node.children()
        pending.extend(children.apply(i) for i in reversed(range(children.size())))
    if len(found) != len(key_names):
        return None
    unresolved = jvm_class("org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute")
    conjunction = jvm_class("org.apache.spark.sql.catalyst.expressions.And")
    to_map = jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap
    filters: list[Any] = []
    for (aggregate, conditions), names in zip(found, key_names):
        grouping = _scala_list(aggregate.groupingExpressions())
        if len(grouping) != len(names) or any(g.getClass().getSimpleName() != "AttributeReference"
                                              for g in grouping):
            return None
        if not conditions:
            filters.append(None)
            continue
        condition = conditions[0]
        for other in conditions[1:]:
            condition = conjunction(condition, other)
        position = {g.exprId().id(): i for i, g in enumerate(grouping)}
        used = _attribute_references(condition)
        if not condition.deterministic() or any(a.exprId().id() not in position for a in used):
            filters.append(None)
            continue
        replaced = jvm_class("java.util.HashMap")()
        for attribute in used:
            replaced.put(attribute, unresolved.quoted(names[position[attribute.exprId().id()]]))
        filters.append(column_of_expression(condition.transform(to_map(replaced))))
    return filters


def pruned_from_joins(df: Any, columns: list[tuple[Any, str]]) -> list[bool]:
    """For each ``(side, name)`` (a DataFrame ``df``'s plan joins as one side of a join, and
    a column of it): whether Spark's optimizer prunes the column from that join's input in
    ``df``'s optimized plan (ColumnPruning: nothing above the join reads it, nor the join's
    condition). A streaming join exec sees only its inputs' columns, so a side's event time
    pruned is one it has not: it drops no late rows and evicts no state by it. The side is
    found in ``df``'s analysed plan as the one join input with its column names (Spark's
    analysis gives new attributes to a side that reads a relation the other side reads);
    False when none or several are, and the side's own attribute is no join's input, and
    when a join's input in the
    optimized plan has a column of that name: the optimizer gives some columns back their
    first attribute (RemoveRedundantAliases: ``toDF``'s ``maxn AS maxn`` is ``maxn`` of
    the relation), so an attribute missing there may still be read. Never a column the
    join's condition reads: a left semi join Spark pushes below a projection that renames
    the column (PushDownLeftSemiAntiJoin) reads it there under its old attribute."""
    def join_inputs(plan: Any) -> tuple[set[int], set[int], set[str], list[list]]:
        found, read, names, inputs, pending = set(), set(), set(), [], [plan]
        while pending:
            node = pending.pop()
            children = _scala_list(node.children())
            if node.getClass().getSimpleName() == "Join":
                for child in children:
                    inputs.append(_scala_list(child.output()))
                    for a in inputs[-1]:
                        found.add(a.exprId().id())
                        names.add(a.name().lower())
                if node.condition().isDefined():
                    read.update(a.exprId().id() for a in _attribute_references(node.condition().get()))
            pending.extend(children)
        return found, read, names, inputs

    def side_output(side: Any) -> list:
        """The side's columns as the whole plan's analysis has them: the one join input of
        the side's column names (Spark's analysis gives a side that reads a relation the
        other side reads new attributes), else the side's own."""
        output = _scala_list(analyzed_plan(side).output())
        names = [a.name().lower() for a in output]
        matching = [i for i in inputs if [a.name().lower() for a in i] == names]
        return matching[0] if len(matching) == 1 else output

    execution = df._jdf.queryExecution()
    (analyzed, read, _, inputs), (optimized, _, optimized_names, _) = (join_inputs(execution.analyzed()),
                                                                       join_inputs(execution.optimizedPlan()))
    pruned = []
    for side, name in columns:
        output = side_output(side)
        attribute = next((a for a in output if a.name().lower() == name.lower()), None)
        ids = None if attribute is None else attribute.exprId().id()
        pruned.append(ids is not None and ids in analyzed and ids not in optimized and ids not in read
                      and name.lower() not in optimized_names)
    return pruned


def pruned_below_repartitions(df: Any, columns: list[tuple[Any, str, int]]) -> list[bool]:
    """For each ``(below, name, partitions)`` (a DataFrame ``df``'s plan reads under a
    ``repartition(partitions, ..)`` of its own, that number its mark, and a column of
    ``below``): whether Spark's optimizer prunes the column from that repartition's input
    in ``df``'s optimized plan (ColumnPruning: nothing above reads it, nor the
    repartition). A stand-in for a streaming Deduplicate, which reads only its keys: a
    column pruned from its input is one its exec has not. False when the marked
    repartition is not found in the optimized plan or the column is not ``below``'s."""
    found: dict[int, set[int]] = {}
    pending = [df._jdf.queryExecution().optimizedPlan()]
    while pending:
        node = pending.pop()
        children = _scala_list(node.children())
        if node.getClass().getSimpleName() == "RepartitionByExpression" and node.optNumPartitions().isDefined():
            found.setdefault(node.optNumPartitions().get(), set()).update(
                a.exprId().id() for child in children for a in _scala_list(child.output()))
        pending.extend(children)
    pruned = []
    for below, name, partitions in columns:
        output = _scala_list(analyzed_plan(below).output())
        attribute = next((a for a in output if a.name().lower() == name.lower()), None)
        pruned.append(attribute is not None and partitions in found
                      and attribute.exprId().id() not in found[partitions])
    return pruned


#: the column of the grouping set's id an Expand into grouping sets adds (Spark's VirtualColumn)
GROUPING_ID = "spark_grouping_id"


def _adds_grouping_id(expand: Any) -> bool:
    """Whether an Expand is an expansion into grouping sets (it adds Spark's grouping id,
    ``spark_grouping_id``), not a sliding time window's (one row per window the row is in,
    right under an aggregation by the window)."""
    output = expand.output()
    return any(output.apply(i).name() == GROUPING_ID for i in range(output.size()))


@dataclass(frozen=True)
class AggregateCall:
    """An aggregate function call of an analysed aggregation, in Python terms."""

    function: str                  # Spark's class name, e.g. "Average"
    pretty_name: str               # e.g. "avg"
    sql: str                       # the call as Spark prints it, e.g. "avg(v)"
    distinct: bool
    arguments: tuple[str, ...]     # SQL of each argument
    filter: str | None             # SQL of FILTER (WHERE ...), if any
    decimal_argument: bool         # avg of a decimal (Spark sums decimals exactly)
    ignore_nulls: bool             # first/last(x, ignoreNulls)
    relative_sd: float | None      # approx_count_distinct's relative standard deviation
    eval_mode: str | None = None   # sum's and avg's: ANSI, LEGACY or TRY (try_sum, try_avg)
    argument_types: tuple[str, ...] = ()   # each argument's type (simpleString)
    replaced: str | None = None    # the function Spark's optimizer replaces this call's by
                                   # (count_if -> Count...): ``function`` is then that one
    final: str | None = None       # Spark's final expression over its buffers "{0}", "{1}"...
                                   # (the moment-based functions: corr, regr_*, skewness...)
    #: percentile (percentile_cont, percentile_disc, median): (percentages, whether it returns
    #: an array, reverse, discrete); mode: (reverse or None: the tie-break); listagg: (the
    #: delimiter's SQL, None or (whether it orders by its value, ascending));
    #: percentile_approx: (percentages, whether it returns an array, accuracy);
    #: histogram_numeric: (the number of bins, the result's x type)
    parameters: tuple = ()


#: The RuntimeReplaceableAggregate functions a streaming aggregation plans as their
#: replacement (what Spark's optimizer runs: count_if as count(nullif(x, false)), bool_and
#: as min, bool_or as max, any_value as first, median and percentile_cont as percentile,
#: regr_avgx/avgy as avg, regr_count as count, regr_sxx/syy as a central moment).
_REPLACEABLE_AGGREGATES = frozenset({
    "CountIf", "BoolAnd", "BoolOr", "AnyValue", "RegrCount", "RegrAvgX", "RegrAvgY", "RegrSXX",
    "RegrSYY", "Median", "PercentileCont"})


#: The functions whose final expression is read from Spark (``AggregateCall.final``).
_FINALS_READ = frozenset({"Corr", "CovPopulation", "CovSample", "RegrSXY", "RegrR2", "RegrSlope",
                          "RegrIntercept", "RegrReplacement", "Skewness", "Kurtosis"})


def _final_sql(function: Any) -> str:
    """The SQL of a declarative aggregate function's ``evaluateExpression``, its buffer
    attributes as the placeholders "{0}", "{1}"... (in buffer order; the names may repeat:
    regr_slope keeps two ``n``)."""
    import re
    buffers = function.aggBufferAttributes()
    ids = {buffers.apply(i).exprId().id(): i for i in range(buffers.size())}
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq

    def renamed(jexpr):
        if jexpr.getClass().getSimpleName() == "AttributeReference" and jexpr.exprId().id() in ids:
            return jexpr.withName(f"__microbatch_buffer_{ids[jexpr.exprId().id()]}")
        children = [jexpr.children().apply(i) for i in range(jexpr.children().size())]
        replaced = [renamed(c) for c in children]
        if all(r is c for r, c in zip(replaced, children)):
            return jexpr
        return jexpr.withNewChildren(to_seq(replaced))

    sql = renamed(function.evaluateExpression()).sql().replace("{", "{{").replace("}", "}}")
    return re.sub(r"`?__microbatch_buffer_(\d+)`?", lambda m: "{" + m.group(1) + "}", sql)


def _has_method(jobject: Any, method: str) -> bool:
    return any(m.getName() == method for m in jobject.getClass().getMethods())


def _call_parameters(kind: str, function: Any, children: list) -> tuple[tuple, list]:
    """An aggregate function's constant parameters (``AggregateCall.parameters``) and its
    children without them."""

    def seq(values) -> list:
        return [values.apply(i) for i in range(values.size())]

    def name(jexpr) -> str:
        return jexpr.getClass().getSimpleName()

    parameters: tuple = ()
    if kind in ("Percentile", "PercentileDisc"):
        parameters = (tuple(float(p) for p in function.percentages()),
                      name(function.percentageExpression().dataType()) == "ArrayType",
                      bool(function.reverse()), bool(function.discrete()))
        children = children[:1] + children[2:]   # (the percentages are a parameter)
    elif kind == "ApproximatePercentile":
        parameters = _approx_percentile_parameters(function)
        children = children[:1]
    elif kind == "HistogramNumeric":
        x_type = function.dataType().elementType().apply(0).dataType().simpleString()
        parameters = (int(function.nBins().eval(None)), x_type)
        children = children[:1]
    elif kind == "Mode":
        reverse = function.reverseOpt()
        parameters = (bool(reverse.get()) if reverse.isDefined() else None,)
        children = children[:1]
    elif kind == "ListAgg":
        orders = seq(function.orderExpressions())
        order = None
        if orders:
            order = (len(orders) == 1 and orders[0].child().semanticEquals(function.child()),
                     orders[0].direction().toString() == "Ascending")
        parameters = (function.delimiter().sql(), order)
        children = children[:1]
    return parameters, children


def _approx_percentile_parameters(function: Any) -> tuple:
    """percentile_approx's (percentages, whether it returns an array, accuracy), its
    constants evaluated as Spark's ApproximatePercentile does."""
    percentage = function.percentageExpression()
    is_array = percentage.dataType().getClass().getSimpleName() == "ArrayType"
    found = percentage.eval(None)
    percentages = tuple(float(p) for p in found.toDoubleArray()) if is_array else (float(found),)
    return percentages, is_array, int(function.accuracyExpression().eval(None))


@dataclass(frozen=True)
class AggregateOutput:
    """One output column of an analysed aggregation: its SQL (without its alias) and the
    aggregate calls in it, outermost first."""

    sql: str
    calls: tuple[AggregateCall, ...]


def aggregation_parts(grouped: Any) -> tuple[str, int, list[AggregateOutput]]:
    """Spark's analysed plan of ``grouped`` (``df.groupBy(...).agg(...)``): the plan's root
    node name, its number of grouping expressions, and each aggregate expression."""
    analyzed = analyzed_plan(grouped)
    root = analyzed.getClass().getSimpleName()
    if root != "Aggregate":
        return root, 0, []

    def seq(values) -> list:
        return [values.apply(i) for i in range(values.size())]

    def name(jexpr) -> str:
        return jexpr.getClass().getSimpleName()

    def calls_in(jexpr) -> list:
        if name(jexpr) == "AggregateExpression":
            return [jexpr]
        return [found for child in seq(jexpr.children()) for found in calls_in(child)]

    unqualified = _unqualified   # (the output is computed over the aggregation's result,
                                 # where no relation's name is)
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq

    def call(jagg, plain) -> AggregateCall:
        function = jagg.aggregateFunction()
        pretty = function.prettyName()
        replaced = None
        if function.getClass().getSimpleName() in _REPLACEABLE_AGGREGATES:
            # a RuntimeReplaceableAggregate (count_if, bool_and, any_value, median, regr_avgx...):
            # Spark's optimizer runs it as its replacement, whose buffers the state keeps
            replaced = name(function)
            function = function.replacement()
        kind = name(function)
        children = seq(function.children())
        eval_mode = None
        if kind in ("Sum", "Average"):   # (Spark 4.1 moved Sum's into a NumericEvalContext)
            holder = function.evalContext() if _has_method(function, "evalContext") else function
            eval_mode = str(holder.evalMode().toString())
        final = _final_sql(function) if kind in _FINALS_READ else None
        parameters, children = _call_parameters(kind, function, children)
        return AggregateCall(
            kind, pretty, plain.sql(), bool(jagg.isDistinct()),
            tuple(c.sql() for c in children),
            jagg.filter().get().sql() if jagg.filter().isDefined() else None,
            kind == "Average" and function.child().dataType().typeName().startswith("decimal"),
            bool(function.ignoreNulls()) if kind in ("First", "Last") else False,
            float(function.relativeSD()) if kind == "HyperLogLogPlusPlus" else None,
            eval_mode, tuple(c.dataType().simpleString() for c in children), replaced, final, parameters)

    aggregate_expressions = seq(analyzed.aggregateExpressions())
    unresolved = jvm_class("org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute")
    # a grouping expression that is not a column (``_metadata.file_name``, ``substr(k, 1, 1)``)
    # is, above the aggregation, its key column: Spark's PhysicalAggregation rewrites the
    # result expressions the same way, not inside the aggregate calls
    keys = [(expression, unresolved.quoted(output.name()))
            for expression, output in zip(seq(analyzed.groupingExpressions()), aggregate_expressions)
            if name(expression) not in ("AttributeReference", "Alias")]

    def over_keys(jexpr):
        if name(jexpr) == "AggregateExpression":
            return jexpr
        for expression, key in keys:
            if jexpr.semanticEquals(expression):
                return key
        children = seq(jexpr.children())
        replaced = [over_keys(c) for c in children]
        if all(r is c for r, c in zip(replaced, children)):
            return jexpr
        return jexpr.withNewChildren(to_seq(replaced))

    outputs = []
    grouping_count = analyzed.groupingExpressions().size()
    for position, jexpr in enumerate(aggregate_expressions):
        plain = unqualified(jexpr)
        if keys and position >= grouping_count:
            plain = over_keys(plain)
        body = plain.child().sql() if name(plain) == "Alias" else plain.sql()
        outputs.append(AggregateOutput(body, tuple(call(j, p) for j, p in zip(calls_in(jexpr), calls_in(plain)))))
    return root, grouping_count, outputs


def hyperloglog_tables(p: int) -> tuple:
    """The bias tables of the running Spark's HyperLogLog++ at precision ``p``: (threshold,
    raw estimates, biases); empty from 19 on, where Spark uses none."""
    if p >= 19:
        return 0.0, (), ()
    helper = jvm_class("org.apache.spark.sql.catalyst.util.HyperLogLogPlusPlusHelper")
    return (float(helper.THRESHOLDS()[p - 4]), tuple(float(x) for x in helper.RAW_ESTIMATE_DATA()[p - 4]),
            tuple(float(x) for x in helper.BIAS_DATA()[p - 4]))


def nullable_output(df: Any) -> Any:
    """``df`` with every column nullable, values and metadata kept: Spark 4.3's stateful
    operators' output (``spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled``),
    each column wrapped in Catalyst's ``KnownNullable`` (kept through the optimizer)."""
    known_nullable = jvm_class("org.apache.spark.sql.catalyst.expressions.KnownNullable")
    output = analyzed_plan(df).output()   # the resolved attributes: names may repeat
    columns = []
    for i, field in enumerate(df.schema.fields):
        wrapped = column_of_expression(known_nullable(output.apply(i)))
        columns.append(wrapped.alias(field.name, metadata=field.metadata) if field.metadata
                       else wrapped.alias(field.name))
    return df.select(*columns)


def column_sql(column: Any) -> str:
    """A PySpark Column as Spark prints its expression (``window(ts, 10 seconds)``)."""
    return column._jc.toString()


def schema_tree(df: Any, level: int | None = None) -> str:
    """``df``'s schema as ``printSchema`` prints it."""
    schema = df._jdf.schema()
    return schema.treeString(level) if level else schema.treeString()


def grouped_dataframe(grouped: Any) -> Any:
    """The DataFrame a PySpark ``GroupedData`` groups."""
    return grouped._df


def output_qualifiers(df: Any) -> tuple[tuple[str, ...], ...]:
    """Each output column's qualifier (``("l",)`` for ``l.id``; ``()`` for none) in ``df``'s
    analysed plan: the relation names a query may still call its columns by."""
    output = analyzed_plan(df).output()
    return tuple(tuple(str(part) for part in _scala_list(output.apply(i).qualifier()))
                 for i in range(output.size()))


def _scala_list(values: Any) -> list:
    return [values.apply(i) for i in range(values.size())]


def qualified_alias(column: Any, name: str, qualifier: tuple[str, ...], metadata: dict | None = None) -> Any:
    """``column.alias(name, metadata=...)`` whose output column keeps ``qualifier`` (Spark's
    ``Alias`` carries one; PySpark's ``alias`` cannot give it): a column of a join's output
    that a query names as ``l.id``."""
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    expression = expression_of_column(column)
    explicit = jvm_class("scala.None$") if not metadata else jvm_class("scala.Some")(
        jvm_class("org.apache.spark.sql.types.Metadata").fromJson(json.dumps(metadata)))
    alias = jvm_class("org.apache.spark.sql.catalyst.expressions.Alias")(
        expression, name, jvm_class("org.apache.spark.sql.catalyst.expressions.NamedExpression").newExprId(),
        to_seq(list(qualifier)), explicit, to_seq([]))
    return column_of_expression(alias)


def _attribute_references(expression: Any) -> list:
    """The ``AttributeReference`` s in a Catalyst expression (resolved columns of a frame)."""
    found, pending = [], [expression]
    while pending:
        node = pending.pop()
        if node.getClass().getSimpleName() == "AttributeReference":
            found.append(node)
            continue
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))
    return found


def _catalyst_expression(column: Any) -> Any:
    """The Catalyst expression of a classic Column, its column nodes converted (Spark 4
    keeps a Column as nodes until a session converts them)."""
    if running_version().at_least_4:
        return jvm_class("org.apache.spark.sql.SparkSession").active().expression(column._jc)
    return column._jc.expr()


def _columns_in(value: Any) -> list:
    """The classic PySpark Columns in ``value`` (a Column, or lists, tuples and dicts of them)."""
    from pyspark.sql import Column
    if isinstance(value, Column):
        return [value] if hasattr(value, "_jc") else []
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _columns_in(v)]
    if isinstance(value, dict):
        return [c for v in value.values() for c in _columns_in(v)]
    return []


def bound_attribute_ids(values: Any) -> set[int]:
    """The attribute ids the Columns in ``values`` are bound to: a column taken from a frame
    (``frame.ts``, ``frame["ts"]``) is that frame's attribute, which Spark resolves by its id,
    not its name (none for ``F.col("ts")``, resolved by name where it is used)."""
    return {a.exprId().id() for c in _columns_in(values)
            for a in _attribute_references(_catalyst_expression(c))}


def output_attribute_ids(df: Any) -> tuple[int, ...]:
    """The ids of ``df``'s output attributes, in order."""
    output = analyzed_plan(df).output()
    return tuple(output.apply(i).exprId().id() for i in range(output.size()))


def attribute_positions(df: Any, ids: set[int]) -> dict[int, Any]:
    """Where ``df``'s analysed plan has the attributes ``ids``: ``{attribute id: output
    index}`` for those of its output; for one only below it (a column of an earlier frame,
    dropped or replaced since, which Spark's analysis of a filter or a sort over ``df``
    finds below and carries up: ResolveMissingReferences), ``(path, classes, index)``: the
    children's indexes down to the highest node whose output has it, the classes of the
    nodes passed on the way, and its index in that node's output. A step's own plan above
    its inputs has the same shape in every batch, so ``rebound`` finds the batch's
    attribute where the template's is."""
    plan = analyzed_plan(df)
    output = plan.output()
    found: dict[int, Any] = {}
    for n in range(output.size()):
        key = output.apply(n).exprId().id()
        if key in ids and key not in found:
            found[key] = n
    level = [((), (), plan)]
    while level and len(found) < len(ids):
        below = []
        for path, classes, node in level:
            children = node.children()
            for c in range(children.size()):
                child = children.apply(c)
                child_output = child.output()
                for n in range(child_output.size()):
                    key = child_output.apply(n).exprId().id()
                    if key in ids and key not in found:
                        found[key] = (path + (c,), classes + (node.getClass().getName(),), n)
                below.append((path + (c,), classes + (node.getClass().getName(),), child))
        level = below
    return found


def positions_below_projection(projected: Any, positions: dict[int, Any]) -> dict[int, Any] | None:
    """``positions`` (a step's bound Columns: ``{attribute id: output index}`` in
    ``projected``'s output, ``attribute_positions``) as the same columns' indexes in the
    output of the input of the step at the top of ``projected``'s analysed plan (a
    projection, a repartition: one input), for a step moved below it: each column must be
    passed through unchanged (the same attribute); None where one is not, is found only
    below the output, or the top has other than one input."""
    plan = analyzed_plan(projected)
    if plan.children().size() != 1:
        return None
    output, below = plan.output(), plan.children().apply(0).output()
    below_ids = [below.apply(i).exprId().id() for i in range(below.size())]
    moved: dict[int, Any] = {}
    for key, where in positions.items():
        if not isinstance(where, int) or where >= output.size():
            return None
        there = output.apply(where).exprId().id()
        if there not in below_ids:
            return None
        moved[key] = below_ids.index(there)
    return moved


def _attribute_at(plan: Any, output: Any, where: Any, name: str) -> Any:
    """The attribute ``attribute_positions`` found at ``where``, in ``plan`` (whose output
    is ``output``); None where ``plan`` has another shape on the way, or another column there."""
    if isinstance(where, int):
        return output.apply(where)
    path, classes, index = where
    node = plan
    for step, cls in zip(path, classes):
        if node.getClass().getName() != cls or step >= node.children().size():
            return None
        node = node.children().apply(step)
    below = node.output()
    if index >= below.size() or below.apply(index).name() != name:
        return None
    return below.apply(index)


def rebound(values: Any, sides: list[tuple[Any, dict[int, Any]]]) -> Any:
    """``values`` with every Column bound to an attribute of the frames a step was defined
    on bound instead to the attribute in the same position of the DataFrame the step is
    applied to now: ``sides`` pairs each such DataFrame with the positions of the ids
    (``{attribute id: output index}`` of the frame's template, or where below its output,
    ``attribute_positions``). So a step that names a column through a frame (the left
    side's ``id`` of a join, a column of the frame before ``withWatermark``) means the same
    column in every batch, as Spark's binding of a batch into its analysed query keeps
    attribute ids."""
    from pyspark.sql import Column
    plans = [analyzed_plan(df) for df, _ in sides]
    outputs = [(plan, plan.output(), positions) for plan, (_, positions) in zip(plans, sides)]
    to_map = jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap

    def one(value: Any) -> Any:
        if isinstance(value, Column) and hasattr(value, "_jc"):
            expression = _catalyst_expression(value)
            replaced = jvm_class("java.util.HashMap")()
            for attribute in _attribute_references(expression):
                key = attribute.exprId().id()
                for plan, output, positions in outputs:
                    if key in positions:
                        there = _attribute_at(plan, output, positions[key], attribute.name())
                        if there is not None:
                            replaced.put(attribute, there)
                        break
            return column_of_expression(expression.transform(to_map(replaced))) if not replaced.isEmpty() else value
        if isinstance(value, list):
            return [one(v) for v in value]
        if isinstance(value, tuple):
            return tuple(one(v) for v in value)
        if isinstance(value, dict):
            return {k: one(v) for k, v in value.items()}
        return value

    return one(values)


def is_aggregation(df: Any) -> bool:
    """Whether Spark's analysis made ``df``'s plan an aggregation at its top."""
    return analyzed_plan(df).getClass().getSimpleName() == "Aggregate"


def having_condition(df: Any) -> tuple[Any, bool] | None:
    """Where Spark's analysis made ``df``'s last filter a HAVING (ResolveAggregateFunctions:
    a filter right over an aggregation, an aggregate function in its condition resolved to
    the aggregation's output): (the condition as analysed, a Column bound to the
    aggregation's output attributes; whether the aggregation got hidden aggregate columns
    for it, which a projection above the filter drops). None for any other plan."""
    plan = analyzed_plan(df)
    hidden = False
    if plan.getClass().getSimpleName() == "Project" and plan.child().getClass().getSimpleName() == "Filter":
        plan, hidden = plan.child(), True
    if plan.getClass().getSimpleName() != "Filter" or plan.child().getClass().getSimpleName() != "Aggregate":
        return None
    if hidden and plan.child().output().size() == analyzed_plan(df).output().size():
        return None
    return column_of_expression(plan.condition()), hidden


def hidden_aggregates_added(aggregated: Any, having: Any) -> Any:
    """``aggregated`` (a DataFrame whose analysed plan is an aggregation) with the aggregate
    columns Spark's analysis of ``having`` added to an aggregation of the same shape for a
    filter above it (ResolveAggregateFunctions: ``groupBy("k").count().where("sum(v) > 2")``
    aggregates ``sum(v)`` too, as a hidden column a projection above the filter drops):
    those columns appended to ``aggregated``'s aggregation, over its input's attributes in
    the same positions, each with an attribute of its own (so the analysis of a filter by
    the same condition over the result finds them there and adds none)."""
    plan = analyzed_plan(aggregated)
    found = analyzed_plan(having).child().child()   # (Project, Filter, Aggregate: having_condition's shape)

    def seq(values) -> list:
        return [values.apply(i) for i in range(values.size())]

    ours, theirs = seq(plan.aggregateExpressions()), seq(found.aggregateExpressions())
    inputs, their_inputs = seq(plan.child().output()), seq(found.child().output())
    if len(inputs) != len(their_inputs) or len(theirs) <= len(ours):
        raise ValueError("the aggregation over the filter's input has another shape")
    replaced = jvm_class("java.util.HashMap")()
    for theirs_in, ours_in in zip(their_inputs, inputs):
        if theirs_in.exprId().id() != ours_in.exprId().id():
            replaced.put(theirs_in, ours_in)
    to_map = jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    hidden = [(e.transform(to_map(replaced)) if not replaced.isEmpty() else e).newInstance()
              for e in theirs[len(ours):]]
    arguments = [plan.productElement(i) for i in range(plan.productArity())]
    arguments[1] = to_seq(ours + hidden)    # (Aggregate(groupingExpressions, aggregateExpressions, child, ...))
    return dataframe_of_plan(aggregated.sparkSession, plan.copy(*arguments))


def having_aggregation(having: Any) -> Any:
    """The aggregation, with its hidden aggregate columns, under the filter of ``having``
    (``having_condition``'s shape with hidden columns), as a DataFrame of its own."""
    return dataframe_of_plan(having.sparkSession, analyzed_plan(having).child().child())


def output_columns(df: Any) -> list:
    """``df``'s output columns in order, each a Column bound to its attribute (a frame's
    ``df["x"]``, where two columns may share a name)."""
    output = analyzed_plan(df).output()
    return [column_of_expression(output.apply(i)) for i in range(output.size())]


def is_global_aggregation(df: Any) -> bool:
    """Whether Spark's analysis made ``df``'s last projection an aggregation over all its
    rows (``select(count("*"))``, SQL's ``SELECT count(*) FROM t``: an aggregate function
    in a projection without a grouping)."""
    plan = analyzed_plan(df)
    return plan.getClass().getSimpleName() == "Aggregate" and plan.groupingExpressions().isEmpty()


def event_time_marked(df: Any, column: str, delay_ms: int) -> Any:
    """``df`` with ``column`` marked as Spark's EventTimeWatermark marks its event time: the
    same attribute (its id kept) with the delay in its metadata (``spark.watermarkDelayMs``).
    A batch plan drops ``withWatermark`` in analysis, so a stream's template marks it here;
    Spark's analysis of the steps above then carries the mark as it does on a stream:
    through aliases and renames, onto windows over the column and the grouping keys of an
    aggregation, and not onto expressions over it or onto a column of an earlier frame.
    As EventTimeWatermark's output (``updateEventTimeColumn``), every other column loses
    a mark it had: after a second ``withWatermark`` only its column is the event time."""
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    plan = analyzed_plan(df)
    output = _scala_list(plan.output())
    resolver = plan.conf().resolver()
    marked = []
    for attribute in output:
        builder = jvm_class("org.apache.spark.sql.types.MetadataBuilder")().withMetadata(attribute.metadata())
        if resolver.apply(attribute.name(), column):
            attribute = attribute.withMetadata(builder.putLong("spark.watermarkDelayMs", int(delay_ms)).build())
        elif attribute.metadata().contains("spark.watermarkDelayMs"):
            attribute = attribute.withMetadata(builder.remove("spark.watermarkDelayMs").build())
        marked.append(attribute)
    project = jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project")(to_seq(marked), plan)
    return dataframe_of_plan(df.sparkSession, project)


def requalified(df: Any, qualifiers: tuple[tuple[str, ...], ...]) -> Any:
    """``df`` with its output columns qualified as ``qualifiers`` say (the same columns and
    rows: a projection of its own attributes, each with the qualifier), or ``df`` itself
    when none has one."""
    if not any(qualifiers):
        return df
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    plan = analyzed_plan(df)
    output = plan.output()
    columns = [output.apply(i).withQualifier(to_seq(list(q))) for i, q in enumerate(qualifiers)]
    project = jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project")(to_seq(columns), plan)
    return dataframe_of_plan(df.sparkSession, project)


def _window_nodes(plan: Any) -> list:
    found, pending = [], [plan]
    while pending:
        node = pending.pop()
        if node.getClass().getSimpleName() == "Window":
            found.append(node)
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))
    return found


def window_function_error(stepped: Any, before: Any) -> Exception | None:
    """Spark's NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING error, built as Spark's
    UnsupportedOperationChecker builds it, when the step that made ``stepped`` from
    ``before`` (a stream's templates) added a window function (``OVER (...)``); else None."""
    from pyspark.errors.exceptions.captured import convert_exception
    added = _window_nodes(analyzed_plan(stepped))
    if len(added) <= len(_window_nodes(analyzed_plan(before))):
        return None
    window = added[0]
    functions, columns, specs = [], [], []
    expressions = window.windowExpressions()
    for i in range(expressions.size()):
        named = expressions.apply(i)
        pending = [named]
        while pending:
            expression = pending.pop()
            if expression.getClass().getSimpleName() == "WindowExpression":
                functions.append(expression.windowFunction().toString())
                columns.append(named.toAttribute().sql())
                specs.append(expression.windowSpec().toString())
            else:
                children = expression.children()
                pending.extend(children.apply(j) for j in range(children.size()))
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    errors = jvm_class("org.apache.spark.sql.errors.QueryExecutionErrors")
    return convert_exception(errors.nonTimeWindowNotSupportedInStreamingError(
        to_seq(functions), to_seq(columns), to_seq(specs), window.origin()))


# -- the filters Spark's optimizer pushes down to a stream's scans ---------------------------
def reads_only_files(df: Any) -> bool:
    """Whether every leaf of ``df``'s analysed plan is a file relation (a file source's
    batch: its scan's ``numOutputRows`` are the source's input rows)."""
    leaves = analyzed_plan(df).collectLeaves()
    return leaves.size() > 0 and all(
        leaves.apply(i).getClass().getSimpleName() == "LogicalRelation"
        and leaves.apply(i).relation().getClass().getSimpleName() == "HadoopFsRelation"
        for i in range(leaves.size()))


def scan_filters(query: Any, reads: list[Any]) -> dict[int, list[tuple[str, bool]]]:
    """What Spark's optimizer filters each of ``reads``' rows by before anything else reads
    them, in ``query``: a batch DataFrame over ``reads`` (a relation of its own each, over
    no files), optimized. Per read (by index), the conjuncts (SQL text, columns unqualified)
    of the filters between its leaf and the first node above that is neither a filter nor a
    projection that are deterministic, hold no subquery and read the leaf's columns only,
    each with whether Spark's file scan takes it (``scan_takes_filter``): the scan returns
    only the rows that pass those it takes, and its ``numOutputRows`` counts them; the
    others run right above it. A read the optimized plan does not read has none."""
    owner: dict[int, int] = {}     # an attribute id of a read's relation -> the read
    for i, read in enumerate(reads):
        output = analyzed_plan(read).output()
        owner.update((output.apply(j).exprId().id(), i) for j in range(output.size()))
    subquery = jvm_class("org.apache.spark.sql.catalyst.expressions.SubqueryExpression$")
    optimized = optimized_plan(query)
    found: dict[int, list[tuple[str, bool]]] = {}
    pending = [(optimized, [])]     # a node, and the filters and projections right above it
    while pending:
        node, above = pending.pop()
        children = node.children()
        if children.size() == 0:
            output = node.output()
            ids = {output.apply(j).exprId().id() for j in range(output.size())}
            index = next((owner[i] for i in ids if i in owner), None)
            if index is None:
                continue
            parts = found.setdefault(index, [])
            for filtered in above:
                if filtered.getClass().getSimpleName() != "Filter":
                    continue
                for part in _conjuncts(filtered.condition()):
                    used = part.references().toSeq()
                    if part.deterministic() and not subquery.hasSubquery(part) and all(
                            used.apply(j).exprId().id() in ids for j in range(used.size())):
                        parts.append((_unqualified(part).sql(), scan_takes_filter(node, part)))
            continue
        kind = node.getClass().getSimpleName()
        chain = [node] + above if kind in ("Filter", "Project") else []
        pending.extend((children.apply(j), chain) for j in range(children.size()))
    return {i: list(dict.fromkeys(parts)) for i, parts in found.items()}


def scan_takes_filter(relation: Any, condition: Any) -> bool:
    """Whether Spark's file scan of ``relation`` (a file relation's leaf of an optimized
    plan) takes ``condition`` (an expression over its columns) from a filter right above
    it, as Spark's planner makes the scan (FileSourceStrategy): a condition it translates
    for the file format (its ``PushedFilters``: a JSON or CSV reader returns only the rows
    that pass them, a Parquet one skips the row groups they rule out) or prunes the
    partitions by. Its other ``DataFilters`` (``isnotnull((v % 4))``: no source filter
    reads an expression of a column) run in a filter above the scan, after its
    ``numOutputRows``. False for a leaf that is no file relation."""
    if (relation.getClass().getSimpleName() != "LogicalRelation"
            or relation.relation().getClass().getSimpleName() != "HadoopFsRelation"):
        return False
    filtered = jvm_class("org.apache.spark.sql.catalyst.plans.logical.Filter")(condition, relation)
    planned = jvm_class("org.apache.spark.sql.execution.datasources.FileSourceStrategy").apply(filtered)
    for i in range(planned.size()):
        leaves = planned.apply(i).collectLeaves()
        for j in range(leaves.size()):
            scan = leaves.apply(j)
            if scan.getClass().getSimpleName() != "FileSourceScanExec":
                continue
            pruning = scan.partitionFilters()
            if scan.pushedDownFilters().nonEmpty() or any(
                    pruning.apply(k).references().nonEmpty() for k in range(pruning.size())):
                return True
    return False


def scan_skips_filter(sql: str) -> str:
    """``sql`` (a filter's condition) as a condition that passes the same rows and from
    which Spark's planner gives a file scan nothing: ``element_at(array(c), 1)`` is ``c``
    to the row, and the optimizer neither simplifies it back nor infers from it the
    not-null filters of the columns under ``c`` (InferFiltersFromConstraints reads
    ``isnotnull(v)`` out of ``isnotnull((v % 4))``, and a scan takes that one), nor
    does the scan translate it for its file format."""
    return f"element_at(array({sql}), 1)"


def optimized_plan(df: Any) -> Any:
    """``df``'s optimized logical plan; a plan that reads a stream's relation (a source
    without data in a batch, as Spark's engine reads it: ``stream_without_data``) optimized
    by the session's optimizer itself, as Spark's engine optimizes a batch of the stream
    (a batch query's ``optimizedPlan`` refuses it)."""
    analyzed = analyzed_plan(df)
    if not analyzed.isStreaming():
        return df._jdf.queryExecution().optimizedPlan()
    return df.sparkSession._jsparkSession.sessionState().optimizer().execute(analyzed)


def event_time_barrier(df: Any, column: str) -> Any:
    """``df`` with ``column`` made anew by a generator (``explode_outer(array(column))``): in a
    batch plan it stands for a watermark on ``column``, through which Spark's optimizer
    pushes the parts of a filter that do not read ``column`` and keeps the others above
    (as it does through EventTimeWatermark, which a batch plan drops)."""
    from pyspark.sql import functions as F
    return df.withColumn(column, F.explode_outer(F.array(F.col(f"`{column}`"))))


#: Spark's ambiguous self-join check (DetectAmbiguousSelfJoin)
AMBIGUOUS_SELF_JOIN = "_LEGACY_ERROR_TEMP_1182"


def ambiguous_on_a_stream(df: Any, step: Any) -> None:
    """Spark's ambiguous self-join check as its analysis of a *stream's* plan makes it, for
    ``step(df)`` (a grouping of ``df``, analysed): Spark's AnalysisException
    (``_LEGACY_ERROR_TEMP_1182``) where that analysis refuses the step, else nothing.

    The check finds a frame's column (``df["k"]``) ambiguous where the analysed plan gives
    it another attribute than the frame's own, as a rollup's or cube's alias of a grouping
    column, or a window over a frame's time column, does, in a plan with a join. A batch
    plan's analysis first renews the attributes of duplicated expansions
    (DeduplicateRelations: a sliding window's Expand under a rollup's), after which the
    column is not ambiguous; the analysis of a stream's plan skips that renewal (it leaves
    a streaming plan alone), so Spark's engine refuses a query the template's batch
    analysis accepts. Here ``df``'s plan is analysed again with every leaf an empty
    relation marked as a stream's (the same attributes and Dataset tags): analysis only,
    nothing runs, and only this refusal is taken from it."""
    from pyspark.errors import AnalysisException
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    joins = []

    def as_stream(node: Any) -> Any:
        children = _scala_list(node.children())
        if node.getClass().getSimpleName() == "Join":
            joins.append(node)
        if not children:
            leaf = _streaming_relation(node.output())
            leaf.copyTagsFrom(node)
            return leaf
        return node.withNewChildren(to_seq([as_stream(c) for c in children]))

    stream_plan = as_stream(df._jdf.logicalPlan())
    if not joins:   # (the check finds no self-join in a plan without a join)
        return
    try:
        step(dataframe_of_plan(df.sparkSession, stream_plan))
    except AnalysisException as e:
        condition = getattr(e, "getCondition", None) or e.getErrorClass   # (3.5: no getCondition)
        if condition() == AMBIGUOUS_SELF_JOIN:
            raise


def _streaming_relation(output: Any) -> Any:
    """An empty LocalRelation of ``output`` marked as a stream's (``isStreaming``)."""
    cls = jvm_class("org.apache.spark.sql.catalyst.plans.logical.LocalRelation")
    extra = [jvm_class("scala.None$")] * (_local_relation_arity() - 3)   # (4.x: the stream, an Option)
    return cls(output, jvm_class("org.apache.spark.api.python.PythonUtils").toSeq([]), True, *extra)


@functools.lru_cache(maxsize=1)
def _local_relation_arity() -> int:
    cls = jvm_class("java.lang.Class").forName("org.apache.spark.sql.catalyst.plans.logical.LocalRelation")
    return max(len(c.getParameterTypes()) for c in cls.getConstructors())


def plan_json(df: Any) -> list[dict]:
    """Spark's own JSON of ``df``'s analysed plan (``TreeNode.toJSON``: nodes in pre-order,
    expressions as lists of their nodes), parsed: what real-time mode's tasks evaluate
    (``plan.arrow_steps``)."""
    import json
    return json.loads(df._jdf.queryExecution().analyzed().toJSON())
