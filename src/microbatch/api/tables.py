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
    the table's location, with the table's storage options under the reader's ``options``."""
    batch = spark.table(name)   # Spark's own TABLE_OR_VIEW_NOT_FOUND when there is none
    temp_view = spark_internals.temp_view_exists(spark, name)
    table = None if temp_view else spark_internals.catalog_table(spark, name)
    if table is None or table.table_type == "VIEW":
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1008",
                                          quoted=name)
    _check_file_table(table, "streams", "Read it with spark.table(...) in a foreachBatch, or "
                                        "stream the files it is loaded from.")
    merged = dict(table.storage_properties)
    merged.update(options)
    merged["path"] = table.location
    return make_frame(table.provider, merged, batch.schema)


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
    if source.lower() == "delta":
        raise UnsupportedOperationError(
            f"toTable('{name}') with format 'delta' needs a catalog that keeps Delta tables, which this "
            "Spark has not (no delta-spark jar). Write the table by its path: "
            "writeStream.format('delta').start('/path/to/table').")
    table = spark_internals.catalog_table(spark, name)
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
