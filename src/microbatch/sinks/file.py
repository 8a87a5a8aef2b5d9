"""File sinks: ``parquet``, ``json``, ``csv``, ``text``, ``orc`` into a directory (Spark's FileStreamSink).

Guarantee: exactly-once for every reader that lists the directory through its
``_spark_metadata`` log, which Spark's batch readers do (``spark.read.parquet(out)``)
and so does microbatch's file source.

``add_batch(N, df)``:

1. If the log already has batch N (or a later one), the batch was committed by
   an earlier attempt: log "Skipping already committed batch N" and return.
2. Write the batch with Spark's batch writer into a fresh staging directory
   ``<out>/_microbatch_staging/batch-N-<uuid>/`` (``_``-prefixed, so no reader
   lists it). File names carry a UUID per attempt.
3. Move the files into ``<out>`` (under their ``key=value`` partition directories).
4. Write ``_spark_metadata/N`` listing them (create-if-absent; compacted every
   ``spark.sql.streaming.fileSink.log.compactInterval`` batches, default 10).

A crash before step 4 leaves files that no log lists: readers never see them and
the engine re-runs batch N under new file names. Staging directories left by a
crash are removed before the next batch is written. The log's size is reported in progress
(``sink.metrics``); the ``retention`` option drops entries of files older than
it at the next compaction, as in Spark.
"""
from __future__ import annotations

import logging
import os
import shutil
import uuid

from pyspark.sql import DataFrame, SparkSession

from microbatch import spark_internals
from microbatch.checkpoint.file_stream_log import (FILE_FORMATS, SINK_METADATA_DIR,
                                                   FileStreamSinkLog, SinkFileStatus)
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.errors import (AnalysisException, ConcurrentUpdateError,
                               IllegalArgumentException)
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider
from microbatch.util import conf_bool, local_path, time_string_as_ms

log = logging.getLogger(__name__)

STAGING_DIR = "_microbatch_staging"
#: Options of the sink itself; the rest go to Spark's batch writer.
_SINK_OPTIONS = {"path", "checkpointlocation", "retention"}


class FileStreamSink(Sink):
    reads_batch_through = READS_SQL

    def __init__(self, spark: SparkSession, fmt: str, path: str, partition_by: list[str],
                 options: dict[str, str], retention_ms: int | None, fs: CheckpointFileSystem):
        self.format = fmt
        self.path = path
        self.partition_by = partition_by
        self.writer_options = options
        self.file_log = FileStreamSinkLog(
            os.path.join(path, SINK_METADATA_DIR), fs,
            default_compact_interval=int(spark.conf.get(
                "spark.sql.streaming.fileSink.log.compactInterval", "10")),
            cleanup_delay_ms=time_string_as_ms(spark.conf.get(
                "spark.sql.streaming.fileSink.log.cleanupDelay", "10m")),
            deleting_expired=conf_bool(spark, "spark.sql.streaming.fileSink.log.deletion", True),
            min_batches_to_retain=int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100")),
            retention_ms=retention_ms)
        self.staging_root = os.path.join(path, STAGING_DIR)
        self._metrics: dict[str, str] = {}

    def _remove_stale_staging(self, batch_id: int) -> None:
        """Remove staging directories of earlier attempts of batches up to ``batch_id``:
        with one writer per output directory, their writers are dead."""
        for name in self._staging_names():
            parts = name.split("-")
            if len(parts) > 2 and parts[0] == "batch" and parts[1].isdigit() and int(parts[1]) <= batch_id:
                log.info("Removing the staging directory of an interrupted attempt: %s", name)
                shutil.rmtree(os.path.join(self.staging_root, name), ignore_errors=True)

    def _staging_names(self) -> list[str]:
        try:
            return os.listdir(self.staging_root)
        except FileNotFoundError:
            return []

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        latest = self.file_log.get_latest_batch_id()
        if latest is not None and batch_id <= latest:
            log.info("Skipping already committed batch %d", batch_id)
            return
        self._remove_stale_staging(batch_id)
        staging = os.path.join(self.staging_root, f"batch-{batch_id}-{uuid.uuid4()}")
        writer = df.write.format(self.format).options(**self.writer_options).mode("errorifexists")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save("file://" + staging)
        statuses = self._move_into_place(staging)
        if not self.file_log.add(batch_id, statuses):
            raise ConcurrentUpdateError(
                f"Concurrent update to the log. Multiple streaming jobs detected for {batch_id} "
                f"({self.file_log.path}). Another query writes to the output directory "
                f"'{self.path}'; give each query its own output directory.")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            os.rmdir(self.staging_root)
        except OSError:
            pass  # not empty: leftovers of another attempt, removed before a later batch
        files, size = self.file_log.log_size()
        self._metrics = {"numOutputFiles": str(len(statuses)),
                         "metadataLogFiles": str(files), "metadataLogBytes": str(size)}

    def _move_into_place(self, staging: str) -> list[SinkFileStatus]:
        """Move the data files of a finished write from ``staging`` into the output directory."""
        statuses = []
        for directory, dirs, names in os.walk(staging):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_")) or "=" in d]
            for name in sorted(names):
                if name.startswith((".", "_")):
                    continue  # _SUCCESS, checksum files (moved with their data file)
                source = os.path.join(directory, name)
                target = os.path.join(self.path, os.path.relpath(source, staging))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.exists(target):
                    raise FileExistsError(f"Refusing to overwrite existing output file {target}")
                os.rename(source, target)
                checksum = os.path.join(directory, f".{name}.crc")
                if os.path.exists(checksum):
                    os.rename(checksum, os.path.join(os.path.dirname(target), f".{name}.crc"))
                statuses.append(SinkFileStatus.of_local_file(target))
        return statuses

    def progress_metrics(self) -> dict[str, str]:
        return dict(self._metrics)

    def __str__(self) -> str:
        return f"FileSink[file:{self.path}]"


class FileSinkProvider(SinkProvider):
    """``writeStream.format(<fmt>)`` for one file format (append mode only, as in Spark)."""

    def __init__(self, fmt: str):
        self.short_name = fmt

    def create(self, context: SinkContext) -> Sink:
        options = context.options
        if "path" not in options:
            raise spark_internals.spark_error("SparkIllegalArgumentException",
                                              "_LEGACY_ERROR_TEMP_2047")
        if context.output_mode != "append":
            raise spark_internals.spark_error(
                "AnalysisException", "STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE",
                outputMode=context.output_mode, className=self.short_name)
        path = local_path(options["path"], "output")
        columns = context.schema.fieldNames()
        lowered = {c.lower(): c for c in columns}
        partition_by = []
        for col in context.partition_by:
            if col.lower() not in lowered:
                raise spark_internals.spark_error(
                    "AnalysisException", "_LEGACY_ERROR_TEMP_1196", columnType="Partition",
                    columnName=col, validColumnNames=", ".join(columns))
            partition_by.append(lowered[col.lower()])
        if self.short_name == "text":
            data = [f for f in context.schema.fields if f.name not in partition_by]
            if len(data) != 1 or data[0].dataType.simpleString() != "string":
                raise AnalysisException(
                    "Text data source supports only a single column of type string, and the "
                    f"query writes {', '.join(f'{f.name} {f.dataType.simpleString()}' for f in data)}. "
                    "Select one string column (e.g. with to_json or concat_ws) before the sink.")
        try:
            os.makedirs(os.path.join(path, SINK_METADATA_DIR), exist_ok=True)
            probe = os.path.join(path, SINK_METADATA_DIR, f".write-probe-{uuid.uuid4().hex}")
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            raise AnalysisException(
                f"Cannot write to the output directory '{path}': {e.strerror or e}. Make the "
                "directory writable by this user, or choose another output path.") from e
        retention_ms = None
        if "retention" in options:
            try:
                retention_ms = time_string_as_ms(options["retention"])
            except ValueError as e:
                raise IllegalArgumentException(f"Invalid value for option 'retention': {e}") from None
        writer_options = {k: v for k, v in options.as_dict().items() if k.lower() not in _SINK_OPTIONS}
        return FileStreamSink(context.spark, self.short_name, path, partition_by, writer_options,
                              retention_ms, context.fs)


PROVIDERS = [FileSinkProvider(fmt) for fmt in FILE_FORMATS]
