"""Catalog tables as streams: ``readStream.table(name)`` and ``writeStream.toTable(name)``.

As Spark does for tables whose data it keeps in files (``USING parquet``, ``json``, ...):

- reading streams the table's location with the file source, with the table's schema
  (data and partition columns) and storage options; a temporary view over a batch
  DataFrame is refused with Spark's error (temporary views over *streams* are served by
  the session before this module is asked);
- writing creates the table when it does not exist (provider: ``format(...)`` or
  ``spark.sql.sources.default``; ``partitionBy`` or ``clusterBy`` as PySpark 4.3 takes
  them), then runs the file sink on the table's location, whose ``_spark_metadata`` log
  makes ``spark.table(name)`` see the rows of committed batches only. An existing table
  must have the writer's provider; a temporary view cannot be written.

Delta tables by name: Spark's catalog cannot hold a Delta table without the delta-spark
jar (an entry of provider ``delta`` breaks ``spark.catalog.listTables()``), so
``toTable(name)`` with ``format("delta")`` writes the Delta table where the catalog keeps a
managed table of that name (``<spark.sql.warehouse.dir>/<name>``, as delta-spark's
``toTable`` does) without a catalog entry, and ``readStream.table(name)`` of a name the
catalog does not know streams the Delta table at that place, if there is one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from microbatch import spark_internals
from microbatch.checkpoint.file_stream_log import FILE_FORMATS
from microbatch.errors import UnsupportedOperationError



def _check_file_table(table: spark_internals.CatalogTableInfo, doing: str, instead: str) -> None:
    if table.provider not in FILE_FORMATS or table.location is None:
        raise UnsupportedOperationError(
            f"Table {table.name} is a '{table.provider}' table; microbatch {doing} tables whose "
            f"data Spark keeps in files ({', '.join(FILE_FORMATS)}). {instead}")


def stream_of_table(spark: Any, name: str, options: dict[str, str],
                    make_frame: Callable[[str, dict, Any], Any]) -> Any:
    """The stream of the file table ``name``: ``make_frame(format, options, schema)`` over
    the table's location, with the table's storage options under the reader's ``options``
    (or of the Delta table of that name, see the module docstring)."""
    temp_view = spark_internals.temp_view_exists(spark, name)
    if not temp_view and spark_internals.catalog_table(spark, name) is None:
        location = _delta_table_at_managed_location(spark, name)
        if location is not None:
            return make_frame("delta", {**options, "path": location}, None)
    batch = spark.table(name)   # Spark's own TABLE_OR_VIEW_NOT_FOUND when there is none
    schema = batch.schema
    table = None if temp_view else spark_internals.catalog_table(spark, name)
    if table is not None and table.table_type != "VIEW":
        # (resolving the table left its relation in the session's cache with the files of
        # now, which a later spark.table(name) would read as the table: Spark's streaming
        # read of a table leaves none)
        spark.catalog.refreshTable(name)
    if table is None or table.table_type == "VIEW":
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1008",
                                          quoted=name)
    _check_file_table(table, "streams", "Read it with spark.table(...) in a foreachBatch, or "
                                        "stream the files it is loaded from.")
    merged = dict(table.storage_properties)
    merged.update(options)
    merged["path"] = table.location
    return make_frame(table.provider, merged, schema)


@dataclass(frozen=True)
class TableWrite:
    """What ``toTable`` needs of its writer."""

    spark: Any                         # the SparkSession
    schema: Any                        # the stream's StructType
    format: str | None                 # the writer's format(...), if any
    partition_by: list[str] | None
    cluster_by: list[str] | None
    is_stream_view: Callable[[str], bool]


def table_location(write: TableWrite, name: str) -> tuple[str, str]:
    """The (provider, location) a stream written to table ``name`` goes to: the table,
    created first when it does not exist."""
    spark = write.spark
    if write.is_stream_view(name) or spark_internals.temp_view_exists(spark, name):
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1190",
                                          viewName=name)
    source = write.format or spark.conf.get("spark.sql.sources.default", "parquet")
    if source.lower() == "iceberg":     # (a table of an Iceberg catalog: the sink resolves the name)
        return "iceberg", name
    table = spark_internals.catalog_table(spark, name)
    if source.lower() == "delta":
        if table is not None:
            if table.table_type == "VIEW":
                raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1190", viewName=name)
            raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1192",
                                              source=source, tableName=name, provider=table.provider)
        if write.cluster_by:
            raise UnsupportedOperationError(
                f"clusterBy on toTable('{name}') with format 'delta' (liquid clustering) is not supported by "
                "microbatch's Delta sink: use partitionBy, or neither.")
        return "delta", spark_internals.managed_table_location(spark, name)
    if table is None:
        _create_table(write, name, source)
        table = spark_internals.catalog_table(spark, name)
    if table.table_type == "VIEW":
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1190",
                                          viewName=name)
    _check_file_table(table, "writes streams to", "Write it from a foreachBatch function instead.")
    if source.lower() != table.provider.lower():
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1192",
                                          source=source, tableName=name, provider=table.provider)
    return table.provider, table.location


def _delta_table_at_managed_location(spark: Any, name: str) -> str | None:
    """The managed location of ``name`` if a Delta table is there (its ``_delta_log``)."""
    from microbatch.checkpoint.stores import storage_for
    try:
        location = spark_internals.managed_table_location(spark, name)
    except Exception:   # noqa: BLE001 - e.g. no such database: Spark's own error follows from spark.table
        return None
    fs = storage_for(location)
    return location if fs.exists(f"{fs.resolve(location)}/_delta_log") else None


def _create_table(write: TableWrite, name: str, provider: str) -> None:
    """``CREATE TABLE`` with the stream's schema, as Spark's ``toTable`` does (its errors,
    e.g. both ``partitionBy`` and ``clusterBy``)."""
    spark = write.spark
    if write.partition_by and write.cluster_by:
        raise spark_internals.spark_error("AnalysisException",
                                          "SPECIFY_CLUSTER_BY_WITH_PARTITIONED_BY_IS_NOT_ALLOWED")
    columns = spark_internals.schema_ddl(spark, write.schema)

    def quoted(names: list[str]) -> str:
        return ", ".join("`" + c.replace("`", "``") + "`" for c in names)

    ddl = f"CREATE TABLE {name} ({columns}) USING {provider}"
    if write.partition_by:
        ddl += f" PARTITIONED BY ({quoted(write.partition_by)})"
    if write.cluster_by:
        # as Spark's toTable: the clustering and the writer's clustering option
        ddl += f" CLUSTER BY ({quoted(write.cluster_by)})"
        option = json.dumps(write.cluster_by, separators=(",", ":")).replace("'", "\\'")
        ddl += f" TBLPROPERTIES ('__clustering_columns' = '{option}')"
    spark.sql(ddl)
