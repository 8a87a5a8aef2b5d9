"""The parts of a stream-stream join's condition beside its equality keys and time
comparisons (``a.num >= b.maxn``), read from Spark's analysed ``Join``: which side each
reads, the "not null" filters Spark infers from them, and the ones that read both sides
compiled to a small expression tree the join's task evaluates on a pair of rows (its
stored rows are the sides' own columns, so a part is evaluated from them, not by Spark)."""
from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any

from microbatch.spark_internals.analysis import _unqualified, analyzed_plan
from microbatch.spark_internals.jvm import jvm_class

__all__ = ["ConditionPart", "join_condition_parts"]


@dataclass(frozen=True)
class ConditionPart:
    """One conjunct of a join's condition that is neither an equality key nor a time
    comparison: ``side`` 0 or 1 when it is deterministic and reads that side's columns only
    (Spark splits those off: its optimizer pushes them into the side, or its join exec
    filters the side's rows with them before the join), else None; ``sql`` as SQL text
    (over the side's columns, without qualifiers, for a one-side part); ``tree`` the part
    compiled for the task (a part of both sides), or None with ``refusal`` naming what the
    task cannot evaluate."""

    side: int | None
    sql: str
    tree: tuple | None
    refusal: str | None
    #: a one-side part's state value watermark of its side, in ms, where it stays in the
    #: join's condition: Spark's StreamingJoinHelper solves a comparison of one column of
    #: the side with literals (``num > 2``) as it solves a time range, a literal read as
    #: seconds (2000 ms), and evicts the side's rows by the smallest it finds
    bound_ms: int | None = None


_COMPARISONS = {"EqualTo": "=", "EqualNullSafe": "<=>", "LessThan": "<", "LessThanOrEqual": "<=",
                "GreaterThan": ">", "GreaterThanOrEqual": ">="}
_ARITHMETIC = {"Add": "+", "Subtract": "-", "Multiply": "*"}
_INTEGRAL = ("byte", "short", "integer", "long")
_FRACTIONAL = ("float", "double")


def _type_name(e: Any) -> str:
    return e.dataType().typeName()


def _literal(e: Any) -> Any:
    """A literal's value as the join's task holds its type's values (timestamps in µs,
    dates as ``datetime.date``, decimals as ``Decimal``)."""
    value = e.value()
    kind = _type_name(e)
    if value is None:
        return None
    if kind in _INTEGRAL or kind == "boolean":
        return value
    if kind in _FRACTIONAL:
        return float(value)
    if kind == "string":
        return value.toString()
    if kind.startswith("decimal"):
        return decimal.Decimal(value.toString())
    if kind in ("timestamp", "timestamp_ntz"):
        return int(value)
    if kind == "date":
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=int(value))
    if kind.startswith("interval") or kind == "day-time interval" or "interval" in kind:
        if e.dataType().getClass().getSimpleName().startswith("CalendarInterval"):
            if value.months != 0:
                raise ValueError(f"an interval in months or years ({e.toString()})")
            return value.days * 86_400_000_000 + value.microseconds
        return int(value)
    raise ValueError(f"a literal of type {kind} ({e.toString()})")


def _compiled(e: Any, sides: list[dict]) -> tuple:  # noqa: C901 - one case per expression kind
    """``e`` as the task's tree (``operators.join.step.evaluate``); ValueError naming the part
    it cannot take."""
    name = e.getClass().getSimpleName()
    if name == "AttributeReference":
        for side, ids in enumerate(sides):
            if e.exprId().id() in ids:
                return ("col", side, ids[e.exprId().id()])
        raise ValueError(f"'{e.toString()}' (a column of neither side)")
    if name == "Literal":
        return ("lit", _literal(e))
    if name in ("And", "Or"):
        return (name.lower(), _compiled(e.left(), sides), _compiled(e.right(), sides))
    if name == "Not":
        return ("not", _compiled(e.child(), sides))
    if name in ("IsNull", "IsNotNull"):
        return (name.lower(), _compiled(e.child(), sides))
    if name in _COMPARISONS:
        return ("cmp", _COMPARISONS[name], _compiled(e.left(), sides), _compiled(e.right(), sides))
    if name == "In":
        items = e.list()
        return ("in", _compiled(e.value(), sides), tuple(_compiled(items.apply(i), sides) for i in range(items.size())))
    if name == "Cast":
        source, target = _type_name(e.child()), _type_name(e)
        child = _compiled(e.child(), sides)
        if source == target or {source, target} <= {"timestamp", "timestamp_ntz"}:
            return child
        if source in _INTEGRAL and target in _INTEGRAL + _FRACTIONAL:
            return child if target in _INTEGRAL else ("float", child)
        if source in _FRACTIONAL and target in _FRACTIONAL:
            return ("float", child)
        if source in _INTEGRAL and target.startswith("decimal"):
            return ("decimal", child)
        if source.startswith("decimal") and target in _FRACTIONAL:
            return ("float", child)
        raise ValueError(f"a cast from {source} to {target} ({e.toString()})")
    if name in ("DatetimeSub", "DatetimeAdd"):
        return _compiled(e.replacement(), sides)
    if name in ("TimestampAddInterval", "TimeAdd"):
        return ("+", _compiled(e.children().apply(0), sides), _compiled(e.children().apply(1), sides))
    if name == "UnaryMinus":
        return ("-", ("lit", 0), _compiled(e.child(), sides))
    if name in _ARITHMETIC:
        kind = _type_name(e)
        if kind not in _INTEGRAL + _FRACTIONAL:
            raise ValueError(f"arithmetic on {kind} ({e.toString()})")
        op = _ARITHMETIC[name]
        limits = None if kind in _FRACTIONAL else {"byte": 8, "short": 16, "integer": 32, "long": 64}[kind]
        return (op, _compiled(e.left(), sides), _compiled(e.right(), sides), limits)
    raise ValueError(f"'{e.toString()}'")


_SOLVED = {"LessThan": (False, 0), "LessThanOrEqual": (False, -1), "GreaterThan": (True, 0),
           "GreaterThanOrEqual": (True, -1)}


def _terms(e: Any, negate: bool, found: list) -> bool:
    """Spark's StreamingJoinHelper.collectTerms: ``e`` as a sum of terms, each (sign,
    attribute id or None, value in µs as a double); False where it is not such a sum."""
    name = e.getClass().getSimpleName()
    if name in ("Add", "TimeAdd"):
        return _terms(e.children().apply(0), negate, found) and _terms(e.children().apply(1), negate, found)
    if name == "Subtract":
        return _terms(e.left(), negate, found) and _terms(e.right(), not negate, found)
    if name == "DatetimeSub":
        return _terms(e.replacement(), negate, found)
    if name == "UnaryMinus":
        return _terms(e.child(), not negate, found)
    if name in ("CheckOverflow", "PromotePrecision"):
        return _terms(e.child(), negate, found)
    sign = -1 if negate else 1
    if name == "Cast":
        target = _type_name(e)
        if target in _INTEGRAL + _FRACTIONAL + ("timestamp",) or target.startswith("decimal"):
            return _terms(e.child(), negate, found)
        return False
    if name == "AttributeReference":
        found.append((sign, e.exprId().id(), 0.0))
        return True
    if name == "Literal":
        kind = e.dataType().getClass().getSimpleName()
        value = e.value()
        if kind.startswith("CalendarInterval"):
            if value.months != 0:
                return False
            micros = value.days * 86_400_000_000.0 + value.microseconds
        elif kind.startswith("DayTimeInterval"):
            micros = float(value)
        elif kind.startswith("Timestamp") and not kind.startswith("TimestampNTZ"):
            micros = float(value) * 1_000_000.0
        elif _type_name(e) in _INTEGRAL + _FRACTIONAL or _type_name(e).startswith("decimal"):
            micros = float(str(value.toString()) if _type_name(e).startswith("decimal") else value) * 1_000_000.0
        else:
            raise ValueError(f"a literal Spark's join helper does not take ({e.toString()})")
        found.append((sign, None, micros))
        return True
    return False


def _one_side_bound(part: Any, ids: dict) -> int | None:
    """The state value watermark (ms) Spark's StreamingJoinHelper finds in a part that reads
    one side only (``ids``: its attributes), for that side: a comparison whose terms are one
    of its columns, negated once the comparison is put as ``x - y < 0``, and literals."""
    solved = _SOLVED.get(part.getClass().getSimpleName())
    if solved is None:
        return None
    turned, adjust = solved
    lhs, rhs = (part.right(), part.left()) if turned else (part.left(), part.right())
    found: list = []
    try:
        if not (_terms(lhs, False, found) and _terms(rhs, True, found)):
            return None
    except ValueError:
        return None
    terms = list(dict.fromkeys(found))     # (Spark's ExpressionSet: a term once)
    columns = [t for t in terms if t[1] is not None]
    if len({t[1] for t in columns}) != 1 or len(columns) != 1 or columns[0][1] not in ids or columns[0][0] != -1:
        return None
    literals = [sign * micros for sign, ident, micros in terms if ident is None]
    if not literals:
        return None
    value = sum(literals)
    return int(value / 1000.0) + adjust


def _side_of(e: Any, sides: list[dict]) -> int | None:
    """The one side whose columns ``e`` reads (None: none, or both)."""
    references = e.references().toSeq()
    read = set()
    for i in range(references.size()):
        ident = references.apply(i).exprId().id()
        read.add(next((s for s, ids in enumerate(sides) if ident in ids), None))
    return read.pop() if len(read) == 1 else None


def join_condition_parts(joined: Any, parts: list[Any]) -> tuple[list[ConditionPart], tuple[list[int], list[int]]]:
    """Each of ``parts`` (conjuncts of the condition of ``joined``'s analysed ``Join``) as a
    ``ConditionPart``, and per side the columns (indexes) Spark infers "not null" for from
    them (its ``constructIsNotNullConstraints``: the columns a null-intolerant part reads
    through null-intolerant expressions)."""
    plan = analyzed_plan(joined)
    sides = []
    for child in (plan.left(), plan.right()):
        output = child.output()
        sides.append({output.apply(i).exprId().id(): i for i in range(output.size())})
    found = []
    for part in parts:
        side = _side_of(part, sides) if part.deterministic() else None
        if side is not None:
            found.append(ConditionPart(side, _unqualified(part).sql(), None, None, _one_side_bound(part, sides[side])))
            continue
        if part.getClass().getSimpleName() in ("EqualTo", "EqualNullSafe") and \
                {_side_of(part.left(), sides), _side_of(part.right(), sides)} == {0, 1}:
            found.append(ConditionPart(None, part.sql(), None,
                                       f"'{part.toString()}' (an equality of expressions Spark makes a join key of)"))
            continue
        try:
            found.append(ConditionPart(None, part.sql(), _compiled(part, sides), None))
        except ValueError as e:
            found.append(ConditionPart(None, part.sql(), None, str(e)))
    nulls: tuple[list[int], list[int]] = ([], [])
    if parts:
        to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
        constraints = jvm_class("org.apache.spark.sql.catalyst.expressions.ExpressionSet$").apply(to_seq(parts))
        inferred = plan.constructIsNotNullConstraints(constraints, plan.left().output().toSeq()
                                                      .union(plan.right().output().toSeq())).toSeq()
        for i in range(inferred.size()):
            e = inferred.apply(i)
            child = e.child() if e.getClass().getSimpleName() == "IsNotNull" else None
            if child is None or child.getClass().getSimpleName() != "AttributeReference":
                continue
            for side, ids in enumerate(sides):
                index = ids.get(child.exprId().id())
                if index is not None and index not in nulls[side]:
                    nulls[side].append(index)
    return found, nulls
