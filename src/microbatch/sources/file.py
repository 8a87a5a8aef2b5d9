"""File sources: ``text``, ``csv``, ``json``, ``parquet``, ``orc``, ``xml`` over a directory
(Spark's FileStreamSource).

How a batch is made:

1. ``latest_offset`` lists the path (glob patterns, ``key=value`` partition
   directories, hidden and ``_``-prefixed names skipped), keeps the files not seen
   before and not older than ``maxFileAge`` behind the newest file, sorts them by
   modification time (newest first with ``latestFirst``), takes what the read limit
   allows (``maxFilesPerTrigger`` or ``maxBytesPerTrigger``), and records them as
   the next batch of the source log ``<checkpoint>/sources/<i>/`` before answering
   ``{"logOffset":N}``. The log is written before the offset log, so a file is
   never taken twice nor skipped, whatever crashes.
2. ``get_batch((a, b])`` reads exactly the files the log lists for batches
   ``a+1..b`` with Spark's batch reader, the stream's schema and every reader
   option (``mode``, ``columnNameOfCorruptRecord``, ``multiLine``, ``sep``, ...).
3. ``commit(b)`` applies ``cleanSource`` (``delete``, or ``archive`` into
   ``sourceArchiveDir``) to the files of batch ``b``, which the query has committed.

A directory written by a file sink (it has ``_spark_metadata``) is listed through
that log, on local disk or on the store, so only files of committed batches are read.

Replayable: the same range always reads the same files, as long as they exist.

The path may be local or on an object store (``s3://``, ``s3a://``, ``gs://``,
``abfss://``): listed through the storage layer (s3fs, gcsfs, adlfs) by the same rules
(or from the last key read on, ``useIncrementalListing``), each batch read by Spark's
reader where this Spark has the store's Hadoop connector, else in Spark tasks (``file_store``; the progress metric
``readPath`` says which).

Modules beside this one hold its parts: ``file_listing`` (the listing),
``file_sink_log`` (a file sink's log read as the listing) and ``file_clean_source``
(``cleanSource``); this one holds the stream's options, the source and its providers.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

from pyspark.errors import AnalysisException as PySparkAnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from microbatch.checkpoint.file_stream_log import (FILE_FORMATS, SINK_METADATA_DIR, FileEntry,
                                                   FileStreamSourceLog, live_files, path_to_uri)
from microbatch import spark_internals
from microbatch.errors import (AnalysisException, IllegalArgumentException,
                               UnsupportedOperationError)
from microbatch.sources.base import (ALL_AVAILABLE, ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                     ReadMaxFiles, Source, SourceContext, SourceProvider)
from microbatch.sources.file_clean_source import CLEANER_THREADS, SourceFileCleaner
from microbatch.sources.file_listing import (INCREMENTAL_LISTING, LOCAL_FILES, IncrementalListing, ListedFile,
                                             StoreFiles, is_glob_path, list_input_files)
from microbatch.sources.file_store import (READ_BY_SPARK, READ_IN_TASKS, StoreBatches, check_readable,
                                           describe_read_path, infer_schema, store_scheme)
from microbatch.sources.file_sink_log import has_sink_metadata, sink_log_reader
from microbatch.spark_internals.file_text import has_hadoop_file_system
from microbatch.util import CaseInsensitiveOptions, conf_bool, local_path, time_string_as_ms

log = logging.getLogger(__name__)

#: Options of the stream itself; the rest go to Spark's batch reader.
_STREAM_OPTIONS = {"path", "maxfilespertrigger", "maxbytespertrigger", "latestfirst",
                   "filenameonly", "maxfileage", "cleansource", "sourcearchivedir",
                   "maxcachedfiles", "discardcachedinputratio", INCREMENTAL_LISTING.lower()}


# -- options -------------------------------------------------------------------
@dataclass(frozen=True)
class FileStreamOptions:
    """The stream's own options, validated with Spark's messages (FileStreamOptions)."""

    max_files_per_trigger: int | None
    max_bytes_per_trigger: int | None
    max_file_age_ms: int
    latest_first: bool
    file_name_only: bool
    clean_source: str              # off | delete | archive
    source_archive_dir: str | None
    max_cached_files: int
    discard_cached_input_ratio: float
    incremental_listing: bool = False      #: microbatch's own (file_listing.IncrementalListing)

    @classmethod
    def parse(cls, options: CaseInsensitiveOptions) -> "FileStreamOptions":
        for banned in ("modifiedBefore", "modifiedAfter"):
            if banned in options:
                raise IllegalArgumentException(
                    f"option '{banned}' is not allowed in file stream sources")

        def number(name: str, convert, valid, default, requirement: str):
            if name not in options:
                return default
            raw = options[name]
            try:
                value = convert(str(raw).strip())
            except ValueError:
                value = None
            if value is None or not valid(value):
                raise IllegalArgumentException(
                    f"Invalid value '{raw}' for option '{name}', must be {requirement}")
            return value

        def boolean(name: str) -> bool:
            try:
                return options.get_bool(name, False)
            except ValueError as e:
                raise IllegalArgumentException(str(e)) from None

        max_files = number("maxFilesPerTrigger", int, lambda v: v > 0, None, "a positive integer")
        max_bytes = number("maxBytesPerTrigger", int, lambda v: v > 0, None, "a positive integer")
        if max_files is not None and max_bytes is not None:
            raise IllegalArgumentException(
                "Options 'maxFilesPerTrigger' and 'maxBytesPerTrigger' can't be both set at the same time")
        try:
            max_age = time_string_as_ms(options["maxFileAge"]) if "maxFileAge" in options else 7 * 86_400_000
        except ValueError as e:
            raise IllegalArgumentException(f"Invalid value for option 'maxFileAge': {e}") from None
        clean = str(options["cleanSource"]).strip().lower() if "cleanSource" in options else "off"
        if clean not in ("off", "delete", "archive"):
            raise IllegalArgumentException(
                f"Invalid mode for clean source option Some({options['cleanSource']}). "
                "Must be one of ARCHIVE,DELETE,OFF")
        archive_dir = options["sourceArchiveDir"] if "sourceArchiveDir" in options else None
        if clean == "archive" and not archive_dir:
            raise IllegalArgumentException("Archive mode must be used with 'sourceArchiveDir' option.")
        cached = number("maxCachedFiles", int, lambda v: v >= 0, 10000,
                        "an integer greater than or equal to 0")
        ratio = number("discardCachedInputRatio", float, lambda v: 0 <= v <= 1, 0.2,
                       "a positive float between 0 and 1")
        return cls(max_files, max_bytes, max_age, boolean("latestFirst"), boolean("fileNameOnly"),
                   clean, archive_dir, cached, ratio, boolean(INCREMENTAL_LISTING))


def reader_options(options: CaseInsensitiveOptions) -> dict[str, str]:
    """The options Spark's batch reader gets: everything but the stream's own."""
    return {k: v for k, v in options.as_dict().items() if k.lower() not in _STREAM_OPTIONS}


# -- seen files ----------------------------------------------------------------
class SeenFilesMap:
    """The files taken so far, forgotten once ``max_age_ms`` older than the newest one."""

    def __init__(self, max_age_ms: int, file_name_only: bool):
        self.max_age_ms = max_age_ms
        self.file_name_only = file_name_only
        self._map: dict[str, int] = {}
        self.latest_timestamp = 0
        self.last_purge_timestamp = 0

    def _key(self, uri: str) -> str:
        return uri.rsplit("/", 1)[-1] if self.file_name_only else uri

    def add(self, uri: str, timestamp: int) -> None:
        self._map[self._key(uri)] = timestamp
        self.latest_timestamp = max(self.latest_timestamp, timestamp)

    def is_new_file(self, uri: str, timestamp: int) -> bool:
        return timestamp >= self.last_purge_timestamp and self._key(uri) not in self._map

    def purge(self) -> int:
        self.last_purge_timestamp = self.latest_timestamp - self.max_age_ms
        old = [k for k, t in self._map.items() if t < self.last_purge_timestamp]
        for k in old:
            del self._map[k]
        return len(old)

    def __len__(self) -> int:
        return len(self._map)


# -- where the files are --------------------------------------------------------
def _store(spark: SparkSession, path: str) -> Any:
    """The object store (``checkpoint.fs.ObjectStoreFileSystem``) ``path`` is on, with the
    endpoint and credentials of ``spark.hadoop.fs.s3a.*``, ``fs.gs.*`` or ``fs.azure.*``; None for a local path."""
    if store_scheme(path) is None:
        return None
    from microbatch.checkpoint.stores import storage_for
    return storage_for(path, spark_internals.session_settings(spark))


def _uri(path: str) -> str:
    """A listed file's name in the source log: ``file://`` URI of a local path, or the
    object store's URI as listed."""
    return path if "://" in path else path_to_uri(path)


def _entry_path(entry: FileEntry) -> str:
    return entry.path if store_scheme(entry.path) else entry.local_path


# -- the source ------------------------------------------------------------------
def _log_offset(offset: Any) -> int:
    if offset is None:
        return -1
    if isinstance(offset, int):
        return offset
    try:
        return int(offset["logOffset"])
    except (TypeError, KeyError, ValueError):
        raise AnalysisException(
            f"The offset {offset!r} is not a file source offset ({{\"logOffset\":N}}); the "
            "checkpoint belongs to a query with a different source.") from None


class FileStreamSource(Source):
    supports_available_now = True

    def __init__(self, context: SourceContext, fmt: str, path: str, schema: StructType,
                 options: CaseInsensitiveOptions):
        spark = context.spark
        self._spark = spark
        self.format = fmt
        self.path = path
        self._schema = schema
        self.options = FileStreamOptions.parse(options)
        self._path_glob_filter = options["pathGlobFilter"] if "pathGlobFilter" in options else None
        self._recursive = options.get_bool("recursiveFileLookup", False)
        self._ignore_missing = options.get_bool(
            "ignoreMissingFiles", conf_bool(spark, "spark.sql.files.ignoreMissingFiles", False))
        self._ignore_corrupt = options.get_bool(
            "ignoreCorruptFiles", conf_bool(spark, "spark.sql.files.ignoreCorruptFiles", False))
        inner = reader_options(options)
        self._store = _store(spark, path)
        self._files = LOCAL_FILES if self._store is None else StoreFiles(self._store)
        self.read_path: str | None = None     # on an object store: who reads the files
        if self._store is not None:
            scheme = store_scheme(path)
            self.read_path = (READ_BY_SPARK if has_hadoop_file_system(spark, scheme)
                              else READ_IN_TASKS)
            if self.read_path == READ_IN_TASKS:
                check_readable(fmt, path, inner)
            log.info("File source %s on an object store: listed through the storage layer, each batch's files "
                     "read by %s",
                     path, describe_read_path(self.read_path, scheme))
            found = None if is_glob_path(path) else self._files.kind(self._files.key(path))
            if found is not None and found[0] == "directory":
                inner["basePath"] = path
        elif not is_glob_path(path) and os.path.isdir(path):
            inner["basePath"] = path
        inner["__globPaths__"] = "false"  # file names are names, not patterns
        self._reader_options = inner
        self._batches: spark_internals.FileBatches | None = None   # made at the first batch
        self._store_batches: StoreBatches | None = None
        #: the ``_metadata`` struct type each batch read in tasks carries (carry_hidden_columns)
        self._carried_metadata: Any = None
        self._no_files: DataFrame | None = None    # the batch of a log range whose files are gone
        self.metadata_log = FileStreamSourceLog(
            context.metadata_path, context.fs,
            default_compact_interval=int(spark.conf.get(
                "spark.sql.streaming.fileSource.log.compactInterval", "10")),
            cleanup_delay_ms=time_string_as_ms(spark.conf.get(
                "spark.sql.streaming.fileSource.log.cleanupDelay", "10m")),
            deleting_expired=conf_bool(spark, "spark.sql.streaming.fileSource.log.deletion", True),
            min_batches_to_retain=int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100")))
        latest = self.metadata_log.get_latest_batch_id()
        self.current_log_offset = -1 if latest is None else latest
        opts = self.options
        if opts.latest_first:
            log.warning("'latestFirst' is true. New files will be processed first, which may "
                        "affect the watermark\nvalue. In addition, 'maxFileAge' will be ignored.")
        self.max_file_age_ms = (2**63 - 1 if opts.latest_first and (
            opts.max_files_per_trigger or opts.max_bytes_per_trigger) else opts.max_file_age_ms)
        if opts.file_name_only:
            log.warning("'fileNameOnly' is enabled. Make sure your file names are unique (e.g. "
                        "using UUID), otherwise, files with the same name but under different "
                        "paths will be considered the same and causes data lost.")
        self.seen_files = SeenFilesMap(self.max_file_age_ms, opts.file_name_only)
        for entry in self.metadata_log.all_files():
            self.seen_files.add(entry.path, entry.timestamp)
        self.seen_files.purge()
        self.source_has_metadata: bool | None = False if is_glob_path(path) else None
        self.cleaner = (SourceFileCleaner(opts.clean_source, path, opts.source_archive_dir,
                                          int(spark.conf.get(CLEANER_THREADS, "1")), self._store)
                        if opts.clean_source != "off" else None)
        self._unread_files: list[ListedFile] | None = None
        self._available_now_files: list[ListedFile] | None = None
        self._incremental = (IncrementalListing(self._files, path, [e.path for e in self.metadata_log.all_files()],
                                                self._path_glob_filter, self._recursive)
                             if opts.incremental_listing else None)
        log.info("maxFilesPerBatch = %s, maxBytesPerBatch = %s, maxFileAgeMs = %d",
                 opts.max_files_per_trigger, opts.max_bytes_per_trigger, self.max_file_age_ms)

    @property
    def schema(self) -> StructType:
        return self._schema

    def __str__(self) -> str:
        return f"FileStreamSource[{self.path if self._store is not None else 'file:' + self.path}]"

    def metrics(self, consumed: Any) -> dict[str, str]:
        """On an object store, ``readPath``: ``sparkReader`` (Spark's own reader, through
        its Hadoop connector) or ``pythonTasks`` (read in Spark tasks through the storage
        layer); with ``useIncrementalListing``, ``filesListed``: the objects the last
        listing returned."""
        if self.read_path is None:
            return {}
        if self._incremental is None:
            return {"readPath": self.read_path}
        return {"readPath": self.read_path, "filesListed": str(self._incremental.listed)}

    def initial_offset(self) -> Any:
        return None

    def report_latest_offset(self, latest: Any) -> Any:
        return None  # as Spark's file source (admission control, no reportLatestOffset)

    def default_read_limit(self) -> ReadLimit:
        if self.options.max_files_per_trigger:
            return ReadMaxFiles(self.options.max_files_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ALL_AVAILABLE

    def prepare_for_trigger_available_now(self) -> None:
        self._available_now_files = self.fetch_all_files()

    # -- listing ------------------------------------------------------------
    def fetch_all_files(self) -> list[ListedFile]:
        """All files of the path, oldest first (newest first with ``latestFirst``)."""
        if self.source_has_metadata is None and has_sink_metadata(self._spark, self.path, self._store):
            self._set_has_metadata()
        if self.source_has_metadata:
            files = self._files_from_sink_log()
        elif self._incremental is not None:
            files = self._incremental.list()
            self.source_has_metadata = False     # (asked once: not a sink's output)
        else:
            files = list_input_files(self.path, self._path_glob_filter, self._recursive, self._files)
            if files and self.source_has_metadata is None:
                # The sink may have created its log after the check above.
                if has_sink_metadata(self._spark, self.path, self._store):
                    self._set_has_metadata()
                    files = self._files_from_sink_log()
                else:
                    self.source_has_metadata = False
        if self.options.latest_first:
            files.sort(key=lambda f: (-f.mtime_ms, f.path))
        else:
            files.sort(key=lambda f: (f.mtime_ms, f.path))
        return files

    def _set_has_metadata(self) -> None:
        if self.cleaner is not None:
            raise UnsupportedOperationError(
                "Cleaning up source files is not supported when reading from the output "
                f"directory of FileStreamSink ('{self.path}' has {SINK_METADATA_DIR}). Remove "
                "the cleanSource option.")
        self.source_has_metadata = True

    def _files_from_sink_log(self) -> list[ListedFile]:
        reader = sink_log_reader(self._spark, self.path, self._store)
        return [ListedFile(e.path if self._store is not None else e.local_path, e.size, e.modificationTime)
                for e in live_files(reader.all_files())]

    # -- offsets ------------------------------------------------------------
    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        offset = self._fetch_max_offset(limit)
        return None if offset == -1 else {"logOffset": offset}

    def _fetch_max_offset(self, limit: ReadLimit) -> int:
        if self._unread_files:
            new_files = self._unread_files
        else:
            candidates = (self._available_now_files if self._available_now_files is not None
                          else self.fetch_all_files())
            new_files = [f for f in candidates
                         if self.seen_files.is_new_file(_uri(f.path), f.mtime_ms)]
        should_cache = not self.options.latest_first and self._available_now_files is None
        ratio = self.options.discard_cached_input_ratio
        unselected: list[ListedFile] | None = None
        if isinstance(limit, ReadMaxFiles):
            batch = new_files[:limit.files]
            if should_cache:
                rest = new_files[limit.files:]
                unselected = None if len(rest) < limit.files * ratio else rest
        elif isinstance(limit, ReadMaxBytes):
            batch, rest = self._take_until_max_bytes(new_files, limit.bytes)
            if should_cache:
                unselected = None if sum(f.size for f in rest) < limit.bytes * ratio else rest
        elif isinstance(limit, ReadAllAvailable):
            batch = new_files
        else:
            raise ValueError(f"The file source does not understand the read limit {limit}")
        if unselected and self.options.max_cached_files > 0:
            self._unread_files = unselected[:self.options.max_cached_files]
        else:
            self._unread_files = None
        for f in batch:
            self.seen_files.add(_uri(f.path), f.mtime_ms)
            log.debug("New file: %s", f.path)
        self.seen_files.purge()
        if self._incremental is not None:
            self._incremental.consumed(lambda f: self.seen_files.is_new_file(_uri(f.path), f.mtime_ms))
        if batch:
            next_offset = self.current_log_offset + 1
            entries = [FileEntry(_uri(f.path), f.mtime_ms, next_offset) for f in batch]
            if not self.metadata_log.add(next_offset, entries):
                raise IllegalArgumentException(
                    "Concurrent update to the log. Multiple streaming jobs detected for "
                    f"{next_offset} (file source log '{self.metadata_log.path}'). Another run of "
                    "this query owns the checkpoint.")
            self.current_log_offset = next_offset
            log.info("Log offset set to %d with %d new files", next_offset, len(batch))
        return self.current_log_offset

    @staticmethod
    def _take_until_max_bytes(files: list[ListedFile], max_bytes: int
                              ) -> tuple[list[ListedFile], list[ListedFile]]:
        """The first file always; then files while the total stays within ``max_bytes``."""
        taken: list[ListedFile] = []
        rest: list[ListedFile] = []
        size = 0
        for i, f in enumerate(files):
            if i == 0 or (not rest and size + f.size <= max_bytes):
                taken.append(f)
                size += f.size
            else:
                rest.append(f)
        return taken, rest

    # -- data ---------------------------------------------------------------
    def get_batch(self, start: Any, end: Any) -> DataFrame:
        start_offset, end_offset = _log_offset(start), _log_offset(end)
        assert start_offset <= end_offset, f"{start_offset} > {end_offset}"
        entries = self.metadata_log.files_in_range(start_offset + 1, end_offset)
        log.info("Processing %d files from %d:%d", len(entries), start_offset + 1, end_offset)
        paths = [_entry_path(e) for e in entries]
        modified_ms = {path: e.timestamp for path, e in zip(paths, entries)}
        # on a store, a missing file is found by the task reading it (no request per file here)
        missing = [] if self._store is not None else [p for p in paths if not os.path.exists(p)]
        if missing:
            if not self._ignore_missing:
                shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                raise FileNotFoundError(
                    f"[FILE_SOURCE_MISSING_FILE] The file source '{self.path}' listed {shown} for "
                    f"log batches {start_offset + 1}..{end_offset} ({self.metadata_log.path}), but "
                    "the file no longer exists. Restore the file, or set the option "
                    "ignoreMissingFiles=true to skip files removed after they were listed.")
            log.warning("Skipping %d missing file(s) (ignoreMissingFiles): %s", len(missing), missing[:5])
            paths = [p for p in paths if p not in set(missing)]
        self._batch_paths = ((start_offset, end_offset), paths)
        if not paths:   # a relation of no files, which has the hidden ``_metadata`` too
            if self._no_files is None:
                self._no_files = no_files(self._spark, self.format, self._schema, self._reader_options)
            return self._no_files
        if self.read_path == READ_IN_TASKS:
            if self._store_batches is None:
                self._store_batches = StoreBatches(self._spark, self.format, self._schema, self._reader_options,
                                                   self._store.spec(), self._ignore_missing)
            if self._carried_metadata is not None:
                return self._store_batches.dataframe(paths, self._carried_metadata, modified_ms)
            return self._store_batches.dataframe(paths)
        df = self._file_batches().dataframe([p if self._store is not None else "file://" + p for p in paths])
        if df.columns != self._schema.fieldNames():
            # e.g. partition directories that appeared after the stream's schema was fixed
            df = df.select(*self._schema.fieldNames())
        return df

    def batches_expose_hidden_columns(self) -> bool:
        return self.read_path != READ_IN_TASKS

    def carry_hidden_columns(self) -> None:
        """The files read in Python tasks (no Hadoop connector for the store) give
        ``_metadata`` in a column of their own: parquet's, from each file's name, size and
        listed modification time and each row's index in it. Spark's json, csv and text
        parsers there take the files' lines without their file: refused."""
        if self.format != "parquet":
            raise UnsupportedOperationError(
                f"The file source '{self.path}' reads its {self.format} files in Python tasks (this Spark has "
                f"no Hadoop FileSystem for {self._store.scheme}://), where the hidden column _metadata is "
                "available for parquet files only. Read parquet files, or run on a Spark with the store's "
                "connector on its class path, whose reader gives _metadata for every format.")
        local = {k: v for k, v in self._reader_options.items() if k != "basePath"}   # (no Hadoop FileSystem for it)
        empty = no_files(self._spark, self.format, self._schema, local)
        self._carried_metadata = empty.select("_metadata").schema.fields[0].dataType

    def _file_batches(self) -> spark_internals.FileBatches:
        if self._batches is None:
            options = dict(self._reader_options)
            if self._ignore_missing:
                options["ignoreMissingFiles"] = "true"
            self._batches = spark_internals.FileBatches(self._spark, self.format, self._schema, options)
        return self._batches

    #: Up to this many files a batch's row count is read from the parquet footers;
    #: beyond, the engine counts the rows as they pass.
    MAX_FOOTERS_PER_BATCH = 256

    def num_rows(self, start: Any, end: Any) -> int | None:
        """For parquet, the rows of the batch's files from their footers (about 0.3 ms a
        file), so the engine need not count rows in the plan: counting there stops
        whole-stage code generation and filter pushdown at the scan (100-150 ms a batch
        of 1M rows). Spark counts the rows its scan returned, which is fewer when a
        pushed filter skips whole row groups; this counts the rows in the files."""
        if self.format != "parquet" or self._ignore_corrupt or self._store is not None:   # Spark's scan skips corrupt files
            return None
        batch = getattr(self, "_batch_paths", None)
        if batch is None or batch[0] != (_log_offset(start), _log_offset(end)):
            return None
        paths = batch[1]
        if len(paths) > self.MAX_FOOTERS_PER_BATCH:
            return None
        import pyarrow.parquet as pq
        try:
            return sum(pq.read_metadata(p).num_rows for p in paths)
        except (OSError, ValueError) as e:   # unreadable: Spark's scan will say why
            log.debug("Cannot read parquet footers, counting rows instead: %s", e)
            return None

    def commit(self, end: Any) -> None:
        if self.cleaner is None:
            return
        log_offset = _log_offset(end)
        if log_offset < 0:
            return
        self.cleaner.clean_all([entry for entry in self.metadata_log.files_in_range(log_offset, log_offset)
                                if entry.batchId == log_offset])


# -- providers -------------------------------------------------------------------
def _listed(path: str, options: CaseInsensitiveOptions, store: Any = None) -> list[ListedFile]:
    return list_input_files(path, options["pathGlobFilter"] if "pathGlobFilter" in options else None,
                            options.get_bool("recursiveFileLookup", False),
                            LOCAL_FILES if store is None else StoreFiles(store))


def _nullable(schema: StructType) -> StructType:
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


def no_files(spark: SparkSession, fmt: str, schema: StructType, options: Mapping[str, str]) -> DataFrame:
    """A relation of the format over no files: it has Spark's hidden ``_metadata`` column
    (``file_path``, ``file_name``, ``file_size``, ``file_block_start``, ``file_block_length``,
    ``file_modification_time``), as the files' batches have. Its columns are data columns,
    but for the text format, whose data is one string column (``value``, or a user
    schema's own name for it, its first: ``data STRING``): the others are the directory's
    partition columns."""
    partitions = ()
    if fmt == "text" and schema.fields:
        names = [f.name for f in schema.fields]
        data = "value" if "value" in names else names[0]
        partitions = tuple(n for n in names if n != data)
    return spark_internals.FileBatches(spark, fmt, schema, options, partitions).dataframe([])


class FileSourceProvider(SourceProvider):
    """``readStream.format(<fmt>)`` for one file format."""

    spark_v1_source = True   # (Spark's FileStreamSource)

    def __init__(self, fmt: str):
        self.short_name = fmt

    def _path(self, options: CaseInsensitiveOptions) -> str:
        if "path" not in options:
            raise IllegalArgumentException(
                f"'path' is not specified. Give the directory to watch: "
                f"readStream.format('{self.short_name}').load('/path/to/dir').")
        raw = str(options["path"])
        if store_scheme(raw) is not None:
            scheme, _, rest = raw.partition("://")
            return f"{scheme}://{rest.rstrip('/')}" if rest.strip("/") else raw
        return local_path(raw, "input")

    def resolve_schema(self, spark: SparkSession, options: CaseInsensitiveOptions,
                       user_schema: StructType | None) -> StructType:
        path = self._path(options)
        FileStreamOptions.parse(options)
        if store_scheme(path) is not None:
            return self._resolve_store_schema(spark, path, options, user_schema)
        glob = is_glob_path(path)
        if not glob and not os.path.exists(path):
            raise spark_internals.spark_error("AnalysisException", "PATH_NOT_FOUND", path=path)
        inference = conf_bool(spark, "spark.sql.streaming.schemaInference", False)
        self_describing = self.short_name in ("parquet", "orc")
        if user_schema is None and not inference and self.short_name != "text":
            if not self_describing or not _listed(path, options):
                raise spark_internals.spark_error("SparkIllegalArgumentException",
                                                  "_LEGACY_ERROR_TEMP_2048")
        if glob and not _listed(path, options):
            if user_schema is None and self.short_name != "text":
                raise AnalysisException(
                    f"Unable to infer schema for {self.short_name.upper()}: no file matches "
                    f"'{path}' yet. It must be specified manually with .schema(...).")
            schema = user_schema if user_schema is not None else StructType([StructField("value", StringType())])
            return _nullable(schema)
        # Spark's batch reader does the same inference Spark's file stream does: the
        # data schema (given or inferred) plus the partition columns of the directory.
        reader = spark.read.format(self.short_name).options(**reader_options(options))
        if user_schema is not None:
            reader = reader.schema(user_schema)
        try:
            schema = reader.load("file://" + path).schema
        except PySparkAnalysisException as e:
            raise AnalysisException(f"{e} (file source '{path}')") from e
        if conf_bool(spark, "spark.sql.streaming.fileSource.schema.forceNullable", True):
            schema = _nullable(schema)
        return schema

    def _resolve_store_schema(self, spark: SparkSession, path: str, options: CaseInsensitiveOptions,
                              user_schema: StructType | None) -> StructType:
        """The schema of a stream over an object store: Spark's reader resolves it where
        this Spark has the store's connector; else as Spark's would (file_store.infer_schema)."""
        store = _store(spark, path)
        scheme = store_scheme(path)
        connector = has_hadoop_file_system(spark, scheme)
        if not connector:
            check_readable(self.short_name, path, reader_options(options))
        glob = is_glob_path(path)
        if not glob and store.kind(StoreFiles(store).key(path)) is None:
            raise spark_internals.spark_error("AnalysisException", "PATH_NOT_FOUND", path=path)
        inference = conf_bool(spark, "spark.sql.streaming.schemaInference", False)
        self_describing = self.short_name in ("parquet", "orc")
        listed = _listed(path, options, store)
        if user_schema is None and not inference and self.short_name != "text":
            if not self_describing or not listed:
                raise spark_internals.spark_error("SparkIllegalArgumentException",
                                                  "_LEGACY_ERROR_TEMP_2048")
        if not listed and (glob or not connector):
            if user_schema is None and self.short_name != "text":
                raise AnalysisException(
                    f"Unable to infer schema for {self.short_name.upper()}: no file matches "
                    f"'{path}' yet. It must be specified manually with .schema(...).")
            schema = user_schema if user_schema is not None else StructType([StructField("value", StringType())])
            return _nullable(schema)
        if connector:
            reader = spark.read.format(self.short_name).options(**reader_options(options))
            if user_schema is not None:
                reader = reader.schema(user_schema)
            try:
                schema = reader.load(path).schema
            except PySparkAnalysisException as e:
                raise AnalysisException(f"{e} (file source '{path}')") from e
        else:
            schema = infer_schema(spark, self.short_name, listed, user_schema, reader_options(options),
                                  store.spec(), conf_bool(spark, "spark.sql.sources.partitionColumnTypeInference.enabled", True),
                                  glob)
        if conf_bool(spark, "spark.sql.streaming.fileSource.schema.forceNullable", True):
            schema = _nullable(schema)
        return schema

    def create(self, context: SourceContext, options: CaseInsensitiveOptions,
               schema: StructType) -> Source:
        return FileStreamSource(context, self.short_name, self._path(options), schema, options)

    def empty_batch(self, spark: SparkSession, options: CaseInsensitiveOptions,
                    schema: StructType) -> DataFrame:
        return no_files(spark, self.short_name, schema, reader_options(options))


PROVIDERS = [FileSourceProvider(fmt) for fmt in FILE_FORMATS]
