"""The Delta Lake source: ``readStream.format("delta").load(path)`` reads a table's commits
incrementally, as Delta's own streaming source (``DeltaSource``) does.

Where it starts: without options, the table's snapshot at the version of the first batch
(its files ordered by modification time, then path), then every later commit; with
``startingVersion`` (a version, or ``latest``: the commits after the current one) or
``startingTimestamp`` (the first commit at or after it), that commit's changes on. Each
commit's files are its ``add`` actions that change data, in the log's order.

An offset is Delta's: ``{"sourceVersion": 1, "reservoirId": <table id>,
"reservoirVersion": v, "index": i, "isStartingVersion": b}``, meaning every file up to
index ``i`` of version ``v`` (of its snapshot when ``isStartingVersion``) is read; index -1
is none of that version yet. Offsets name the table's versions, so a batch re-run after a
crash reads the same files: the source is replayable.

A commit that rewrites data (``remove`` actions that change data: DELETE, UPDATE, MERGE,
an overwrite) stops the stream with Delta's DELTA_SOURCE_TABLE_IGNORE_CHANGES error,
unless ``skipChangeCommits`` (such a commit is skipped whole) or ``ignoreDeletes`` (a commit
that only removes files is skipped). Commits that do not change data (OPTIMIZE) are
skipped. ``maxFilesPerTrigger`` (default 1000) and ``maxBytesPerTrigger`` bound a batch.
The batch's files are read by Spark's parquet reader, the partition values from the
files' directories as Delta writes them; a table on S3 (this Spark has no hadoop-aws) is
read in Spark tasks through the storage layer (``object_store_files``), the partition
values from the log, with the checkpoint's endpoint and credentials
(``spark.hadoop.fs.s3a.*``).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.errors import AnalysisException, IllegalArgumentException, UnsupportedOperationError
from microbatch.lakehouse import DeltaLocation, delta_location, open_delta_table
from microbatch.sources.base import (CompositeReadLimit, ReadAllAvailable, ReadLimit,
                                     ReadMaxBytes, ReadMaxFiles, Source, SourceContext, SourceProvider)
from microbatch.sources.object_store_files import ParquetFile, read_parquet_files
from microbatch.util import CaseInsensitiveOptions, byte_size

log = logging.getLogger(__name__)

#: Delta's default ``maxFilesPerTrigger`` (DeltaOptions.MAX_FILES_PER_TRIGGER_OPTION_DEFAULT)
DEFAULT_MAX_FILES = 1000


@dataclass(frozen=True)
class DeltaFile:
    """One data file a stream reads: where it is in the table's history, and the file."""

    version: int
    index: int
    starting: bool          # a file of the first version's snapshot
    path: str               # relative to the table, decoded
    size: int
    partition_values: tuple[tuple[str, str | None], ...] = ()   # as the log has them


def _table(location: DeltaLocation, version: int | None = None) -> Any:
    return open_delta_table(location, version)


def table_schema(location: DeltaLocation) -> StructType:
    """The Delta table's schema as Spark's, or Delta's error for a path without a table."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema
    if not DeltaTable.is_deltatable(location.uri, location.storage_options):
        raise AnalysisException(f"[DELTA_MISSING_DELTA_TABLE] `{location.uri}` is not a Delta table. Write to "
                                "it first (writeStream.format('delta').start(path)), or read the right path.")
    return from_arrow_schema(pa.schema(_table(location).schema().to_arrow()))


class DeltaSource(Source):
    """Reads a Delta table's commits (see the module docstring)."""

    supports_available_now = True

    def __init__(self, context: SourceContext, location: DeltaLocation, schema: StructType,
                 options: CaseInsensitiveOptions):
        self._spark = context.spark
        self.location = location
        self.path = location.uri
        self._schema = schema
        self._start_record = f"{context.metadata_path}/delta-start"   # where a new query starts
        self._fs = context.fs
        table = self._latest_table = _table(location)
        metadata = table.metadata()
        self.table_id = metadata.id
        self.partition_columns = tuple(metadata.partition_columns)
        self.skip_change_commits = options.get_bool("skipChangeCommits", False)
        self.ignore_deletes = options.get_bool("ignoreDeletes", False)
        self.ignore_changes = options.get_bool("ignoreChanges", False)
        self.max_files = _positive(options, "maxFilesPerTrigger")
        self.max_bytes = _bytes(options.get("maxBytesPerTrigger")) if "maxBytesPerTrigger" in options else None
        self._starting_version = options.get("startingVersion")
        self._starting_timestamp = options.get("startingTimestamp")
        if self._starting_version is not None and self._starting_timestamp is not None:
            raise IllegalArgumentException(
                "[DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET] Please either provide 'startingVersion' "
                "or 'startingTimestamp'.")
        self._available_now_end: dict | None = None
        self._batches: spark_internals.FileBatches | None = None

    @property
    def schema(self) -> StructType:
        return self._schema

    # -- offsets ------------------------------------------------------------------------
    def _offset(self, version: int, index: int, starting: bool) -> dict:
        return {"sourceVersion": 1, "reservoirId": self.table_id, "reservoirVersion": version,
                "index": index, "isStartingVersion": starting}

    def _position(self, offset: Any) -> tuple[int, int, bool]:
        if offset is None:
            return self._start()
        if offset.get("reservoirId") != self.table_id:
            raise AnalysisException(
                f"[DELTA_DIFFERENT_TABLE] The Delta table at {self.path} has changed: the checkpoint's offsets "
                f"are of table {offset.get('reservoirId')}, the path now holds table {self.table_id} (it was "
                "replaced). Start the query with a new checkpoint.")
        return int(offset["reservoirVersion"]), int(offset["index"]), bool(offset["isStartingVersion"])

    def _start(self) -> tuple[int, int, bool]:
        """Where the query begins (before any file): resolved once, then kept in the
        source's checkpoint directory, so a restart before the first commit begins there too."""
        if self._fs.exists(self._start_record):
            found = json.loads(self._fs.read_text(self._start_record))
            return int(found["version"]), -1, bool(found["starting"])
        current = self._latest_version()
        if self._starting_version is not None:
            text = str(self._starting_version).strip().lower()
            if text == "latest":
                version, starting = current + 1, False
            else:
                try:
                    version, starting = int(text), False
                except ValueError:
                    raise IllegalArgumentException(
                        f"[DELTA_INVALID_STARTING_VERSION] Invalid value '{self._starting_version}' for option "
                        "'startingVersion'. Give a version number or 'latest'.") from None
                if version > current:
                    raise AnalysisException(
                        f"[DELTA_VERSION_NOT_FOUND] Cannot time travel Delta table to version {version}. "
                        f"Available versions: [0, {current}].")
        elif self._starting_timestamp is not None:
            version, starting = self._version_at(self._starting_timestamp, current), False
        else:
            version, starting = current, True
        self._fs.write(self._start_record, json.dumps({"version": version, "starting": starting}))
        return version, -1, starting

    def _version_at(self, timestamp: str, current: int) -> int:
        """The first commit at or after ``timestamp`` (Delta's startingTimestamp)."""
        from datetime import datetime, timezone
        try:
            moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:
            raise IllegalArgumentException(
                f"[DELTA_INVALID_TIMESTAMP_FORMAT] The provided timestamp ({timestamp}) cannot be converted "
                "to a valid timestamp: give e.g. '2026-01-01' or '2026-01-01 10:00:00'.") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        wanted_ms = int(moment.timestamp() * 1000)
        for entry in sorted(_table(self.location).history(), key=lambda e: e["version"]):
            if entry["timestamp"] >= wanted_ms:
                return int(entry["version"])
        raise AnalysisException(
            f"[DELTA_TIMESTAMP_GREATER_THAN_COMMIT] The provided timestamp ({timestamp}) is after the latest "
            f"version of the table (version {current}). Use a timestamp before it, or startingVersion='latest'.")

    def initial_offset(self) -> Any:
        return None

    def report_latest_offset(self, latest: Any) -> Any:
        return None   # (admission control, as the file source)

    def default_read_limit(self) -> ReadLimit:
        files = ReadMaxFiles(self.max_files or DEFAULT_MAX_FILES)
        if self.max_bytes is not None:
            by_bytes = ReadMaxBytes(self.max_bytes)
            return by_bytes if self.max_files is None else CompositeReadLimit((files, by_bytes))
        return files

    def prepare_for_trigger_available_now(self) -> None:
        version = self._latest_version()
        self._available_now_end = {"version": version}

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        position = self._position(start)
        max_files, max_bytes = _limits(limit)
        last, files, size = None, 0, 0
        end_version = None if self._available_now_end is None else self._available_now_end["version"]
        for found in self._files_after(position, end_version):
            if last is not None and ((max_files is not None and files >= max_files)
                                     or (max_bytes is not None and size >= max_bytes)):
                break
            last = found
            files += 1
            size += found.size
        if last is None:
            return start
        return self._offset(last.version, last.index, last.starting)

    # -- the log --------------------------------------------------------------------------
    def _latest_version(self) -> int:
        """The table's newest version: the table opened at start, brought up to date with
        the commits since (``update_incremental``: about 1 ms, where opening is 4)."""
        self._latest_table.update_incremental()
        return self._latest_table.version()

    def _files_after(self, position: tuple[int, int, bool], end_version: int | None) -> Iterator[DeltaFile]:
        """The files after ``position``, in the stream's order, up to the table's latest
        version (or ``end_version``)."""
        version, index, starting = position
        if starting:
            for found in self._snapshot(version):
                if found.index > index:
                    yield found
            version, index = version + 1, -1
        latest = self._latest_version() if end_version is None else end_version
        while version <= latest:
            for found in self._commit_files(version):
                if found.index > index:
                    yield found
            version, index = version + 1, -1

    def _snapshot(self, version: int) -> list[DeltaFile]:
        import pyarrow as pa
        adds = pa.table(_table(self.location, version).get_add_actions(flatten=True)).to_pylist()
        if any(a.get("deletionVector.storageType") for a in adds):
            raise _deletion_vectors(self.path, version)
        adds.sort(key=lambda a: (a["modification_time"], a["path"]))
        return [DeltaFile(version, i, True, a["path"], int(a["size_bytes"]),
                          _partition_values(a, self.partition_columns)) for i, a in enumerate(adds)]

    def _commit_files(self, version: int) -> list[DeltaFile]:
        """The files commit ``version`` adds that change data, after Delta's source's checks."""
        log_file = f"{self.location.root}/_delta_log/{version:020d}.json"
        try:
            actions = [json.loads(line) for line in self.location.storage.read_text(log_file).splitlines()
                       if line.strip()]
        except FileNotFoundError:
            raise AnalysisException(
                f"[DELTA_LOG_FILE_NOT_FOUND_FOR_STREAMING_SOURCE] The log file of version {version} of the "
                f"Delta table at {self.path} is gone (log retention, or a VACUUM of the log): the stream "
                "cannot go on from its checkpoint. Start it again with a new checkpoint (and startingVersion), "
                "or keep the log longer (delta.logRetentionDuration).") from None
        for action in actions:
            if "metaData" in action:
                self._check_schema(action["metaData"], version)
            if "protocol" in action and int(action["protocol"].get("minReaderVersion", 1)) > 3:
                raise AnalysisException(
                    f"[DELTA_INVALID_PROTOCOL_VERSION] The Delta table at {self.path} needs reader version "
                    f"{action['protocol']['minReaderVersion']} from version {version} on; microbatch reads up to 3.")
        adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        removes = [a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)]
        if removes:
            if self.skip_change_commits:
                return []
            if self.ignore_deletes and not adds:
                return []
            if not self.ignore_changes:
                raise AnalysisException(
                    f"[DELTA_SOURCE_TABLE_IGNORE_CHANGES] Detected a data update (for example "
                    f"{removes[0].get('path')}) in the source table at version {version}. This is currently "
                    "not supported. If this is going to happen regularly and you are okay to skip changes, "
                    "set the option 'skipChangeCommits' to 'true'. If you would like the data update to be "
                    "reflected, please restart this query with a fresh checkpoint directory or do a full "
                    "refresh. The source table can be found at path " + self.path + ".")
        if any(a.get("deletionVector") for a in adds):
            raise _deletion_vectors(self.path, version)
        return [DeltaFile(version, i, False, unquote(a["path"]), int(a.get("size", 0)),
                          tuple((c, (a.get("partitionValues") or {}).get(c)) for c in self.partition_columns))
                for i, a in enumerate(adds)]

    def _check_schema(self, metadata: dict, version: int) -> None:
        import pyarrow as pa
        from deltalake import Schema
        from pyspark.sql.pandas.types import from_arrow_schema
        schema = from_arrow_schema(pa.schema(Schema.from_json(metadata["schemaString"]).to_arrow()))
        if schema != self._schema:
            raise AnalysisException(
                f"[DELTA_SCHEMA_CHANGED_WITH_VERSION] Detected schema change in version {version} of the "
                f"Delta table at {self.path}: streaming source schema {self._schema.simpleString()}, data "
                f"file schema {schema.simpleString()}. Please try restarting the query. If this issue "
                "repeats across query restarts without making progress, you have made an incompatible "
                "schema change and need to start your query from scratch using a new checkpoint directory.")

    # -- data -------------------------------------------------------------------------------
    def get_batch(self, start: Any, end: Any) -> DataFrame:
        position, last = self._position(start), self._position(end)
        files = []
        for found in self._files_after(position, last[0]):
            if (found.version, found.starting) == (last[0], last[2]) and found.index > last[1]:
                break
            if found.version > last[0]:
                break
            files.append(found)
        if not self.location.is_local:
            return read_parquet_files(
                self._spark, [ParquetFile(f"{self.location.root}/{f.path}", f.partition_values) for f in files],
                self._schema, self.location.storage.spec())
        if self._batches is None:
            self._batches = spark_internals.FileBatches(
                self._spark, "parquet", self._schema, {"basePath": "file://" + self.path}, self.partition_columns)
        df = self._batches.dataframe([f"file://{os.path.join(self.path, f.path)}" for f in files])
        if df.columns != self._schema.fieldNames():
            df = df.select(*[f"`{name}`" for name in self._schema.fieldNames()])
        return df

    def __str__(self) -> str:
        return f"DeltaSource[{'file:' if self.location.is_local else ''}{self.path}]"


def _partition_values(add: dict, columns: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """A snapshot file's partition values (``get_add_actions(flatten=True)``'s typed
    ``partition.<column>``) as the log's text."""
    import datetime
    values = []
    for column in columns:
        value = add.get(f"partition.{column}")
        if isinstance(value, datetime.datetime):
            value = value.strftime("%Y-%m-%d %H:%M:%S.%f")
        elif isinstance(value, bool):
            value = str(value).lower()
        values.append((column, None if value is None else str(value)))
    return tuple(values)


def _deletion_vectors(path: str, version: int) -> Exception:
    return UnsupportedOperationError(
        f"The Delta table at {path} has deletion vectors (version {version}): microbatch's Delta source "
        "reads tables without them. Purge them (REORG TABLE ... APPLY (PURGE)) or disable the feature "
        "(delta.enableDeletionVectors = false).")


def _positive(options: CaseInsensitiveOptions, name: str) -> int | None:
    if name not in options:
        return None
    try:
        value = int(options[name])
    except ValueError:
        value = 0
    if value <= 0:
        raise IllegalArgumentException(
            f"[DELTA_ILLEGAL_OPTION] Invalid value '{options[name]}' for option '{name}', must be a positive integer.")
    return value


def _bytes(text: str) -> int:
    try:
        value = byte_size(text)
    except (TypeError, ValueError):
        value = 0
    if value <= 0:
        raise IllegalArgumentException(
            f"[DELTA_ILLEGAL_OPTION] Invalid value '{text}' for option 'maxBytesPerTrigger', must be a size "
            "configuration such as '10g'.")
    return value


def _limits(limit: ReadLimit) -> tuple[int | None, int | None]:
    if isinstance(limit, ReadAllAvailable):
        return None, None
    if isinstance(limit, ReadMaxFiles):
        return limit.files, None
    if isinstance(limit, ReadMaxBytes):
        return None, limit.bytes
    if isinstance(limit, CompositeReadLimit):
        files = [x.files for x in limit.limits if isinstance(x, ReadMaxFiles)]
        sizes = [x.bytes for x in limit.limits if isinstance(x, ReadMaxBytes)]
        return (min(files) if files else None), (min(sizes) if sizes else None)
    return None, None


class DeltaSourceProvider(SourceProvider):
    """``readStream.format("delta").load(path)``: the table's own schema (Delta refuses a
    schema given at read time)."""

    short_name = "delta"

    def resolve_schema(self, spark: SparkSession, options: CaseInsensitiveOptions,
                       user_schema: StructType | None) -> StructType:
        if "path" not in options:
            raise IllegalArgumentException("'path' is not specified. Give the Delta table's directory: "
                                           "readStream.format('delta').load('/path/to/table').")
        if user_schema is not None:
            raise AnalysisException("[DELTA_UNSUPPORTED_SCHEMA_DURING_READ] Delta does not support specifying "
                                    "the schema at read time.")
        return table_schema(delta_location(spark, options["path"]))

    def create(self, context: SourceContext, options: CaseInsensitiveOptions, schema: StructType) -> Source:
        return DeltaSource(context, delta_location(context.spark, options["path"]), schema, options)

