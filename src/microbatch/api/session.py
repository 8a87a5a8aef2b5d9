"""StreamingSession: the entry point, wrapping a SparkSession."""
from __future__ import annotations

import logging
import os
import sys

from typing import Any

from pyspark.sql import SparkSession

from microbatch import spark_internals

from microbatch.api.frame import static_joins_take_streams
from microbatch.api.manager import StreamingQueryManager
from microbatch.api.state_reader import READ_FORMATS, SessionReader
from microbatch.api.reader import DataStreamReader

log = logging.getLogger(__name__)

#: Spark's Python workers over Unix domain sockets instead of loopback TCP, where each
#: Python task waited about 40 ms for its first input bytes (Nagle's algorithm against
#: delayed ACKs): a batch's four state tasks took 144 ms against 56 (docs/deploying.md).
#: A static setting: it must be set before the SparkContext starts.
UNIX_SOCKETS_CONF = "spark.python.unix.domain.socket.enabled"

#: Settings for an embedded local Spark (docs/design.md, section 8: measured costs):
#: no UI, few shuffle partitions, Arrow on without a silent fallback, no driver-side
#: local relations for Arrow data, and Python workers over Unix domain sockets.
EMBEDDED_CONF = {
    UNIX_SOCKETS_CONF: "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    "spark.sql.execution.arrow.localRelationThreshold": "0",
}


def embedded_spark(master: str = "local[2]", app_name: str = "microbatch",
                   conf: dict[str, str] | None = None) -> SparkSession:
    """Start (or reuse) a local SparkSession whose Python workers use this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**EMBEDDED_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


#: global temporary views over streams, by ``<global temp database>.<name>`` (lower case):
#: Spark's global temporary views are every session's
_GLOBAL_STREAM_VIEWS: dict[str, Any] = {}


class StreamingSession:
    """``StreamingSession(spark)`` wraps a session; ``StreamingSession()`` starts a local one.

    ``readStream`` and ``streams`` are microbatch's; everything else is the wrapped
    SparkSession's (``ss.table``, ``ss.sql``, ``ss.createDataFrame``, ``ss.conf``, ...), so
    a ported job that takes a session runs unchanged with this one."""

    def __init__(self, spark: SparkSession | None = None, *, master: str = "local[2]",
                 conf: dict[str, str] | None = None, ui_port: int | None = None,
                 ui_host: str = "127.0.0.1"):
        spark_internals.check_supported(spark)      # (PySpark's version: before any JVM starts)
        # Stop Spark on stop() only if this object started it.
        self._embedded = spark is None and SparkSession.getActiveSession() is None
        self.spark = spark if spark is not None else embedded_spark(master, conf=conf)
        static_joins_take_streams()      # (a Connect session's DataFrame class is imported by now)
        if (spark_internals.static_conf(self.spark, UNIX_SOCKETS_CONF, "false") or "false").lower() != "true":
            log.info("This session's Python workers talk to the JVM over TCP, which costs each "
                     "Python task (every state task) about 40 ms; start the session with %s=true "
                     "for faster stateful batches (docs/deploying.md)", UNIX_SOCKETS_CONF)
        self.streams = StreamingQueryManager(self.spark, READ_FORMATS)
        self._stream_views: dict[str, Any] = {}   # temp views over streams, by lower-case name
        self._dashboard = None
        if ui_port is not None:
            self.start_ui(ui_port, ui_host)

    def start_ui(self, port: int = 4050, host: str = "127.0.0.1") -> str:
        """Serve the dashboard of this session's queries (and ``/metrics``) on ``port``
        (0: a free one); return its URL. ``StreamingSession(spark, ui_port=...)`` calls it."""
        if self._dashboard is None:
            from microbatch.ops.dashboard import Dashboard
            from microbatch.ops.history import (RETAINED_PROGRESS_CONF, RETAINED_QUERIES_CONF,
                                                ProcessQueries)
            queries = ProcessQueries(self.streams,
                                     int(self.spark.conf.get(RETAINED_QUERIES_CONF, "100")),
                                     int(self.spark.conf.get(RETAINED_PROGRESS_CONF, "100")))
            self.streams.addListener(queries)
            self._dashboard = Dashboard(queries, host, port, title=spark_internals.app_name(self.spark))
            self._dashboard.start()
        return self._dashboard.url

    @property
    def ui_url(self) -> str | None:
        """Where the dashboard is served, or None without one."""
        return None if self._dashboard is None else self._dashboard.url

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("spark", "streams", "_stream_views", "_embedded", "_dashboard"):
            raise AttributeError(name)
        return getattr(self.spark, name)

    def __reduce__(self):
        """Over Spark Connect this session pickles as PySpark's Connect session does (into
        the unpickling process's active session of the same id), so a ``foreachBatch``
        function that reads it pickles as on Spark's engine, whose server runs it; a
        classic session does not pickle."""
        if spark_internals.is_connect(self.spark):
            return self.spark.__reduce__()
        raise TypeError(f"cannot pickle a {type(self).__name__} of a classic session")

    def interruptAll(self) -> list[str]:
        """PySpark's ``interruptAll``: every operation of the session interrupted. Over
        Spark Connect the server stops the session's streaming queries too, so this stops
        microbatch's queries started here (their runs' operations are tagged, and their
        stream threads stop) and returns their ids with the operations' (as the server
        does); on a classic session it is the session's own."""
        if not spark_internals.is_connect(self.spark):
            return self.spark.interruptAll()
        stopped = []
        for query in self.streams.active:
            query.stop()
            stopped.append(query.id)
        return list(self.spark.interruptAll()) + stopped

    @property
    def dataSource(self):
        """PySpark's ``spark.dataSource``: ``register(cls)`` makes a Python data source's
        name a format for ``readStream`` (over Spark Connect, registered here as well as on
        the server, where a client cannot read the class back)."""
        return spark_internals.data_source_registration(self.spark)

    @property
    def read(self):
        """Spark's batch reader, plus ``format("statestore")`` to read a query's state."""
        return SessionReader(self.spark)

    @property
    def readStream(self) -> DataStreamReader:
        return DataStreamReader(self)

    def sql(self, sqlQuery: str, args: Any = None, **kwargs: Any) -> Any:
        """PySpark's ``SparkSession.sql``, over streams too: a query that reads a temporary
        view of a stream (``StreamFrame.createOrReplaceTempView``) or ``STREAM t`` is a
        stream (a StreamFrame: ``isStreaming``, ``writeStream``); any other is Spark's own
        DataFrame (``api/sql.py``)."""
        from microbatch.api.sql import streaming_sql
        return streaming_sql(self, sqlQuery, args, **kwargs)

    @property
    def _streamingCheckpointManager(self):
        """PySpark's ``StreamingCheckpointManager`` for microbatch's checkpoints:
        ``repartition(checkpoint_location, num_partitions, enforce_exactly_once_sink=True)``
        rewrites a stopped query's state into ``num_partitions`` partitions (ops/repartition.py)."""
        from microbatch.ops.repartition import StreamingCheckpointManager
        return StreamingCheckpointManager(self.spark)

    # -- temporary views over streams (StreamFrame.createOrReplaceTempView) ---------------
    @staticmethod
    def _global_stream_views() -> list[str]:
        return list(_GLOBAL_STREAM_VIEWS)

    def _global_database(self) -> str:
        return self.spark.conf.get("spark.sql.globalTempDatabase", "global_temp").lower()

    def _stream_view(self, name: str):
        """The stream a temporary view names (``v``), or a global one (``global_temp.v``)."""
        found = self._stream_views.get(name.lower())
        if found is None and name.lower().startswith(self._global_database() + "."):
            found = _GLOBAL_STREAM_VIEWS.get(name.lower())
        return found

    def _register_global_stream_view(self, name: str, frame: Any, replace: bool) -> None:
        """A global temporary view over a stream (``global_temp.<name>``, every session's)."""
        qualified = f"{self._global_database()}.{name.lower()}"
        batch_view = spark_internals.temp_view_exists(self.spark, f"{self._global_database()}.{name}")
        if not replace and (batch_view or qualified in _GLOBAL_STREAM_VIEWS):
            raise spark_internals.spark_error("AnalysisException", "TEMP_TABLE_OR_VIEW_ALREADY_EXISTS",
                                              relationName=f"`{self._global_database()}`.`{name}`")
        if batch_view:
            self.spark.catalog.dropGlobalTempView(name)
        _GLOBAL_STREAM_VIEWS[qualified] = frame

    def _register_stream_view(self, name: str, frame: Any, replace: bool) -> None:
        batch_view = spark_internals.temp_view_exists(self.spark, name)
        if not replace and (batch_view or name.lower() in self._stream_views):
            raise spark_internals.spark_error("AnalysisException", "TEMP_TABLE_OR_VIEW_ALREADY_EXISTS",
                                              relationName=f"`{name}`")
        if batch_view:
            self.spark.catalog.dropTempView(name)   # one namespace of temp views, as in Spark
        self._stream_views[name.lower()] = frame

    def stop(self) -> None:
        """Stop every active query, and the Spark session if this object started it."""
        for query in self.streams.active:
            query.stop()
        if self._dashboard is not None:
            self._dashboard.stop()
            self._dashboard = None
        if self._embedded:
            self.spark.stop()
