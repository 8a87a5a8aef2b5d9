"""The parts of a filter Spark's optimizer pushes through the aggregation under it
(PushPredicateThroughNonJoin's rule for an ``Aggregate``): each deterministic conjunct
that reads only the aggregation's grouping columns (an alias of a grouping expression read
as that expression) filters the aggregation's input instead of its output, so the rows it
rejects never reach the aggregation, nor its state in a stream. Spark's engine optimizes
each batch so: a ``where("k IS NOT NULL")`` over ``groupBy("k")`` keeps no null key in the
aggregation's state."""
from __future__ import annotations

from typing import Any

from microbatch.spark_internals.analysis import _attribute_references, _conjuncts, _scala_list, _unqualified, analyzed_plan
from microbatch.spark_internals.jvm import jvm_class

__all__ = ["conjuncts_through_aggregation"]


def _holds_aggregate(expression: Any) -> bool:
    """Whether ``expression`` holds an aggregate function call (or a grouped-aggregate
    Python UDF), which Spark's alias map of an aggregation leaves out."""
    pending = [expression]
    while pending:
        node = pending.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AggregateExpression" or (kind == "PythonUDF" and node.evalType() == 202):
            return True     # (202: SQL_GROUPED_AGG_PANDAS_UDF)
        pending.extend(_scala_list(node.children()))
    return False


def conjuncts_through_aggregation(filtered: Any) -> tuple[list[str], list[str]] | None:
    """The conjuncts of the filter that is ``filtered``'s last step, right over an
    aggregation, split as Spark's optimizer splits them: those it pushes below the
    aggregation, as SQL text over the aggregation's input (without qualifiers, each alias of
    a grouping expression replaced by the expression), and those that stay above, as SQL
    text. None when the last step is not a filter over an aggregation, or Spark's rule
    pushes nothing through it: a global aggregation, or one with a non-deterministic
    expression (``groupBy(rand())``; ``first`` and ``any_value`` are deterministic)."""
    analyzed = analyzed_plan(filtered)
    if analyzed.getClass().getSimpleName() != "Filter":
        return None
    aggregate = analyzed.child()
    if aggregate.getClass().getSimpleName() != "Aggregate" or aggregate.groupingExpressions().isEmpty():
        return None
    if not all(e.deterministic() for e in _scala_list(aggregate.aggregateExpressions())):
        return None
    aliases = {e.exprId().id(): e.child() for e in _scala_list(aggregate.aggregateExpressions())
               if e.getClass().getSimpleName() == "Alias" and not _holds_aggregate(e.child())}
    below = {a.exprId().id() for a in _scala_list(aggregate.child().output())}
    to_map = jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap
    pushed, kept = [], []
    for part in _conjuncts(analyzed.condition()):
        used = _attribute_references(part)
        substitutes = jvm_class("java.util.HashMap")()
        for attribute in used:
            if attribute.exprId().id() in aliases:
                substitutes.put(attribute, aliases[attribute.exprId().id()])
        moved = part.transform(to_map(substitutes)) if not substitutes.isEmpty() else part
        if part.deterministic() and used and all(a.exprId().id() in below for a in _attribute_references(moved)):
            pushed.append(_unqualified(moved).sql())
        else:
            kept.append(part.sql())
    return pushed, kept
