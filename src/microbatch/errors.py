"""Exceptions raised by microbatch.

Where Spark has an error class for a problem, microbatch raises Spark's own exception
(``spark_internals.spark_error``: PySpark's class, Spark's message and condition). The
classes here are for problems that are microbatch's own; they subclass PySpark's
exception classes, so code ported from Structured Streaming that catches
``pyspark.errors.AnalysisException`` keeps working. A query that fails raises PySpark's
``pyspark.errors.StreamingQueryException`` (see ``runtime.stream_execution``).
"""
from __future__ import annotations

import inspect
import re

from pyspark.errors import AnalysisException as _PySparkAnalysisException
from pyspark.errors import IllegalArgumentException as _PySparkIllegalArgumentException
from pyspark.errors import StreamingQueryException  # noqa: F401 - PySpark's, re-exported
from pyspark.errors.exceptions.captured import CapturedException


#: PySpark 4 names its exceptions' keywords errorClass/messageParameters; 3.5 error_class/...
_CAMEL_CASE_KEYWORDS = "errorClass" in inspect.signature(_PySparkAnalysisException.__init__).parameters


class AnalysisException(_PySparkAnalysisException):
    """A query, option or checkpoint that cannot work, found before or at start.
    ``error_class``: Spark's, when the problem is one Spark names (``str()`` then starts
    with ``[ERROR_CLASS]`` and ``getCondition()`` returns it)."""

    def __init__(self, message: str, error_class: str | None = None,
                 parameters: dict[str, str] | None = None):
        if _CAMEL_CASE_KEYWORDS:
            super().__init__(message=message, errorClass=error_class, messageParameters=parameters)
        else:   # PySpark 3.5 takes a message or a class, not both
            super().__init__(message=message)
            self.error_class, self.message_parameters = error_class, parameters


#: PySpark 4's messages of the error classes microbatch raises that PySpark 3.5 lacks
_CONDITIONS_AFTER_3_5 = {
    "INVALID_STREAMING_SOURCE_NAME": "Invalid streaming source name '<source_name>'. Source names must "
                                     "contain only ASCII letters, digits, and underscores.",
    "NOT_EXPECTED_TYPE": "Argument `<arg_name>` should be <expected_type>, got <arg_type>.",
    "RESULT_COLUMN_NAMES_MISMATCH": "Column names of the returned data do not match specified schema.<missing><extra>",
    "RESULT_COLUMN_SCHEMA_MISMATCH": "Number of columns of the returned data doesn't match specified schema. "
                                     "Expected: <expected> Actual: <actual>",
    "VALUE_NOT_ALLOWED": "Value for `<arg_name>` has to be amongst the following values: <allowed_values>.",
}


def pyspark_error(cls: type, condition: str, parameters: dict[str, str], message: str | None = None) -> Exception:
    """PySpark's exception ``cls`` (``PySparkValueError``, ...) with its error class
    ``condition`` (and ``message``, when not the catalogue's), as the running PySpark
    builds it: 4.x takes ``errorClass=``, 3.5 ``error_class=`` and not both a message and
    a class; a class 3.5's catalogue lacks gets PySpark 4's message and the class as
    ``getErrorClass()``."""
    if _CAMEL_CASE_KEYWORDS:
        if message is not None:
            return cls(message=message, errorClass=condition, messageParameters=parameters)
        return cls(errorClass=condition, messageParameters=parameters)
    from pyspark.errors.error_classes import ERROR_CLASSES_MAP
    if message is None and condition in ERROR_CLASSES_MAP:
        return cls(error_class=condition, message_parameters=parameters)
    if message is None:
        message = _CONDITIONS_AFTER_3_5[condition]
        for key, value in parameters.items():
            message = message.replace(f"<{key}>", str(value))
        message = f"[{condition}] {message}"
    error = cls(message=message)
    error.error_class, error.message_parameters = condition, parameters
    return error


class UnsupportedOperationError(AnalysisException):
    """An operation Spark supports on streams that microbatch does not implement yet,
    or one that no stream supports."""


class CheckpointError(AnalysisException):
    """A checkpoint that cannot be read or does not belong to this query."""


class StorageUnavailableError(CheckpointError):
    """The store of a checkpoint or an output failed past its retry limits (an outage):
    the message names the location, the attempts and the settings that bound them."""


class StorageFullError(CheckpointError):
    """A checkpoint's disk is full (ENOSPC, or a quota): the message names the file."""


class ConcurrentUpdateError(CheckpointError, AssertionError):
    """Two runs wrote the same batch of one checkpoint (Spark raises an AssertionError)."""


class IllegalArgumentException(_PySparkIllegalArgumentException, ValueError):
    """A bad option value or argument (Spark raises IllegalArgumentException)."""

    def __init__(self, message: str):
        super().__init__(message=message)


class UserFunctionError(Exception):
    """A user function of a sink failed (``foreachBatch``): raised with Spark's JVM
    ``ForeachBatchUserFuncException`` as its origin, so the query fails with Spark's
    ``FOREACH_BATCH_USER_FUNCTION_ERROR`` and the user's error as the cause."""

    def __init__(self, error: BaseException, origin):
        super().__init__(str(error))
        self._origin = origin


_RAISED_IN_WORKER = re.compile(r"^microbatch\.errors\.(\w+): (.+)$", re.MULTILINE)


def raised_in_worker(error: BaseException) -> "AnalysisException | IllegalArgumentException | None":
    """The microbatch error a Spark task raised, when ``error`` is the Spark job failure
    that carries it (PySpark's ``PythonException``, whose first line is "An exception
    was thrown from the Python worker"). A damaged state file is found in a task; the
    user must read the file and the problem first, not a worker's traceback. The job
    failure stays the returned error's ``__cause__``."""
    if not isinstance(error, CapturedException) or "Python worker" not in str(error):
        return None
    found = _RAISED_IN_WORKER.search(str(error))
    kind = globals().get(found.group(1)) if found else None
    if not (isinstance(kind, type) and issubclass(kind, (AnalysisException, IllegalArgumentException))):
        return None
    raised = kind(found.group(2))
    raised.__cause__ = error
    return raised
