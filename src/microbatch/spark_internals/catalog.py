"""What Spark's catalog and data source manager know: tables, views, Python data sources."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType


def schema_ddl(spark: SparkSession, schema: StructType) -> str:
    """``StructType.toDDL``: column definitions for ``CREATE TABLE``."""
    return spark._jsparkSession.parseDataType(schema.json()).toDDL()


@dataclass(frozen=True)
class CatalogTableInfo:
    """What a streaming read or write of a catalog table needs to know about it."""

    name: str                     # the qualified name, e.g. spark_catalog.default.t
    table_type: str               # MANAGED, EXTERNAL or VIEW
    provider: str | None          # parquet, json, ...
    location: str | None          # a file: URI
    partition_columns: list[str]
    storage_properties: dict[str, str]


def temp_view_exists(spark: SparkSession, name: str) -> bool:
    catalog = spark._jsparkSession.sessionState().catalog()
    parts = spark._jsparkSession.sessionState().sqlParser().parseMultipartIdentifier(name)
    return bool(catalog.isTempView(parts))


def catalog_table(spark: SparkSession, name: str) -> CatalogTableInfo | None:
    """The session catalog's metadata of table ``name``, or None if there is none."""
    state = spark._jsparkSession.sessionState()
    identifier = state.sqlParser().parseTableIdentifier(name)
    catalog = state.catalog()
    if not catalog.tableExists(identifier):
        return None
    table = catalog.getTableMetadata(identifier)
    provider = table.provider()
    location = table.storage().locationUri()
    partitions = table.partitionColumnNames()
    properties = table.storage().properties()
    return CatalogTableInfo(
        name=table.qualifiedName(),
        table_type=table.tableType().name(),
        provider=provider.get() if provider.isDefined() else None,
        location=location.get().toString() if location.isDefined() else None,
        partition_columns=[partitions.apply(i) for i in range(partitions.size())],
        storage_properties={k: properties.apply(k) for k in _scala_keys(properties)})


def managed_table_location(spark: SparkSession, name: str) -> str:
    """Where the session catalog keeps the data of a managed table ``name`` (a ``file:``
    URI under ``spark.sql.warehouse.dir``); Spark's SCHEMA_NOT_FOUND for a database that
    does not exist."""
    state = spark._jsparkSession.sessionState()
    return state.catalog().defaultTablePath(state.sqlParser().parseTableIdentifier(name)).toString()


def _scala_keys(scala_mapping: Any) -> list[str]:
    keys, iterator = [], scala_mapping.keys().iterator()
    while iterator.hasNext():
        keys.append(iterator.next())
    return keys


def python_data_source(spark: SparkSession, name: str) -> type | None:
    """The ``pyspark.sql.datasource.DataSource`` class registered under ``name`` with
    ``spark.dataSource.register`` (or found by Spark among installed packages), as the
    JVM's DataSourceManager holds it: PySpark's serialized class, read back as PySpark's
    workers read it. None when no Python data source has that name."""
    from pyspark.serializers import CloudPickleSerializer

    from microbatch.spark_internals.versions import running_version
    if not running_version().at_least(4, 0):
        return None      # (Python data sources came with Spark 4.0)
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(name):
        return None
    command = manager.lookupDataSource(name).dataSourceCls().command()
    return CloudPickleSerializer().loads(bytes(command.unsafeArray()))
