"""The sessions and threads queries run in: job tags, settings."""
from __future__ import annotations


from pyspark import SparkContext
from pyspark.sql import SparkSession


def job_tags(sc: SparkContext) -> set[str]:
    """The calling thread's job tags, as ``SparkContext.getJobTags()`` gives them, without
    PySpark's walk of the Java set: py4j's iterator ends in a Java exception that PySpark
    converts, about 15 ms of a query's start."""
    tags = sc._jsc.getJobTags()
    return set(tags.toArray()) if tags.size() else set()


def cloned_session(spark: SparkSession) -> SparkSession:
    """A new session with ``spark``'s confs, temporary views and functions, as Spark's
    StreamExecution clones the user's session for a query."""
    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())


def session_settings(spark: SparkSession) -> dict[str, str]:
    """Every setting of the session: the SparkConf's (``spark.hadoop.*`` given at
    start), then the SQL conf's over them; where a remote store's endpoint and
    credentials are read from."""
    runtime = spark.conf.getAll if hasattr(spark.conf, "getAll") else _jvm_runtime_conf(spark)   # 4.0+ / 3.5
    return {**dict(spark.sparkContext.getConf().getAll()), **runtime}


def _jvm_runtime_conf(spark: SparkSession) -> dict[str, str]:
    """The session's runtime conf as a dict, read from the JVM (PySpark 3.5 has no
    ``RuntimeConfig.getAll``)."""
    found = {}
    entries = spark._jsparkSession.conf().getAll().iterator()
    while entries.hasNext():
        entry = entries.next()
        found[entry._1()] = entry._2()
    return found
