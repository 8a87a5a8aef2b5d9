"""microbatch: Spark Structured Streaming's micro-batch engine, in Python, on Spark batch jobs.

    from microbatch import StreamingSession
    ss = StreamingSession(spark)          # or StreamingSession() for an embedded local Spark
    q = ss.readStream.format("rate").load().writeStream.format("console").start()

The names below are imported on first use (PEP 562), not with the package: a PySpark
worker process imports ``microbatch`` when it unpickles a task's function, and needs only
that function's modules, not the API, its connectors, the dashboard's web framework and
the terminal's (about a second of imports a process).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from microbatch import python_worker

python_worker.install()

__version__ = "0.1.0"

#: each public name, by the module it is defined in
_HOMES = {
    "StreamFrame": "microbatch.api.frame",
    "StreamingQueryManager": "microbatch.api.manager",
    "MemoryStream": "microbatch.api.memory",
    "StreamingQuery": "microbatch.api.query",
    "DataStreamReader": "microbatch.api.reader",
    "StreamingSession": "microbatch.api.session",
    "embedded_spark": "microbatch.api.session",
    "DataStreamWriter": "microbatch.api.writer",
    "StreamingQueryException": "pyspark.errors",
    "AnalysisException": "microbatch.errors",
    "CheckpointError": "microbatch.errors",
    "IllegalArgumentException": "microbatch.errors",
    "UnsupportedOperationError": "microbatch.errors",
    "ManualClock": "microbatch.runtime.clock",
    "SystemClock": "microbatch.runtime.clock",
    "QueryIdleEvent": "microbatch.runtime.events",
    "QueryProgressEvent": "microbatch.runtime.events",
    "QueryStartedEvent": "microbatch.runtime.events",
    "QueryTerminatedEvent": "microbatch.runtime.events",
    "StreamingQueryListener": "microbatch.runtime.events",
    "Trigger": "microbatch.runtime.triggers",
}

__all__ = [
    "StreamingSession", "embedded_spark", "DataStreamReader", "StreamFrame", "DataStreamWriter",
    "StreamingQuery", "StreamingQueryManager", "MemoryStream", "Trigger", "ManualClock",
    "SystemClock", "StreamingQueryListener", "QueryStartedEvent", "QueryProgressEvent",
    "QueryIdleEvent", "QueryTerminatedEvent", "AnalysisException", "CheckpointError",
    "IllegalArgumentException", "StreamingQueryException", "UnsupportedOperationError",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'microbatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from pyspark.errors import StreamingQueryException

    from microbatch.api.frame import StreamFrame
    from microbatch.api.manager import StreamingQueryManager
    from microbatch.api.memory import MemoryStream
    from microbatch.api.query import StreamingQuery
    from microbatch.api.reader import DataStreamReader
    from microbatch.api.session import StreamingSession, embedded_spark
    from microbatch.api.writer import DataStreamWriter
    from microbatch.errors import AnalysisException, CheckpointError, IllegalArgumentException, UnsupportedOperationError
    from microbatch.runtime.clock import ManualClock, SystemClock
    from microbatch.runtime.events import (QueryIdleEvent, QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent,
                                           StreamingQueryListener)
    from microbatch.runtime.triggers import Trigger
