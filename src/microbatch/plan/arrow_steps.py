"""A query's stateless steps evaluated over Arrow in a Python task: real-time mode's path.

Spark's engine runs a real-time query's steps in the JVM, a record at a time. microbatch's
records are read and written in Python tasks (its Kafka client), and between two Python
runners Spark's JVM gathers ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows before
it hands any on: a record would wait for ten thousand others. So a real-time batch's tasks
evaluate the steps themselves, over the few records each read returns: Spark's analysed
plan of the steps (``Project``, ``Filter``, a ``SubqueryAlias``, over the source's
relation; a ``Union`` of sources by position: a source's tasks run the branches that read
it, each projected to the union's columns), read as Spark's own JSON of it
(``spark_internals.plan_json``), becomes ``ArrowSteps``: a function from an Arrow batch
of the source's columns to one of the query's output columns, with Spark's answers for
the expressions below. Any other plan
node or expression is refused before the query reads a record (the query fails naming its Spark class)
(``NotEvaluable``), so a query never runs with answers of its own.

The expressions (Spark's semantics, ANSI or not as the session says): columns, literals,
``Alias``; ``Cast`` between the integral, floating and decimal types, binary and string
(bytes that are not UTF-8 replaced, as Spark does), numbers and booleans to string;
``+ - * / %`` and unary minus (overflow and division by zero raise Spark's errors under
ANSI, wrap or give null without); comparisons, ``<=>``, ``AND``/``OR``/``NOT`` (three-valued),
``IS [NOT] NULL``, ``IN``, ``IF``, ``CASE WHEN``, ``coalesce``; ``upper``, ``lower``,
``concat``; struct fields and ``struct(...)``; ``from_json`` (a struct of integral,
floating, decimal, string, boolean, timestamp and struct fields, Spark's PERMISSIVE
defaults: a record that is not JSON gives a struct of nulls, a field of the wrong kind a
null) and ``to_json`` of a struct (Spark's JSON generator: null fields left out, doubles
as Java prints them, timestamps ``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` in the session's zone).
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from microbatch.spark_internals.java_text import java_double_text

_EXPR = "org.apache.spark.sql.catalyst.expressions."


class NotEvaluable(Exception):
    """A plan node or expression the Python evaluation does not know (its Spark class)."""


class ArithmeticError_(Exception):      # noqa: N801 - Spark's error, raised in a task
    """Spark's ANSI errors (``ARITHMETIC_OVERFLOW``, ``DIVIDE_BY_ZERO``, ``CAST_INVALID_INPUT``)."""


# -- Spark's types as Arrow's -----------------------------------------------------------------
def arrow_type(spark_type: Any) -> pa.DataType:
    """Spark's JSON of a type (``"long"``, ``"decimal(3,3)"``, ``{"type": "struct", ...}``)
    as the Arrow type Spark's Arrow conversion gives it."""
    if isinstance(spark_type, dict):
        if spark_type.get("type") == "struct":
            return pa.struct([pa.field(f["name"], arrow_type(f["type"]), f.get("nullable", True))
                              for f in spark_type["fields"]])
        raise NotEvaluable(f"the type {spark_type.get('type')}")
    simple = {"integer": pa.int32(), "long": pa.int64(), "short": pa.int16(), "byte": pa.int8(),
              "double": pa.float64(), "float": pa.float32(), "string": pa.string(), "binary": pa.binary(),
              "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32(),
              "null": pa.null(), "void": pa.null()}
    if spark_type in simple:
        return simple[spark_type]
    if isinstance(spark_type, str) and spark_type.startswith("decimal("):
        precision, scale = spark_type[len("decimal("):-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    raise NotEvaluable(f"the type {spark_type}")


def _spark_name(t: pa.DataType) -> str:
    names = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.int16(): "SMALLINT", pa.int8(): "TINYINT",
             pa.float64(): "DOUBLE", pa.float32(): "FLOAT", pa.string(): "STRING", pa.bool_(): "BOOLEAN"}
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    return names.get(t, str(t).upper())


# -- the JSON of Spark's trees ------------------------------------------------------------------------
def _tree(nodes: list[dict], at: int = 0) -> tuple[dict, int]:
    """Spark's ``TreeNode.toJSON``: nodes in pre-order, each with its ``num-children``;
    a node's fields name its children by their index among them."""
    node = dict(nodes[at])
    at += 1
    children = []
    for _ in range(node.get("num-children", 0)):
        child, at = _tree(nodes, at)
        children.append(child)
    node["_children"] = children
    return node, at


def _kind(node: dict) -> str:
    return node["class"].rsplit(".", 1)[-1]


def _expr_id(node: dict) -> int:
    return int(node["exprId"]["id"])


# -- expressions -------------------------------------------------------------------------------------
class Expr:
    type: pa.DataType

    def eval(self, columns: dict[int, pa.Array], n: int) -> pa.Array:
        raise NotImplementedError


@dataclass
class Column(Expr):
    expr_id: int
    type: pa.DataType

    def eval(self, columns, n):
        return columns[self.expr_id]


@dataclass
class Literal(Expr):
    value: Any
    type: pa.DataType

    def eval(self, columns, n):
        if self.value is None:
            return pa.nulls(n, self.type)
        return pa.array([self.value] * n, self.type)


def _literal(node: dict) -> Literal:
    t = arrow_type(node["dataType"])
    raw = node.get("value")
    if raw is None:
        return Literal(None, t)
    if pa.types.is_integer(t):
        value: Any = int(raw)
    elif pa.types.is_floating(t):
        value = float(raw)
    elif pa.types.is_decimal(t):
        value = decimal.Decimal(raw)
    elif pa.types.is_boolean(t):
        value = raw == "true"
    elif pa.types.is_string(t):
        value = raw
    else:
        raise NotEvaluable(f"a literal of type {node['dataType']}")
    return Literal(value, t)


@dataclass
class Cast(Expr):
    child: Expr
    type: pa.DataType
    ansi: bool

    def eval(self, columns, n):
        values = self.child.eval(columns, n)
        source, target = values.type, self.type
        if source == target:
            return values
        if pa.types.is_null(source):
            return pa.nulls(len(values), target)
        if pa.types.is_binary(source) and pa.types.is_string(target):
            return _utf8(values)
        if pa.types.is_string(source) and pa.types.is_binary(target):
            return pc.cast(values, pa.binary())
        if pa.types.is_boolean(source) and pa.types.is_string(target):
            return pc.if_else(values, "true", "false")
        if pa.types.is_integer(source) and pa.types.is_string(target):
            return pc.cast(values, pa.string())
        if pa.types.is_decimal(source) and pa.types.is_string(target):
            return pa.array([None if v is None else str(v) for v in values.to_pylist()], pa.string())
        if pa.types.is_string(source) and pa.types.is_integer(target):
            return self._parsed(values)
        if pa.types.is_integer(source) and pa.types.is_integer(target):
            return _narrowed(values, target, self.ansi)
        if (pa.types.is_integer(source) or pa.types.is_floating(source)) and pa.types.is_floating(target):
            return pc.cast(values, target, safe=False)
        if pa.types.is_integer(source) and pa.types.is_decimal(target):
            return pc.cast(values, target)       # (Spark's widening casts: the decimal holds every value)
        if pa.types.is_decimal(source) and pa.types.is_decimal(target):
            return _decimal_fit(values, target, self.ansi)
        if pa.types.is_decimal(source) and pa.types.is_floating(target):
            return pc.cast(values, target)
        raise NotEvaluable(f"Cast from {_spark_name(source)} to {_spark_name(target)}")

    def _parsed(self, values: pa.Array) -> pa.Array:
        out = []
        bits = self.type.bit_width
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        for v in values.to_pylist():
            if v is None:
                out.append(None)
                continue
            text = v.strip()
            try:
                number = int(text, 10) if text and text.lstrip("+-").isdigit() else None
            except ValueError:
                number = None
            if number is None or not low <= number <= high:
                if self.ansi:
                    raise ArithmeticError_(
                        f"[CAST_INVALID_INPUT] The value '{v}' of the type \"STRING\" cannot be cast to "
                        f"\"{_spark_name(self.type)}\" because it is malformed. Correct the value as per the "
                        "syntax, or change its target type. Use `try_cast` to tolerate malformed input and "
                        "return NULL instead. SQLSTATE: 22018")
                number = None
            out.append(number)
        return pa.array(out, self.type)


def _utf8(values: pa.Array) -> pa.Array:
    """Bytes as text, as Spark's cast: bytes that are not UTF-8 become U+FFFD."""
    try:
        return pc.cast(values, pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()],
                        pa.string())


def _narrowed(values: pa.Array, target: pa.DataType, ansi: bool) -> pa.Array:
    try:
        return pc.cast(values, target)
    except pa.ArrowInvalid:
        if ansi:
            raise ArithmeticError_(
                f"[CAST_OVERFLOW] The value of the type \"{_spark_name(values.type)}\" cannot be cast to "
                f"\"{_spark_name(target)}\" due to an overflow. Use `try_cast` to tolerate overflow and "
                "return NULL instead. SQLSTATE: 22003") from None
        return pc.cast(values, target, safe=False)        # (Java's wrap)


def _decimal_fit(values: pa.Array, target: pa.DataType, ansi: bool) -> pa.Array:
    """A decimal to another precision and scale, rounding half up as Spark; a value that
    does not fit is Spark's overflow (ANSI) or null."""
    return pa.array(_decimals_fit(values.to_pylist(), target, ansi), target)


def _decimals_fit(values: list, target: pa.DataType, ansi: bool) -> list:
    quantum = decimal.Decimal(1).scaleb(-target.scale)
    limit = decimal.Decimal(10) ** (target.precision - target.scale)
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        r = v.quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=decimal.Context(prec=60))
        if abs(r) >= limit:
            if ansi:
                raise ArithmeticError_(
                    f"[NUMERIC_VALUE_OUT_OF_RANGE.WITH_SUGGESTION] {v} cannot be represented as "
                    f"Decimal({target.precision}, {target.scale}). If necessary set \"spark.sql.ansi.enabled\" "
                    "to \"false\" to bypass this error, and return NULL instead. SQLSTATE: 22003")
            r = None
        out.append(r)
    return out


def _decimal_result(kind: str, a: pa.DataType, b: pa.DataType, adjust: bool = True) -> pa.DataType:
    """Spark's DecimalPrecision for ``+ - *`` (with its loss of precision above 38 digits;
    ``adjust=False``: the exact result's type, None beyond 38 digits)."""
    p1, s1, p2, s2 = a.precision, a.scale, b.precision, b.scale
    if kind in ("Add", "Subtract"):
        scale = max(s1, s2)
        precision = max(p1 - s1, p2 - s2) + scale + 1
    else:
        precision, scale = p1 + p2 + 1, s1 + s2
    if precision > 38 and not adjust:
        return None
    if precision > 38:          # DecimalType.adjustPrecisionScale
        digits = precision - scale
        scale = max(38 - digits, min(scale, 6))
        precision = 38
    return pa.decimal128(precision, scale)


@dataclass
class Arithmetic(Expr):
    kind: str
    left: Expr
    right: Expr
    type: pa.DataType
    ansi: bool

    def eval(self, columns, n):
        a, b = self.left.eval(columns, n), self.right.eval(columns, n)
        t = self.type
        if pa.types.is_decimal(t):
            return self._decimal(a, b)
        if self.kind in ("Divide", "Remainder"):
            return self._divided(a, b)
        function = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply"}[self.kind]
        if pa.types.is_integer(t):
            try:
                return pc.call_function(function + "_checked", [a, b])
            except pa.ArrowInvalid:
                if self.ansi:
                    raise ArithmeticError_(
                        f"[ARITHMETIC_OVERFLOW] {_spark_name(t).lower()} overflow. Use 'try_{function}' to "
                        "tolerate overflow and return NULL instead. If necessary set "
                        "\"spark.sql.ansi.enabled\" to \"false\" to bypass this error. SQLSTATE: 22003") from None
                return pc.call_function(function, [a, b])
        return pc.call_function(function, [a, b])

    def _decimal(self, a: pa.Array, b: pa.Array) -> pa.Array:
        function = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply"}[self.kind]
        if _decimal_result(self.kind, a.type, b.type, adjust=False) == self.type:
            # (no digit lost: Arrow's result type is Spark's, and the exact result fits it)
            return pc.call_function(function, [a, b])
        import operator
        op = {"Add": operator.add, "Subtract": operator.sub, "Multiply": operator.mul}[self.kind]
        context = decimal.Context(prec=80)
        exact = [None if x is None or y is None else context.create_decimal(op(x, y))
                 for x, y in zip(a.to_pylist(), b.to_pylist())]
        return pa.array(_decimals_fit(exact, self.type, self.ansi), self.type)

    def _divided(self, a: pa.Array, b: pa.Array) -> pa.Array:
        zero = pc.fill_null(pc.equal(b, 0), False)
        if pc.any(zero).as_py():
            if self.ansi:
                raise ArithmeticError_(
                    "[DIVIDE_BY_ZERO] Division by zero. Use `try_divide` to tolerate divisor being 0 and "
                    "return NULL instead. If necessary set \"spark.sql.ansi.enabled\" to \"false\" to "
                    "bypass this error. SQLSTATE: 22012")
            b = pc.if_else(zero, pa.scalar(None, b.type), b)
        if self.kind == "Divide":
            return pc.divide(pc.cast(a, pa.float64()), pc.cast(b, pa.float64()))
        # Java's %: the sign of the dividend
        mask = pc.or_(pc.is_null(a), pc.is_null(b))
        x = pc.fill_null(a, 0).to_numpy(zero_copy_only=False)
        y = pc.fill_null(b, 1).to_numpy(zero_copy_only=False)
        return pa.array(np.fmod(x, y), self.type, mask=mask.to_numpy(zero_copy_only=False))


@dataclass
class Negate(Expr):
    child: Expr
    type: pa.DataType
    ansi: bool

    def eval(self, columns, n):
        values = self.child.eval(columns, n)
        if pa.types.is_integer(self.type) and self.ansi:
            try:
                return pc.negate_checked(values)
            except pa.ArrowInvalid:
                raise ArithmeticError_(f"[ARITHMETIC_OVERFLOW] {_spark_name(self.type).lower()} overflow. "
                                       "SQLSTATE: 22003") from None
        return pc.negate(values)


_COMPARISONS = {"EqualTo": "equal", "LessThan": "less", "LessThanOrEqual": "less_equal",
                "GreaterThan": "greater", "GreaterThanOrEqual": "greater_equal"}


@dataclass
class Compare(Expr):
    """A boolean function of two values: comparisons, and AND/OR (``and_kleene``,
    ``or_kleene``: SQL's three-valued logic)."""

    function: str
    left: Expr
    right: Expr
    type: pa.DataType = field(default_factory=pa.bool_)

    def eval(self, columns, n):
        return pc.call_function(self.function, [self.left.eval(columns, n), self.right.eval(columns, n)])


@dataclass
class NullSafeEqual(Expr):
    left: Expr
    right: Expr
    type: pa.DataType = field(default_factory=pa.bool_)

    def eval(self, columns, n):
        a, b = self.left.eval(columns, n), self.right.eval(columns, n)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        return pc.or_(both_null, pc.fill_null(pc.equal(a, b), False))


@dataclass
class Unary(Expr):
    function: str           # invert, is_null, is_valid, utf8_upper, utf8_lower
    child: Expr
    type: pa.DataType

    def eval(self, columns, n):
        return pc.call_function(self.function, [self.child.eval(columns, n)])


@dataclass
class In(Expr):
    child: Expr
    values: list
    has_null: bool
    type: pa.DataType = field(default_factory=pa.bool_)

    def eval(self, columns, n):
        values = self.child.eval(columns, n)
        found = pc.is_in(values, value_set=pa.array(self.values, values.type))
        if self.has_null:       # x IN (..., NULL) is NULL where not found
            found = pc.if_else(found, True, pa.scalar(None, pa.bool_()))
        return pc.if_else(pc.is_null(values), pa.scalar(None, pa.bool_()), found)


@dataclass
class CaseWhen(Expr):
    branches: list          # [(condition, value)]
    otherwise: Expr | None
    type: pa.DataType

    def eval(self, columns, n):
        result = self.otherwise.eval(columns, n) if self.otherwise is not None else pa.nulls(n, self.type)
        for condition, value in reversed(self.branches):
            taken = pc.fill_null(condition.eval(columns, n), False)
            result = pc.if_else(taken, value.eval(columns, n), result)
        return result


@dataclass
class Coalesce(Expr):
    children: list
    type: pa.DataType

    def eval(self, columns, n):
        return pc.coalesce(*[c.eval(columns, n) for c in self.children])


@dataclass
class Concat(Expr):
    children: list
    type: pa.DataType = field(default_factory=pa.string)

    def eval(self, columns, n):
        # (null if any input is null, as Spark's concat)
        return pc.binary_join_element_wise(*[c.eval(columns, n) for c in self.children], "",
                                           null_handling="emit_null")


@dataclass
class StructField(Expr):
    child: Expr
    ordinal: int
    type: pa.DataType

    def eval(self, columns, n):
        return pc.struct_field(self.child.eval(columns, n), [self.ordinal])


@dataclass
class MakeStruct(Expr):
    names: list
    children: list
    type: pa.DataType

    def eval(self, columns, n):
        arrays = [c.eval(columns, n) for c in self.children]
        return pa.StructArray.from_arrays(arrays, fields=list(self.type))


@dataclass
class FromJson(Expr):
    child: Expr
    type: pa.DataType
    zone: str

    def eval(self, columns, n):
        texts = self.child.eval(columns, n).to_pylist()
        read = self.__dict__.get("_read")
        if read is None:        # (made once, in the process that evaluates: never pickled)
            read = self.__dict__["_read"] = _json_reader(self.type, ZoneInfo(self.zone))
        rows = []
        loads = json.loads
        for text in texts:
            if text is None:
                rows.append(None)
                continue
            try:
                parsed = loads(text, parse_float=_RawFloat)
            except ValueError:
                parsed = None
            rows.append(read(parsed if isinstance(parsed, dict) else {}))
        return pa.array(rows, self.type)


class _RawFloat(str):
    """A JSON number with a fraction or an exponent, kept as written."""


def _json_value(value: Any, t: pa.DataType, zone: ZoneInfo) -> Any:
    """A JSON value as Spark's JacksonParser converts it to ``t``, for the types
    ``_json_reader`` leaves to it (None where Spark's PERMISSIVE mode gives null)."""
    if value is None:
        return None
    if pa.types.is_boolean(t):
        return value if isinstance(value, bool) else None
    if pa.types.is_floating(t):
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, _RawFloat)):
            return float(value)
        special = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "-Infinity": -math.inf,
                   "INF": math.inf, "+INF": math.inf, "-INF": -math.inf}
        return special.get(value) if isinstance(value, str) else None
    if pa.types.is_decimal(t):
        if isinstance(value, bool) or not isinstance(value, (int, _RawFloat)):
            return None
        d = decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-t.scale), rounding=decimal.ROUND_HALF_UP,
                                                 context=decimal.Context(prec=60))
        return d if abs(d) < decimal.Decimal(10) ** (t.precision - t.scale) else None
    if pa.types.is_timestamp(t):
        if isinstance(value, bool):
            return None
        if isinstance(value, int) and not isinstance(value, _RawFloat):
            return dt.datetime.fromtimestamp(value, dt.timezone.utc)
        if isinstance(value, str) and not isinstance(value, _RawFloat):
            return _timestamp(value, zone)
        return None
    raise NotEvaluable(f"from_json into {t}")


def _json_reader(t: pa.DataType, zone: ZoneInfo) -> Callable[[Any], Any]:
    """``_json_value`` for one type, its dispatch made once: what a task runs per value."""
    if pa.types.is_struct(t):
        fields = [(f.name, _json_reader(f.type, zone)) for f in t]

        def struct(value):
            if not isinstance(value, dict):
                return None
            get = value.get
            return {name: (None if (v := get(name)) is None else read(v)) for name, read in fields}
        return struct
    if pa.types.is_string(t):
        return lambda v: v if type(v) is str else _json_text(v)
    if pa.types.is_integer(t):
        low, high = -(1 << (t.bit_width - 1)), 1 << (t.bit_width - 1)
        return lambda v: v if type(v) is int and low <= v < high else None
    return lambda v: _json_value(v, t, zone)


def _json_writer(t: pa.DataType, zone: ZoneInfo) -> Callable[[Any], str]:
    """``_json_written`` for one type, its dispatch made once."""
    if pa.types.is_struct(t):
        fields = [(f.name, json.dumps(f.name, ensure_ascii=False) + ":", _json_writer(f.type, zone)) for f in t]

        def struct(row):
            return "{" + ",".join(key + write(v) for name, key, write in fields
                                  if (v := row[name]) is not None) + "}"
        return struct
    if pa.types.is_string(t):
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        return dumps
    if pa.types.is_integer(t):
        return str
    if pa.types.is_timestamp(t):
        def timestamp(value):
            text = value.astimezone(zone).isoformat(timespec="milliseconds")
            return '"' + (text[:-6] + "Z" if text.endswith("+00:00") else text) + '"'
        return timestamp
    return lambda v: _json_written(v, t, zone)


def _json_text(value: Any) -> str:
    """A JSON value that is not a string, as the text Spark keeps for a string field: the
    value as Jackson read and writes it again (``copyCurrentStructure``: numbers with a
    fraction as doubles, compact)."""
    if isinstance(value, _RawFloat):
        return java_double_text(float(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _json_text_or_string(v)
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text_or_string(v) for v in value) + "]"
    return str(value)


def _json_text_or_string(value: Any) -> str:
    if isinstance(value, str) and not isinstance(value, _RawFloat):
        return json.dumps(value, ensure_ascii=False)
    return _json_text(value)


def _timestamp(text: str, zone: ZoneInfo) -> dt.datetime | None:
    """Spark's default timestamp parsing of JSON text (ISO-8601; no zone: the session's)."""
    try:
        stamp = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=zone)
    return stamp.astimezone(dt.timezone.utc)


@dataclass
class ToJson(Expr):
    child: Expr
    zone: str
    type: pa.DataType = field(default_factory=pa.string)

    def eval(self, columns, n):
        values = self.child.eval(columns, n)
        write = self.__dict__.get("_write")
        if write is None:       # (made once, in the process that evaluates: never pickled)
            write = self.__dict__["_write"] = _json_writer(values.type, ZoneInfo(self.zone))
        return pa.array([None if row is None else write(row) for row in values.to_pylist()], pa.string())


def _json_written(value: Any, t: pa.DataType, zone: ZoneInfo) -> str:
    """A value of the types ``_json_writer`` leaves to it, as Spark's JSON generator writes it."""
    if pa.types.is_boolean(t):
        return "true" if value else "false"
    if pa.types.is_floating(t):
        return java_double_text(value)
    if pa.types.is_decimal(t):
        return str(value)       # (BigDecimal.toString and Python's str follow the same spec)
    if pa.types.is_binary(t):
        return '"' + base64.b64encode(value).decode() + '"'
    raise NotEvaluable(f"to_json of {t}")


# -- the expressions from Spark's JSON -----------------------------------------------------------------------
@dataclass
class _Context:
    ansi: bool
    zone: str
    types: dict              # exprId -> Arrow type, of every attribute seen
    #: per relation of the plan (in pre-order), whether it is the source the tasks read (a
    #: union's branches that read it); None: every relation is
    source: list | None = None


def _compile(node: dict, ctx: _Context) -> Expr:   # noqa: C901 - one case an expression
    kind = _kind(node)
    kids = node["_children"]

    def child(name: str = "child") -> Expr:
        return _compile(kids[node[name]], ctx)

    if kind == "AttributeReference":
        t = arrow_type(node["dataType"])
        ctx.types.setdefault(_expr_id(node), t)
        return Column(_expr_id(node), t)
    if kind == "Alias":
        return child()
    if kind == "Literal":
        return _literal(node)
    if kind in ("Cast", "AnsiCast"):
        eval_mode = node.get("evalMode")
        ansi = ctx.ansi if eval_mode in (None, "") else eval_mode == "ANSI"
        if eval_mode == "TRY":
            raise NotEvaluable("try_cast")
        return Cast(child(), arrow_type(node["dataType"]), ansi)
    if kind in ("Add", "Subtract", "Multiply", "Divide", "Remainder"):
        if node.get("evalMode") == "TRY":
            raise NotEvaluable(f"try_{kind.lower()}")
        left, right = child("left"), child("right")
        if kind == "Divide" and not pa.types.is_floating(left.type):
            raise NotEvaluable(f"Divide of {_spark_name(left.type)}")
        t = _decimal_result(kind, left.type, right.type) if pa.types.is_decimal(left.type) else left.type
        if pa.types.is_decimal(t) and kind in ("Divide", "Remainder"):
            raise NotEvaluable(f"{kind} of decimals")
        return Arithmetic(kind, left, right, t, ctx.ansi)
    if kind == "UnaryMinus":
        c = child()
        return Negate(c, c.type, ctx.ansi)
    if kind in _COMPARISONS:
        return Compare(_COMPARISONS[kind], child("left"), child("right"))
    if kind == "EqualNullSafe":
        return NullSafeEqual(child("left"), child("right"))
    if kind in ("And", "Or"):
        return Compare("and_kleene" if kind == "And" else "or_kleene", child("left"), child("right"))
    if kind == "Not":
        return Unary("invert", child(), pa.bool_())
    if kind == "IsNull":
        return Unary("is_null", child(), pa.bool_())
    if kind == "IsNotNull":
        return Unary("is_valid", child(), pa.bool_())
    if kind in ("Upper", "Lower"):
        c = child()
        return Unary("utf8_upper" if kind == "Upper" else "utf8_lower", c, c.type)
    if kind == "In":
        value = _compile(kids[0], ctx)
        items = [_constant(_compile(k, ctx)) for k in kids[1:]]
        if any(i is _NOT_CONSTANT for i in items):
            raise NotEvaluable("IN with values that are not constants")
        present = [i for i in items if i is not None]
        return In(value, present, len(present) < len(items))
    if kind == "InSet":
        raise NotEvaluable("InSet")
    if kind == "If":
        condition, yes, no = (_compile(k, ctx) for k in kids)
        return CaseWhen([(condition, yes)], no, yes.type)
    if kind == "CaseWhen":
        compiled = [_compile(k, ctx) for k in kids]
        pairs = [(compiled[i], compiled[i + 1]) for i in range(0, len(compiled) - 1, 2)]
        otherwise = compiled[-1] if len(compiled) % 2 else None
        return CaseWhen(pairs, otherwise, pairs[0][1].type)
    if kind == "Coalesce":
        compiled = [_compile(k, ctx) for k in kids]
        return Coalesce(compiled, compiled[0].type)
    if kind == "Concat":
        compiled = [_compile(k, ctx) for k in kids]
        if not all(pa.types.is_string(c.type) for c in compiled):
            raise NotEvaluable("concat of values that are not strings")
        return Concat(compiled)
    if kind == "GetStructField":
        c = child()
        ordinal = int(node["ordinal"])
        return StructField(c, ordinal, c.type.field(ordinal).type)
    if kind == "CreateNamedStruct":
        compiled = [_compile(k, ctx) for k in kids]
        names, values = compiled[0::2], compiled[1::2]
        if not all(isinstance(n, Literal) for n in names):
            raise NotEvaluable("struct(...) with computed field names")
        t = pa.struct([pa.field(n.value, v.type) for n, v in zip(names, values)])
        return MakeStruct([n.value for n in names], values, t)
    if kind == "JsonToStructs":
        if node.get("options"):
            raise NotEvaluable("from_json with options")
        schema = arrow_type(node["schema"])
        c = child()
        if not pa.types.is_string(c.type):
            raise NotEvaluable("from_json of a value that is not a string")
        return FromJson(c, schema, node.get("timeZoneId") or ctx.zone)
    if kind == "StructsToJson":
        if node.get("options"):
            raise NotEvaluable("to_json with options")
        c = child()
        if not pa.types.is_struct(c.type):
            raise NotEvaluable("to_json of a value that is not a struct")
        _check_writable(c.type)
        return ToJson(c, node.get("timeZoneId") or ctx.zone)
    raise NotEvaluable(kind)


_NOT_CONSTANT = object()


def _constant(expr: Expr) -> Any:
    """The value of an expression of no column (a literal, a cast of one), or _NOT_CONSTANT."""
    try:
        return expr.eval({}, 1)[0].as_py()
    except KeyError:
        return _NOT_CONSTANT


def _check_writable(t: pa.DataType) -> None:
    for f in t:
        if pa.types.is_struct(f.type):
            _check_writable(f.type)
        elif not (pa.types.is_string(f.type) or pa.types.is_boolean(f.type) or pa.types.is_integer(f.type)
                  or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
                  or pa.types.is_timestamp(f.type) or pa.types.is_binary(f.type)):
            raise NotEvaluable(f"to_json of a {f.type} field")


# -- the plan -------------------------------------------------------------------------------------------
@dataclass
class _Input:
    ids: list[int]
    names: list[str] = field(default_factory=list)


@dataclass
class _Concat:
    """A union's branches that read this source (each a projection to the union's
    columns), their rows one after another."""
    children: list


@dataclass
class _Project:
    child: Any
    outputs: list            # [(exprId, name, Expr)]


@dataclass
class _Filter:
    child: Any
    condition: Expr


def _compile_plan(node: dict, ctx: _Context) -> Any:
    kind = _kind(node)
    if not node["_children"]:
        ids, names = [], []
        for attribute in node.get("output") or []:
            head = attribute[0]
            ctx.types[_expr_id(head)] = arrow_type(head["dataType"])
            ids.append(_expr_id(head))
            names.append(head.get("name", ""))
        if not ids:
            raise NotEvaluable(f"the relation {kind}")
        return _Input(ids, names)
    if kind == "Union" and not node.get("byName") and not node.get("allowMissingCol"):
        return _union(node, ctx)
    if kind in ("SubqueryAlias", "EventTimeWatermark", "Project", "Filter") and len(node["_children"]) == 1:
        child = _compile_plan(node["_children"][0], ctx)
        if kind == "Project":
            outputs = []
            for nodes in node["projectList"]:
                head, _ = _tree(nodes)
                name = head.get("name", "")
                expr_id = _expr_id(head) if "exprId" in head else None
                outputs.append((expr_id, name, _compile(head, ctx)))
            return _Project(child, outputs)
        if kind == "Filter":
            condition, _ = _tree(node["condition"])
            return _Filter(child, _compile(condition, ctx))
        return child     # (a name for the plan; a stateless query's watermark changes no row)
    raise NotEvaluable(kind)


def _outputs(plan: Any, ctx: _Context) -> list[tuple[int, str, pa.DataType]]:
    """A compiled plan's output columns: (exprId, name, type) each."""
    if isinstance(plan, _Input):
        return [(i, name, ctx.types[i]) for i, name in zip(plan.ids, plan.names)]
    if isinstance(plan, _Project):
        return [(expr_id, name, expr.type) for expr_id, name, expr in plan.outputs]
    return _outputs(plan.child, ctx)


def _numbered_leaves(node: dict, start: int = 0) -> int:
    """Each relation under ``node`` (Spark's JSON) numbered in pre-order (``_leaf``); the
    next number."""
    if not node["_children"]:
        node["_leaf"] = start
        return start + 1
    for child in node["_children"]:
        start = _numbered_leaves(child, start)
    return start


def _reads_source(node: dict, ctx: _Context) -> bool:
    if not node["_children"]:
        return ctx.source[node["_leaf"]]
    return any(_reads_source(child, ctx) for child in node["_children"])


def _union(node: dict, ctx: _Context) -> Any:
    """A union (by position) as this source's tasks evaluate it: the branches that read the
    source (``ctx.source``: whether each relation is it; None: every branch), each projected
    to the union's columns (its first child's exprIds, as Spark's Union outputs them), their
    rows one after another."""
    children = node["_children"]
    first = _outputs(_compile_plan(children[0], ctx), ctx)
    branches = []
    for child in children:
        if ctx.source is not None and not _reads_source(child, ctx):
            continue
        plan = _compile_plan(child, ctx)
        own = _outputs(plan, ctx)
        if len(own) != len(first) or any(o[2] != f[2] for o, f in zip(own, first)):
            raise NotEvaluable("a union of branches of other columns")
        branches.append(_Project(plan, [(first_id, name, Column(own_id, kind))
                                        for (first_id, name, kind), (own_id, _, _) in zip(first, own)]))
    if not branches:
        raise NotEvaluable("a union none of whose branches reads the source")
    if len(branches) == 1:
        return branches[0]
    return _Project(_Concat(branches), [(first_id, name, Column(first_id, kind)) for first_id, name, kind in first])


#: (the key of each row's input row index beside the columns)
_ROW = "row"


@dataclass
class ArrowSteps:
    """The steps as one function of Arrow batches (picklable: it goes to the tasks)."""

    plan: Any
    names: list[str]
    schema: pa.Schema

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return self.rows(batch)[0]

    def rows(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.Array]:
        """The output of ``batch``, and for each output row the index of its input row."""
        columns, ids, n = self._run(self.plan, batch)
        out = pa.RecordBatch.from_arrays([columns[i] for i in ids], schema=self.schema)
        return out, columns[_ROW]

    def _run(self, node: Any, batch: pa.RecordBatch) -> tuple[dict, list, int]:
        if isinstance(node, _Input):
            columns = {i: batch.column(k) for k, i in enumerate(node.ids)}
            columns[_ROW] = pa.array(range(batch.num_rows), pa.int64())
            return columns, node.ids, batch.num_rows
        if isinstance(node, _Concat):
            parts = [self._run(child, batch) for child in node.children]
            ids = parts[0][1]
            columns = {key: pa.concat_arrays([part[0][key] for part in parts]) for key in (*ids, _ROW)}
            return columns, ids, sum(part[2] for part in parts)
        columns, ids, n = self._run(node.child, batch)
        if isinstance(node, _Filter):
            keep = pc.fill_null(node.condition.eval(columns, n), False)
            kept = {i: pc.filter(a, keep) for i, a in columns.items()}
            return kept, ids, len(kept[_ROW])
        out = {_ROW: columns[_ROW]}
        order = []
        for k, (expr_id, _, expr) in enumerate(node.outputs):
            key = expr_id if expr_id is not None else -1 - k
            values = expr.eval(columns, n)
            out[key] = values if isinstance(values, pa.Array) else values.combine_chunks()
            order.append(key)
        return out, order, n


def compile_steps(plan_json: list[dict], *, ansi: bool, zone: str, source: list[bool] | None = None) -> ArrowSteps:
    """Spark's JSON of the steps' analysed plan as ``ArrowSteps`` (``NotEvaluable`` names
    the first plan node or expression it does not evaluate). ``source``: where the plan
    reads several relations (a union of sources), whether each (in the plan's pre-order)
    is the one the tasks read: the union's branches that read it are theirs. (By position,
    not by attribute: Spark's analysis gives a relation read in two branches new
    attributes in the second.)"""
    root, _ = _tree(plan_json)
    if source is not None and _numbered_leaves(root) != len(source):
        raise NotEvaluable("a plan whose relations are not the query's sources, one a read")
    ctx = _Context(ansi=ansi, zone=zone, types={}, source=source)
    plan = _compile_plan(root, ctx)
    if isinstance(plan, _Project):
        names = [name for _, name, _ in plan.outputs]
        fields = [pa.field(name, expr.type) for _, name, expr in plan.outputs]
    else:
        raise NotEvaluable("a plan whose top is not a projection")
    return ArrowSteps(plan, names, pa.schema(fields))
