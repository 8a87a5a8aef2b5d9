"""A file stream over the output of a file sink: whether the directory is one (it has
``_spark_metadata``), and that log opened for reading, so the stream lists only the files
of the sink's committed batches: on local disk, or on an object store through the
storage layer (``store``, as the sink wrote it there). Spark's file source does the same
through Hadoop's file system on any scheme."""
from __future__ import annotations

import os
from typing import Any

from pyspark.sql import SparkSession

from microbatch.checkpoint.file_stream_log import SINK_METADATA_DIR, FileStreamSinkLog
from microbatch.checkpoint.fs import LOCAL
from microbatch.sources.file_listing import is_glob_path
from microbatch.util import conf_bool


def has_sink_metadata(spark: SparkSession, path: str, store: Any = None) -> bool:
    """True when ``path`` is a directory a file sink writes (it has ``_spark_metadata``);
    ``store``: the object store ``path`` is on, or None for local disk."""
    if conf_bool(spark, "spark.sql.streaming.fileStreamSink.ignoreMetadata", False) or is_glob_path(path):
        return False
    if store is not None:
        return store.exists(f"{path.rstrip('/')}/{SINK_METADATA_DIR}")
    return os.path.isdir(path) and os.path.isdir(os.path.join(path, SINK_METADATA_DIR))


def sink_log_reader(spark: SparkSession, output_path: str, store: Any = None) -> FileStreamSinkLog:
    """Open a file sink's ``_spark_metadata`` log for reading (never written here)."""
    directory = (f"{output_path.rstrip('/')}/{SINK_METADATA_DIR}" if store is not None
                 else os.path.join(output_path, SINK_METADATA_DIR))
    return FileStreamSinkLog(
        directory, store if store is not None else LOCAL,
        default_compact_interval=int(spark.conf.get(
            "spark.sql.streaming.fileSink.log.compactInterval", "10")),
        deleting_expired=False, read_only=store is not None)
