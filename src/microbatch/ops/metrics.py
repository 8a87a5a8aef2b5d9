"""The Prometheus metrics of running queries (prometheus-client), with Spark's names.

Spark reports a query's metrics (``spark.sql.streaming.metricsEnabled``) through a metrics
source named ``spark.streaming.<query name or id>`` with the gauges ``inputRate-total``,
``processingRate-total``, ``latency``, ``eventTime-watermark``, ``states-rowsTotal`` and
``states-usedBytes``, each computed from the last progress. Here they are the same gauges
from the same progress fields, named as Prometheus names Spark's (``.`` and ``-`` become
``_``: ``spark_streaming_inputRate_total``) and labelled by ``query_name`` and ``query_id``
instead of carrying the query in the name. As in Spark, a query's metrics exist while it
runs. microbatch adds the batch id, the batch's input rows, its duration by phase, a
processing-time trigger's interval, and a Kafka source's consumer lag (how far the batch's
end is behind the latest offsets, from the source's progress metrics).

``monitoring/`` beside this module holds a Grafana dashboard and Prometheus alert rules
over these names (``microbatch monitoring grafana|alerts`` prints them; docs/deploying.md).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Iterable

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from microbatch.ops.history import RUNNING, QueryHistory

LABELS = ["query_name", "query_id"]

#: (Spark's gauge name, help, value from the last progress): Spark's MetricsReporter gauges
#: (its metrics source ``spark.streaming.<query name or id>``; in Prometheus
#: ``spark_streaming_<name>`` with ``-`` as ``_``)
SPARK_GAUGES: list[tuple[str, str, Callable[[dict], float]]] = [
    ("inputRate-total", "Spark's inputRate-total: input rows per second",
     lambda p: p.get("inputRowsPerSecond") or 0.0),
    ("processingRate-total", "Spark's processingRate-total: processed rows per second",
     lambda p: p.get("processedRowsPerSecond") or 0.0),
    ("latency", "Spark's latency: the last trigger's execution time, in ms",
     lambda p: (p.get("durationMs") or {}).get("triggerExecution", 0)),
    ("eventTime-watermark", "Spark's eventTime-watermark: ms since the epoch",
     lambda p: _epoch_ms((p.get("eventTime") or {}).get("watermark"))),
    ("states-rowsTotal", "Spark's states-rowsTotal: rows in all state stores",
     lambda p: sum(op.get("numRowsTotal", 0) for op in p.get("stateOperators", []))),
    ("states-usedBytes", "Spark's states-usedBytes: memory of all state stores",
     lambda p: sum(op.get("memoryUsedBytes", 0) for op in p.get("stateOperators", []))),
]


def prometheus_name(spark_name: str) -> str:
    return "spark_streaming_" + spark_name.replace("-", "_")


def _epoch_ms(timestamp: str | None) -> int:
    if not timestamp:
        return 0
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


class QueryMetricsCollector:
    """A prometheus-client collector over the histories of running queries."""

    def __init__(self, histories: Callable[[], Iterable[QueryHistory]]):
        self._histories = histories

    def collect(self) -> Iterable[Any]:
        spark = {name: GaugeMetricFamily(prometheus_name(name), help, labels=LABELS) for name, help, _ in SPARK_GAUGES}
        batch = GaugeMetricFamily("microbatch_batch_id", "The last batch's id", labels=LABELS)
        rows = GaugeMetricFamily("microbatch_batch_input_rows", "The last batch's input rows",
                                 labels=LABELS)
        phases = GaugeMetricFamily("microbatch_batch_duration_ms",
                                   "The last batch's duration by phase (progress durationMs)",
                                   labels=LABELS + ["phase"])
        trigger = GaugeMetricFamily("microbatch_trigger_interval_ms",
                                    "A processing-time trigger's interval, in ms (absent for other triggers)",
                                    labels=LABELS)
        behind = GaugeMetricFamily("microbatch_source_offsets_behind_latest",
                                   "How far the last batch's end is behind the source's latest offsets "
                                   "(a Kafka source's progress metrics: the consumer lag, per stat over partitions)",
                                   labels=LABELS + ["source", "stat"])
        latency = GaugeMetricFamily("microbatch_real_time_latency_ms",
                                    "A real-time batch's record latencies, per kind (sourceQueuingLatencyMs: "
                                    "from the record's Kafka timestamp to its read; processingLatencyMs: from "
                                    "the read to the sink; e2eLatencyMs: both) and percentile (P0 ... P99)",
                                    labels=LABELS + ["kind", "percentile"])
        for history in self._histories():
            progress = history.last_progress
            if history.status != RUNNING or progress is None:
                continue
            labels = [history.name or "", history.id or ""]
            for name, _, value in SPARK_GAUGES:
                spark[name].add_metric(labels, float(value(progress)))
            batch.add_metric(labels, float(progress["batchId"]))
            rows.add_metric(labels, float(progress.get("numInputRows", 0)))
            if history.trigger_interval_ms:
                trigger.add_metric(labels, float(history.trigger_interval_ms))
            for phase, ms in sorted((progress.get("durationMs") or {}).items()):
                phases.add_metric(labels + [phase], float(ms))
            for source in progress.get("sources") or []:
                for stat in ("min", "avg", "max"):
                    value = (source.get("metrics") or {}).get(f"{stat}OffsetsBehindLatest")
                    if value is not None:
                        behind.add_metric(labels + [source.get("description", ""), stat], float(value))
            for key, value in sorted(((progress.get("sink") or {}).get("metrics") or {}).items()):
                kind, _, percentile = key.rpartition(".")
                if kind.endswith("LatencyMs") and percentile.startswith("P"):
                    latency.add_metric(labels + [kind, percentile], float(value))
        yield from spark.values()
        yield from (batch, rows, phases, trigger, behind, latency)


def metrics_text(histories: Callable[[], Iterable[QueryHistory]]) -> bytes:
    """The Prometheus text exposition of the running queries' metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueryMetricsCollector(histories))
    return generate_latest(registry)
