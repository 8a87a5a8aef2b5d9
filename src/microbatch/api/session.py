"""StreamingSession: the entry point, wrapping a SparkSession."""
from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from microbatch.api.manager import StreamingQueryManager
from microbatch.api.reader import DataStreamReader

#: Settings ../shared/SPARK-NOTES.md recommends for an embedded local Spark.
EMBEDDED_CONF = {
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


class StreamingSession:
    """``StreamingSession(spark)`` wraps a session; ``StreamingSession()`` starts a local one."""

    def __init__(self, spark: SparkSession | None = None, *, master: str = "local[2]",
                 conf: dict[str, str] | None = None):
        # Stop Spark on stop() only if this object started it.
        self._embedded = spark is None and SparkSession.getActiveSession() is None
        self.spark = spark if spark is not None else embedded_spark(master, conf=conf)
        self.streams = StreamingQueryManager(self.spark)

    @property
    def read(self):
        """Spark's batch reader, plus ``format("statestore")`` to read a query's state."""
        from microbatch.api.state_reader import SessionReader
        return SessionReader(self.spark)

    @property
    def readStream(self) -> DataStreamReader:
        return DataStreamReader(self)

    def stop(self) -> None:
        """Stop every active query, and the Spark session if this object started it."""
        for query in self.streams.active:
            query.stop()
        if self._embedded:
            self.spark.stop()
