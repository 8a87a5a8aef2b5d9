"""The Iceberg sink: ``writeStream.format("iceberg").toTable("db.table")`` (or
``.start("db.table")``), exactly once, as Iceberg's Spark streaming writer commits.

A batch, in order:

1. The table's snapshots whose summary says ``spark.sql.streaming.queryId`` = the query's
   id: at or past the batch id in ``spark.sql.streaming.epochId``, the batch is there
   already (a re-run after a crash between the table's commit and ``commits/N``): skipped.
2. Spark tasks write the batch's rows as parquet files under the table's ``data/``
   directory (``<uuid>-<task>.parquet``): the data never passes through the driver.
3. The driver commits one snapshot with pyiceberg: the files appended (``add_files``), the
   query id and batch id in its summary; in complete mode the same transaction first
   deletes every row (an overwrite, as Iceberg's writer does then).

A crash before step 3 leaves files no snapshot names: Iceberg's readers never see them
(``remove_orphan_files`` removes them); a crash after it is step 1's case. The table is made
from the stream's schema by the first batch when it does not exist.
"""
from __future__ import annotations

import io
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.fs import LOCAL, storage_for, storage_from_spec
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import AnalysisException, IllegalArgumentException, UnsupportedOperationError
from microbatch.lakehouse import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY, iceberg_catalog, last_batch_of
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IcebergWriteTask:
    """The Spark task of an Iceberg batch: one partition's rows as one parquet file in the
    table's data directory; yields the file's URI."""

    data_dir: str          # a local directory, or the data directory's URI on an object store
    attempt: str
    storage: tuple = field(repr=False, default=("file", ()))   # storage_from_spec's; may hold credentials

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyspark import TaskContext
        batches = list(batches)
        if not batches or not sum(b.num_rows for b in batches):
            return
        name = f"{self.attempt}-{TaskContext.get().partitionId():05d}.parquet"
        if self.storage[0] == "file":
            path = os.path.join(self.data_dir, name)
            os.makedirs(self.data_dir, exist_ok=True)
            pq.write_table(pa.Table.from_batches(batches), path, compression="zstd")
            uri = "file://" + path
        else:    # an object store: the file written whole at its final key
            encoded = io.BytesIO()
            pq.write_table(pa.Table.from_batches(batches), encoded, compression="zstd")
            uri = f"{self.data_dir}/{name}"
            storage_from_spec(self.storage).write_bytes(uri, encoded.getvalue())
        yield pa.RecordBatch.from_pylist([{"path": uri}], schema=pa.schema([("path", pa.string())]))


#: (stream type, table type) pairs Iceberg's writer casts without loss
_SAFE_WIDENING = {("byte", "integer"), ("short", "integer"), ("byte", "long"), ("short", "long"),
                  ("integer", "long"), ("float", "double")}


class IcebergSink(Sink):
    """Appends each batch to an Iceberg table as one snapshot (complete mode: replaces its
    rows), exactly once by the query's id and the batch id (see the module docstring)."""

    reads_batch_through = READS_SQL

    def __init__(self, context: SinkContext, identifier: str):
        self.identifier = identifier
        self.complete = context.output_mode == "complete"
        self._settings = spark_internals.session_settings(context.spark)
        self._catalog = iceberg_catalog(context.spark.conf.get("spark.sql.warehouse.dir"), context.options,
                                        self._settings)
        self._fs, self._checkpoint_root = context.fs, context.checkpoint_root
        self._query_id: str | None = None
        self._metrics: dict[str, str] = {}

    @property
    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = StreamMetadata.read_or_create(self._fs, self._checkpoint_root).id
        return self._query_id

    def _table(self, arrow_schema: pa.Schema) -> Any:
        from pyiceberg.exceptions import NoSuchTableError
        try:
            return self._catalog.load_table(self.identifier)
        except NoSuchTableError:
            namespace = self.identifier.rsplit(".", 1)[0] if "." in self.identifier else None
            if namespace:
                self._catalog.create_namespace_if_not_exists(namespace)
            log.info("Creating the Iceberg table %s from the stream's schema", self.identifier)
            return self._catalog.create_table(self.identifier, schema=arrow_schema)

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        from pyiceberg.expressions import AlwaysTrue
        from pyspark.sql.pandas.types import to_arrow_schema
        table = self._table(to_arrow_schema(df.schema, timezone="UTC"))
        done = last_batch_of(table, self.query_id)
        if done is not None and done >= batch_id:
            log.info("Skipping batch %d: the Iceberg table %s has it (epoch %d of query %s)",
                     batch_id, self.identifier, done, self.query_id)
            self._metrics = {"numOutputFiles": "0"}
            return
        columns = self._table_columns(table, df)
        if not table.spec().is_unpartitioned():
            raise UnsupportedOperationError(
                f"The Iceberg table {self.identifier} is partitioned ({table.spec()}); microbatch's Iceberg sink "
                "writes unpartitioned tables so far. Write to an unpartitioned table.")
        data_dir, storage = self._data_dir(table.location().rstrip("/"))
        task = IcebergWriteTask(data_dir, uuid.uuid4().hex, storage)
        uris = sorted(r.path for r in df.select(*columns)
                      .mapInArrow(task, "path STRING").collect())
        crash_points.reached("sink-data-written")
        properties = {QUERY_ID_PROPERTY: self.query_id, EPOCH_ID_PROPERTY: str(batch_id)}
        with table.transaction() as transaction:
            if self.complete and table.current_snapshot() is not None:
                transaction.delete(AlwaysTrue(), snapshot_properties=properties)
            if uris:
                transaction.add_files(uris, snapshot_properties=properties)
        crash_points.reached("sink-manifest-written")
        self._metrics = {"numOutputFiles": str(len(uris))}

    def _data_dir(self, location: str) -> tuple[str, tuple]:
        """The table's data directory and the storage the tasks reach it by
        (for ``IcebergWriteTask``)."""
        if location.startswith("file:"):
            return "/" + location[len("file:"):].lstrip("/") + "/data", LOCAL.spec()
        if urlparse(location).scheme.lower() in ("s3", "s3a", "s3n"):
            return location + "/data", storage_for(location, self._settings).spec()
        raise UnsupportedOperationError(
            f"The Iceberg table {self.identifier} lives at {location}; microbatch's Iceberg sink writes "
            "tables on local or shared disk (file:) and on S3 (s3://, s3a://).")

    def _table_columns(self, table: Any, df: DataFrame) -> list[Any]:
        """The stream's columns as the table's, in its order: the same names (Iceberg's
        writer matches them so), each of the table's type or one that widens safely to it
        (int to long, float to double: cast); anything else is Spark's
        INCOMPATIBLE_DATA_FOR_TABLE, before any file is written."""
        from pyspark.sql.pandas.types import from_arrow_type
        expected = [f.name for f in table.schema().fields]
        if sorted(c.lower() for c in df.columns) != sorted(c.lower() for c in expected):
            raise AnalysisException(
                f"[INCOMPATIBLE_DATA_FOR_TABLE] Cannot write incompatible data for the Iceberg table "
                f"{self.identifier}: the table has columns {expected}, the stream {df.columns}. Select the "
                "table's columns, or evolve the table's schema first.")
        given = {f.name.lower(): f for f in df.schema.fields}
        columns = []
        for field_ in table.schema().as_arrow():
            wanted = from_arrow_type(field_.type)
            have = given[field_.name.lower()]
            column = F.col("`" + have.name.replace("`", "``") + "`")
            if have.dataType != wanted:
                if (have.dataType.typeName(), wanted.typeName()) not in _SAFE_WIDENING:
                    raise AnalysisException(
                        f"[INCOMPATIBLE_DATA_FOR_TABLE.CANNOT_SAFELY_CAST] Cannot write incompatible data for the "
                        f"Iceberg table {self.identifier}: Cannot safely cast `{field_.name}` "
                        f"\"{have.dataType.simpleString().upper()}\" to \"{wanted.simpleString().upper()}\". Cast "
                        "the column to the table's type, or evolve the table's schema first.")
                column = column.cast(wanted)
            columns.append(column.alias(field_.name))
        return columns

    def progress_metrics(self) -> dict[str, str]:
        return dict(self._metrics)

    def __str__(self) -> str:
        return f"IcebergSink[{self.identifier}]"


class IcebergSinkProvider(SinkProvider):
    """``writeStream.format("iceberg")``: the table's identifier as ``path`` (``start(name)``,
    ``toTable(name)``); append and complete output modes."""

    short_name = "iceberg"

    def create(self, context: SinkContext) -> Sink:
        options = context.options
        if "path" not in options:
            raise IllegalArgumentException(
                "'path' is not specified. Name the Iceberg table: writeStream.format('iceberg').toTable('db.t').")
        if context.output_mode not in ("append", "complete"):
            raise AnalysisException(
                f"[STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE] Data source iceberg does not support "
                f"{context.output_mode} output mode. Use append or complete.")
        if context.partition_by:
            raise UnsupportedOperationError(
                "partitionBy on microbatch's Iceberg sink is not supported yet: create the table with its "
                "partition spec first (pyiceberg's create_table), then write to it.")
        return IcebergSink(context, options["path"])
