"""The Delta Lake sink: ``writeStream.format("delta").start(path)``, exactly once, as Delta's
own streaming sink (``DeltaSink``) writes a table.

A batch, in order:

1. The table's last transaction of this query (``txn`` of app id = the query's id, read by
   ``deltalake``): at or past the batch id, the batch is there already (a re-run after a
   crash between the table's commit and ``commits/N``) and is skipped.
2. Spark tasks write the batch's rows as parquet files at their final names in the table's
   directory (``part-<task>-<uuid>.c000.snappy.parquet``, under the partition directories),
   each task returning the files' paths, sizes and statistics (row and null counts, each
   column's least and greatest value): the data never passes through the driver.
3. The driver commits one Delta log entry: an ``add`` per file and a
   ``txn(appId = query id, version = batch id)``, with ``deltalake``'s
   ``create_write_transaction`` (the table made by the first batch's commit). In complete
   mode the entry replaces every file of the table (Delta's sink overwrites then).

A crash before step 3 leaves files no log entry names: no Delta reader sees them, the
re-run batch writes its own, and ``VACUUM`` removes them. A crash after it is step 1's case.
"""
from __future__ import annotations

import io
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import quote

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.stores import storage_from_spec
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import AnalysisException, IllegalArgumentException
from microbatch.lakehouse import DeltaLocation, delta_location, open_delta_table
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider
from microbatch.sinks.file import partition_directory, partition_groups

log = logging.getLogger(__name__)

_FILES_SCHEMA = "path STRING, size LONG, modificationTime LONG, partitionValues STRING, stats STRING"


@dataclass(frozen=True)
class DeltaWriteTask:
    """The Spark task of a Delta batch: one partition's rows, grouped by the partition
    columns (already strings), each group one parquet file in the table's directory.
    Yields a row per file: its path relative to the table (URI-encoded, as Delta's log
    has it), size, modification time, partition values and statistics."""

    root: str                           # the table's directory (local) or URI (an object store)
    partition_columns: tuple[str, ...]
    attempt: str
    storage: tuple = field(repr=False, default=("file", ()))   # storage_from_spec's; may hold credentials

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        batches = list(batches)
        if not batches or not sum(b.num_rows for b in batches):
            return
        table = pa.Table.from_batches(batches)
        task = TaskContext.get().partitionId()
        for values, rows in partition_groups(table, self.partition_columns):
            relative = (partition_directory(self.partition_columns, values).lstrip("/") + "/").lstrip("/") + \
                f"part-{task:05d}-{self.attempt}-c000.snappy.parquet"
            data = rows.drop_columns(list(self.partition_columns))
            if self.storage[0] == "file":
                target = os.path.join(self.root, relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                pq.write_table(data, target, compression="snappy")
                size = os.path.getsize(target)
            else:    # an object store: the file written whole at its final key
                encoded = io.BytesIO()
                pq.write_table(data, encoded, compression="snappy")
                storage_from_spec(self.storage).write_bytes(f"{self.root}/{relative}", encoded.getvalue())
                size = len(encoded.getvalue())
            stats = {"numRecords": data.num_rows, **column_bounds(data),
                     "nullCount": {name: data.column(name).null_count for name in data.column_names
                                   if not pa.types.is_nested(data.schema.field(name).type)}}
            yield pa.RecordBatch.from_pylist([{
                "path": quote(relative, safe="/="), "size": size,
                "modificationTime": int(time.time() * 1000),
                "partitionValues": json.dumps(dict(zip(self.partition_columns, values))),
                "stats": json.dumps(stats)}],
                schema=pa.schema([("path", pa.string()), ("size", pa.int64()), ("modificationTime", pa.int64()),
                                  ("partitionValues", pa.string()), ("stats", pa.string())]))


#: Delta's writers keep string bounds of at most this many characters (DataSkippingReader)
_STRING_PREFIX = 32


def column_bounds(data: pa.Table) -> dict[str, dict[str, Any]]:
    """Delta's ``minValues``/``maxValues`` of a file: per column of an integer, float, date,
    timestamp or (short) string type, its least and greatest non-null value, as Delta's
    writers record them (timestamps as ``yyyy-MM-dd'T'HH:mm:ss.SSS'Z'``, truncated to the
    millisecond: down for the minimum, up for the maximum). Readers skip files by them."""
    import datetime

    import pyarrow.compute as pc
    low, high = {}, {}
    for name in data.column_names:
        kind = data.schema.field(name).type
        column = data.column(name)
        if column.null_count == len(column) or not (
                pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_date(kind)
                or pa.types.is_timestamp(kind) or pa.types.is_string(kind)):
            continue
        bounds = pc.min_max(column)
        least, greatest = bounds["min"].as_py(), bounds["max"].as_py()
        if pa.types.is_floating(kind) and (least != least or greatest != greatest):
            continue       # NaN: no bound a reader could rely on
        if pa.types.is_string(kind):
            if len(least) > _STRING_PREFIX or len(greatest) > _STRING_PREFIX:
                continue   # (Delta truncates; leaving them out is always safe)
        elif pa.types.is_timestamp(kind):
            if kind.tz is None:
                least, greatest = (v.replace(tzinfo=datetime.timezone.utc) for v in (least, greatest))
            up = greatest.microsecond % 1000 != 0
            least = least.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            greatest = greatest.astimezone(datetime.timezone.utc) + datetime.timedelta(milliseconds=1 if up else 0)
            greatest = greatest.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        elif pa.types.is_date(kind):
            least, greatest = least.isoformat(), greatest.isoformat()
        low[name], high[name] = least, greatest
    return {"minValues": low, "maxValues": high} if low else {}


class DeltaSink(Sink):
    """Appends each batch to a Delta table (complete mode: replaces its files), exactly
    once by the query's id and the batch id (see the module docstring)."""

    reads_batch_through = READS_SQL

    def __init__(self, context: SinkContext, location: DeltaLocation, merge_schema: bool):
        self.location = location
        self.path = location.uri               # a local directory, or s3://bucket/key
        self._storage_options = location.storage_options
        self.partition_by = list(context.partition_by)
        self.complete = context.output_mode == "complete"
        self.merge_schema = merge_schema
        self._fs, self._checkpoint_root = context.fs, context.checkpoint_root
        self._app_id: str | None = None
        self._metrics: dict[str, str] = {}

    @property
    def app_id(self) -> str:
        """The query's id (the checkpoint's ``metadata``): Delta's sink's ``txn`` app id."""
        if self._app_id is None:
            self._app_id = StreamMetadata.read_or_create(self._fs, self._checkpoint_root).id
        return self._app_id

    def _table(self) -> Any:
        from deltalake import DeltaTable
        if not DeltaTable.is_deltatable(self.path, self._storage_options):
            return None
        return open_delta_table(self.location, writing=True)

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction, create_table_with_add_actions

        table = self._table()
        if table is not None:
            done = table.transaction_version(self.app_id)
            if done is not None and done >= batch_id:
                log.info("Skipping batch %d: the Delta table at %s has it (txn %s = %d)",
                         batch_id, self.path, self.app_id, done)
                self._metrics = {"numOutputFiles": "0"}
                self.last_num_output_rows = 0
                return
        data = [c for c in df.columns if c not in self.partition_by]
        schema = spark_internals.arrow_schema(
            StructType([df.schema[c] for c in data] + [df.schema[c] for c in self.partition_by]))
        if table is not None:
            self._check_table(table, schema)
        prepared = df.select(*[F.col(_quoted(c)).cast("string").alias(c) for c in self.partition_by],
                             *[F.col(_quoted(c)) for c in data])
        task = DeltaWriteTask(self.location.root, tuple(self.partition_by), uuid.uuid4().hex,
                              self.location.storage.spec())
        files = prepared.mapInArrow(task, _FILES_SCHEMA).collect()
        crash_points.reached("sink-data-written")
        actions = [AddAction(f.path, f.size, json.loads(f.partitionValues), f.modificationTime, True, f.stats)
                   for f in sorted(files, key=lambda f: f.path)]
        delta_schema = _delta_schema(schema)
        if table is not None and self.merge_schema:
            table = self._table()    # (its schema, with the columns mergeSchema added)
            delta_schema = table.schema()
        commit = CommitProperties(app_transactions=[Transaction(self.app_id, batch_id, int(time.time() * 1000))],
                                  custom_metadata={"microbatch.batchId": str(batch_id)})
        mode = "overwrite" if self.complete else "append"
        if table is None:
            create_table_with_add_actions(self.path, delta_schema, actions, mode="append",
                                          partition_by=self.partition_by or None, commit_properties=commit,
                                          storage_options=self._storage_options)
        else:
            from deltalake.exceptions import CommitFailedError
            try:
                table.create_write_transaction(actions, mode, delta_schema,
                                               partition_by=self.partition_by or None, commit_properties=commit)
            except CommitFailedError as e:
                if "Unsupported table features" not in str(e):
                    raise
                raise AnalysisException(
                    f"[DELTA_UNSUPPORTED_FEATURES_FOR_WRITE] Unable to write the Delta table at {self.path}: it "
                    f"requires writer table features this Delta Lake (delta-rs) does not support ({e}). Nothing "
                    "was committed (the batch's files are in no log entry). Upgrade the deltalake package, or "
                    "write to another table.") from None
        crash_points.reached("sink-manifest-written")
        self._metrics = {"numOutputFiles": str(len(actions))}
        self.last_num_output_rows = sum(json.loads(a.stats)["numRecords"] for a in actions)

    def _check_table(self, table: Any, schema: pa.Schema) -> None:
        """Delta's checks of a write into an existing table: the same partition columns;
        columns of the same types; a column the table lacks only with ``mergeSchema``,
        which adds it (a commit of its own, before the batch's: delta-rs commits a schema
        change apart from files). A table column the stream lacks is null in its rows."""
        metadata = table.metadata()
        if [c.lower() for c in metadata.partition_columns] != [c.lower() for c in self.partition_by]:
            raise AnalysisException(
                f"[DELTA_PARTITION_COLUMN_MISMATCH] Partition columns do not match the partition columns of "
                f"the table at {self.path}. Given: {self.partition_by}; table: "
                f"{list(metadata.partition_columns)}. Write with .partitionBy("
                f"{', '.join(repr(c) for c in metadata.partition_columns)}), or to another table.")
        existing = {f.name.lower(): f for f in table.schema().fields}
        given = _delta_schema(schema).fields
        for column in given:
            known = existing.get(column.name.lower())
            if known is not None and known.type != column.type:
                raise AnalysisException(
                    f"[DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields '{known.name}' and '{column.name}': "
                    f"the Delta table at {self.path} has {known.type}, the stream {column.type}. Cast the "
                    "column to the table's type, or write to another table.")
        new = [f for f in given if f.name.lower() not in existing]
        if new and not self.merge_schema:
            raise AnalysisException(
                "[DELTA_METADATA_MISMATCH] A schema mismatch detected when writing to the Delta table at "
                f"{self.path}: the stream has columns the table does not ({[f.name for f in new]}; the "
                f"table's: {[f.name for f in table.schema().fields]}). To add them to the table, set "
                "writeStream.option(\"mergeSchema\", \"true\"); or select the table's columns.")
        if new:
            log.info("Adding columns %s to the Delta table at %s (mergeSchema)", [f.name for f in new], self.path)
            table.alter.add_columns(new)

    def progress_metrics(self) -> dict[str, str]:
        return dict(self._metrics)

    def __str__(self) -> str:
        return f"DeltaSink[{self.path}]"


def _delta_schema(schema: pa.Schema) -> Any:
    from deltalake import Schema
    return Schema.from_arrow(schema)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaSinkProvider(SinkProvider):
    """``writeStream.format("delta")``: options ``path``, ``mergeSchema``; ``partitionBy``;
    append and complete output modes, as Delta's sink."""

    short_name = "delta"

    def create(self, context: SinkContext) -> Sink:
        options = context.options
        if "path" not in options:
            raise IllegalArgumentException(
                "'path' is not specified. Give the Delta table's directory: "
                "writeStream.format('delta').start('/path/to/table').")
        if context.output_mode not in ("append", "complete"):
            raise AnalysisException(
                f"[DELTA_UNSUPPORTED_OUTPUT_MODE] Data source delta does not support "
                f"{context.output_mode.capitalize()} output mode. Use append or complete.")
        merge = options.get("mergeSchema", "false").lower() == "true"
        columns = context.schema.fieldNames()
        for column in context.partition_by:
            if column not in columns:
                raise AnalysisException(
                    f"[DELTA_PARTITION_COLUMN_NOT_FOUND] Partition column `{column}` not found in schema "
                    f"[{', '.join(columns)}]. Give partitionBy columns of the stream.")
        location = delta_location(context.spark, options["path"])
        if not location.is_local:
            location.storage.check_reachable(location.root, "Delta table")
        return DeltaSink(context, location, merge)
