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
3. run_batch: each source's ``real_time_read`` from its last committed end (a new
   partition from its earliest offset); one Spark job whose tasks (at most the cluster's
   cores, shared among the sources of a union: every task of the batch runs at once)
   read, evaluate the branches of the query that read their source and write through
   the sink's ``real_time_writer`` until start + duration, then flush and answer the
   offsets they reached and the latencies they saw.
4. ``offsets/N`` gets each source's merged end offsets (create-if-absent), then
   ``commits/N``; the sources hear the batch committed; progress reports the batch with
   the latency percentiles in the sink's ``metrics``.

A crash before ``commits/N`` runs batch N again from N-1's end: the sink gets those
records again (at least once, as Spark's), or skips the ones it has with the Kafka
sink's ``microbatch.exactlyOnce``.

``check_real_time_query`` holds Spark's rules for the mode, checked at start: the Kafka
source only, the sinks of Spark's allowlist (Kafka, foreach, console: its rows shown at the batch's end), Update
output mode, no stateful operator, no asynchronous progress tracking, a duration of at
least ``spark.sql.streaming.realTimeMode.minBatchDuration``; and microbatch's: steps its
tasks evaluate (``plan.arrow_steps.NotEvaluable`` named), no union into the Kafka sink's
``microbatch.exactlyOnce``.
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
from microbatch.kafka.sink import EXACTLY_ONCE_OPTION
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
    unions = [n for n in plan.nodes() if len(n.children) > 1]
    if unions and fmt == "kafka" and options.get(EXACTLY_ONCE_OPTION, "false").lower() == "true":
        raise UnsupportedOperationError(
            f"The Kafka sink's {EXACTLY_ONCE_OPTION} does not take a union in real-time mode in microbatch: "
            "its records' ids are their input positions, which a union's branches share. Write each "
            "source with a query of its own, or leave the option out (at least once, as Spark's).")


def steps_of(df: Any, spark: Any, source: list[bool] | None = None) -> ArrowSteps:
    """The steps from the source's columns to ``df``'s, as the tasks evaluate them
    (``source``: where ``df`` reads several relations, whether each, in plan order, is
    the tasks' source; ``compile_steps``)."""
    try:
        return compile_steps(spark_internals.plan_json(df),
                             ansi=conf_bool(spark, "spark.sql.ansi.enabled", spark_internals.running_version().at_least_4),
                             zone=spark.conf.get("spark.sql.session.timeZone"), source=source)
    except NotEvaluable as e:
        raise UnsupportedOperationError(
            f"microbatch's real-time mode evaluates the query's steps in its Kafka tasks, and does not "
            f"evaluate {e} there yet (plan.arrow_steps lists what it does). Rewrite the step, or use a "
            "processingTime trigger.") from None


class _UnionTasks:
    """The ``mapInArrow`` function of a real-time batch of several sources (a union): task
    index ``i`` runs the task of the source whose tasks it is among (``tasks``: each
    source's task function and its number of tasks, in order), with its index there."""

    def __init__(self, tasks: tuple):
        self.tasks = tasks

    def __call__(self, batches):
        import pyarrow as pa
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for task, count in self.tasks:
                    if index < count:
                        yield from task(iter([pa.record_batch([pa.array([index], pa.int64())], names=["id"])]))
                        break
                    index -= count


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
    def _log_and_commit(self, batch_id: int, ends: list) -> None:
        """``offsets/N`` with the ends the tasks reached (one a source), then ``commits/N``
        (step 4)."""
        progress = self.progress
        with progress.time_phase("walCommit"):
            self.lease.check()
            seq = OffsetSeq(ends, self.offset_seq_metadata,       # (version 2: by the sources' ids)
                            list(self.source_ids[:len(ends)]) if self.offset_log_version >= 2 else None)
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
        spark = self._batch_session
        count = len(self.sources)
        # (a union of sources: the cores shared among them, every task of the batch at once)
        share = None if count == 1 else max(1, spark_internals.default_parallelism(spark) // count)
        with progress.time_phase("latestOffset"):
            reads = []
            for i, source in enumerate(self.sources):
                reads.append(source.real_time_read(self.committed_offsets.get(i) or source.initial_offset(), share))
                self.latest_offsets[i] = source.report_latest_offset(None)
        with progress.time_phase("queryPlanning"):
            empties = [self._empty_batch(i) for i in range(count)]
            output = self.plan.build(dict(zip(self.relations, empties)))
            columns, write = self.sink.real_time_writer(output, batch_id, self.id)
            if self._steps is None:
                # (the plan's leaves in pre-order, a read each: which source each is)
                leaves = [self.relations.index(n) if n in self.relations else -1
                          for n in self.plan.nodes() if not n.children]
                self._steps = [steps_of(columns, spark, [r == i for r in leaves] if count > 1 else None)
                               for i in range(count)]
        spark_internals.describe_batch(self.jobs_session(), batch_id=batch_id)
        with self._batch_running:
            self._running = True
        try:
            with progress.time_phase("addBatch"):
                deadline_ms = int(time.time() * 1000) + self.batch_duration_ms
                marker = (self.fs.spec(), self._end_marker)
                sizes = [len(read.groups) for read in reads]
                tasks = [read.task(steps, write, deadline_ms, marker) for read, steps in zip(reads, self._steps)]
                job = tasks[0] if count == 1 else _UnionTasks(tuple(zip(tasks, sizes)))
                total = sum(sizes)
                results = sorted(spark.range(0, total, 1, total).mapInArrow(job, reads[0].result_schema).collect(),
                                 key=lambda r: r["task"])
                self.sink.real_time_batch_ended(batch_id, [r["rows"] for r in results])
                crash_points.reached("sink-added")
            per_source, at = [], 0
            for size in sizes:
                per_source.append(results[at:at + size])
                at += size
            ends = [read.end_offset([json.loads(r["offsets"]) for r in part]) for read, part in zip(reads, per_source)]
            self.available_offsets = dict(enumerate(ends))
            self._log_and_commit(batch_id, ends)
        finally:
            self._batch_ended()
        self.sink.last_num_output_rows = sum(r["rows_out"] for r in results)
        for source, end in zip(self.sources, ends):
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
            "sources": [source_progress(source, self.trigger_start_offsets.get(i), end, self.latest_offsets.get(i),
                                        sum(r["rows_in"] for r in part))
                        for i, (source, end, part) in enumerate(zip(self.sources, ends, per_source))],
            "sink": sink, "eventTime": None, "stateOperators": [], "observedMetrics": {}}
        with self.await_progress:
            self.await_progress.notify_all()
