"""What the Iceberg sink and source share: the catalog a table lives in, and the snapshot
properties that record which query wrote which batch (Iceberg's Spark streaming writer's).

The catalog is named by the reader's or writer's options, as pyiceberg's ``load_catalog``
takes them after the ``catalog.`` prefix (``option("catalog.type", "rest")``,
``option("catalog.uri", "http://...")``, ``catalog.warehouse``, credentials ...), its name
by ``catalog`` (``default``). Without any, the embedded default: a SQL catalog on SQLite in
the session's warehouse directory (``spark.sql.warehouse.dir``/``iceberg_catalog.db``),
its tables under that directory.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

#: the snapshot summary properties of Iceberg's Spark streaming writer (SparkWrite)
QUERY_ID_PROPERTY = "spark.sql.streaming.queryId"
EPOCH_ID_PROPERTY = "spark.sql.streaming.epochId"


def iceberg_catalog(warehouse_dir: str, options: Mapping[str, str]) -> Any:
    """The pyiceberg catalog the options name (see the module docstring)."""
    from pyiceberg.catalog import load_catalog
    properties = {key[len("catalog."):]: value for key, value in options.items()
                  if key.lower().startswith("catalog.")}
    name = options.get("catalog", "default")
    if not properties:
        root = _local(warehouse_dir)
        os.makedirs(root, exist_ok=True)
        properties = {"type": "sql", "uri": f"sqlite:///{root}/iceberg_catalog.db", "warehouse": f"file://{root}"}
    return load_catalog(name, **properties)


def _local(path: str) -> str:
    if path.startswith("file:"):
        path = path[len("file:"):]
        while path.startswith("//"):
            path = path[1:]
    return os.path.abspath(path)


def last_batch_of(table: Any, query_id: str) -> int | None:
    """The newest batch id (epoch) query ``query_id`` committed to the Iceberg table, as
    Iceberg's Spark writer finds it: from the snapshots' summaries."""
    newest = None
    for snapshot in table.snapshots():
        summary = snapshot.summary
        properties = summary.additional_properties if summary is not None else {}
        if properties.get(QUERY_ID_PROPERTY) == query_id and EPOCH_ID_PROPERTY in properties:
            epoch = int(properties[EPOCH_ID_PROPERTY])
            newest = epoch if newest is None else max(newest, epoch)
    return newest
