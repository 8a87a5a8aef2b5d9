"""The sessions and threads queries run in: job tags, settings."""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping

from microbatch.spark_internals.jvm import SparkContext   # (None in PySpark's Connect-only client)
from pyspark.sql import SparkSession


def job_tags(spark: SparkSession | SparkContext) -> set[str]:
    """The calling thread's job tags, as ``SparkContext.getJobTags()`` gives them, without
    PySpark's walk of the Java set: py4j's iterator ends in a Java exception that PySpark
    converts, about 15 ms of a query's start."""
    sc = spark if isinstance(spark, SparkContext) else spark.sparkContext
    tags = sc._jsc.getJobTags()
    return set(tags.toArray()) if tags.size() else set()


def cloned_session(spark: SparkSession) -> SparkSession:
    """A new session with ``spark``'s confs, temporary views and functions, as Spark's
    StreamExecution clones the user's session for a query."""
    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())


#: Spark 4 ends an Arrow batch to a Python worker at this many bytes (64 MB unless set;
#: and at ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), measuring the batch
#: after every row.
ARROW_MAX_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
#: the value at which Spark's Arrow input does not measure batches at all
UNMEASURED_ARROW_BYTES = str(2**31 - 1)

log = logging.getLogger(__name__)


def arrow_batches_by_rows(spark: Any) -> None:
    """Batches to Python workers bounded by rows only, as in Spark 3.5, where nobody set a
    byte bound: Spark 4's Arrow writer measures its batch after every row it adds (the
    size of every column vector), about a third of the JVM's work in a state task's input
    (``benchmarks/RESULTS.md``, "many groups"). ``Int.MaxValue`` turns the measure off.
    A session that set its own bound keeps it (PySpark 3.5 has no such conf: setting it
    changes nothing there)."""
    if spark.conf.get(ARROW_MAX_BYTES_CONF, None) is not None:    # (None: not set)
        return
    try:
        spark.conf.set(ARROW_MAX_BYTES_CONF, UNMEASURED_ARROW_BYTES)
    except Exception:  # a Spark whose check refuses Int.MaxValue: its bound stays
        log.debug("Spark keeps its Arrow batch byte bound", exc_info=True)


def jobs_see_session_confs(spark: SparkSession) -> None:
    """Every job the calling thread starts from now on carries ``spark``'s confs (those
    set on it or on the SparkConf it started from) to its tasks as local properties, which
    a task's ``SQLConf`` reads: what Spark's ``SQLExecution.withSQLConfPropagated`` does
    around each SQL action, and an RDD action on a DataFrame's plan (the ``noop`` sink's)
    does not do. Without it such a batch's tasks read Spark's defaults, not the
    session's (the Python runner's Arrow batch bounds among them). A SQL action on the
    thread sets the same properties again and puts these back after it."""
    sc = spark.sparkContext
    if hasattr(spark.conf, "getAll"):   # 4.0+: in the JVM, three calls (one a conf costs ~1 ms)
        sc._jsc.sc().getLocalProperties().putAll(spark._jsparkSession.conf().getAllAsJava())
        return
    for key, value in _jvm_runtime_conf(spark).items():   # 3.5
        sc.setLocalProperty(key, value)


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


# -- what the engine asked the SparkContext directly, now behind the seam ------------------
def enter_query_thread(spark: SparkSession, run_id: str, query_id: str, tags: set[str],
                       description: str) -> None:
    """The stream thread's jobs: the run's job group (cancelled on stop), the query id as
    Spark's engine sets it, and the starting thread's job tags."""
    sc = spark.sparkContext
    sc.setJobGroup(run_id, description, interruptOnCancel=True)
    sc.setLocalProperty("sql.streaming.queryId", query_id)
    for tag in tags:
        sc.addJobTag(tag)


def cancel_run(spark: SparkSession, run_id: str) -> None:
    """Cancel the run's running jobs (its job group), if it has any."""
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    if set(tracker.getJobIdsForGroup(run_id)) & set(tracker.getActiveJobsIds()):
        sc.cancelJobGroup(run_id)


def describe_batch(spark: SparkSession, description: str | None = None, batch_id: int | None = None) -> None:
    """The jobs' description in Spark's UI, and the batch id as a local property."""
    sc = spark.sparkContext
    if description is not None:
        sc.setJobDescription(description)
    if batch_id is not None:
        sc.setLocalProperty("streaming.sql.batchId", str(batch_id))


def static_conf(spark: SparkSession, key: str, default: str | None) -> str | None:
    """A setting of the SparkConf the context started with."""
    return spark.sparkContext.getConf().get(key, default)


def app_name(spark: SparkSession) -> str:
    return spark.sparkContext.appName


def default_parallelism(spark: SparkSession) -> int:
    return spark.sparkContext.defaultParallelism


def operator_accumulator(spark: SparkSession, param: Any) -> Any:
    """An operator's metrics channel from its tasks: an accumulator of ``param``."""
    return spark.sparkContext.accumulator({}, param)


def map_state_task(df: Any, task: Any, output: Any) -> Any:
    """A state task over ``df``'s partitions (its metrics go to its accumulator)."""
    return df.mapInArrow(task, output)


def binds_plans(df: Any) -> bool:
    """Whether batches bind a plan analysed once (classic) instead of being rebuilt."""
    return True


def set_local_property(spark: SparkSession, key: str, value: str | None) -> None:
    """A Spark local property of the calling thread: every task of the jobs it starts
    sees it (``TaskContext.getLocalProperty``), as ``streaming.sql.batchId``."""
    spark.sparkContext.setLocalProperty(key, value)


def row_accumulator(spark: SparkSession) -> Any:
    """An accumulator of rows that tasks add to (a kept batch plan's source counts its
    rows with one, since an ``Observation`` is filled once)."""
    return spark.sparkContext.accumulator(0)


def with_read_formats(spark: Any, formats: Mapping[str, Callable[[Any], Any]]) -> Any:
    """``spark`` (a query's batch session, classic or Connect) whose ``read.format(name)``
    gives ``formats[name.lower()](spark)`` for each of ``formats``: readers of microbatch's
    own (its state data sources), as ``batch_df.sparkSession.read`` inside ``foreachBatch``
    is the engine's. The session stays PySpark's class (a subclass made here, of the same
    name), and so does its reader; every other format is Spark's."""
    spark.__class__ = _reading_session_class(type(spark))
    spark._microbatch_read_formats = dict(formats)
    return spark


def sparks_own_reader(spark: Any) -> Any:
    """Spark's ``DataFrameReader`` of ``spark``, past the formats ``with_read_formats`` gave it."""
    if getattr(spark, "_microbatch_read_formats", None) is None:
        return spark.read
    return super(type(spark), spark).read


@functools.lru_cache(maxsize=None)
def _reading_session_class(base: type) -> type:
    def read(self):
        reader = base.read.fget(self)
        reader.__class__ = _format_reader_class(type(reader))
        reader._microbatch_formats, reader._microbatch_session = self._microbatch_read_formats, self
        return reader
    read.__doc__ = base.read.__doc__
    return type(base.__name__, (base,), {"read": property(read), "__module__": base.__module__,
                                         "__qualname__": base.__qualname__})


@functools.lru_cache(maxsize=None)
def _format_reader_class(base: type) -> type:
    def format(self, source: str):
        made = self._microbatch_formats.get(source.lower()) if isinstance(source, str) else None
        return base.format(self, source) if made is None else made(self._microbatch_session)
    format.__doc__ = base.format.__doc__
    return type(base.__name__, (base,), {"format": format, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__})
