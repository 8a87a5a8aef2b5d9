"""Spark Connect's side of the seam: what the classic modules beside it do through py4j,
done with a Connect client's public objects (``pyspark.sql.connect``), which have no JVM
behind them. ``spark_internals`` picks this side by the type of the session, DataFrame or
Column it is given (``is_connect``). Only what the stateless and the windowed-aggregation
paths need is here; everything else is refused (``support.refuse``)."""
from __future__ import annotations

from typing import Any


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a session, DataFrame, Column, ...) is a Spark Connect client's."""
    return type(obj).__module__.startswith("pyspark.sql.connect")
