"""What the lakehouse sinks and sources share.

Delta: where a table is (``delta_location``): a local directory, or an S3 location reached
with the endpoint and credentials of ``spark.hadoop.fs.s3a.*``, as the checkpoint takes
them: delta-rs gets them as its storage options, the Spark tasks as the storage layer's.

Iceberg: the catalog a table lives in, and the snapshot properties that record which query
wrote which batch (Iceberg's Spark streaming writer's).

The catalog is named by the reader's or writer's options, as pyiceberg's ``load_catalog``
takes them after the ``catalog.`` prefix (``option("catalog.type", "rest")``,
``option("catalog.uri", "http://...")``, ``catalog.warehouse``, credentials ...), its name
by ``catalog`` (``default``). Without any, the embedded default: a SQL catalog on SQLite in
the session's warehouse directory (``spark.sql.warehouse.dir``/``iceberg_catalog.db``),
its tables under that directory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlparse

from microbatch import spark_internals
from microbatch.checkpoint.fs import LOCAL, CheckpointFileSystem
from microbatch.checkpoint.stores import storage_for
from microbatch.util import local_path

_OBJECT_STORES = ("s3", "s3a", "s3n")

#: the snapshot summary properties of Iceberg's Spark streaming writer (SparkWrite)
QUERY_ID_PROPERTY = "spark.sql.streaming.queryId"
EPOCH_ID_PROPERTY = "spark.sql.streaming.epochId"


# -- Delta ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeltaLocation:
    """A Delta table's place, as each of its readers and writers names it."""

    uri: str                          # delta-rs's: a local directory, or s3://bucket/key
    storage: CheckpointFileSystem     # the storage layer's, for the log and the tasks
    root: str                         # the table's root as ``storage`` names it
    storage_options: dict[str, str] | None = field(default=None, repr=False)   # delta-rs's: may hold keys

    @property
    def is_local(self) -> bool:
        return self.storage is LOCAL


def delta_location(spark: Any, raw: str) -> DeltaLocation:
    """The table at ``raw``: a local path or ``file:`` URI, or ``s3://``/``s3a://``."""
    if urlparse(raw).scheme.lower() in _OBJECT_STORES:
        settings = spark_internals.session_settings(spark)
        fs = storage_for(raw, settings)
        root = fs.resolve(raw)
        parsed = urlparse(root)
        return DeltaLocation(f"s3://{parsed.netloc}{parsed.path}", fs, root, delta_storage_options(settings))
    path = local_path(raw, "Delta table")
    return DeltaLocation(path, LOCAL, path)


def open_delta_table(location: DeltaLocation, version: int | None = None, *, writing: bool = False) -> Any:
    """``deltalake.DeltaTable`` of the table at ``location``; a table that needs a protocol
    or table features delta-rs does not know (written by a newer Delta) gets Delta's
    DELTA_UNSUPPORTED_FEATURES_FOR_READ/_WRITE error, naming them."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError
    try:
        return DeltaTable(location.uri, version=version, storage_options=location.storage_options)
    except DeltaError as e:
        text = str(e)
        lowered = text.lower()
        if "unsupported" not in lowered or not any(w in lowered for w in ("feature", "protocol", "version")):
            raise
        from microbatch.errors import AnalysisException
        doing = "WRITE" if writing else "READ"
        raise AnalysisException(
            f"[DELTA_UNSUPPORTED_FEATURES_FOR_{doing}] Unable to {doing.lower()} the Delta table at {location.uri}: "
            f"it requires a protocol or table features this Delta Lake (delta-rs) does not support ({text}). "
            "Upgrade the deltalake package, or use a table written without those features.") from None


def delta_storage_options(settings: Mapping[str, str]) -> dict[str, str]:
    """delta-rs's storage options of an S3 table, from the Spark settings the checkpoint
    takes its endpoint and credentials from (``spark.hadoop.fs.s3a.*``); the environment's
    AWS variables when those are not set (delta-rs reads them itself)."""
    keys = {"spark.hadoop.fs.s3a.endpoint": "AWS_ENDPOINT_URL", "spark.hadoop.fs.s3a.access.key": "AWS_ACCESS_KEY_ID",
            "spark.hadoop.fs.s3a.secret.key": "AWS_SECRET_ACCESS_KEY",
            "spark.hadoop.fs.s3a.session.token": "AWS_SESSION_TOKEN",
            "spark.hadoop.fs.s3a.endpoint.region": "AWS_REGION"}
    options = {option: settings[key] for key, option in keys.items() if settings.get(key)}
    endpoint = options.get("AWS_ENDPOINT_URL")
    if endpoint is not None and "://" not in endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint = "https://" + endpoint
    if endpoint is not None and endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


# -- Iceberg --------------------------------------------------------------------------------
#: pyiceberg's FileIO properties from Spark's S3A settings, for tables on S3
_S3_PROPERTIES = {"spark.hadoop.fs.s3a.endpoint": "s3.endpoint", "spark.hadoop.fs.s3a.access.key": "s3.access-key-id",
                  "spark.hadoop.fs.s3a.secret.key": "s3.secret-access-key",
                  "spark.hadoop.fs.s3a.session.token": "s3.session-token",
                  "spark.hadoop.fs.s3a.endpoint.region": "s3.region"}


def iceberg_catalog(warehouse_dir: str, options: Mapping[str, str],
                    settings: Mapping[str, str] | None = None) -> Any:
    """The pyiceberg catalog the options name (see the module docstring). ``settings``:
    the session's, whose ``spark.hadoop.fs.s3a.*`` give the catalog's FileIO its S3
    endpoint and credentials when the options do not (``catalog.s3.endpoint``, ...)."""
    from pyiceberg.catalog import load_catalog
    properties = {key[len("catalog."):]: value for key, value in options.items()
                  if key.lower().startswith("catalog.")}
    name = options.get("catalog", "default")
    if not properties:
        root = _local(warehouse_dir)
        os.makedirs(root, exist_ok=True)
        properties = {"type": "sql", "uri": f"sqlite:///{root}/iceberg_catalog.db", "warehouse": f"file://{root}"}
    for key, prop in _S3_PROPERTIES.items():
        if settings and settings.get(key) and prop not in properties:
            value = settings[key]
            properties[prop] = "https://" + value if prop == "s3.endpoint" and "://" not in value else value
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
