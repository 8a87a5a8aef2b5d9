"""Spark's exceptions as PySpark raises them: built in the JVM from Spark's error
catalogue, so users get PySpark's own exception objects with Spark's conditions."""
from __future__ import annotations

import contextlib
import logging
import traceback
from typing import Any, Iterator

from microbatch.spark_internals.jvm import SparkContext   # (None in PySpark's Connect-only client)
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException, convert_exception

from microbatch.spark_internals.jvm import _jvm, scala_map
from microbatch.spark_internals.versions import running_version


#: JVM exception classes by the short names this module takes; each is built with
#: ``(errorClass, messageParameters)`` and formatted from Spark's error catalogue.
_ERROR_CLASSES = {
    "AnalysisException": "org.apache.spark.sql.AnalysisException",
    "SparkIllegalArgumentException": "org.apache.spark.SparkIllegalArgumentException",
    "SparkUnsupportedOperationException": "org.apache.spark.SparkUnsupportedOperationException",
}


#: What Spark 3.5 raises where later Sparks raise these error classes (its own legacy
#: class, or a message without one), by class: (kind, class or None, message template)
_BEFORE_4_0 = {
    "STREAMING_OUTPUT_MODE.INVALID": (
        "SparkIllegalArgumentException", None,
        "Unknown output mode {outputMode}. Accepted output modes are 'append', 'complete', 'update'"),
    "STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE": ("AnalysisException", "_LEGACY_ERROR_TEMP_1131", None),
}
#: Spark 3.5's messages of an output mode's unsupported operations, by (mode, operation)
_OUTPUT_MODE_BEFORE_4_0 = {
    ("complete", "no streaming aggregations"):
        "Complete output mode not supported when there are no streaming aggregations on streaming "
        "DataFrames/Datasets;",
    ("append", "streaming aggregations without watermark"):
        "Append output mode not supported when there are streaming aggregations on streaming "
        "DataFrames/DataSets without watermark;",
    ("update", "session window streaming aggregations"):
        "Update output mode not supported for session window on streaming DataFrames/DataSets;",
}


def _known_error_class(error_class: str) -> bool:
    """Whether the running Spark's error catalogue has ``error_class`` (every class
    microbatch raises is in 4.0's)."""
    if running_version().at_least_4:
        return True
    try:
        getattr(_jvm(), "org.apache.spark.SparkThrowableHelper").errorReader().getMessageTemplate(error_class)
    except Exception as e:  # noqa: BLE001 (py4j wraps Spark's INTERNAL_ERROR)
        return "Cannot find" not in str(e)
    return True


def _message_exception(kind: str, message: str) -> CapturedException:
    """Spark 3.5's exception of ``kind`` with a message and no error class."""
    jvm = _jvm()
    none = jvm.scala.Option.apply(None)
    if kind == "AnalysisException":
        jexception = jvm.org.apache.spark.sql.AnalysisException(   # (message, line, position, cause, class, ...)
            message, none, none, none, none, scala_map({}), _empty_query_contexts())
    else:
        jexception = jvm.java.lang.IllegalArgumentException(message)
    return convert_exception(jexception)


def spark_error(kind: str, error_class: str, **parameters: Any) -> CapturedException:
    """Spark's exception for ``error_class`` with its catalogued message, as PySpark
    raises it (e.g. ``pyspark.errors.AnalysisException`` with ``getCondition()``). On a
    Spark whose catalogue lacks the class (3.5), what that Spark raises in its place."""
    if not _known_error_class(error_class):
        if error_class == "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION":
            message = _OUTPUT_MODE_BEFORE_4_0.get((parameters["outputMode"], parameters["operation"]))
            if message is not None:
                return _message_exception(kind, message)
        kind, legacy_class, template = _BEFORE_4_0.get(error_class, (kind, None, None))
        if legacy_class is not None:
            return spark_error(kind, legacy_class, **parameters)
        if template is None:   # a feature 3.5 lacks (refused before): Spark 4's class, named
            template = f"[{error_class}] " + ", ".join(f"{k}={{{k}}}" for k in parameters)
        return _message_exception(kind, template.format(**parameters))
    params = scala_map({k: str(v) for k, v in parameters.items()})
    if kind == "SparkIllegalArgumentException" and not running_version().at_least_4:
        # 3.5: (class, parameters, contexts, summary, cause)
        jexception = _jvm().org.apache.spark.SparkIllegalArgumentException(
            error_class, params, _empty_query_contexts(), "", None)
    elif kind == "SparkRuntimeException":
        jexception = _jvm().org.apache.spark.SparkRuntimeException(
            error_class, params, None, _empty_query_contexts(), "")
    elif kind == "SparkIllegalStateException":   # (class, parameters, contexts, cause, summary)
        jexception = _jvm().org.apache.spark.SparkIllegalStateException(
            error_class, params, _empty_query_contexts(), None, _jvm().scala.Option.apply(None))
    else:
        constructor = _jvm()
        for part in _ERROR_CLASSES[kind].split("."):
            constructor = getattr(constructor, part)
        jexception = constructor(error_class, params)
    exception = convert_exception(jexception)
    if getattr(exception, "_origin", None) is None:
        # PySpark converts a class it does not know (SparkIllegalStateException) to an
        # UnknownException without its origin, whose getCondition() is then None
        exception._origin = jexception
    return exception


#: where Spark keeps the errors of its state data source and of its state stores
_STATE_ERRORS = {
    "source": "org.apache.spark.sql.execution.datasources.v2.state.StateDataSourceErrors$",
    "store": "org.apache.spark.sql.execution.streaming.state.StateStoreErrors$",
}


def state_reader_error(kind: str, method: str, *args: Any) -> CapturedException:
    """The exception Spark's state data source raises, built by Spark's own factory
    (``StateDataSourceErrors.<method>`` for ``kind`` "source", ``StateStoreErrors`` for
    "store"), so its class, condition and message are Spark's: e.g.
    ``state_reader_error("source", "conflictOptions", ["joinSide", "storeName"])``. A list
    argument is passed as a Scala ``Seq``."""
    from microbatch.spark_internals.jvm import jvm_class
    converted = []
    for arg in args:
        if isinstance(arg, (list, tuple)):
            java_list = jvm_class("java.util.ArrayList")()
            for item in arg:
                java_list.add(item)
            arg = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq(java_list)
        converted.append(arg)
    jexception = getattr(jvm_class(_STATE_ERRORS[kind]), method)(*converted)
    exception = convert_exception(jexception)
    if getattr(exception, "_origin", None) is None:
        exception._origin = jexception
    return exception


def jvm_throwable(error: BaseException) -> Any:
    """The JVM exception behind ``error``, or a JVM stand-in for a Python one.

    An error that came from a Spark job or from Spark's analyzer has its JVM exception
    (PySpark keeps it as ``_origin``); it is used as it is. A Python error becomes a
    ``SparkException`` carrying its message, error class and parameters (when it is a
    ``PySparkException``), with the Python frames as its stack trace, so the JVM's
    exception strings (``QueryTerminatedEvent.exception``) show where it happened."""
    origin = getattr(error, "_origin", None)
    if origin is not None:
        return origin
    java_exception = getattr(error, "java_exception", None)   # py4j.protocol.Py4JJavaError
    if java_exception is not None:
        return java_exception
    jvm = _jvm()
    error_class = params = None
    if isinstance(error, PySparkException):
        error_class = error.getCondition()
        params = error.getMessageParameters()
    message = str(error) if error_class else f"{type(error).__name__}: {error}"
    option = jvm.scala.Option
    cause = getattr(error.__cause__, "_origin", None)   # e.g. the Spark job a task error failed
    jexception = jvm.org.apache.spark.SparkException(
        message, cause, option.apply(error_class), scala_map(params or {}),
        _empty_query_contexts())
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    elements = SparkContext._gateway.new_array(jvm.java.lang.StackTraceElement, len(frames))
    for i, frame in enumerate(reversed(frames)):
        elements[i] = jvm.java.lang.StackTraceElement(
            frame.filename.rsplit("/", 1)[-1].removesuffix(".py"), frame.name,
            frame.filename, frame.lineno or -1)
    jexception.setStackTrace(elements)
    return jexception


def _empty_query_contexts() -> Any:
    return SparkContext._gateway.new_array(_jvm().org.apache.spark.QueryContext, 0)


def python_proxy_error(error: BaseException) -> Any:
    """What the JVM sees when Python code it called raised (py4j's proxy error): the
    message carries the Python traceback, as for a Spark ``foreachBatch`` function."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return _jvm().py4j.Py4JException(
        "An exception was raised by the Python Proxy. Return Message: " + text)


def foreach_batch_user_error(batch: Any, error: BaseException) -> Any:
    """Spark's ``FOREACH_BATCH_USER_FUNCTION_ERROR`` around a user function's error
    (Spark 3.5 fails the query with the Python proxy's error itself). ``batch`` is the
    DataFrame the function was given (the seam's choice of side)."""
    cause = python_proxy_error(error)
    if not running_version().at_least_4:
        return cause
    jvm = _jvm()
    return jvm.org.apache.spark.sql.execution.streaming.sources.ForeachBatchUserFuncException(cause)


def is_foreach_user_error(jexception: Any) -> bool:
    name = jexception.getClass().getName()
    return name.endswith(".ForeachBatchUserFuncException") or name.endswith(".ForeachUserFuncException")


def error_condition(jexception: Any) -> str | None:
    """The error class of a JVM exception, if it is a ``SparkThrowable``."""
    from py4j.java_gateway import is_instance_of
    if is_instance_of(SparkContext._gateway, jexception, "org.apache.spark.SparkThrowable"):
        return _jvm().PythonErrorUtils.getCondition(jexception)
    return None


def exception_string(jexception: Any) -> str:
    """Spark's ``Utils.exceptionString``: class, message and stack trace."""
    return getattr(_jvm(), "org.apache.spark.util.Utils").exceptionString(jexception)


def streaming_query_exception(debug_string: str, cause: Any, start_offsets: str,
                              end_offsets: str, query_id: str, run_id: str,
                              message: str) -> Any:
    """Spark's ``StreamingQueryException`` (``STREAM_FAILED``) as the JVM builds it."""
    return _jvm().org.apache.spark.sql.streaming.StreamingQueryException(
        debug_string, cause, start_offsets, end_offsets, "STREAM_FAILED",
        scala_map({"id": query_id, "runId": run_id, "message": message}))


def captured(jexception: Any) -> CapturedException:
    """PySpark's exception for a JVM one, as py4j calls raise it."""
    return convert_exception(jexception)


def exception_message(jexception: Any) -> str:
    """A JVM exception's message ("" without one)."""
    return jexception.getMessage() or ""


def user_error_cause(jexception: Any) -> Any:
    """What a query's failure names as its cause: a foreach/foreachBatch user function's
    own error (Spark unwraps it; the error class stays FOREACH_BATCH_USER_FUNCTION_ERROR),
    else the exception itself."""
    return jexception.getCause() if is_foreach_user_error(jexception) else jexception


def cause_string(jexception: Any) -> str:
    """The cause of a query's ``StreamingQueryException`` as Spark's listener events give it."""
    return exception_string(jexception.getCause())


def query_exception(jexception: Any) -> CapturedException:
    """PySpark's ``StreamingQueryException`` for a JVM one, as PySpark's
    ``StreamingQuery.exception()`` builds it (message, stack trace, cause converted)."""
    from pyspark.errors.exceptions.captured import StreamingQueryException
    message = jexception.toString().split(": ", 1)[1]
    stack_trace = "\n\t at ".join(e.toString() for e in jexception.getStackTrace())
    return StreamingQueryException(message, stack_trace, jexception.getCause())


def java_exception(class_name: str, message: str, called: str | None = None) -> Exception:
    """A plain Java exception (``java.lang.IllegalStateException``,
    ``java.util.concurrent.TimeoutException``) with ``message``, as PySpark raises it when
    Spark throws one: a class PySpark does not know is its ``UnknownException``; or, for a
    call PySpark makes without converting what it throws (``called``, e.g. ``"start"``:
    DataStreamWriter.start), py4j's own ``Py4JJavaError`` for that call."""
    constructor = _jvm()
    for part in class_name.split("."):
        constructor = getattr(constructor, part)
    jexception = constructor(message)
    if called is not None:
        from py4j.protocol import Py4JJavaError
        return Py4JJavaError(f"An error occurred while calling o0.{called}.\n", jexception)
    return convert_exception(jexception)


@contextlib.contextmanager
def refusals_not_logged() -> Iterator[None]:
    """A block whose refused queries are results, not each logged: PySpark's loggers of a
    failed query's context quiet and py4j's bridge at warnings (the levels restored after)."""
    try:   # (PySpark's loggers take keywords a plain Logger does not: made by PySpark's class)
        from pyspark.logger import PySparkLogger
        make = PySparkLogger.getLogger
    except ImportError:   # PySpark 3.5
        make = logging.getLogger
    levels = {make("SQLQueryContextLogger"): logging.CRITICAL,
              make("DataFrameQueryContextLogger"): logging.CRITICAL,
              logging.getLogger("py4j"): logging.WARNING}
    before = {logger: logger.level for logger in levels}
    for logger, level in levels.items():
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, level in before.items():
            logger.setLevel(level)
