"""Spark's exceptions over Spark Connect, built in the client: the classes a Connect
client raises (``pyspark.errors.exceptions.connect``), with Spark's error conditions,
parameters, SQL states and catalogued messages, as Spark's engine on a Connect server
hands them to the client.

The classic side builds them in the JVM from Spark's catalogue; a Connect client has
no JVM, so the catalogue is read from the jar PySpark ships
(``error/error-conditions.json`` in ``spark-common-utils``). A client without the jars
(``pyspark-client``) gets the condition and its parameters in the message instead.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import re
import traceback
import zipfile
from dataclasses import dataclass
from typing import Any

from pyspark.errors import PySparkException

#: the JVM classes a server reports for each kind ``spark_error`` takes, most specific
#: first; the first one PySpark's Connect client maps is the class users get
_JVM_HIERARCHY = {
    "AnalysisException": ["org.apache.spark.sql.AnalysisException"],
    "SparkIllegalArgumentException": ["org.apache.spark.SparkIllegalArgumentException",
                                      "java.lang.IllegalArgumentException"],
    "SparkUnsupportedOperationException": ["org.apache.spark.SparkUnsupportedOperationException",
                                           "java.lang.UnsupportedOperationException"],
    "SparkRuntimeException": ["org.apache.spark.SparkRuntimeException"],
    "SparkIllegalStateException": ["org.apache.spark.SparkIllegalStateException"],
}

_PARAMETER = re.compile(r"<([a-zA-Z0-9_-]+)>")


@functools.lru_cache(maxsize=1)
def _catalogue() -> dict[str, Any]:
    """Spark's error conditions, from the jar beside the running PySpark ({} without jars)."""
    import pyspark
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    for jar in sorted(glob.glob(os.path.join(jars, "spark-common-utils_*.jar"))):
        with zipfile.ZipFile(jar) as archive:
            try:
                return json.loads(archive.read("error/error-conditions.json"))
            except KeyError:
                continue
    return {}


def catalogued_message(error_class: str, parameters: dict[str, str]) -> tuple[str, str | None]:
    """Spark's message for ``error_class`` (``[CLASS] text SQLSTATE: state``) and its SQL
    state, as ``SparkThrowableHelper.getMessage`` formats it."""
    main, _, sub = error_class.partition(".")
    info = _catalogue().get(main)
    if info is None or (sub and sub not in info.get("subClass", {})):
        listed = ", ".join(f"{k}={v}" for k, v in parameters.items())
        return f"[{error_class}] {listed}", None
    template, sql_state = "\n".join(info["message"]), info.get("sqlState")
    if sub:
        sub_info = info["subClass"][sub]
        template += " " + "\n".join(sub_info["message"])
        sql_state = sub_info.get("sqlState", sql_state)
    text = _PARAMETER.sub(lambda m: parameters.get(m.group(1), m.group(0)), template)
    prefix = "" if error_class.startswith("_LEGACY_ERROR_") else f"[{error_class}] "
    return prefix + text + (f" SQLSTATE: {sql_state}" if sql_state else ""), sql_state


def _connect_class(jvm_classes: list[str]) -> type:
    from pyspark.errors.exceptions import connect
    for name in jvm_classes:
        found = connect.EXCEPTION_CLASS_MAPPING.get(name)
        if found is not None:
            return found
    return connect.UnknownException


def spark_error(kind: str, error_class: str, **parameters: Any) -> PySparkException:
    """What a Connect client raises for Spark's ``kind`` with ``error_class`` (e.g.
    ``pyspark.errors.exceptions.connect.AnalysisException`` answering ``getCondition()``)."""
    params = {k: str(v) for k, v in parameters.items()}
    message, sql_state = catalogued_message(error_class, params)
    return _connect_class(_JVM_HIERARCHY[kind])(
        message, errorClass=error_class, messageParameters=params, sql_state=sql_state)


def foreach_batch_user_error(error: BaseException) -> PySparkException:
    """A ``foreachBatch`` function's error as Spark's engine on a Connect server reports
    it: ``PYTHON_EXCEPTION`` ("Found error inside foreachBatch Python process") with the
    function's traceback (the server runs the function in a Python process of its own;
    microbatch runs it in the client, as it always does)."""
    from pyspark.errors.exceptions import connect
    params = {"msg": "Found error inside foreachBatch Python process",
              "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))}
    message, sql_state = catalogued_message("PYTHON_EXCEPTION", params)
    return connect.PythonException(message, errorClass="PYTHON_EXCEPTION", messageParameters=params,
                                   sql_state=sql_state)


@dataclass(frozen=True)
class QueryFailure:
    """How a failed query reports its error over Connect."""
    message: str                      #: the cause's message (``STREAM_FAILED``'s ``message``)
    error_class: str | None           #: the cause's condition (``errorClassOnException``)
    raised: PySparkException          #: what ``awaitTermination`` raises
    reported: PySparkException        #: what ``exception()`` returns


def query_failure(error: BaseException, debug_string: str, query_id: str, run_id: str) -> QueryFailure:
    """The ``StreamingQueryException`` of a query that ``error`` ended, as a Connect
    client gets Spark's: ``awaitTermination`` raises it with ``STREAM_FAILED`` and the
    cause's message; ``exception()`` returns one built from the exception's string, whose
    condition is the reason in parentheses (PySpark's Connect ``exception()``)."""
    from pyspark.errors.exceptions import connect
    origin = getattr(error, "_origin", None)
    cause = origin if isinstance(origin, PySparkException) else error
    if isinstance(cause, PySparkException):
        message, error_class = str(cause), cause.getCondition()
    else:
        message, error_class = f"{type(cause).__name__}: {cause}", None
    params = {"id": query_id, "runId": run_id, "message": message}
    text, sql_state = catalogued_message("STREAM_FAILED", params)
    raised = connect.StreamingQueryException(f"{text}\n{debug_string}", errorClass="STREAM_FAILED",
                                             messageParameters=params, sql_state=sql_state)
    reported = connect.StreamingQueryException(f"{message}\n{debug_string}", reason="STREAM_FAILED")
    return QueryFailure(message, error_class, raised, reported)


def foreach_batch_command(spark: Any, func: Any) -> bytes:
    """A ``foreachBatch`` function pickled as PySpark's Connect writer pickles it in
    ``foreachBatch`` (for the server's Python process): an unpicklable one is its
    ``PySparkPicklingError`` (``STREAMING_CONNECT_SERIALIZATION_ERROR``) there.
    microbatch calls the function in the client, but a job must run on either engine."""
    import pickle

    from pyspark.errors import PySparkPicklingError
    from pyspark.serializers import CloudPickleSerializer
    try:
        return CloudPickleSerializer().dumps(func)
    except pickle.PicklingError:
        raise PySparkPicklingError(errorClass="STREAMING_CONNECT_SERIALIZATION_ERROR",
                                   messageParameters={"name": "foreachBatch"}) from None


def check_foreach_batch_command(spark: Any, command: bytes) -> None:
    """At ``start()``, the pickled function read back, as the server's Python runner reads
    it before the query starts, with the user's session ``spark`` active (a session the
    function reads unpickles as that one): one that does not unpickle is Spark's
    ``StreamingPythonRunnerInitializationException``
    (``STREAMING_PYTHON_RUNNER_INITIALIZATION_FAILURE``, the runner's -2 and traceback)."""
    from pyspark.errors.exceptions import connect
    from pyspark.serializers import CloudPickleSerializer
    active = type(spark)._active_session
    before = getattr(active, "session", None)
    active.session = spark
    try:
        CloudPickleSerializer().loads(command)
    except Exception as e:  # noqa: BLE001 - whatever unpickling raised is the runner's cause
        params = {"resFromPython": "-2",
                  "msg": "".join(traceback.format_exception(type(e), e, e.__traceback__))}
        message, sql_state = catalogued_message("STREAMING_PYTHON_RUNNER_INITIALIZATION_FAILURE", params)
        raise connect.StreamingPythonRunnerInitializationException(
            message, errorClass="STREAMING_PYTHON_RUNNER_INITIALIZATION_FAILURE", messageParameters=params,
            sql_state=sql_state) from None
    finally:
        active.session = before


#: Spark's state data source's error factories (``StateDataSourceErrors``,
#: ``StateStoreErrors``) that microbatch's state reader raises through: each method's error
#: class and its parameters' names, in the method's order (all SparkRuntimeException;
#: ``tests/test_connect_moments_table.py`` checks them against the JVM's)
_STATE_ERRORS = {
    "requiredOptionUnspecified": ("STDS_REQUIRED_OPTION_UNSPECIFIED", ("optionName",)),
    "invalidOptionValue": ("STDS_INVALID_OPTION_VALUE.WITH_MESSAGE", ("optionName", "message")),
    "invalidOptionValueIsNegative": ("STDS_INVALID_OPTION_VALUE.IS_NEGATIVE", ("optionName",)),
    "invalidOptionValueIsEmpty": ("STDS_INVALID_OPTION_VALUE.IS_EMPTY", ("optionName",)),
    "conflictOptions": ("STDS_CONFLICT_OPTIONS", ("options",)),
    "committedBatchUnavailable": ("STDS_COMMITTED_BATCH_UNAVAILABLE", ("checkpointLocation",)),
    "offsetLogUnavailable": ("STDS_OFFSET_LOG_UNAVAILABLE", ("batchId", "checkpointLocation")),
    "stateStoreSnapshotPartitionNotFound": ("CANNOT_LOAD_STATE_STORE.SNAPSHOT_PARTITION_ID_NOT_FOUND",
                                            ("snapshotPartitionId", "operatorId", "checkpointLocation")),
    "stateStoreSnapshotFileNotFound": ("CANNOT_LOAD_STATE_STORE.CANNOT_READ_MISSING_SNAPSHOT_FILE",
                                       ("fileToRead", "clazz")),
}


def state_reader_error(kind: str, method: str, *args: Any) -> PySparkException:
    """The exception Spark's state data source raises, as a Connect client raises it (the
    classic side builds it with Spark's own factory ``method``): a list argument is printed
    as Spark prints a ``Seq`` of option names, ``['a', 'b']``."""
    error_class, names = _STATE_ERRORS[method]
    values = ["[" + ", ".join(f"'{a}'" for a in arg) + "]" if isinstance(arg, (list, tuple)) else arg
              for arg in args]
    return spark_error("SparkRuntimeException", error_class, **dict(zip(names, values)))
