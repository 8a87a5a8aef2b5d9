"""Exceptions raised by microbatch.

They subclass PySpark's own exception classes, so code ported from Structured
Streaming that catches ``pyspark.errors.AnalysisException`` or
``pyspark.errors.StreamingQueryException`` keeps working.
"""
from __future__ import annotations

from pyspark.errors import AnalysisException as _PySparkAnalysisException
from pyspark.errors import StreamingQueryException as _PySparkStreamingQueryException


class AnalysisException(_PySparkAnalysisException):
    """A query, option or checkpoint that cannot work, found before or at start."""

    def __init__(self, message: str):
        super().__init__(message=message)


class UnsupportedOperationError(AnalysisException):
    """An operation Spark supports on streams that microbatch does not implement yet,
    or one that no stream supports."""


class CheckpointError(AnalysisException):
    """A checkpoint that cannot be read or does not belong to this query."""


class ConcurrentUpdateError(CheckpointError, AssertionError):
    """Two runs wrote the same batch of one checkpoint (Spark raises an AssertionError)."""


class StreamingQueryException(_PySparkStreamingQueryException):
    """The exception that stopped a query; ``cause`` is the original error."""

    def __init__(self, message: str, cause: BaseException | None = None,
                 query_desc: str = ""):
        super().__init__(message=message)
        self.cause = cause
        self.desc = message
        self.query_desc = query_desc
        if cause is not None:
            self.__cause__ = cause


from pyspark.errors import IllegalArgumentException as _PySparkIllegalArgumentException  # noqa: E402


class IllegalArgumentException(_PySparkIllegalArgumentException, ValueError):
    """A bad option value or argument (Spark raises IllegalArgumentException)."""

    def __init__(self, message: str):
        super().__init__(message=message)
