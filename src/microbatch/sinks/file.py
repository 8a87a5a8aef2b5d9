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

On an object store (``s3://``, ``s3a://``, ``gs://``, ``abfss://``; Spark here cannot write there, and a
rename there is a copy) the batch is written in place, with no rename:

1. as above;
2. record the attempt: an empty object ``<out>/_microbatch_attempts/N-<attempt>``;
3. Spark tasks write the batch's files straight to their final names
   ``<out>/[k=v/]part-<task>-<N>-<attempt>-c000.<ext>`` through the storage layer
   (parquet and orc by Arrow; json, csv and text as lines Spark's own ``to_json`` /
   ``to_csv`` made), one PUT per file;
4. write ``_spark_metadata/N`` listing them (the commit), then delete the record.

Files of an attempt that did not commit are listed by no log entry, so readers never
see them; before the next batch, each record left by a crash has its attempt's files
deleted (unless the log shows the attempt committed), then the record.
On local disk the staging-and-rename protocol stays: Spark's own writer with a rename
is faster there than writing through Python tasks (``benchmarks/RESULTS.md``), and the
layout is Spark's.
"""
from __future__ import annotations

import gzip
import io
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.file_stream_log import (FILE_FORMATS, SINK_METADATA_DIR,
                                                   FileStreamSinkLog, SinkFileStatus)
from microbatch.checkpoint.fs import OBJECT_STORE_SCHEMES, CheckpointFileSystem
from microbatch.checkpoint.stores import storage_for, storage_from_spec
from microbatch.errors import (AnalysisException, ConcurrentUpdateError,
                               IllegalArgumentException)
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider
from microbatch.util import conf_bool, local_path, time_string_as_ms

log = logging.getLogger(__name__)

STAGING_DIR = "_microbatch_staging"
ATTEMPTS_DIR = "_microbatch_attempts"
#: What Spark's S3A file system reports for an object (SinkFileStatus fields).
OBJECT_BLOCK_REPLICATION, OBJECT_BLOCK_SIZE = 1, 32 * 1024 * 1024
#: Compression codecs of the in-place writer per format: option value -> (Arrow or
#: Python codec, file name suffix), with Spark's defaults first.
_CODECS = {
    "parquet": {"snappy": ("snappy", ".snappy"), "none": ("none", ""), "uncompressed": ("none", ""),
                "gzip": ("gzip", ".gz"), "zstd": ("zstd", ".zstd"), "lz4": ("lz4", ".lz4")},
    "orc": {"snappy": ("snappy", ".snappy"), "none": ("uncompressed", ""), "uncompressed": ("uncompressed", ""),
            "zlib": ("zlib", ".zlib"), "zstd": ("zstd", ".zstd"), "lz4": ("lz4", ".lz4")},
    "text": {"none": (None, ""), "uncompressed": (None, ""), "gzip": ("gzip", ".gz")},
}
_EXTENSIONS = {"parquet": ".parquet", "orc": ".orc", "json": ".json", "csv": ".csv", "text": ".txt"}
_STATUS_SCHEMA = "path STRING, size LONG, modificationTime LONG"


def escape_path_name(value: str) -> str:
    """A partition value as Spark writes it in a path (``ExternalCatalogUtils.escapePathName``)."""
    special = set('"#%\'*/:=?\\\x7f{[]^')
    return "".join(f"%{ord(c):02X}" if c in special or ord(c) < 0x20 else c for c in value)


def partition_groups(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[tuple, pa.Table]]:
    """``table``'s rows by the values of ``columns`` (strings, or None): (values, rows)."""
    import pyarrow.compute as pc
    if not columns:
        return [((), table)]
    distinct = table.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([]).to_pylist()
    groups = []
    for values in distinct:
        mask = None
        for name in columns:
            value = values[name]
            test = pc.is_null(table.column(name)) if value is None \
                else pc.fill_null(pc.equal(table.column(name), value), False)
            mask = test if mask is None else pc.and_(mask, test)
        groups.append((tuple(values[n] for n in columns), table.filter(mask)))
    return groups


def partition_directory(columns: tuple[str, ...], values: tuple) -> str:
    """``/c1=v1/c2=v2`` as Spark names a partition's directory (an empty or null value as
    ``__HIVE_DEFAULT_PARTITION__``)."""
    return "".join(f"/{escape_path_name(n)}="
                   f"{'__HIVE_DEFAULT_PARTITION__' if v in (None, '') else escape_path_name(v)}"
                   for n, v in zip(columns, values))


@dataclass(frozen=True)
class InPlaceWriteTask:
    """The Spark task of an in-place write: one partition's rows, grouped by the
    partition columns (already strings), each group one file at its final name, written
    whole through the storage layer. Yields a status row per file."""

    root: str                         # the output directory, e.g. s3://bucket/out
    fmt: str
    batch_id: int
    attempt: str
    partition_columns: tuple[str, ...]
    codec: str | None
    suffix: str                       # codec suffix + extension, e.g. ".snappy.parquet"
    header: str | None                # csv: the header line to write first
    storage: tuple = field(repr=False, default=("file", ()))   # may hold credentials

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        batches = list(batches)
        if not batches or not sum(b.num_rows for b in batches):
            return
        table = pa.Table.from_batches(batches)
        task = TaskContext.get().partitionId()
        fs = storage_from_spec(self.storage)
        for values, rows in partition_groups(table, self.partition_columns):
            directory = self.root + partition_directory(self.partition_columns, values)
            path = f"{directory}/part-{task:05d}-{self.batch_id}-{self.attempt}-c000{self.suffix}"
            data = self._encode(rows.drop_columns(list(self.partition_columns)))
            fs.write_bytes(path, data)
            yield pa.RecordBatch.from_pylist(
                [{"path": path, "size": len(data), "modificationTime": int(time.time() * 1000)}],
                schema=pa.schema([("path", pa.string()), ("size", pa.int64()), ("modificationTime", pa.int64())]))

    def _encode(self, rows: pa.Table) -> bytes:
        sink = io.BytesIO()
        if self.fmt == "parquet":
            import pyarrow.parquet as pq
            pq.write_table(rows, sink, compression=self.codec)
        elif self.fmt == "orc":
            import pyarrow.orc as orc
            orc.write_table(rows, sink, compression=self.codec)
        else:   # one column of lines Spark made (to_json, to_csv, or the text column)
            lines = [("" if line is None else line) for line in rows.column(0).to_pylist()]
            text = "".join(f"{line}\n" for line in ([self.header] if self.header else []) + lines)
            data = text.encode("utf-8")
            return gzip.compress(data) if self.codec == "gzip" else data
        return sink.getvalue()
#: Options of the sink itself; the rest go to Spark's batch writer.
_SINK_OPTIONS = {"path", "checkpointlocation", "retention"}


class FileStreamSink(Sink):
    reads_batch_through = READS_SQL

    def __init__(self, spark: SparkSession, fmt: str, path: str, partition_by: list[str],
                 options: dict[str, str], retention_ms: int | None, fs: CheckpointFileSystem,
                 in_place: bool = False):
        self.format = fmt
        self.path = path
        self.partition_by = partition_by
        self.writer_options = options
        #: write each batch's files at their final names, the manifest as the commit
        self.in_place = in_place
        self.fs = fs
        self.file_log = FileStreamSinkLog(
            f"{path}/{SINK_METADATA_DIR}", fs,
            default_compact_interval=int(spark.conf.get(
                "spark.sql.streaming.fileSink.log.compactInterval", "10")),
            cleanup_delay_ms=time_string_as_ms(spark.conf.get(
                "spark.sql.streaming.fileSink.log.cleanupDelay", "10m")),
            deleting_expired=conf_bool(spark, "spark.sql.streaming.fileSink.log.deletion", True),
            min_batches_to_retain=int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100")),
            retention_ms=retention_ms)
        self.staging_root = os.path.join(path, STAGING_DIR)
        self._metrics: dict[str, str] = {}
        # Read the live part of the log (the last compact file and the batches after it)
        # now: a damaged entry would otherwise pass unnoticed until a batch reader
        # (spark.read of the output) fails on it; this names the file before anything runs.
        self.file_log.all_files()

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
        if self.in_place:
            self._add_batch_in_place(batch_id, df)
            return
        self._remove_stale_staging(batch_id)
        staging = os.path.join(self.staging_root, f"batch-{batch_id}-{uuid.uuid4()}")
        writer = df.write.format(self.format).options(**self.writer_options).mode("error")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save("file://" + staging)
        statuses = self._move_into_place(staging)
        crash_points.reached("sink-data-written")
        self._commit(batch_id, statuses)
        crash_points.reached("sink-manifest-written")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            os.rmdir(self.staging_root)
        except OSError:
            pass  # not empty: leftovers of another attempt, removed before a later batch
        self._report(statuses)

    def _commit(self, batch_id: int, statuses: list[SinkFileStatus]) -> None:
        if not self.file_log.add(batch_id, statuses):
            raise ConcurrentUpdateError(
                f"Concurrent update to the log. Multiple streaming jobs detected for {batch_id} "
                f"({self.file_log.path}). Another query writes to the output directory "
                f"'{self.path}'; give each query its own output directory.")

    def _report(self, statuses: list[SinkFileStatus]) -> None:
        files, size = self.file_log.log_size()
        self._metrics = {"numOutputFiles": str(len(statuses)),
                         "metadataLogFiles": str(files), "metadataLogBytes": str(size)}

    # -- in place (object stores) ---------------------------------------------------------
    def _add_batch_in_place(self, batch_id: int, df: DataFrame) -> None:
        self._remove_interrupted_attempts()
        attempt = uuid.uuid4().hex[:12]
        record = f"{self.path}/{ATTEMPTS_DIR}/{batch_id}-{attempt}"
        self.fs.write_bytes(record, b"")
        statuses = self._write_in_place(batch_id, attempt, df)
        crash_points.reached("sink-data-written")
        self._commit(batch_id, statuses)
        crash_points.reached("sink-manifest-written")
        self.fs.delete(record)
        self._report(statuses)

    def _remove_interrupted_attempts(self) -> None:
        """Delete the files of attempts a crash left uncommitted (found by their records)."""
        records = self.fs.list(f"{self.path}/{ATTEMPTS_DIR}")
        if not records:
            return
        committed = " ".join(e.path for e in self.file_log.all_files())
        everything = None
        for record in records:
            attempt = record.partition("-")[2]
            if attempt and f"-{attempt}-c000" not in committed:
                if everything is None:
                    everything = [p for p in self.fs.find(self.path)
                                  if f"/{SINK_METADATA_DIR}/" not in p and f"/{ATTEMPTS_DIR}/" not in p]
                leftovers = [p for p in everything if f"-{attempt}-c000" in p.rsplit("/", 1)[-1]]
                log.info("Removing %d files of an interrupted attempt (%s) of the file sink at %s",
                         len(leftovers), record, self.path)
                for path in leftovers:
                    self.fs.delete(path)
            self.fs.delete(f"{self.path}/{ATTEMPTS_DIR}/{record}")

    def _write_in_place(self, batch_id: int, attempt: str, df: DataFrame) -> list[SinkFileStatus]:
        options = {k.lower(): v for k, v in self.writer_options.items()}
        data = [c for c in df.columns if c not in self.partition_by]
        partitions = [F.col(_quoted(c)).cast("string").alias(c) for c in self.partition_by]
        header = None
        if self.format in ("parquet", "orc"):
            prepared = df.select(*partitions, *[F.col(_quoted(c)) for c in data])
        elif self.format == "json":
            prepared = df.select(*partitions, F.to_json(F.struct(*[F.col(_quoted(c)) for c in data]),
                                                         self.writer_options).alias("__line"))
        elif self.format == "csv":
            prepared = df.select(*partitions, F.to_csv(F.struct(*[F.col(_quoted(c)) for c in data]),
                                                        self.writer_options).alias("__line"))
            if options.get("header", "false").lower() == "true":
                header = options.get("sep", options.get("delimiter", ",")).join(data)
        else:
            prepared = df.select(*partitions, F.col(_quoted(data[0])).alias("__line"))
        codec, suffix = in_place_codec(self.format, options)
        task = InPlaceWriteTask(self.path, self.format, batch_id, attempt, tuple(self.partition_by),
                                codec, suffix + _EXTENSIONS[self.format], header, storage=self.fs.spec())
        rows = prepared.mapInArrow(task, _STATUS_SCHEMA).collect()
        return [SinkFileStatus(r.path, r.size, False, r.modificationTime, OBJECT_BLOCK_REPLICATION,
                               OBJECT_BLOCK_SIZE, "add") for r in sorted(rows, key=lambda r: r.path)]

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
        return f"FileSink[{self.path}]" if self.in_place else f"FileSink[file:{self.path}]"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def in_place_codec(fmt: str, options: dict[str, str]) -> tuple[str | None, str]:
    """The codec and file-name suffix of the ``compression`` option for an in-place write."""
    codecs = _CODECS.get(fmt, _CODECS["text"])
    default = next(iter(codecs)) if fmt in ("parquet", "orc") else "none"
    name = options.get("compression", options.get("codec", default)).lower()
    if name not in codecs:
        raise IllegalArgumentException(
            f"Codec [{name}] is not available for the {fmt} sink on an object store. Known "
            f"codecs are {', '.join(sorted(codecs))}.")
    return codecs[name]


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
        raw = options["path"]
        in_place = urlparse(raw).scheme.lower() in OBJECT_STORE_SCHEMES
        if in_place:
            spark = context.spark
            fs = storage_for(raw, spark_internals.session_settings(spark))
            path = fs.resolve(raw)
        else:
            fs = context.fs
            path = local_path(raw, "output")
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
        writer_options = {k: v for k, v in options.as_dict().items() if k.lower() not in _SINK_OPTIONS}
        if in_place:
            in_place_codec(self.short_name, {k.lower(): v for k, v in writer_options.items()})
            fs.check_reachable(path, "Output path")
        else:
            self._check_local_output(path)
        retention_ms = None
        if "retention" in options:
            try:
                retention_ms = time_string_as_ms(options["retention"])
            except ValueError as e:
                raise IllegalArgumentException(f"Invalid value for option 'retention': {e}") from None
        return FileStreamSink(context.spark, self.short_name, path, partition_by, writer_options,
                              retention_ms, fs, in_place=in_place)

    @staticmethod
    def _check_local_output(path: str) -> None:
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


PROVIDERS = [FileSinkProvider(fmt) for fmt in FILE_FORMATS]
