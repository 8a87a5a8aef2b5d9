"""The Iceberg source: ``readStream.format("iceberg").load("db.table")`` reads the table's
appended snapshots incrementally, as Iceberg's Spark streaming source (SparkMicroBatchStream).

The snapshots are the current snapshot's ancestry, oldest first (from
``stream-from-timestamp``, in ms, when given); each ``append`` snapshot's added data files,
in its manifests' order, are the stream's files. An ``overwrite`` or ``delete`` snapshot
stops the stream with Iceberg's message, unless ``streaming-skip-overwrite-snapshots`` or
``streaming-skip-delete-snapshots``; a ``replace`` (a compaction) is skipped.
``streaming-max-files-per-micro-batch`` and ``streaming-max-rows-per-micro-batch`` bound a
batch. An offset is Iceberg's ``{"version": 1, "snapshot_id": s, "position": p,
"scan_all_files": false}``: every file of the snapshots before ``s`` and the first ``p``
files of ``s`` are read. The batch's files are read by Spark's parquet reader, by column
name (tables whose columns were renamed are not read right yet); files on S3 (this Spark
has no hadoop-aws) in Spark tasks through the storage layer (``object_store_files``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.errors import AnalysisException, IllegalArgumentException
from microbatch.checkpoint.stores import storage_for
from microbatch.lakehouse import iceberg_catalog
from microbatch.sources.base import (CompositeReadLimit, ReadAllAvailable, ReadLimit, ReadMaxFiles, ReadMaxRows,
                                     Source, SourceContext, SourceProvider)
from microbatch.sources.object_store_files import ParquetFile, read_parquet_files
from microbatch.util import CaseInsensitiveOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IcebergFile:
    snapshot_id: int
    position: int        # its index among its snapshot's added files
    path: str
    records: int


def _load(spark: SparkSession, options: CaseInsensitiveOptions) -> Any:
    from pyiceberg.exceptions import NoSuchTableError
    name = options["path"]
    try:
        return iceberg_catalog(spark.conf.get("spark.sql.warehouse.dir"), options,
                               spark_internals.session_settings(spark)).load_table(name)
    except NoSuchTableError:
        raise AnalysisException(
            f"[TABLE_OR_VIEW_NOT_FOUND] The table or view `{name}` cannot be found in the Iceberg catalog. "
            "Check its name and the catalog options (catalog.*), or write it first.") from None


class IcebergSource(Source):
    """Reads an Iceberg table's appended snapshots (see the module docstring)."""

    supports_available_now = True

    def __init__(self, context: SourceContext, options: CaseInsensitiveOptions, schema: StructType):
        self._spark = context.spark
        self._options = options
        self._schema = schema
        self.name = options["path"]
        self.skip_overwrites = options.get_bool("streaming-skip-overwrite-snapshots", False)
        self.skip_deletes = options.get_bool("streaming-skip-delete-snapshots", False)
        self.from_ms = int(options["stream-from-timestamp"]) if "stream-from-timestamp" in options else None
        self.max_files = int(options["streaming-max-files-per-micro-batch"]) \
            if "streaming-max-files-per-micro-batch" in options else None
        self.max_rows = int(options["streaming-max-rows-per-micro-batch"]) \
            if "streaming-max-rows-per-micro-batch" in options else None
        self._end_snapshot: int | None = None
        self._batches: spark_internals.FileBatches | None = None
        self._object_store: dict[str, tuple] = {}     # scheme -> the storage spec its tasks read with

    @property
    def schema(self) -> StructType:
        return self._schema

    def initial_offset(self) -> Any:
        return None

    def report_latest_offset(self, latest: Any) -> Any:
        return None

    def default_read_limit(self) -> ReadLimit:
        limits = []
        if self.max_files is not None:
            limits.append(ReadMaxFiles(self.max_files))
        if self.max_rows is not None:
            limits.append(ReadMaxRows(self.max_rows))
        if not limits:
            return ReadAllAvailable()
        return limits[0] if len(limits) == 1 else CompositeReadLimit(tuple(limits))

    def prepare_for_trigger_available_now(self) -> None:
        current = _load(self._spark, self._options).current_snapshot()
        self._end_snapshot = None if current is None else current.snapshot_id

    # -- snapshots ---------------------------------------------------------------------------
    def _ancestry(self, table: Any) -> list[Any]:
        """The current snapshot's ancestors and itself, oldest first (up to the
        available-now end, if set)."""
        chain = []
        snapshot = table.current_snapshot()
        if self._end_snapshot is not None:
            snapshot = table.snapshot_by_id(self._end_snapshot)
        while snapshot is not None:
            chain.append(snapshot)
            snapshot = None if snapshot.parent_snapshot_id is None else table.snapshot_by_id(snapshot.parent_snapshot_id)
        chain.reverse()
        if self.from_ms is not None:
            chain = [s for s in chain if s.timestamp_ms >= self.from_ms]
        return chain

    def _files(self, table: Any, snapshot: Any) -> list[IcebergFile]:
        operation = snapshot.summary.operation.value if snapshot.summary is not None else "append"
        if operation == "replace":
            return []
        if operation == "overwrite":
            if self.skip_overwrites:
                return []
            raise IllegalArgumentException(
                f"Cannot process overwrite snapshot : {snapshot.snapshot_id}, to ignore overwrites, set "
                "streaming-skip-overwrite-snapshots=true")
        if operation == "delete":
            if self.skip_deletes:
                return []
            raise IllegalArgumentException(
                f"Cannot process delete snapshot : {snapshot.snapshot_id}, to ignore deletes, set "
                "streaming-skip-delete-snapshots=true")
        found = []
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status.name == "ADDED" and entry.snapshot_id == snapshot.snapshot_id:
                    found.append((entry.data_file.file_path, int(entry.data_file.record_count)))
        return [IcebergFile(snapshot.snapshot_id, i, path, records) for i, (path, records) in enumerate(found)]

    def _files_after(self, offset: Any) -> Iterator[IcebergFile]:
        table = _load(self._spark, self._options)
        chain = self._ancestry(table)
        ids = [s.snapshot_id for s in chain]
        start, position = 0, 0
        if offset is not None:
            if int(offset["snapshot_id"]) not in ids:
                raise AnalysisException(
                    f"The Iceberg table {self.name} no longer has snapshot {offset['snapshot_id']} the stream "
                    "read up to (expired, or the table was replaced): start the query with a new checkpoint.")
            start, position = ids.index(int(offset["snapshot_id"])), int(offset["position"])
        for i in range(start, len(chain)):
            for found in self._files(table, chain[i]):
                if i > start or found.position >= position:
                    yield found

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        max_files, max_rows = None, None
        for one in (limit.limits if isinstance(limit, CompositeReadLimit) else (limit,)):
            if isinstance(one, ReadMaxFiles):
                max_files = one.files
            elif isinstance(one, ReadMaxRows):
                max_rows = one.rows
        last, files, rows = None, 0, 0
        for found in self._files_after(start):
            if last is not None and ((max_files is not None and files >= max_files)
                                     or (max_rows is not None and rows + found.records > max_rows)):
                break
            last, files, rows = found, files + 1, rows + found.records
        if last is None:
            return start
        return {"version": 1, "snapshot_id": last.snapshot_id, "position": last.position + 1, "scan_all_files": False}

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        paths, end_snapshot, end_position, reached = [], int(end["snapshot_id"]), int(end["position"]), False
        for found in self._files_after(start):
            if found.snapshot_id == end_snapshot:
                if found.position >= end_position:
                    break
                reached = True
            elif reached:
                break
            paths.append(found.path)
        if paths and urlparse(paths[0]).scheme.lower() in ("s3", "s3a", "s3n"):
            scheme = urlparse(paths[0]).scheme.lower()
            if scheme not in self._object_store:     # (made once: the settings are a call into Spark, s3fs a client)
                self._object_store[scheme] = storage_for(
                    paths[0], spark_internals.session_settings(self._spark)).spec()
            return read_parquet_files(self._spark, [ParquetFile(p) for p in paths], self._schema,
                                      self._object_store[scheme])
        if self._batches is None:
            self._batches = spark_internals.FileBatches(self._spark, "parquet", self._schema, {})
        return self._batches.dataframe(paths)

    def __str__(self) -> str:
        return f"IcebergSource[{self.name}]"


class IcebergSourceProvider(SourceProvider):
    """``readStream.format("iceberg").load("db.table")``: the table's schema."""

    short_name = "iceberg"

    def resolve_schema(self, spark: SparkSession, options: CaseInsensitiveOptions,
                       user_schema: StructType | None) -> StructType:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema
        if "path" not in options:
            raise IllegalArgumentException("Name the Iceberg table: readStream.format('iceberg').load('db.table').")
        if user_schema is not None:
            raise AnalysisException("Iceberg does not support specifying the schema at read time: the stream "
                                    "has the table's schema.")
        return from_arrow_schema(pa.schema(_load(spark, options).schema().as_arrow()))

    def create(self, context: SourceContext, options: CaseInsensitiveOptions, schema: StructType) -> Source:
        return IcebergSource(context, options, schema)
