"""What a batch reports once it committed: each source's entry, the sink's, the event
time, the stateful operators' and the observed metrics, gathered from the run's parts as
Spark's progress has them; and the trigger's close, which hands them to the query's
``ProgressReporter`` (``runtime.progress``: the phases' times, the rates, the JSON)."""
from __future__ import annotations

from typing import Any

from microbatch.operators.base import state_operator_progress
from microbatch.runtime.batch_metrics import BatchMetrics
from microbatch.runtime.incremental import IncrementalExecution, PlannedBatch
from microbatch.runtime.progress import ProgressReporter
from microbatch.sinks.base import Sink
from microbatch.sources.base import Source


def source_progress(source: Source, start: Any, end: Any, latest: Any, rows: int) -> dict:
    """A source's entry: its offsets in the trigger (``start``, ``end``, ``latest``), the
    rows it gave and its own metrics at ``end``."""
    progress = {"description": str(source),
                "startOffset": start,
                "endOffset": end,
                "latestOffset": latest,
                "numInputRows": rows, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0}
    metrics = source.metrics(end)
    if metrics:
        progress["metrics"] = metrics
    return progress


def sink_progress(sink: Sink) -> dict:
    progress = {"description": str(sink), "numOutputRows": sink.last_num_output_rows}
    metrics = sink.progress_metrics()
    if metrics:
        progress["metrics"] = metrics
    return progress


def batch_stats(sources: list[Source], sink: Sink, rows: list[int], *, start_offsets: dict[int, Any],
                end_offsets: dict[int, Any], latest_offsets: dict[int, Any], event_time: dict | None,
                planner: IncrementalExecution, planned: PlannedBatch, metrics: BatchMetrics) -> dict:
    """What the batch reports (read once it committed): ``rows``, the rows each source
    gave; the offsets by source index."""
    return {
        "sources": [source_progress(sources[i], start_offsets.get(i), end_offsets.get(i), latest_offsets.get(i),
                                    rows[i]) for i in range(len(sources))],
        "sink": sink_progress(sink),
        "eventTime": event_time,
        "stateOperators": [state_operator_progress(op.name, planner.operator_metrics(
            op, metrics.observed(planned.operators[op.id].late_rows)), op.num_state_stores, planner.shuffle_partitions)
            for op in planner.operators],
        "observedMetrics": metrics.user_metrics(planned.user_observations),
    }


def finish_trigger(reporter: ProgressReporter, executed: bool, batch_id: int,
                   stats: dict | None) -> tuple[str, Any]:
    """Close the trigger with what its batch reported (``batch_stats``; nothing if no batch
    ran): ``ProgressReporter.finish_trigger``'s answer."""
    stats = stats if executed and stats else {}
    return reporter.finish_trigger(
        executed, batch_id, stats.get("sources", []), stats.get("sink", {}),
        event_time=stats.get("eventTime"), state_operators=stats.get("stateOperators"),
        observed_metrics=stats.get("observedMetrics"))
