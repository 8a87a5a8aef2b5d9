"""A file stream over the output of a file sink: whether the directory is one (it has
``_spark_metadata``), and that log opened for reading, so the stream lists only the files
of the sink's committed batches."""
from __future__ import annotations

import os

from pyspark.sql import SparkSession

from microbatch.checkpoint.file_stream_log import SINK_METADATA_DIR, FileStreamSinkLog
from microbatch.sources.file_listing import is_glob_path
from microbatch.util import conf_bool


def has_sink_metadata(spark: SparkSession, path: str) -> bool:
    """True when ``path`` is a directory a file sink writes (it has ``_spark_metadata``)."""
    if conf_bool(spark, "spark.sql.streaming.fileStreamSink.ignoreMetadata", False):
        return False
    return (not is_glob_path(path) and os.path.isdir(path)
            and os.path.isdir(os.path.join(path, SINK_METADATA_DIR)))


def sink_log_reader(spark: SparkSession, output_path: str) -> FileStreamSinkLog:
    """Open a file sink's ``_spark_metadata`` log for reading."""
    return FileStreamSinkLog(
        os.path.join(output_path, SINK_METADATA_DIR),
        default_compact_interval=int(spark.conf.get(
            "spark.sql.streaming.fileSink.log.compactInterval", "10")),
        deleting_expired=False)
