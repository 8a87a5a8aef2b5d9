"""microbatch's query events on Spark's own streaming listener bus.

Spark's engine posts a query's events (started, progress, idle, terminated) to its
session's ``StreamingQueryListenerBus``, which hands them to the listeners of
``spark.streams`` (JVM ones, those named in ``spark.sql.streaming.streamingQueryListeners``,
PySpark's) and, through the SparkContext's listener bus, to the Spark UI's Structured
Streaming tab (``StreamingQueryStatusListener``) and the event log. microbatch's queries
post the same events there, as Spark's own objects made from PySpark's:
``QueryStartedEvent``, ``QueryIdleEvent`` and ``QueryTerminatedEvent`` by their
constructors, ``QueryProgressEvent`` from the progress's JSON (Spark's ``fromJson``, the
way Spark Connect's client reads it; on 3.5, which has none, by the progress classes'
constructors, without the observed metrics), through ``StreamingQueryManager.postListenerEvent``.
A Spark Connect session has no JVM here: its events stay with microbatch's own bus.
Spark's own confs rule the rest: ``spark.sql.streaming.ui.enabled=false`` leaves the UI's
listener out, as for Spark's queries.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from microbatch.spark_internals.jvm import jvm_class
from microbatch.spark_internals.versions import running_version

log = logging.getLogger(__name__)

_EVENTS = "org.apache.spark.sql.streaming.StreamingQueryListener$"


def post_to_spark_listeners(spark: Any, event: Any) -> None:
    """Post PySpark's ``event`` to ``spark``'s streaming listener bus as Spark's event.
    A failure is logged (a listener never fails a query, nor does the bus)."""
    try:
        made = _spark_event(event)
        if made is not None:
            spark._jsparkSession.streams().postListenerEvent(made)
    except Exception:  # py4j errors of a JVM without these classes: events stay microbatch's
        log.warning("Could not post %s to Spark's streaming listener bus", type(event).__name__, exc_info=True)


def _spark_event(event: Any) -> Any:
    uuid = jvm_class("java.util.UUID")
    kind = type(event).__name__
    if kind == "QueryStartedEvent":
        return jvm_class(_EVENTS + "QueryStartedEvent")(
            uuid.fromString(str(event.id)), uuid.fromString(str(event.runId)), event.name, event.timestamp)
    if kind == "QueryProgressEvent":
        body = _progress_body(event.progress)
        if running_version().at_least_4:
            return jvm_class(_EVENTS + "QueryProgressEvent$").fromJson(json.dumps({"progress": body}))
        return jvm_class(_EVENTS + "QueryProgressEvent")(_progress_3_5(body))
    if kind == "QueryIdleEvent":
        return jvm_class(_EVENTS + "QueryIdleEvent")(
            uuid.fromString(str(event.id)), uuid.fromString(str(event.runId)), event.timestamp)
    if kind == "QueryTerminatedEvent":
        option = jvm_class("scala.Option")
        return jvm_class(_EVENTS + "QueryTerminatedEvent")(
            uuid.fromString(str(event.id)), uuid.fromString(str(event.runId)),
            option.apply(event.exception), option.apply(event.errorClassOnException))
    return None


def _progress_body(progress: Any) -> dict:
    """The progress's JSON as a dict, each map of it there (Spark's JSON leaves out an empty
    map, which its parser reads back as null, and PySpark's listeners then fail on it)."""
    text = progress.json if isinstance(progress.json, str) else json.dumps(progress.json)
    body = json.loads(text)
    for key in ("durationMs", "eventTime", "observedMetrics"):
        body.setdefault(key, {})
    for key in ("stateOperators", "sources"):
        body.setdefault(key, [])
    for operator in body["stateOperators"]:
        operator.setdefault("customMetrics", {})
    for source in body["sources"]:
        source.setdefault("metrics", {})
    if isinstance(body.get("sink"), dict):
        body["sink"].setdefault("metrics", {})
    return body


def _progress_3_5(body: dict) -> Any:
    """Spark 3.5's ``StreamingQueryProgress`` (it has no ``fromJson``), by its constructors;
    the observed metrics left out (rows of a schema the JSON does not carry)."""
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    uuid = jvm_class("java.util.UUID")

    mapper = jvm_class("com.fasterxml.jackson.databind.ObjectMapper")()
    named = jvm_class("java.lang.Class").forName

    def java_map(values: dict, as_long: bool = False) -> Any:
        # (read by Jackson in the JVM: a value py4j sends is an Integer where Spark wants a Long)
        kind = mapper.getTypeFactory().constructMapType(
            named("java.util.HashMap"), named("java.lang.String"), named("java.lang.Long" if as_long else "java.lang.String"))
        return mapper.readValue(json.dumps({str(k): int(v) if as_long else str(v) for k, v in values.items()}), kind)

    def array(kind: str, items: list) -> Any:
        out = gateway.new_array(jvm_class("org.apache.spark.sql.streaming." + kind), len(items))
        for i, item in enumerate(items):
            out[i] = item
        return out

    def text(value: Any) -> Any:
        return value if value is None or isinstance(value, str) else json.dumps(value)

    operators = [jvm_class("org.apache.spark.sql.streaming.StateOperatorProgress")(
        op.get("operatorName", ""), *(int(op.get(k, 0)) for k in (
            "numRowsTotal", "numRowsUpdated", "allUpdatesTimeMs", "numRowsRemoved", "allRemovalsTimeMs",
            "commitTimeMs", "memoryUsedBytes", "numRowsDroppedByWatermark", "numShufflePartitions",
            "numStateStoreInstances")), java_map(op["customMetrics"], as_long=True)) for op in body["stateOperators"]]
    sources = [jvm_class("org.apache.spark.sql.streaming.SourceProgress")(
        source.get("description", ""), text(source.get("startOffset")), text(source.get("endOffset")),
        text(source.get("latestOffset")), int(source.get("numInputRows", 0)),
        float(source.get("inputRowsPerSecond") or 0.0), float(source.get("processedRowsPerSecond") or 0.0),
        java_map(source["metrics"])) for source in body["sources"]]
    sink = body.get("sink") or {"description": "", "numOutputRows": -1, "metrics": {}}
    return jvm_class("org.apache.spark.sql.streaming.StreamingQueryProgress")(
        uuid.fromString(body["id"]), uuid.fromString(body["runId"]), body.get("name"), body["timestamp"],
        int(body["batchId"]), int(body.get("batchDuration", 0)), java_map(body["durationMs"], as_long=True),
        java_map(body["eventTime"]), array("StateOperatorProgress", operators), array("SourceProgress", sources),
        jvm_class("org.apache.spark.sql.streaming.SinkProgress")(
            sink.get("description", ""), int(sink.get("numOutputRows", -1)), java_map(sink.get("metrics") or {})),
        jvm_class("java.util.HashMap")())
