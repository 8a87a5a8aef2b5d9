"""microbatch: Spark Structured Streaming's micro-batch engine, in Python, on Spark batch jobs.

    from microbatch import StreamingSession
    ss = StreamingSession(spark)          # or StreamingSession() for an embedded local Spark
    q = ss.readStream.format("rate").load().writeStream.format("console").start()
"""
from microbatch.api.frame import StreamFrame
from microbatch.api.manager import StreamingQueryManager
from microbatch.api.memory import MemoryStream
from microbatch.api.query import StreamingQuery
from microbatch.api.reader import DataStreamReader
from microbatch.api.session import StreamingSession, embedded_spark
from microbatch.api.writer import DataStreamWriter
from pyspark.errors import StreamingQueryException

from microbatch.errors import (AnalysisException, CheckpointError, IllegalArgumentException,
                               UnsupportedOperationError)
from microbatch.runtime.clock import ManualClock, SystemClock
from microbatch.runtime.events import (QueryIdleEvent, QueryProgressEvent, QueryStartedEvent,
                                         QueryTerminatedEvent, StreamingQueryListener)
from microbatch.runtime.triggers import Trigger
from microbatch import python_worker

python_worker.install()

__version__ = "0.1.0"

__all__ = [
    "StreamingSession", "embedded_spark", "DataStreamReader", "StreamFrame", "DataStreamWriter",
    "StreamingQuery", "StreamingQueryManager", "MemoryStream", "Trigger", "ManualClock",
    "SystemClock", "StreamingQueryListener", "QueryStartedEvent", "QueryProgressEvent",
    "QueryIdleEvent", "QueryTerminatedEvent", "AnalysisException", "CheckpointError",
    "IllegalArgumentException", "StreamingQueryException", "UnsupportedOperationError",
]
