"""DataStreamWriter: ``frame.writeStream....start()``.

Method by method PySpark 4.3's: the same arguments, checks and errors
(``VALUE_NOT_NON_EMPTY_STR``, ``ONLY_ALLOW_SINGLE_TRIGGER``, ``VALUE_NOT_ALLOWED``,
``ATTRIBUTE_NOT_CALLABLE``, Spark's ``STREAMING_OUTPUT_MODE.INVALID``, ...), ``None``
options ignored, and the order in which ``start(**kwargs)`` applies its arguments.
"""
from __future__ import annotations

import logging
import re
import tempfile
import uuid
from typing import Any, Callable

from pyspark.errors import PySparkTypeError, PySparkValueError

from microbatch import spark_internals
from microbatch.api.tables import TableWrite, table_location
from microbatch.checkpoint.fs import LOCAL, ObjectStoreFileSystem
from microbatch.checkpoint.stores import is_local, storage_for
from microbatch.errors import IllegalArgumentException, UnsupportedOperationError, pyspark_error
from microbatch.runtime.clock import Clock, SystemClock
from microbatch.runtime.real_time import check_real_time_query
from microbatch.runtime.triggers import (AvailableNow, Once, ProcessingTime, RealTime, Trigger,
                                         trigger_from_writer_args)
from microbatch.plan.checks import (CHECK_CORRECTNESS_CONF, check_joins_kept, check_output_mode, check_runs_over_connect,
                                    check_source_names, normalize_output_mode)
from microbatch.connectors import lookup_sink
from microbatch.sinks.base import SinkContext
from microbatch.sinks.foreach import check_foreach_writer
from microbatch.util import CaseInsensitiveOptions, option_value


log = logging.getLogger(__name__)


class DataStreamWriter:
    def __init__(self, frame: Any, session: Any, plan: Any):
        self._frame = frame          # the StreamFrame written
        self._session = session      # its StreamingSession
        self._plan = plan            # its logical plan
        self._format: str | None = None
        self._options: dict[str, str] = {}
        self._output_mode = "append"
        self._trigger: Trigger = ProcessingTime(0)
        self._query_name: str | None = None
        self._partition_by: list[str] = []
        self._cluster_by: list[str] = []
        self._extra: dict[str, Any] = {}
        self._clock: Clock | None = None
        self._fs = None   # a test's file system; otherwise the checkpoint location's
        self._checkpoint_fs = LOCAL
        self._sink = None

    def format(self, source: str) -> "DataStreamWriter":
        self._format = source
        return self

    def option(self, key: str, value: Any) -> "DataStreamWriter":
        if value is not None:
            self._options[key] = option_value(value)
        return self

    def options(self, **options: Any) -> "DataStreamWriter":
        for k, v in options.items():
            self.option(k, v)
        return self

    def outputMode(self, outputMode: str) -> "DataStreamWriter":
        if not outputMode or not isinstance(outputMode, str) or len(outputMode.strip()) == 0:
            raise pyspark_error(PySparkValueError, "VALUE_NOT_NON_EMPTY_STR", {"arg_name": "outputMode",
                                                       "arg_value": str(outputMode)})
        self._output_mode = normalize_output_mode(outputMode)
        return self

    def trigger(self, *, processingTime: str | None = None, once: bool | None = None,
                continuous: str | None = None, availableNow: bool | None = None,
                realTime: str | None = None) -> "DataStreamWriter":
        self._trigger = trigger_from_writer_args(processingTime, once, availableNow, continuous,
                                                 realTime)
        return self

    def queryName(self, queryName: str) -> "DataStreamWriter":
        if not queryName or not isinstance(queryName, str) or len(queryName.strip()) == 0:
            raise pyspark_error(PySparkValueError, "VALUE_NOT_NON_EMPTY_STR", {"arg_name": "queryName",
                                                       "arg_value": str(queryName)})
        self._query_name = queryName
        return self

    def partitionBy(self, *cols: str) -> "DataStreamWriter":
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        self._partition_by = list(cols)
        return self

    def clusterBy(self, *cols: str) -> "DataStreamWriter":
        """Clustering columns of the table ``toTable`` creates (PySpark 4.3)."""
        spark_internals.require("clusterBy")
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        self._cluster_by = list(cols)
        return self

    def foreach(self, f: Any) -> "DataStreamWriter":
        check_foreach_writer(f)
        self._format = "foreach"
        self._extra["foreach"] = f
        return self

    def foreachBatch(self, func: Callable) -> "DataStreamWriter":
        """``func(df, batch_id)`` per batch. As in PySpark, ``func`` is not checked here: a
        function that cannot be called fails the first batch with Spark's
        ``FOREACH_BATCH_USER_FUNCTION_ERROR``. Over Spark Connect it must pickle, and
        unpickle at ``start()``, as PySpark's Connect writer and Spark's server need."""
        self._format = "foreachBatch"
        self._extra["foreach_batch"] = func
        self._extra["foreach_batch_command"] = spark_internals.foreach_batch_command(self._session.spark, func)
        return self

    # -- engine knobs for tests (not in PySpark) ------------------------------
    def clock(self, clock: Clock) -> "DataStreamWriter":
        """Use ``clock`` for triggers and batch timestamps (a ManualClock in tests)."""
        self._clock = clock
        return self

    def fileSystem(self, fs) -> "DataStreamWriter":
        """Do checkpoint I/O through ``fs`` (a FailingFileSystem in tests)."""
        self._fs = fs
        return self

    def sink(self, sink) -> "DataStreamWriter":
        """Write to this Sink object (see ``microbatch.sinks.base``) instead of a format;
        the same object can then serve several runs of a query."""
        self._sink = sink
        return self

    def _apply(self, format: str | None, outputMode: str | None, partitionBy: Any,
               queryName: str | None, options: dict[str, Any]) -> None:
        """``start``'s and ``toTable``'s keyword arguments, in PySpark's order."""
        self.options(**options)
        if outputMode is not None:
            self.outputMode(outputMode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if format is not None:
            self.format(format)
        if queryName is not None:
            self.queryName(queryName)

    def toTable(self, tableName: str, format: str | None = None, outputMode: str | None = None,
                partitionBy: Any = None, queryName: str | None = None,
                **options: Any) -> Any:
        """Write the stream to catalog table ``tableName``, creating it if it does not exist
        (see ``microbatch.api.tables``)."""
        self._apply(format, outputMode, partitionBy, queryName, options)
        if not isinstance(tableName, str):
            raise pyspark_error(PySparkTypeError, "NOT_EXPECTED_TYPE", {"arg_name": "tableName", "expected_type": "str",
                                                      "arg_type": type(tableName).__name__})
        provider, location = table_location(TableWrite(
            self._session.spark, self._frame.schema, self._format, self._partition_by or None,
            self._cluster_by or None, lambda name: self._session._stream_view(name) is not None), tableName)
        return self.format(provider).option("path", location).start()

    def start(self, path: str | None = None, format: str | None = None,
              outputMode: str | None = None, partitionBy: Any = None,
              queryName: str | None = None, **options: Any) -> Any:
        self._apply(format, outputMode, partitionBy, queryName, options)
        if path is not None:
            if not isinstance(path, str):
                raise pyspark_error(PySparkTypeError, "NOT_EXPECTED_TYPE", {"arg_name": "path", "expected_type": "str",
                                                          "arg_type": type(path).__name__})
            self._options["path"] = path
        session = self._session
        spark = session.spark
        check_source_names(self._plan)
        check_output_mode(self._plan, self._output_mode,
                          spark.conf.get(CHECK_CORRECTNESS_CONF, "true").lower() == "true")
        check_joins_kept(self._plan, self._frame._template)
        if self._extra.get("foreach_batch_command") is not None and self._format == "foreachBatch":
            spark_internals.check_foreach_batch_command(spark, self._extra["foreach_batch_command"])
        if spark_internals.is_connect(spark):
            sink_format = self._format or spark.conf.get("spark.sql.sources.default", "parquet")
            check_runs_over_connect(self._plan, sink_format, self._output_mode, self._sink is not None,
                                    lambda: _sink_runs_over_connect(sink_format, spark))
        opts = CaseInsensitiveOptions(self._options)
        if isinstance(self._trigger, RealTime):
            check_real_time_query(spark, self._trigger, self._plan,
                                  "sink object" if self._sink is not None else
                                  self._format or spark.conf.get("spark.sql.sources.default", "parquet"),
                                  self._output_mode, self._options)
        _check_async_progress_tracking(self._options, self._format or spark.conf.get("spark.sql.sources.default", "parquet"),
                                       self._sink, self._trigger, self._plan)
        if self._sink is not None:
            sink = self._sink
            checkpoint, temporary = self._checkpoint_location(opts, True)
        else:
            name = self._format or spark.conf.get("spark.sql.sources.default", "parquet")
            _check_v2_writer_not_disabled(name, spark)
            provider = lookup_sink(name, spark)
            checkpoint, temporary = self._checkpoint_location(opts, provider.allows_temporary_checkpoint)
            context = SinkContext(spark, opts, self._output_mode, self._frame.schema,
                                  self._query_name, self._partition_by, self._extra,
                                  self._fs or LOCAL, checkpoint)
            try:
                sink = provider.create(context)
            except ValueError as e:
                if isinstance(e, IllegalArgumentException):
                    raise
                raise IllegalArgumentException(f"{e} (sink '{name}')") from e
        return session.streams.start_query(
            name=self._query_name, checkpoint_root=checkpoint, delete_checkpoint_on_stop=temporary,
            plan=self._plan, sink=sink, trigger=self._trigger,
            output_mode=self._output_mode, clock=self._clock or SystemClock(),
            fs=self._checkpoint_fs)

    def _spark_settings(self) -> dict[str, str]:
        """The Spark settings a store may take its endpoint and credentials from: the
        context's (``--conf spark.hadoop...``) overridden by the session's."""
        spark = self._session.spark
        return spark_internals.session_settings(spark)

    def _check_object_store(self, location: str) -> None:
        """At start, writing nothing: the bucket must be there and readable."""
        self._checkpoint_fs.check_reachable(location)

    def _checkpoint_location(self, opts: CaseInsensitiveOptions,
                             allows_temporary: bool) -> tuple[str, bool]:
        """The checkpoint location, resolved on the store it lives on (``_checkpoint_fs``)."""
        spark = self._session.spark
        location = None
        if "checkpointLocation" in opts:
            location = opts["checkpointLocation"]
        elif (root := spark.conf.get("spark.sql.streaming.checkpointLocation", None)):
            location = root.rstrip("/") + "/" + (self._query_name or str(uuid.uuid4()))
        if location is not None:
            # (reading every Spark setting costs about 20 ms of calls into Spark: only for a remote store)
            self._checkpoint_fs = self._fs or storage_for(
                location, None if is_local(location) else self._spark_settings())
            resolved = self._checkpoint_fs.resolve(location)
            if isinstance(self._checkpoint_fs, ObjectStoreFileSystem):
                self._check_object_store(resolved)
            return resolved, False
        self._checkpoint_fs = self._fs or LOCAL
        if allows_temporary:
            location = tempfile.mkdtemp(prefix="temporary-")
            log.warning("Temporary checkpoint location created which is deleted normally when "
                        "the query didn't fail: %s. If it's required to delete it under any "
                        "circumstances, please set spark.sql.streaming.forceDeleteTempCheckpointLocation "
                        "to true. Important to know deleting temp checkpoint folder is best effort.",
                        location)
            return location, True
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1298",
                                          config="spark.sql.streaming.checkpointLocation")


def _sink_runs_over_connect(name: str, spark: Any) -> bool:
    """Whether the sink ``name`` looks up to a provider that runs over Spark Connect (a
    Python data source registered with the session); one it does not find is refused
    as not running there, as before it was looked up."""
    try:
        return lookup_sink(name, spark).runs_over_connect
    except Exception:  # noqa: BLE001 - not found: the refusal names it
        return False


#: Spark's sinks that write only through its DataSource V2 API, by format: their provider
#: class (its canonical name), which spark.sql.streaming.disabledV2Writers may list. Spark's
#: other sinks write the same with its V1 API (kafka's KafkaSink, the file formats) or are
#: not looked up (memory, foreach, foreachBatch).
_V2_ONLY_WRITERS = {"console": "org.apache.spark.sql.execution.streaming.ConsoleSinkProvider",
                    "noop": "org.apache.spark.sql.execution.datasources.noop.NoopDataSource"}


def _check_v2_writer_not_disabled(fmt: str, spark: Any) -> None:
    """Spark's DataStreamWriter: a provider listed in ``spark.sql.streaming.disabledV2Writers``
    falls back to its V1 sink, and one without (console, noop) is refused when the query
    starts, with Spark's UnsupportedOperationException."""
    provider = _V2_ONLY_WRITERS.get(fmt.lower())
    disabled = [n.strip() for n in (spark.conf.get("spark.sql.streaming.disabledV2Writers", "") or "").split(",")]
    if provider is not None and provider in disabled:
        from microbatch.spark_internals.errors import java_exception
        raise java_exception("java.lang.UnsupportedOperationException",
                             f"Data source {fmt} does not support streamed writing.")


#: Spark's name of each sink asynchronous progress tracking allows (Spark 4.3's
#: ``AsyncProgressTrackingMicroBatchExecution.validateAndGetTrigger``), by microbatch's format
_ASYNC_TRACKING_SINKS = {"noop": "noop-table", "console": "console", "memory": "MemorySink",
                         "kafka": "KafkaTable", "foreach": "ForeachSink"}
#: how Spark names the other sinks in its refusal (a v1 sink by its ``toString``)
_SPARK_SINK_NAMES = {"foreachBatch": "ForeachBatchSink"}
_FILE_SINKS = ("parquet", "json", "csv", "orc", "text")


def _scala_boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise IllegalArgumentException(f'For input string: "{text}"')
    return text.lower() == "true"


def _check_async_progress_tracking(opts: dict[str, str], sink_format: str, sink: Any,
                                   trigger: Trigger, plan: Any) -> None:
    """Option ``asyncProgressTrackingEnabled``: Spark's refusals, in its order (the
    interval's value, the sink, the trigger; a stateful query, which Spark's engine refuses
    in its first batch, refused here at start), then microbatch's own for what Spark would
    run: microbatch writes a batch's offsets and commit before and after it, never off its
    critical path, and does not drop the option silently. Spark's engine reads these
    options by their exact names (``asyncprogresstrackingenabled`` is no option of its),
    and so does this check."""
    if not _scala_boolean(opts.get("asyncProgressTrackingEnabled", "false")):
        return
    interval = opts.get("asyncProgressTrackingCheckpointIntervalMs", "1000")
    if not re.fullmatch(r"[+-]?\d+", interval):   # (Scala's toLong)
        raise IllegalArgumentException(f'For input string: "{interval}"')
    override = _scala_boolean(opts.get("_asyncProgressTrackingOverrideSinkSupportCheck", "false"))
    name = None if sink is not None else _ASYNC_TRACKING_SINKS.get(sink_format.lower())
    if not override and name is None:
        shown = "a Sink object" if sink is not None else _SPARK_SINK_NAMES.get(sink_format) or (
            f"FileSink[{opts.get('path')}]" if sink_format.lower() in _FILE_SINKS else sink_format)
        raise IllegalArgumentException(f"Sink {shown} does not support async progress tracking")
    if isinstance(trigger, Once):
        raise IllegalArgumentException("Async progress tracking cannot be used with Once trigger")
    if isinstance(trigger, AvailableNow):
        raise IllegalArgumentException("Async progress tracking cannot be used with AvailableNow trigger")
    if any(node.stateful for node in plan.nodes()):
        raise IllegalArgumentException(
            "Stateful streaming queries does not support async progress tracking at this moment.")
    raise UnsupportedOperationError(
        "Option 'asyncProgressTrackingEnabled' (asynchronous progress tracking: offsets and commits "
        "written off the batch's critical path, every 'asyncProgressTrackingCheckpointIntervalMs') is not "
        "supported by microbatch: it writes each batch's offsets and commit in the batch, and does not "
        "ignore the option. Remove it (the query then runs with Spark's default, synchronous tracking).")
