"""The batch's time in a Connect DataFrame: ``current_timestamp()``, ``now()``,
``current_date()``/``curdate()`` and ``localtimestamp()`` replaced by the batch timestamp,
as Spark's engine replaces them (``CurrentBatchTimestamp``) and the classic side does in the
analysed plan (``binding.with_batch_timestamp``).

A Connect client has no analysed plan to transform: the DataFrame's plan is sent as
protobuf messages, so the replacement is made there. Each call of one of those functions
(``UnresolvedFunction`` without arguments) becomes a literal of the batch's time; in SQL
text inside the plan (``F.expr``, ``selectExpr``, a filter's string) each call becomes a
SQL literal. The server then analyses a plan that reads no clock.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any
from zoneinfo import ZoneInfo

#: function name -> the literal's kind (Spark's CurrentBatchTimestamp's data type)
_FUNCTIONS = {"current_timestamp": "timestamp", "now": "timestamp", "current_date": "date",
              "curdate": "date", "localtimestamp": "timestamp_ntz"}
#: a call in SQL text: the name, with its parentheses or (Spark's SQL keywords) without
_IN_SQL = re.compile(r"\b(current_timestamp|now|current_date|curdate|localtimestamp)\b(\s*\(\s*\))?",
                     re.IGNORECASE)
#: the functions SQL allows without parentheses (the others are plain names then)
_KEYWORDS = {"current_timestamp", "current_date", "localtimestamp"}


def with_batch_timestamp(spark: Any, df: Any, timestamp_ms: int) -> Any:
    """``df`` (a Connect DataFrame) with its current-time calls as the batch's time."""
    from pyspark.sql.connect.dataframe import DataFrame

    zone = ZoneInfo(spark.conf.get("spark.sql.session.timeZone"))
    at = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.timezone.utc)
    local = at.astimezone(zone)
    values = {"timestamp": timestamp_ms * 1000,
              "date": (local.date() - dt.date(1970, 1, 1)).days,
              "timestamp_ntz": _micros_of_wall_clock(local)}
    texts = {"timestamp": f"timestamp_millis({timestamp_ms})",
             "date": f"DATE'{local.date().isoformat()}'",
             "timestamp_ntz": f"TIMESTAMP_NTZ'{local.replace(tzinfo=None).isoformat(sep=' ')}'"}
    relation = df._plan.plan(df._session.client)
    _replace(relation, values, texts)
    return DataFrame(_as_plan(relation), df._session)


def _micros_of_wall_clock(local: dt.datetime) -> int:
    wall = local.replace(tzinfo=None) - dt.datetime(1970, 1, 1)
    return (wall.days * 86_400 + wall.seconds) * 1_000_000 + wall.microseconds


def _replace(message: Any, values: dict[str, int], texts: dict[str, str]) -> None:
    """Every current-time call under ``message`` (a protobuf message), in place."""
    name = message.DESCRIPTOR.full_name
    if name == "spark.connect.Expression":
        if message.WhichOneof("expr_type") == "unresolved_function":
            function = message.unresolved_function
            kind = _FUNCTIONS.get(function.function_name.lower())
            if kind is not None and not function.arguments:
                message.Clear()
                setattr(message.literal, kind, values[kind])
                return
        if message.WhichOneof("expr_type") == "expression_string":
            message.expression_string.expression = _in_sql(message.expression_string.expression, texts)
            return
    if name == "spark.connect.SQL":
        message.query = _in_sql(message.query, texts)
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if field.label == field.LABEL_REPEATED:
            items = value.values() if field.message_type.GetOptions().map_entry else value
            for item in items:
                if hasattr(item, "DESCRIPTOR"):
                    _replace(item, values, texts)
        else:
            _replace(value, values, texts)


def _in_sql(text: str, texts: dict[str, str]) -> str:
    def literal(match: re.Match) -> str:
        function, called = match.group(1).lower(), match.group(2)
        if not called and function not in _KEYWORDS:
            return match.group(0)
        return texts[_FUNCTIONS[function]]
    return _IN_SQL.sub(literal, text)


def _as_plan(relation: Any) -> Any:
    """A Connect plan that is ``relation`` (a relation message) as it is."""
    from pyspark.sql.connect.plan import LogicalPlan

    class Given(LogicalPlan):
        def __init__(self, given: Any):
            super().__init__(None)
            self._given = given

        def plan(self, session: Any) -> Any:
            copied = type(self._given)()
            copied.CopyFrom(self._given)
            return copied
    return Given(relation)
