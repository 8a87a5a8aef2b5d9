"""The filters Spark's optimizer infers across a join (InferFiltersFromConstraints), and the
batch of a source without data as Spark's engine reads it (an empty relation marked as a
stream's, which Spark's optimizer propagates up: PropagateEmptyRelation)."""
from __future__ import annotations

from typing import Any

from microbatch.spark_internals.analysis import _conjuncts, _streaming_relation, _unqualified, analyzed_plan, optimized_plan
from microbatch.spark_internals.jvm import jvm_class
from microbatch.spark_internals.versions import dataframe_of_plan

__all__ = ["join_inferred_filters", "optimized_plan", "stream_without_data"]


def stream_without_data(df: Any) -> Any:
    """A DataFrame with ``df``'s columns over an empty relation marked as a stream's: what
    Spark's engine reads of a source without data in a batch (``LocalRelation(output,
    isStreaming = true)``). Spark's optimizer makes the projections and filters over it an
    empty relation too, and keeps a stateful operator over it (a stream-stream join, an
    aggregation): their state is kept whatever the batch reads. Only to be optimized
    (``optimized_plan``), never run."""
    return dataframe_of_plan(df.sparkSession, _streaming_relation(analyzed_plan(df).output()))


def join_inferred_filters(df: Any) -> tuple[list[str], list[str]] | None:
    """What Spark's optimizer adds to each side of the join that is ``df``'s last join
    (InferFiltersFromConstraints; an inner or left semi join: both sides, a left outer
    join: its right side, a right outer join: its left side): the constraints of both
    sides (their filters, as each side's optimized plan holds them; none of a side Spark
    reads as an empty relation) and the join's condition, and those Spark derives from
    them through the condition's equalities, that read one side's columns only, are
    deterministic, and the side does not hold already. Per side, as SQL text over its
    columns; the "not null" ones left out (the join's own null filters). None when ``df``
    has no join.

    Each side's constraints are read as Spark's optimizer has them when it infers: after
    its early batch made the projections and filters right over an empty relation of a
    stream's an empty relation (PropagateEmptyRelation; it passes no EventTimeWatermark),
    and before it pushes a filter below such a watermark, where the later batch would
    make it empty too."""
    plan = analyzed_plan(df)
    while plan.getClass().getSimpleName() != "Join":
        if plan.children().size() != 1:
            return None
        plan = plan.children().apply(0)
    kind = plan.joinType().toString()
    wanted = {"Inner": (0, 1), "Cross": (0, 1), "LeftSemi": (0, 1), "LeftOuter": (1,), "RightOuter": (0,)}.get(kind, ())
    if not wanted:
        return [], []
    sides = [_empty_relations_propagated(plan.left()), _empty_relations_propagated(plan.right())]
    expressions = []
    for side in sides:
        found = side.constraints().toSeq()
        expressions.extend(found.apply(i) for i in range(found.size()))
    if plan.condition().isDefined():
        expressions.extend(_conjuncts(plan.condition().get()))
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    base = jvm_class("org.apache.spark.sql.catalyst.expressions.ExpressionSet$").apply(to_seq(expressions))
    every = base.union(sides[0].inferAdditionalConstraints(base)).toSeq()
    subquery = jvm_class("org.apache.spark.sql.catalyst.expressions.SubqueryExpression$")
    found: tuple[list[str], list[str]] = ([], [])
    for index in wanted:
        side = sides[index]
        output, own = side.outputSet(), side.constraints()
        for i in range(every.size()):
            part = every.apply(i)
            if (part.getClass().getSimpleName() != "IsNotNull" and part.references().nonEmpty()
                    and part.references().subsetOf(output) and part.deterministic()
                    and not subquery.hasSubquery(part) and not own.contains(part)):
                found[index].append(_unqualified(part).sql())
    return found[0], found[1]


def _empty_relations_propagated(plan: Any) -> Any:
    """``plan`` as Spark's optimizer's early batches leave it for the inference: subquery
    aliases gone (FinishAnalysis), and the steps over an empty relation that make no rows
    an empty relation (the "LocalRelation early" batch's PropagateEmptyRelation, to its
    fixed point)."""
    plan = jvm_class("org.apache.spark.sql.catalyst.analysis.EliminateSubqueryAliases$").apply(plan)
    rule = jvm_class("org.apache.spark.sql.catalyst.optimizer.PropagateEmptyRelation$")
    for _ in range(100):
        done = rule.apply(plan)
        if done.fastEquals(plan):
            return done
        plan = done
    return plan
