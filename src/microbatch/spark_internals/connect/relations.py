"""Batch DataFrames of sources over Spark Connect: public reads the server resolves."""
from __future__ import annotations

from typing import Any, Mapping

from pyspark.sql.types import StructType


def empty_batch(spark: Any, schema: StructType) -> Any:
    """An empty DataFrame of ``schema`` the optimizer keeps (a range of no rows over the
    server's parallelism, not a local relation, which PropagateEmptyRelation drops), so
    a stateful task above a batch without rows still runs. Columns become nullable; each
    keeps its metadata (a watermark's mark on an operator's output event time)."""
    from pyspark.sql import functions as F

    from microbatch.spark_internals.connect.session import default_parallelism
    return spark.range(0, 0, 1, default_parallelism(spark)).select(
        *[F.lit(None).cast(f.dataType).alias(f.name, metadata=f.metadata) if f.metadata
          else F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])


def empty_dataframe(spark: Any, schema: StructType) -> Any:
    """A placeholder of ``schema`` (never run, only analysed if at all)."""
    return spark.createDataFrame([], schema)


class FileBatches:
    """Batch DataFrames of the files a file source's log names: ``spark.read`` of the
    files with the stream's schema and the reader's options (the server checks the files
    exist); with no files, the path-less read of the format (no rows, tasks still run)."""

    def __init__(self, spark: Any, fmt: str, schema: StructType, options: Mapping[str, str],
                 partition_columns: tuple[str, ...] = ()):
        if partition_columns:
            from microbatch.spark_internals.connect.support import refuse
            refuse("A file source with partition columns")
        self._spark = spark
        self._format = fmt
        self._schema = schema
        self._options = {k: v for k, v in options.items() if k.lower() != "path"}

    def dataframe(self, paths: list[str]) -> Any:
        reader = self._spark.read.format(self._format).schema(self._schema).options(**self._options)
        df = reader.load(list(paths)) if paths else reader.load()
        df._cached_schema = self._schema     # (the stream's schema: no round trip to ask)
        return df


def in_session(df: Any, spark: Any) -> Any:
    """``df`` (a static DataFrame of the user's session) as a DataFrame of ``spark``, the
    query's batch session: a Connect plan is resolved by the session that runs it, and the
    batch session is a clone of the user's (its temporary views and functions too), so the
    same plan, its columns' plan ids with it, reads the same there."""
    if df.sparkSession is spark:
        return df
    from pyspark.sql.connect.dataframe import DataFrame
    return DataFrame(df._plan, spark)


def sql_over(df: Any, query: str, args: Any, name: str) -> Any:
    """Spark's SQL ``query`` (parameters ``args``, as ``spark.sql``'s) over ``df`` named
    ``name`` in it: PySpark's Connect relation of ``spark.sql(query, **kwargs)`` with a
    DataFrame argument (the server resolves ``name`` to ``df``'s plan), built lazily (not
    run as a command), and keeping ``df``'s observations, which PySpark's SQL relation
    drops (so a batch's input rows are counted through it)."""
    from pyspark.sql.connect import functions as F
    from pyspark.sql.connect.dataframe import DataFrame
    from pyspark.sql.connect.plan import SQL, SubqueryAlias

    class _SQLOver(SQL):
        @property
        def observations(self) -> dict:
            return df._plan.observations

    positional = [F.lit(v) for v in args] if isinstance(args, (list, tuple)) else None
    named = {k: F.lit(v) for k, v in args.items()} if isinstance(args, dict) else None
    return DataFrame(_SQLOver(query, positional, named, [SubqueryAlias(df._plan, name)]), df.sparkSession)
