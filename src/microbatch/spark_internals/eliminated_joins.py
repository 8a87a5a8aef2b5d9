"""The outer joins Spark's optimizer removes from a query (EliminateOuterJoin): an
aggregation over a left (right) outer join that reads only the left (right) side's columns
and whose aggregate functions do not care for duplicates (``min``, ``max``, ``first``, a
grouping alone, ...) aggregates that side alone, each of its rows once, as a left outer join
outputs each left row at least once; a full outer join becomes a left (right) one first
under a filter that drops the rows whose left (right) columns are null (a tumbling window's
``isnotnull(ts)``). Spark's engine optimizes each batch so: the join is no operator of its
plan, keeps no state and has no operator id."""
from __future__ import annotations

from typing import Any

from microbatch.spark_internals.analysis import _attribute_references, _scala_list, optimized_plan

__all__ = ["outer_joins_eliminated", "outer_joins_narrowed"]


def _ids(plan: Any) -> set[int]:
    return {a.exprId().id() for a in _scala_list(plan.output())}


def _joins(plan: Any) -> list[Any]:
    found, pending = [], [plan]
    while pending:
        node = pending.pop()
        if node.getClass().getSimpleName() == "Join":
            found.append(node)
        pending.extend(_scala_list(node.children()))
    return found


def _referenced(plan: Any) -> set[int]:
    """Every attribute id ``plan`` outputs or reads, in any node."""
    found, pending = set(), [plan]
    while pending:
        node = pending.pop()
        found |= _ids(node)
        found |= {a.exprId().id() for a in _attribute_references_of(node)}
        pending.extend(_scala_list(node.children()))
    return found


def _attribute_references_of(node: Any) -> list[Any]:
    expressions = _scala_list(node.expressions())
    return [a for e in expressions for a in _attribute_references(e)]


def _join_of(plan: Any) -> Any | None:
    """The join at the top of ``plan`` (under the projection of a join on column names)."""
    while plan.getClass().getSimpleName() != "Join":
        if plan.children().size() != 1:
            return None
        plan = plan.children().apply(0)
    return plan


def outer_joins_eliminated(df: Any, joins: list[Any]) -> list[int | None]:
    """For each of ``joins`` (the DataFrames of outer joins that ``df``'s plan reads), the
    side Spark's optimizer keeps in ``df``'s optimized plan in the join's place where it
    removed the join (0: the left side, 1: the right), else None: a join of the two sides
    is still there, or what became of it is not told (no fewer joins than in the analysed
    plan; the other side's attributes still read somewhere; both sides' gone)."""
    optimized = optimized_plan(df)
    kept_joins = [(_ids(j.left()), _ids(j.right())) for j in _joins(optimized)]
    fewer = len(kept_joins) < len(_joins(df._jdf.queryExecution().analyzed()))
    present = _referenced(optimized)
    found: list[int | None] = []
    for join_df in joins:
        join = _join_of(join_df._jdf.queryExecution().analyzed())
        if join is None:
            found.append(None)
            continue
        ids = (_ids(join.left()), _ids(join.right()))
        joined = any((a & ids[0] and b & ids[1]) or (a & ids[1] and b & ids[0]) for a, b in kept_joins)
        kept = [side for side in (0, 1) if ids[side] & present]
        found.append(kept[0] if fewer and not joined and len(kept) == 1 else None)
    return found


#: Spark's join types, as ``StreamJoin.how`` names them
_JOIN_TYPES = {"Inner": "inner", "LeftOuter": "left", "RightOuter": "right", "FullOuter": "full", "LeftSemi": "semi"}


def outer_joins_narrowed(df: Any, joins: list[Any]) -> list[str | None]:
    """For each of ``joins`` (the DataFrames of outer joins that ``df``'s plan reads), the
    join type Spark's optimizer gives it in ``df``'s optimized plan where it differs
    (EliminateOuterJoin: a full outer join under a filter that drops the rows whose left
    columns are null is a left outer join, an outer join whose nullable side's nulls are
    all dropped an inner one; such a filter is often one Spark infers, a join above
    reading the join's columns as keys), as ``StreamJoin.how`` names it; else None (the
    same type, or the join not found)."""
    optimized = [(j, _ids(j.left()), _ids(j.right())) for j in _joins(optimized_plan(df))]
    found: list[str | None] = []
    for join_df in joins:
        join = _join_of(join_df._jdf.queryExecution().analyzed())
        if join is None:
            found.append(None)
            continue
        left, right = _ids(join.left()), _ids(join.right())
        kept = [j for j, a, b in optimized if a & left and b & right and not (a & right) and not (b & left)]
        if len(kept) != 1:
            found.append(None)
            continue
        now, before = (_JOIN_TYPES.get(str(j.joinType())) for j in (kept[0], join))
        found.append(now if now is not None and before is not None and now != before else None)
    return found
