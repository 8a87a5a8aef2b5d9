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
from typing import Any

from microbatch import spark_internals
from microbatch.checkpoint.file_stream_log import FILE_FORMATS
from microbatch.errors import UnsupportedOperationError



def _check_file_table(table: spark_internals.CatalogTableInfo, doing: str, instead: str) -> None:
    if table.provider not in FILE_FORMATS or table.location is None:
        raise UnsupportedOperationError(
            f"Table {table.name} is a '{table.provider}' table; microbatch {doing} tables whose "
            f"data Spark keeps in files ({', '.join(FILE_FORMATS)}). {instead}")


def stream_of_table(reader: Any, name: str) -> Any:
    spark = reader._session.spark
    batch = spark.table(name)   # Spark's own TABLE_OR_VIEW_NOT_FOUND when there is none
    temp_view = spark_internals.temp_view_exists(spark, name)
    table = None if temp_view else spark_internals.catalog_table(spark, name)
    if table is None or table.table_type == "VIEW":
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1008",
                                          quoted=name)
    _check_file_table(table, "streams", "Read it with spark.table(...) in a foreachBatch, or "
                                        "stream the files it is loaded from.")
    options = dict(table.storage_properties)
    options.update(reader._options)
    options["path"] = table.location
    return reader._relation_frame(table.provider, options, batch.schema)


def write_to_table(writer: Any, name: str) -> Any:
    session = writer._frame._session
    spark = session.spark
    if session._stream_view(name) is not None or spark_internals.temp_view_exists(spark, name):
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1190",
                                          viewName=name)
    source = writer._format or spark.conf.get("spark.sql.sources.default", "parquet")
    table = spark_internals.catalog_table(spark, name)
    if table is None:
        _create_table(writer, name, source)
        table = spark_internals.catalog_table(spark, name)
    if table.table_type == "VIEW":
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1190",
                                          viewName=name)
    _check_file_table(table, "writes streams to", "Write it from a foreachBatch function instead.")
    if source.lower() != table.provider.lower():
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1192",
                                          source=source, tableName=name, provider=table.provider)
    return writer.format(table.provider).option("path", table.location).start()


def _create_table(writer: Any, name: str, provider: str) -> None:
    """``CREATE TABLE`` with the stream's schema, as Spark's ``toTable`` does (its errors,
    e.g. both ``partitionBy`` and ``clusterBy``)."""
    spark = writer._frame._session.spark
    if writer._partition_by and writer._cluster_by:
        raise spark_internals.spark_error("AnalysisException",
                                          "SPECIFY_CLUSTER_BY_WITH_PARTITIONED_BY_IS_NOT_ALLOWED")
    columns = spark_internals.schema_ddl(spark, writer._frame.schema)

    def quoted(names: list[str]) -> str:
        return ", ".join("`" + c.replace("`", "``") + "`" for c in names)

    ddl = f"CREATE TABLE {name} ({columns}) USING {provider}"
    if writer._partition_by:
        ddl += f" PARTITIONED BY ({quoted(writer._partition_by)})"
    if writer._cluster_by:
        # as Spark's toTable: the clustering and the writer's clustering option
        ddl += f" CLUSTER BY ({quoted(writer._cluster_by)})"
        option = json.dumps(writer._cluster_by, separators=(",", ":")).replace("'", "\\'")
        ddl += f" TBLPROPERTIES ('__clustering_columns' = '{option}')"
    spark.sql(ddl)
