"""Sessions, threads and settings over Spark Connect: what ``spark_internals.session``
and the engine's SparkContext calls do classically (clone, job tags, cancelling a run's
jobs, confs, parallelism), with the Connect session's own API."""
from __future__ import annotations

import re
from typing import Any

from microbatch.spark_internals.connect.support import refuse

#: the tag of a query run's operations (Spark's job group is the run id)
_RUN_TAG = "microbatch-run-{}"


def check_supported(spark: Any) -> None:
    """A Connect server must run the client's Spark line (4.3.x): the engine's behaviour
    (checkpointed confs, offset log version, error classes) follows the client's PySpark."""
    import pyspark

    from microbatch.errors import UnsupportedOperationError
    from microbatch.spark_internals.versions import parse_version
    client = parse_version(pyspark.__version__)
    if not client.at_least(4, 3):
        raise UnsupportedOperationError(
            f"microbatch runs over Spark Connect with a PySpark 4.3 client; this client is PySpark "
            f"{client.text}. Use a classic session, or PySpark 4.3.")
    server = parse_version(spark.version)
    if (server.major, server.minor) != (client.major, client.minor):
        raise UnsupportedOperationError(
            f"microbatch runs over Spark Connect when the server runs the client's Spark line: the client "
            f"is PySpark {client.text} and the server runs Spark {server.text}. Use a {client.major}."
            f"{client.minor}.x server (or a client of the server's line on a classic session).")


def cloned_session(spark: Any) -> Any:
    """A new server-side session with ``spark``'s confs, temporary views and functions."""
    return spark.cloneSession()


def jobs_see_session_confs(spark: Any) -> None:
    """The server runs every operation with its session's confs: nothing to do."""


def job_tags(spark: Any) -> set[str]:
    """The calling thread's operation tags."""
    return set(spark.getTags())


def enter_query_thread(spark: Any, run_id: str, query_id: str, tags: set[str], description: str) -> None:
    """Tag the stream thread's operations with the run (for ``cancel_run``) and the
    starting thread's tags (Connect has no job groups or local properties); the query's
    session is the thread's active one, as Spark's Python runner of ``foreachBatch`` makes
    the batch's cloned session active (``SparkSession.active()`` inside the function is
    ``batch_df.sparkSession``), for this thread only."""
    type(spark)._active_session.session = spark
    spark.addTag(_RUN_TAG.format(run_id))
    for tag in tags:
        spark.addTag(tag)


def cancel_run(spark: Any, run_id: str) -> None:
    """Interrupt the run's running operations (those tagged with the run)."""
    spark.interruptTag(_RUN_TAG.format(run_id))


def describe_batch(spark: Any, description: str | None = None, batch_id: int | None = None) -> None:
    """Connect has no job descriptions or local properties: nothing to do."""


def static_conf(spark: Any, key: str, default: str | None) -> str | None:
    return spark.conf.get(key, default)


def app_name(spark: Any) -> str:
    return spark.conf.get("spark.app.name", "microbatch")


def default_parallelism(spark: Any) -> int:
    """``SparkContext.defaultParallelism`` as the server sets it: ``spark.default.parallelism``
    if set, else ``local[N]``'s N; else ask the server once (the partitions of a parallel range)."""
    value = spark.conf.get("spark.default.parallelism", None)
    if value:
        return int(value)
    master = spark.conf.get("spark.master", "") or ""
    found = re.match(r"local\[(\d+)", master)
    if found:
        return int(found.group(1))
    if master in ("local", "local[1]"):
        return 1
    from pyspark.sql import functions as F
    return max(1, spark.range(1 << 16).select(F.spark_partition_id()).distinct().count())


def session_settings(spark: Any) -> dict[str, str]:
    return dict(spark.conf.getAll)


def unsupported(feature: str):
    """A seam function with no Connect implementation yet."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        refuse(feature)
    return refused


def is_remote_client() -> bool:
    """Whether this process is a Spark Connect client (PySpark's own test of it)."""
    from pyspark.sql.utils import is_remote
    return is_remote()


def metrics_source_unavailable(spark: Any, name: str, gauges: dict) -> None:
    """Over Connect the client has no SparkContext: ``spark.sql.streaming.metricsEnabled``
    feeds no Spark metrics sink here (the dashboard's ``/metrics`` has the same gauges)."""
    import logging
    logging.getLogger(__name__).warning(
        "spark.sql.streaming.metricsEnabled: a Spark Connect client has no access to Spark's metrics "
        "system; query %s's gauges are on microbatch's /metrics only", name)
    return None


def temp_view_exists(spark: Any, name: str) -> bool:
    """Whether ``name`` is a temporary view of the session (the catalog API a Connect
    client has: a name it does not know is no view)."""
    from pyspark.errors import AnalysisException
    try:
        return bool(spark.catalog.getTable(name).isTemporary)
    except AnalysisException:
        return False


def catalog_table(spark: Any, name: str) -> Any:
    """The session catalog's metadata of table ``name`` (``spark_internals.CatalogTableInfo``),
    or None if there is none (a temporary view is none, as classically): what a Connect
    client reads of it, ``DESCRIBE TABLE EXTENDED .. AS JSON``."""
    import json

    from microbatch.spark_internals.catalog import CatalogTableInfo
    if temp_view_exists(spark, name) or not spark.catalog.tableExists(name):
        return None
    table = json.loads(spark.sql(f"DESCRIBE TABLE EXTENDED {name} AS JSON").collect()[0][0])
    return CatalogTableInfo(
        name=".".join([table["catalog_name"], *table.get("namespace", []), table["table_name"]]),
        table_type=table["type"], provider=table.get("provider"), location=table.get("location"),
        partition_columns=list(table.get("partition_columns", [])),
        storage_properties=dict(table.get("storage_properties", {})))


def managed_table_location(spark: Any, name: str) -> str:
    """Where the session catalog keeps the data of a managed table ``name``: its
    database's location and the table's name (Spark's ``defaultTablePath``); Spark's
    SCHEMA_NOT_FOUND for a database that does not exist."""
    parts = _name_parts(name)
    database = parts[-2] if len(parts) > 1 else spark.catalog.currentDatabase()
    table = parts[-1] if str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true" \
        else parts[-1].lower()
    rows = spark.sql(f"DESCRIBE DATABASE EXTENDED `{database.replace('`', '``')}`").collect()
    location = next(r.info_value for r in rows if r.info_name == "Location")
    return f"{location.rstrip('/')}/{table}"


def _name_parts(name: str) -> list[str]:
    """A multi-part name's parts (```a.b`.c``: ``a.b``, ``c``)."""
    parts, current, quoted, i = [], "", False, 0
    while i < len(name):
        c = name[i]
        if c == "`":
            if quoted and name[i + 1:i + 2] == "`":
                current, i = current + "`", i + 2
                continue
            quoted = not quoted
        elif c == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += c
        i += 1
    return parts + [current]


def schema_ddl(spark: Any, schema: Any) -> str:
    """``StructType.toDDL``, which the server gives a Connect client."""
    return spark._to_ddl(schema)


#: the Python data source classes registered through a StreamingSession over Connect, by
#: lower-case name: the server keeps them pickled where no client API reads them back
_PYTHON_DATA_SOURCES: dict[str, type] = {}


class DataSourceRegistration:
    """``StreamingSession.dataSource`` over Connect: PySpark's registration (the server
    gets the class, for Spark's batch reads), the class kept here for microbatch's streams."""

    def __init__(self, spark: Any):
        self._spark = spark

    def register(self, dataSource: type) -> None:  # noqa: N803 - PySpark's argument name
        self._spark.dataSource.register(dataSource)
        _PYTHON_DATA_SOURCES[dataSource.name().lower()] = dataSource


def data_source_registration(spark: Any) -> DataSourceRegistration:
    return DataSourceRegistration(spark)


def python_data_source(spark: Any, name: str) -> type | None:
    """A Python data source class registered through a StreamingSession (``dataSource``),
    or None."""
    return _PYTHON_DATA_SOURCES.get(name.lower())
