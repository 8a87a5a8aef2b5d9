"""Real-time mode: Spark 4.1's ``trigger(realTime="5 minutes")`` on microbatch.

A real-time batch is one long Spark job whose tasks read the source's records as they
arrive, run the query's steps on each read's few records and hand the rows to the sink at
once, until the batch's deadline; the trigger's duration is a checkpoint interval, not a
latency. Spark runs the steps in the JVM; microbatch's records are read and written in
Python tasks, and Spark's JVM, between two Python runners, gathers a whole Arrow batch
(``maxRecordsPerBatch`` rows) before it hands any on, so the tasks evaluate the steps
themselves over Arrow (``plan.arrow_steps``): no record waits for another.

The batch protocol (Spark's MicroBatchExecution under a RealTimeTrigger):

1. populate_start_offsets: ``offsets/N`` without ``commits/N`` is a batch whose tasks
   ended but whose commit was not written: it is deleted (Spark's ``purgeAfter``), so a
   run resumes after the last committed batch, from its end.
2. construct_next_batch: every trigger runs a batch (ProcessingTime(0)'s executor); no
   offsets are logged when it starts: its end is not known yet.
3. run_batch: the source's ``real_time_read`` from the last committed end (a new
   partition from its earliest offset); one Spark job whose tasks (at most the cluster's
   cores: every task of the batch runs at once) read, evaluate and write through the
   sink's ``real_time_writer`` until start + duration, then flush and answer the offsets
   they reached and the latencies they saw.
4. ``offsets/N`` gets the merged end offsets (create-if-absent), then ``commits/N``; the
   sources hear the batch committed; progress reports the batch with the latency
   percentiles in the sink's ``metrics``.

A crash before ``commits/N`` runs batch N again from N-1's end: the sink gets those
records again (at least once, as Spark's), or skips the ones it has with the Kafka
sink's ``microbatch.exactlyOnce``.

``check_real_time_query`` holds Spark's rules for the mode, checked at start: the Kafka
source only, the sinks of Spark's allowlist (Kafka, foreach, console: its rows shown at the batch's end), Update
output mode, no stateful operator, no asynchronous progress tracking, a duration of at
least ``spark.sql.streaming.realTimeMode.minBatchDuration``; and microbatch's: steps its
tasks evaluate (``plan.arrow_steps.NotEvaluable`` named).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.commits import CommitMetadata
from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqMetadata
from microbatch.errors import ConcurrentUpdateError, UnsupportedOperationError
from microbatch.plan.arrow_steps import ArrowSteps, NotEvaluable, compile_steps
from microbatch.runtime.batch_progress import sink_progress, source_progress
from microbatch.runtime.micro_batch import MicroBatchExecution
from microbatch.util import conf_bool, time_string_as_ms

log = logging.getLogger(__name__)

ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"
MIN_BATCH_DURATION = "spark.sql.streaming.realTimeMode.minBatchDuration"
#: Spark's sink classes its real-time allowlist names, by microbatch's format
_ALLOWED_SINKS = {"kafka": "org.apache.spark.sql.kafka010.KafkaSourceProvider$KafkaTable",
                  "foreach": "org.apache.spark.sql.execution.streaming.sources.ForeachWriterTable",
                  "console": "org.apache.spark.sql.execution.streaming.ConsoleTable$"}
#: the class Spark names for the other sinks in its refusal
_SINK_CLASSES = {"foreachbatch": "org.apache.spark.sql.execution.streaming.sources.ForeachBatchSink",
                 "memory": "org.apache.spark.sql.execution.streaming.sources.MemorySink",
                 "noop": "org.apache.spark.sql.execution.datasources.noop.NoopTable$"}
_FILE_SINK = "org.apache.spark.sql.execution.streaming.FileStreamSink"
#: the latencies a batch reports, in the sink's metrics: ``<name>.P50`` ...
LATENCIES = ("sourceQueuingLatencyMs", "processingLatencyMs", "e2eLatencyMs")
#: how long stop() waits for the running batch to end early and commit
END_WAIT_S = 30.0
PERCENTILES = (("P0", 0.0), ("P50", 0.5), ("P90", 0.9), ("P95", 0.95), ("P99", 0.99))


def _refused(subclass: str, kind: str = "SparkUnsupportedOperationException", **parameters: Any) -> Exception:
    return spark_internals.spark_error(kind, f"STREAMING_REAL_TIME_MODE.{subclass}", **parameters)


def check_real_time_query(spark: Any, trigger: Any, plan: Any, sink_format: str, output_mode: str,
                          options: dict[str, str]) -> None:
    """Spark's rules for a real-time query, at start (their error classes), then
    microbatch's (a source or sink Spark allows that microbatch's mode does not run yet)."""
    minimum = time_string_as_ms(str(spark.conf.get(MIN_BATCH_DURATION, "5000")))
    if trigger.batch_duration_ms < minimum:
        raise spark_internals.spark_error("SparkIllegalArgumentException",
                                          "INVALID_STREAMING_REAL_TIME_MODE_TRIGGER_INTERVAL",
                                          interval=trigger.batch_duration_ms, minBatchDuration=minimum)
    if options.get("asyncProgressTrackingEnabled", "false").lower() == "true":
        raise UnsupportedOperationError(
            "Asynchronous progress tracking cannot be used in real-time mode (Spark 4.1 refuses it): "
            "a real-time batch logs its offsets once, at its end. Remove asyncProgressTrackingEnabled.")
    fmt = sink_format.lower()
    if fmt not in _ALLOWED_SINKS:
        name = _SINK_CLASSES.get(fmt, _FILE_SINK if fmt in ("parquet", "json", "csv", "orc", "text") else fmt)
        if conf_bool(spark, ALLOWLIST_CHECK, True):
            raise _refused("OPERATOR_OR_SINK_NOT_IN_ALLOWLIST", errorType="sink", message=name)
        raise _refused("SINK_NOT_SUPPORTED", className=name)
    if output_mode != "update":
        raise _refused("OUTPUT_MODE_NOT_SUPPORTED", "AnalysisException", outputMode=output_mode.capitalize())
    relations = plan.relations()
    not_kafka = [r.source_name for r in relations if r.source_name.lower() != "kafka"]
    if not_kafka:
        raise _refused("INPUT_STREAM_NOT_SUPPORTED", className=not_kafka[0])
    stateful = [n for n in plan.nodes() if n.stateful]
    if stateful and conf_bool(spark, ALLOWLIST_CHECK, True):
        raise _refused("OPERATOR_OR_SINK_NOT_IN_ALLOWLIST", errorType="operator",
                       message=stateful[0].describe())
    if stateful:
        raise UnsupportedOperationError(
            f"microbatch's real-time mode runs stateless queries: {stateful[0].describe()} is a stateful "
            "operator (Spark 4.3's real-time aggregations and deduplication are not in microbatch yet). "
            "Use a processingTime trigger.")
    if len(relations) != 1:
        raise UnsupportedOperationError(
            "microbatch's real-time mode reads one Kafka source a query (a union of sources, which Spark's "
            "allows, is not in microbatch's yet). Subscribe one source to every topic, or use a "
            "processingTime trigger.")


def steps_of(df: Any, spark: Any) -> ArrowSteps:
    """The steps from the source's columns to ``df``'s, as the tasks evaluate them."""
    try:
        return compile_steps(spark_internals.plan_json(df),
                             ansi=conf_bool(spark, "spark.sql.ansi.enabled", spark_internals.running_version().at_least_4),
                             zone=spark.conf.get("spark.sql.session.timeZone"))
    except NotEvaluable as e:
        raise UnsupportedOperationError(
            f"microbatch's real-time mode evaluates the query's steps in its Kafka tasks, and does not "
            f"evaluate {e} there yet (plan.arrow_steps lists what it does). Rewrite the step, or use a "
            "processingTime trigger.") from None


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for name, q in PERCENTILES}


class RealTimeExecution(MicroBatchExecution):
    """The batch runner in real-time mode (the protocol above)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.batch_duration_ms = self.trigger.batch_duration_ms
        self._steps: ArrowSteps | None = None
        self.last_latencies: dict[str, dict[str, float]] = {}
        #: stop(): the running batch is asked to end early (its tasks look for this file), and
        #: commits, so a stop loses no time and repeats no record; no batch starts after it
        self._end_marker = f"{self.checkpoint_root}/real-time/end-{self.run_id}"
        self._batch_running = threading.Condition()
        self._running = False
        self._ending = False

    def stop(self) -> None:
        """Spark's stop cancels the running batch, whose records a restart writes again; here
        the batch's tasks first end early and the batch commits (within ``END_WAIT_S``;
        after that, as Spark's)."""
        if threading.current_thread() is not self.thread:
            with self._batch_running:
                self._ending = True
                if self._running:
                    self.fs.mkdirs(f"{self.checkpoint_root}/real-time")
                    self.fs.create(self._end_marker, "")
                    self._batch_running.wait_for(lambda: not self._running, END_WAIT_S)
        try:
            super().stop()
        finally:
            if self.fs.exists(self._end_marker):
                self.fs.delete(self._end_marker)
    def _log_and_commit(self, batch_id: int, end: Any) -> None:
        """``offsets/N`` with the end the tasks reached, then ``commits/N`` (step 4)."""
        progress = self.progress
        with progress.time_phase("walCommit"):
            self.lease.check()
            seq = OffsetSeq([end], self.offset_seq_metadata,       # (version 2: by the source's id)
                            [self.source_ids[0]] if self.offset_log_version >= 2 else None)
            if not self.offset_log.add(batch_id, seq):
                raise ConcurrentUpdateError(
                    f"Concurrent update to the log. Multiple streaming jobs detected for {batch_id}. Another "
                    f"run of this query owns the checkpoint '{self.checkpoint_root}'.")
            crash_points.reached("offsets-written")
        with progress.time_phase("commitOffsets"):
            self.lease.check()
            if not self.commit_log.add(batch_id, CommitMetadata(self.watermarks.watermark_ms)):
                raise ConcurrentUpdateError(
                    f"Concurrent update to the log. Multiple streaming jobs detected for {batch_id} "
                    f"(commits/{batch_id} already exists). Another run of this query owns the checkpoint "
                    f"'{self.checkpoint_root}'.")
            crash_points.reached("commit-written")
        self.committed_offsets.update(self.available_offsets)

    def _batch_ended(self) -> None:
        with self._batch_running:
            self._running = False
            self._batch_running.notify_all()

    def populate_start_offsets(self) -> None:
        committed = self.commit_log.get_latest()
        last_committed = committed[0] if committed is not None else -1
        # (by name, unread: an entry torn by a crash while it was written goes too)
        for batch_id in self.offset_log.batch_ids():
            if batch_id > last_committed:
                log.info("Deleting offsets/%d, a real-time batch that did not commit: it runs again from "
                         "the last committed batch's end", batch_id)
                self.fs.delete(self.offset_log.batch_file(batch_id))
        super().populate_start_offsets()

    def construct_next_batch(self) -> bool:
        if self._ending:
            return False
        self.offset_seq_metadata = OffsetSeqMetadata(
            self.watermarks.watermark_ms, self.clock.get_time_millis(), self.offset_seq_metadata.conf,
            self.offset_seq_metadata.source_metadata_info)
        self.commit_sources_and_purge_logs()
        with self.await_progress:
            self.no_new_data = False
        return True

    def is_new_data_available(self) -> bool:
        return True         # (Spark's: a real-time trigger always runs its batch)

    def run_batch(self) -> None:
        batch_id = self.current_batch_id
        progress = self.progress
        source = self.sources[0]
        start = self.committed_offsets.get(0) or source.initial_offset()
        with progress.time_phase("latestOffset"):
            read = source.real_time_read(start)
            self.latest_offsets[0] = source.report_latest_offset(None)
        with progress.time_phase("queryPlanning"):
            output = self.plan.build({self.relations[0]: self._empty_batch(0)})
            columns, write = self.sink.real_time_writer(output, batch_id, self.id)
            if self._steps is None:
                self._steps = steps_of(columns, self._batch_session)
        spark = self._batch_session
        spark_internals.describe_batch(self.jobs_session(), batch_id=batch_id)
        with self._batch_running:
            self._running = True
        try:
            with progress.time_phase("addBatch"):
                deadline_ms = int(time.time() * 1000) + self.batch_duration_ms
                task = read.task(self._steps, write, deadline_ms, (self.fs.spec(), self._end_marker))
                tasks = len(read.groups)
                results = spark.range(0, tasks, 1, tasks).mapInArrow(task, read.result_schema).collect()
                self.sink.real_time_batch_ended(batch_id, [r["rows"] for r in results])
                crash_points.reached("sink-added")
            end = read.end_offset([json.loads(r["offsets"]) for r in results])
            self.available_offsets = {0: end}
            self._log_and_commit(batch_id, end)
        finally:
            self._batch_ended()
        rows_in = sum(r["rows_in"] for r in results)
        self.sink.last_num_output_rows = sum(r["rows_out"] for r in results)
        source.batch_committed(end)
        samples: dict[str, list] = {name: [] for name in LATENCIES}
        for r in results:
            for name, values in json.loads(r["latencies"]).items():
                samples[name].extend(values)
        self.last_latencies = {name: _percentiles(values) for name, values in samples.items() if values}
        sink = sink_progress(self.sink)
        sink.setdefault("metrics", {}).update(
            {f"{name}.{p}": str(value) for name, table in self.last_latencies.items() for p, value in table.items()})
        self._last_batch_stats = {
            "sources": [source_progress(source, self.trigger_start_offsets.get(0), end, self.latest_offsets.get(0),
                                        rows_in)],
            "sink": sink, "eventTime": None, "stateOperators": [], "observedMetrics": {}}
        with self.await_progress:
            self.await_progress.notify_all()
