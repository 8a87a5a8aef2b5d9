"""A query's gauges in Spark's metrics system (``spark.sql.streaming.metricsEnabled``).

Spark's engine registers a Dropwizard metrics source named ``spark.streaming.<query name
or id>`` with the gauges of its ``MetricsReporter`` in the SparkContext's
``MetricsSystem`` while a query runs, so the sinks configured in ``metrics.properties``
or ``spark.metrics.conf.*`` (JMX, CSV, Graphite, Prometheus servlet, ...) export them.
microbatch registers the same source with the same gauge names: the source and each gauge
are Python objects implementing the JVM interfaces (``org.apache.spark.metrics.source.Source``,
``com.codahale.metrics.Gauge``) through py4j's callback server, so a reporter's read of a
gauge calls back into Python for the query's last progress.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from microbatch.spark_internals.jvm import jvm_class

log = logging.getLogger(__name__)


class _Gauge:
    """``com.codahale.metrics.Gauge``: ``read()``'s value (0 when it fails)."""

    def __init__(self, read: Callable[[], float]):
        self._read = read

    def getValue(self) -> float:  # noqa: N802 - the JVM interface's name
        try:
            return float(self._read())
        except Exception:  # a reporter's read never fails the query
            log.debug("A gauge could not be read", exc_info=True)
            return 0.0

    class Java:
        implements = ["com.codahale.metrics.Gauge"]


class _Source:
    """``org.apache.spark.metrics.source.Source``: a name and its registry of gauges."""

    def __init__(self, name: str, registry: Any):
        self._name, self._registry = name, registry
        self.system: Any = None     # (the metrics system it is registered in)

    def sourceName(self) -> str:  # noqa: N802 - the JVM interface's name
        return self._name

    def metricRegistry(self) -> Any:  # noqa: N802 - the JVM interface's name
        return self._registry

    # (the JVM compares sources: removeSource takes this one out of the system's list)
    def equals(self, other: Any) -> bool:
        return other is self

    def hashCode(self) -> int:  # noqa: N802 - java.lang.Object's name
        return id(self) & 0x7FFFFFFF

    def toString(self) -> str:  # noqa: N802 - java.lang.Object's name
        return f"microbatch metrics source {self._name}"

    class Java:
        implements = ["org.apache.spark.metrics.source.Source"]


def register_metrics_source(spark: Any, name: str, gauges: dict[str, Callable[[], float]]) -> Any:
    """Register a metrics source ``name`` with ``gauges`` (gauge name -> reader) in the
    SparkContext's metrics system; the handle ``remove_metrics_source`` takes (None where
    it could not be registered: logged, and the query runs without it)."""
    try:
        return _registered(spark, name, gauges)
    except Exception:  # py4j's or the JVM's: the query goes on, its gauges on /metrics only
        log.warning("Could not register metrics source %s in Spark's metrics system", name, exc_info=True)
        return None


def _registered(spark: Any, name: str, gauges: dict[str, Callable[[], float]]) -> Any:
    from pyspark.java_gateway import ensure_callback_server_started
    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    registry = jvm_class("com.codahale.metrics.MetricRegistry")()
    for gauge, read in gauges.items():
        registry.register(gauge, _Gauge(read))
    source = _Source(name, registry)
    source.system = _metrics_system(spark)
    source.system.registerSource(source)
    return source


def remove_metrics_source(source: Any) -> None:
    if source is None:      # (none registered: a Connect client's)
        return
    try:
        source.system.removeSource(source)
    except Exception:  # (a stopped SparkContext's metrics system): the query ends all the same
        log.warning("Could not remove metrics source %s", source.sourceName(), exc_info=True)


def _metrics_system(spark: Any) -> Any:
    """The SparkContext's ``MetricsSystem`` (``SparkEnv.metricsSystem``), reached through a
    method handle: py4j's reflection over the whole ``SparkEnv`` class loads the types of
    all its methods, one of which (4.x) needs protobuf classes the driver's classpath lacks."""
    named = jvm_class("java.lang.Class").forName
    handle = jvm_class("java.lang.invoke.MethodHandles").publicLookup().findVirtual(
        named("org.apache.spark.SparkEnv"), "metricsSystem",
        jvm_class("java.lang.invoke.MethodType").methodType(named("org.apache.spark.metrics.MetricsSystem")))
    arguments = jvm_class("java.util.ArrayList")()
    arguments.add(spark.sparkContext._jsc.sc().env())
    return handle.invokeWithArguments(arguments)
