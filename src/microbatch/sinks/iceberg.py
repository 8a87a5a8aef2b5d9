"""The Iceberg sink: ``writeStream.format("iceberg").toTable("db.table")`` (or
``.start("db.table")``), exactly once, as Iceberg's Spark streaming writer commits.

A batch, in order:

1. The table's snapshots whose summary says ``spark.sql.streaming.queryId`` = the query's
   id: at or past the batch id in ``spark.sql.streaming.epochId``, the batch is there
   already (a re-run after a crash between the table's commit and ``commits/N``): skipped.
2. Spark tasks write the batch's rows with pyiceberg's writer, through the table's FileIO
   (local disk, S3, ...): parquet files under the table's data location, named
   ``00000-<task>-<write uuid>.parquet``, one per partition value of a partitioned table,
   with Iceberg's field ids and column metrics; each task returns its ``DataFile``
   entries: the data never passes through the driver.
3. The driver commits one snapshot with pyiceberg: the data files appended, the query id
   and batch id in its summary; in complete mode the same transaction first deletes every
   row (an overwrite, as Iceberg's writer does then).

A crash before step 3 leaves files no snapshot names: Iceberg's readers never see them
(``remove_orphan_files`` removes them); a crash after it is step 1's case. The table is made
from the stream's schema by the first batch when it does not exist, partitioned by the
writer's ``partitionBy`` columns (identity transforms).
"""
from __future__ import annotations

import logging
import pickle
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import AnalysisException, IllegalArgumentException
from microbatch.lakehouse import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY, iceberg_catalog, last_batch_of
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IcebergWriteTask:
    """The Spark task of an Iceberg batch: one partition's rows written by pyiceberg's own
    writer (Iceberg's file names, field ids, column metrics, one file per partition value
    of a partitioned table: any transform) under the table's data location, through the
    table's FileIO; yields each ``DataFile`` for the driver's commit. The DataFiles are
    pickled in flight only, task result to driver as Spark's own task results travel;
    nothing pickled is ever written to the checkpoint or the table (the snapshot's
    manifests are pyiceberg's Avro)."""

    metadata_json: str                  # the table's metadata, as the batch found it
    attempt: str                        # a uuid: the file names' write id
    io_properties: tuple = field(repr=False, default=())   # the FileIO's; may hold credentials

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import itertools
        import pickle

        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import _dataframe_to_data_files
        from pyiceberg.table.metadata import TableMetadataUtil
        from pyspark import TaskContext
        batches = list(batches)
        if not batches or not sum(b.num_rows for b in batches):
            return
        metadata = TableMetadataUtil.parse_raw(self.metadata_json)
        io = load_file_io(dict(self.io_properties), metadata.location)
        task = TaskContext.get().partitionId()
        for data_file in _dataframe_to_data_files(metadata, pa.Table.from_batches(batches), io,
                                                  uuid.UUID(self.attempt), itertools.count(task * 100_000)):
            yield pa.RecordBatch.from_pylist([{"file": pickle.dumps(data_file)}],
                                             schema=pa.schema([("file", pa.binary())]))


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
        self.partition_by = list(context.partition_by)
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
        """The table; made from the stream's schema (and identity partitions of the
        writer's ``partitionBy``) when it does not exist, as Spark's ``toTable`` makes it.
        An existing table keeps its own partitioning."""
        from pyiceberg.exceptions import NoSuchTableError
        try:
            return self._catalog.load_table(self.identifier)
        except NoSuchTableError:
            namespace = self.identifier.rsplit(".", 1)[0] if "." in self.identifier else None
            if namespace:
                self._catalog.create_namespace_if_not_exists(namespace)
            log.info("Creating the Iceberg table %s from the stream's schema", self.identifier)
            table = self._catalog.create_table(self.identifier, schema=arrow_schema)
            if self.partition_by:
                with table.update_spec() as spec:
                    for column in self.partition_by:
                        spec.add_identity(column)
            return table

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        from pyiceberg.expressions import AlwaysTrue
        table = self._table(spark_internals.arrow_schema(df.schema))
        done = last_batch_of(table, self.query_id)
        if done is not None and done >= batch_id:
            log.info("Skipping batch %d: the Iceberg table %s has it (epoch %d of query %s)",
                     batch_id, self.identifier, done, self.query_id)
            self._metrics = {"numOutputFiles": "0"}
            return
        columns = self._table_columns(table, df)
        task = IcebergWriteTask(table.metadata.model_dump_json(), uuid.uuid4().hex,
                                tuple(sorted(table.io.properties.items())))
        files = sorted((pickle.loads(r.file) for r in df.select(*columns).mapInArrow(task, "file BINARY").collect()),
                       key=lambda f: f.file_path)
        crash_points.reached("sink-data-written")
        properties = {QUERY_ID_PROPERTY: self.query_id, EPOCH_ID_PROPERTY: str(batch_id)}
        with table.transaction() as transaction:
            if self.complete and table.current_snapshot() is not None:
                transaction.delete(AlwaysTrue(), snapshot_properties=properties)
            if files:
                with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
                    for data_file in files:
                        append.append_data_file(data_file)
        crash_points.reached("sink-manifest-written")
        self._metrics = {"numOutputFiles": str(len(files))}

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
        return IcebergSink(context, options["path"])
