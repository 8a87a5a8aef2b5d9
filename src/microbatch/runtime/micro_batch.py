"""MicroBatchExecution: the batch runner and its protocol.

The batch protocol (Spark's, step by step; each step is safe to crash in):

1. populate_start_offsets, once per run. Read the latest ``offsets/N``; the
   committed offsets are those of ``offsets/N-1``. If ``commits/N`` exists,
   batch N is done: continue at N+1. Otherwise re-run batch N with the very
   same offsets and batch metadata (timestamp, watermark, confs) it was planned
   with, and give the sink the same batch id. No batch runs before the checkpoint is
   checked (``runtime.checkpoint_checks``): the logs and the sources as they are read
   here, then, once the run is planned, the stateful operators and their state schemas
   (state Spark's engine wrote adopted first).
2. construct_next_batch. Ask every source for its latest offset within its
   read limit; decide whether to run (new data, or the last execution needs a
   no-data batch). Write ``offsets/N`` atomically and create-if-absent: if it
   exists another run owns this checkpoint and the query fails ("Concurrent
   update to the log"). Then tell the sources that batch N-1 is committed and
   purge log entries older than ``minBatchesToRetain``.
   A crash before the write: nothing happened. After it: step 1 re-runs N.
3. run_batch. ``get_batch(start, end]`` per source, build the batch's DataFrame
   (IncrementalExecution; stateful steps read state version N and commit N+1
   inside the sink's Spark job) -- or, for a stateless query whose sources bind
   their batch at run time, set each source's range as a local property and take
   the DataFrame kept from an earlier batch of the same shape (planned by Spark
   once: ``runtime.kept_plans``) --, ``sink.add_batch(N, df)``, make sure every state
   partition committed, move the watermark from the batch's event times, then
   write ``commits/N`` with the next batch's watermark.
   A crash before ``commits/N``: step 1 re-runs N with the same offsets, so an
   idempotent sink (one that skips a batch id it has) gives exactly-once output,
   and the stateful steps re-commit the same state version N+1.
4. Report progress (what the batch reported, gathered once it committed:
   ``runtime.batch_progress``; written by ``runtime.progress``), post listener events,
   wait for the next trigger.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping

from pyspark.sql import DataFrame, SparkSession

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.commits import CommitLog, CommitMetadata
from microbatch.checkpoint.offsets import (OFFSET_LOG_VERSION_CONF, SOURCE_EVOLUTION_CONF, OffsetSeq,
                                          OffsetSeqLog, OffsetSeqMetadata, to_json)
from microbatch.checkpoint.progress_log import ENABLED_CONF as PROGRESS_LOG_CONF, ProgressLogWriter
from microbatch.errors import CheckpointError, ConcurrentUpdateError
from microbatch.plan.logical import PlanNode, StreamingRelation
from microbatch.runtime.batch_metrics import BatchMetrics
from microbatch.runtime.batch_progress import batch_stats, finish_trigger
from microbatch.runtime.checkpoint_checks import (StateSchemas, check_commits_have_offsets, check_previous_offsets,
                                                  check_repartition_finished, check_source_count,
                                                  check_source_evolution, check_state, torn_last_entry)
from microbatch.runtime.confs import SHUFFLE_PARTITIONS, pin_confs
from microbatch.runtime.engine_scans import EngineScans
from microbatch.runtime.kept_plans import KeptPlans
from microbatch.runtime.scan_filters import with_scan_filters
from microbatch.runtime.incremental import IncrementalExecution, PlannedBatch
from microbatch.runtime.stream_execution import StreamExecution, conf_ms
from microbatch.runtime.triggers import (AvailableNow, MultiBatchExecutor, Once, ProcessingTime,
                                         ProcessingTimeExecutor, RealTime, SingleBatchExecutor, Trigger)
from microbatch.runtime.watermarks import WatermarkTracker
from microbatch.sinks.base import Sink
from microbatch.sources.base import ALL_AVAILABLE, Source, SourceContext
from microbatch.state.store import StateStoreConf
from microbatch.util import conf_bool

log = logging.getLogger(__name__)
#: Spark 4.1's internal conf: adaptive query execution for a stateless query's batches
AQE_STATELESS = "spark.sql.adaptive.streaming.stateless.enabled"


class AvailableNowPin:
    """Spark's AvailableNow wrapper for sources without native support: the first
    latest offset seen is the end of the run."""

    def __init__(self, source: Source):
        self.source = source
        self.end: Any = None
        self.fetched = False

    def latest_offset(self, start: Any) -> Any:
        if not self.fetched:
            self.end = self.source.latest_offset(start, ALL_AVAILABLE)
            self.fetched = True
        return self.end


class MicroBatchExecution(StreamExecution):
    def __init__(self, *, plan: PlanNode, sink: Sink, trigger: Trigger, output_mode: str,
                 read_formats: Mapping[str, Callable[[Any], Any]] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        #: microbatch's own read formats, which each batch's session answers (its state
        #: readers: ``batch_df.sparkSession.read.format("statestore")`` in ``foreachBatch``)
        self.read_formats = dict(read_formats or {})
        self.plan = plan
        self.sink = sink
        self.trigger = trigger
        self.output_mode = output_mode
        self.relations: list[StreamingRelation] = plan.relations()
        #: Each source's id in the checkpoint: its name (``readStream.name``) or its position.
        self.source_ids = [r.user_name or str(i) for i, r in enumerate(self.relations)]
        self.offset_log_version = 1
        self.sources: list[Source] = []
        self.offset_log = OffsetSeqLog(f"{self.checkpoint_root}/offsets", self.fs)
        self.commit_log = CommitLog(f"{self.checkpoint_root}/commits", self.fs)
        #: how each batch ran, for the dashboard and the checkpoint toolkit (off the batch's path)
        self.progress_log = (ProgressLogWriter(self.fs, self.checkpoint_root)
                             if conf_bool(self.spark, PROGRESS_LOG_CONF, True) else None)
        self.current_batch_id = -1
        self.is_current_batch_constructed = False
        self.available_offsets: dict[int, Any] = {}
        self.committed_offsets: dict[int, Any] = {}
        self.latest_offsets: dict[int, Any] = {}
        self.trigger_start_offsets: dict[int, Any] = {}
        self.offset_seq_metadata = OffsetSeqMetadata()
        self._available_now: dict[int, AvailableNowPin] = {}
        self._empty_batches: dict[int, DataFrame] = {}
        self._batch_session: SparkSession | None = None
        #: the run's planner (made once the checkpoint's confs are fixed) and watermark
        self._incremental: IncrementalExecution | None = None
        self.watermarks = WatermarkTracker()
        self._metrics: BatchMetrics | None = None
        self._state_schemas: StateSchemas | None = None
        self._recorded_conf: dict[str, str] = {}     # the confs of the checkpoint's last batch
        self._last_batch_stats: dict | None = None
        self.last_batch_df: DataFrame | None = None
        #: plans kept across batches (runtime.kept_plans)
        self._kept_plans = KeptPlans()
        self._described_batch: int | None = None
        self.stateful = [n for n in plan.nodes() if n.stateful]
        self._requires_another_batch = False
        if isinstance(trigger, ProcessingTime):
            self.trigger_executor = ProcessingTimeExecutor(trigger, self.clock, self.interrupt)
        elif isinstance(trigger, Once):
            self.trigger_executor = SingleBatchExecutor()
        elif isinstance(trigger, AvailableNow):
            self.trigger_executor = MultiBatchExecutor()
        elif isinstance(trigger, RealTime):      # (batches back to back: runtime.real_time)
            self.trigger_executor = ProcessingTimeExecutor(ProcessingTime(0), self.clock, self.interrupt)
        else:
            raise ValueError(f"Unknown type of trigger: {trigger}")

    def start(self) -> None:
        # Batches run on a clone of the user's session, with the confs the checkpoint fixes.
        # It is made when the query starts, as Spark's StreamExecution clones the session in
        # its constructor: a conf the user changes after start() returns is not the query's.
        spark = self.spark
        self._batch_session = spark_internals.with_read_formats(spark_internals.cloned_session(spark),
                                                                self.read_formats)
        # Spark 4.1+ keeps adaptive query execution for a stateless query, under
        # spark.sql.adaptive.enabled and spark.sql.adaptive.streaming.stateless.enabled (an
        # internal conf, true by default); a stateful query's batches run without it
        if self.stateful or not conf_bool(spark, AQE_STATELESS, True):
            self._batch_session.conf.set("spark.sql.adaptive.enabled", "false")
        self._batch_session.conf.set("spark.sql.cbo.enabled", "false")
        spark_internals.arrow_batches_by_rows(self._batch_session)
        super().start()

    def jobs_session(self) -> Any:
        """Classic: the user's session (its SparkContext is the batch session's too);
        Connect: the batch session, whose operations a stop interrupts by tag."""
        if self._batch_session is not None and spark_internals.is_connect(self._batch_session):
            return self._batch_session
        return self.spark

    # -- initialisation (on the stream thread) ------------------------------
    def initialize(self) -> None:
        spark = self._batch_session
        self.min_batches_to_retain = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100"))
        self.polling_delay_ms = conf_ms(spark, "spark.sql.streaming.pollingDelay", 10)
        self.no_data_batches_enabled = spark.conf.get(
            "spark.sql.streaming.noDataMicroBatches.enabled", "true").lower() == "true"
        self._source_evolution = conf_bool(spark, SOURCE_EVOLUTION_CONF, False)
        self._metrics = BatchMetrics(spark, self.sink)
        for relation, source_id in zip(self.relations, self.source_ids):
            context = SourceContext(self._batch_session,
                                    f"{self.checkpoint_root}/sources/{source_id}", self.fs, self.clock)
            if relation.source_instance is not None:
                source = relation.source_instance
            else:
                source = relation.provider.create(context, relation.options, relation.schema)
            log.info("Using Source [%s] named '%s'", source, relation.source_name)
            self.sources.append(source)
        if isinstance(self.trigger, AvailableNow):
            for i, source in enumerate(self.sources):
                if source.supports_available_now:
                    source.prepare_for_trigger_available_now()
                else:
                    self._available_now[i] = AvailableNowPin(source)

    def stop_sources(self) -> None:
        for source in self.sources:
            try:
                source.stop()
            except Exception:
                log.warning("Failed to stop streaming source: %s. Resources may have leaked.",
                            source, exc_info=True)
        try:
            self.sink.stop()
        except Exception:
            log.warning("Failed to stop sink %s", self.sink, exc_info=True)
        if self._metrics is not None:
            self._metrics.close()
        if self.progress_log is not None:
            self.progress_log.close()

    def offsets_description(self) -> tuple[str, str]:
        def show(offsets: dict[int, Any]) -> str:
            return "{" + ",".join(f"{self.sources[i]}: {to_json(o)}" for i, o in sorted(offsets.items())
                                  if i < len(self.sources)) + "}"
        return show(self.committed_offsets), show(self.available_offsets)

    def logical_plan_string(self) -> str:
        return self.plan.tree_string()

    # -- the batch runner ----------------------------------------------------
    def run_activated_stream(self) -> None:
        self.trigger_executor.execute(self._batch_runner)

    def _batch_runner(self) -> bool:
        if not self.is_active:
            return False
        progress = self.progress
        progress.start_trigger()
        executed = False
        with progress.time_phase("triggerExecution"):
            if self.current_batch_id < 0:
                self.populate_start_offsets()
                self._plan_run()
                log.info("Stream started from %s", self.committed_offsets)
            if self._described_batch != self.current_batch_id:  # one JVM call per batch, not per poll
                spark_internals.describe_batch(self.jobs_session(), self.batch_description(self.current_batch_id))
                self._described_batch = self.current_batch_id
            if not self.is_current_batch_constructed:
                self.is_current_batch_constructed = self.construct_next_batch()
            # recordTriggerOffsets: what progress reports as this trigger's range
            self.trigger_start_offsets = dict(self.committed_offsets)
            new_data = self.is_new_data_available()
            progress.update_status(isDataAvailable=new_data)
            if self.is_current_batch_constructed:
                if not self.is_active:
                    return False
                progress.update_status_message(
                    "Processing new data" if new_data else "No new data but cleaning up state")
                self.run_batch()
                executed = True
            else:
                progress.update_status_message("Waiting for data to arrive")
        self._finish_trigger(executed)
        if self.is_current_batch_constructed:
            self.current_batch_id += 1
            self.is_current_batch_constructed = False
        elif isinstance(self.trigger, AvailableNow):
            log.info("Finished processing all available data for the trigger, terminating "
                     "this Trigger.AvailableNow query")
            return False
        elif not isinstance(self.trigger, Once):
            self.interrupt.wait(self.polling_delay_ms / 1000.0)
        progress.update_status_message("Waiting for next trigger")
        return self.is_active

    def _finish_trigger(self, executed: bool) -> None:
        kind, payload = finish_trigger(self.progress, executed, self.current_batch_id, self._last_batch_stats)
        self._last_batch_stats = None
        if kind == "progress":
            if self.progress_log is not None:
                self.progress_log.add(self.current_batch_id, payload[0].json, self.explain_string())
            self.sink.report_progress(payload[0])
        self.report(kind, payload)

    # -- step 1 --------------------------------------------------------------
    def populate_start_offsets(self) -> None:
        try:
            latest = self.offset_log.get_latest()
        except CheckpointError as e:
            raise torn_last_entry(e, self.offset_log, self.commit_log, self.fs) from None
        check_commits_have_offsets(self.commit_log, None if latest is None else latest[0], self.checkpoint_root)
        if latest is None:
            log.info("Starting new streaming query.")
            self.current_batch_id = 0
            configured = int(self._batch_session.conf.get(OFFSET_LOG_VERSION_CONF, "1"))
            self.offset_log_version = max(configured, 2 if self._source_evolution else 1)
            self.offset_seq_metadata = OffsetSeqMetadata(
                0, 0, self._pin_confs(None), {} if self.offset_log_version == 2 else None)
            return
        latest_batch_id, next_offsets = latest
        self.offset_log_version = next_offsets.version
        check_source_evolution(self.offset_log_version, self._source_evolution)
        check_source_count(next_offsets, latest_batch_id, len(self.sources), self.checkpoint_root)
        self.current_batch_id = latest_batch_id
        self.is_current_batch_constructed = True
        self.available_offsets = self._to_progress(next_offsets)
        if latest_batch_id != 0:
            previous = self.offset_log.get(latest_batch_id - 1)
            check_previous_offsets(previous, latest_batch_id, self.offset_log, len(self.sources),
                                   self.checkpoint_root)
            self.committed_offsets = self._to_progress(previous)
        recorded = next_offsets.metadata
        self.offset_seq_metadata = OffsetSeqMetadata(
            recorded.batch_watermark_ms, recorded.batch_timestamp_ms, self._pin_confs(recorded.conf),
            recorded.source_metadata_info)
        latest_commit = self.commit_log.get_latest()
        if latest_batch_id != 0:
            check_repartition_finished(latest_batch_id, latest_commit, recorded.conf, previous.metadata.conf)
        committed_next_ms = None     # (the watermark batch N's commit gives N+1, when N was committed)
        if latest_commit is None:
            log.info("no commit log present")
        else:
            committed_batch_id, commit_metadata = latest_commit
            if committed_batch_id == latest_batch_id:
                self.current_batch_id = committed_batch_id + 1
                self.is_current_batch_constructed = False
                self.committed_offsets.update(self.available_offsets)
                committed_next_ms = commit_metadata.next_batch_watermark_ms
            elif committed_batch_id < latest_batch_id - 1:
                log.warning("Batch completion log latest batch id is %d, which is not trailing "
                            "batchid %d by one", committed_batch_id, latest_batch_id)
        # (the watermark batch N-1 ran with: rows behind it are late in N)
        self.watermarks.restore(recorded.batch_watermark_ms,
                                previous.metadata.batch_watermark_ms if latest_batch_id != 0 else None,
                                committed_next_ms)
        log.info("Resuming at batch %d with committed offsets %s and available offsets %s",
                 self.current_batch_id, self.committed_offsets, self.available_offsets)
        if latest_commit is not None:
            for i, end in self.committed_offsets.items():
                self.sources[i].batch_committed(end)

    def _pin_confs(self, recorded: dict[str, str] | None) -> dict[str, str]:
        self._recorded_conf = dict(recorded or {})
        return pin_confs(self._batch_session.conf, recorded, bool(self.stateful), self.fs, self.checkpoint_root)

    def _plan_run(self) -> None:
        """The run's planner, once the checkpoint's confs are fixed (populate_start_offsets)."""
        conf = self._batch_session.conf
        # (the batches' jobs run on this thread: their tasks read the batch session's confs)
        spark_internals.jobs_see_session_confs(self._batch_session)
        empty_inputs = {r: self._empty_batch(i) for i, r in enumerate(self.relations)}
        store_conf = dataclasses.replace(StateStoreConf.from_session(self._batch_session),
                                         run_id=self.run_id, storage=self.fs.spec())
        # (the filters Spark's engine gives the file sources' scans: runtime.scan_filters)
        plan = with_scan_filters(self._batch_session, self.plan, empty_inputs)
        # (how many times Spark's engine scans a source read in two places: runtime.engine_scans)
        self._metrics.engine_scans = EngineScans(self.plan, self.relations, empty_inputs)
        self._incremental = planner = IncrementalExecution(
            self._batch_session, plan, checkpoint_root=self.checkpoint_root,
            shuffle_partitions=int(self.offset_seq_metadata.conf[SHUFFLE_PARTITIONS]), output_mode=self.output_mode,
            empty_inputs=empty_inputs, store_conf=store_conf,
            hidden_carriers={r: s for r, s in zip(self.relations, self.sources) if not s.batches_expose_hidden_columns()})
        self.stateful = [op.node for op in planner.operators]
        self._kept_plans.decide(planner.keeps_batch_plan, self.sink, self._batch_session)
        # (the policy is one of the checkpoint's confs: read once they are pinned)
        self.watermarks.plan(planner.plan, planner.watermark_nodes, self.stateful,
                             conf.get("spark.sql.streaming.multipleWatermarkPolicy", "min"))
        # (the state against the operators; Spark's state adopted: runtime.checkpoint_checks)
        self._state_schemas = check_state(self.fs, self.checkpoint_root, planner.operators, empty_inputs,
                                          self.current_batch_id, recorded_conf=self._recorded_conf,
                                          store_conf=store_conf, conf=conf)

    def explain_string(self) -> str:
        """The run's plan with each stateful operator's state info; before the run is
        planned, the query's plan."""
        if self._incremental is None:
            return self.plan.tree_string()
        return self._incremental.explain_string(self.run_id, self.current_batch_id)

    def _to_progress(self, seq: OffsetSeq) -> dict[int, Any]:
        """Offsets by source index: by position (version 1) or by source id (version 2)."""
        if seq.version < 2:
            return {i: o for i, o in enumerate(seq.offsets) if o is not None}
        index = {source_id: i for i, source_id in enumerate(self.source_ids)}
        progress = {}
        for source_id, offset in seq.by_source_id().items():
            if source_id not in index:
                log.warning("Source with name '%s' found in checkpoint but not in current query",
                            source_id)
            elif offset is not None:
                progress[index[source_id]] = offset
        return progress

    # -- step 2 --------------------------------------------------------------
    def _latest_offset(self, i: int, source: Source) -> Any:
        start = self.available_offsets.get(i)
        if start is None:
            start = source.initial_offset()
        if i in self._available_now:
            return self._available_now[i].latest_offset(start)
        limit = ALL_AVAILABLE if isinstance(self.trigger, Once) else source.default_read_limit()
        return source.latest_offset(start, limit)

    def construct_next_batch(self) -> bool:
        progress = self.progress
        with progress.time_phase("latestOffset"):
            for i, source in enumerate(self.sources):
                progress.update_status_message(f"Getting offsets from {source}")
                latest = self._latest_offset(i, source)
                self.latest_offsets[i] = source.report_latest_offset(latest)
                if latest is not None:
                    self.available_offsets[i] = latest
        self.offset_seq_metadata = OffsetSeqMetadata(
            self.watermarks.watermark_ms, self.clock.get_time_millis(), self.offset_seq_metadata.conf,
            self.offset_seq_metadata.source_metadata_info)
        last_execution_requires_another = self._requires_another_batch
        new_data = self.is_new_data_available()
        should_construct = new_data or (self.no_data_batches_enabled and last_execution_requires_another)
        log.debug("noDataBatchesEnabled = %s, lastExecutionRequiresAnotherBatch = %s, "
                  "isNewDataAvailable = %s, shouldConstructNextBatch = %s",
                  self.no_data_batches_enabled, last_execution_requires_another, new_data,
                  should_construct)
        if not should_construct:
            with self.await_progress:
                self.no_new_data = True
                self.await_progress.notify_all()
            return False
        progress.update_status_message("Writing offsets to log")
        with progress.time_phase("walCommit"):
            if self.offset_log_version >= 2:   # the sources that have an offset, by id
                seq = OffsetSeq(list(self.available_offsets.values()), self.offset_seq_metadata,
                                [self.source_ids[i] for i in self.available_offsets])
            else:
                seq = OffsetSeq([self.available_offsets.get(i) for i in range(len(self.sources))],
                                self.offset_seq_metadata)
            self.lease.check()
            if not self.offset_log.add(self.current_batch_id, seq):
                raise ConcurrentUpdateError(
                    "Concurrent update to the log. Multiple streaming jobs detected for "
                    f"{self.current_batch_id}. Another run of this query owns the checkpoint "
                    f"'{self.checkpoint_root}'; stop it, or give this query its own checkpoint.")
            crash_points.reached("offsets-written")
            log.info("Committed offsets for batch %d. Metadata %s", self.current_batch_id,
                     self.offset_seq_metadata.json())
            self.commit_sources_and_purge_logs()
        with self.await_progress:
            self.no_new_data = False
        return True

    def commit_sources_and_purge_logs(self) -> None:
        """Tell the sources batch N-1 is committed (what they may drop), and purge log
        entries older than ``minBatchesToRetain``."""
        if self.current_batch_id != 0:
            for i, source in enumerate(self.sources):
                if i in self.committed_offsets:
                    source.commit(self.committed_offsets[i])
        if self.min_batches_to_retain < self.current_batch_id:
            threshold = self.current_batch_id - self.min_batches_to_retain
            self.offset_log.purge(threshold)
            self.commit_log.purge(threshold)
            if self.progress_log is not None:
                self.progress_log.purge(threshold)
            crash_points.reached("logs-purged")

    def is_new_data_available(self) -> bool:
        return any(self.committed_offsets.get(i) != offset
                   for i, offset in self.available_offsets.items())

    # -- step 3 --------------------------------------------------------------
    def _empty_batch(self, i: int) -> DataFrame:
        if i not in self._empty_batches:
            self._empty_batches[i] = self.relations[i].empty_batch(self._batch_session)
        return self._empty_batches[i]

    def run_batch(self) -> None:
        batch_id = self.current_batch_id
        progress = self.progress
        metrics = self._metrics
        log.debug("Running batch %d", batch_id)
        inputs: dict[StreamingRelation, DataFrame] = {}
        metrics.start_batch()
        self.watermarks.begin_batch(self.offset_seq_metadata.batch_watermark_ms)
        with progress.time_phase("getBatch"):
            bound = self._kept_plans.bound_batches(self.sources, self.available_offsets, self.committed_offsets)
            kept = self._kept_plans.kept(bound) if bound is not None else None
            for i, (relation, source) in enumerate(zip(self.relations, self.sources)):
                end = self.available_offsets.get(i)
                start = self.committed_offsets.get(i)
                if bound is not None:
                    spark_internals.set_local_property(self.jobs_session(), bound[i].key, bound[i].value)
                    metrics.input_counted_by(i, bound[i].rows)
                    if kept is None:
                        inputs[relation] = bound[i].frame()
                    crash_points.reached("source-get-batch")
                    continue
                if end is None or end == start:
                    inputs[relation] = self._empty_batch(i)
                    metrics.no_input(i)
                    continue
                if start is None:
                    start = source.initial_offset()
                log.debug("Retrieving data from %s: %s -> %s", source, start, end)
                df = source.get_batch(start, end)
                crash_points.reached("source-get-batch")
                inputs[relation] = metrics.input(i, source, start, end, df)
            metrics.kept_plan = kept is not None
        with progress.time_phase("queryPlanning"):
            if kept is not None:
                planned = dataclasses.replace(kept, batch_id=batch_id)
            else:
                planned = self._incremental.batch(inputs, batch_id, self.offset_seq_metadata.batch_timestamp_ms,
                                                  self.watermarks)
                if bound is not None:
                    self._kept_plans.keep(bound, planned)
            self.last_batch_df = metrics.batch_df = batch_df = planned.df
        if self.stateful and not self._state_schemas.written:
            self._state_schemas.write()
        spark_internals.describe_batch(self.jobs_session(), batch_id=batch_id)
        metrics.sink_starts()
        with progress.time_phase("addBatch"):
            self.sink.last_num_output_rows = -1
            self.sink.add_batch(batch_id, batch_df)
            if self.stateful:
                self._complete_state_commits(planned)
            crash_points.reached("sink-added")
        metrics.sink_ended()
        rows = [metrics.input_rows(i) for i in range(len(self.sources))]
        event_time = self.watermarks.advance(
            planned.watermark_observations, planned.reported_statistics, metrics.observed,
            lambda op: self._incremental.operators[op].metrics.value)
        self._requires_another_batch = self.watermarks.requires_another_batch(self.output_mode)
        with progress.time_phase("commitOffsets"):
            self.lease.check()
            if not self.commit_log.add(batch_id, CommitMetadata(self.watermarks.watermark_ms)):
                raise ConcurrentUpdateError(
                    "Concurrent update to the log. Multiple streaming jobs detected for "
                    f"{batch_id} (commits/{batch_id} already exists). Another run of this query "
                    f"owns the checkpoint '{self.checkpoint_root}'.")
            crash_points.reached("commit-written")
        self.committed_offsets.update(self.available_offsets)
        for i, end in self.available_offsets.items():
            self.sources[i].batch_committed(end)
        self._last_batch_stats = batch_stats(
            self.sources, self.sink, rows, start_offsets=self.trigger_start_offsets,
            end_offsets=self.available_offsets, latest_offsets=self.latest_offsets, event_time=event_time,
            planner=self._incremental, planned=planned, metrics=metrics)
        log.debug("Completed batch %d", batch_id)
        with self.await_progress:
            self.await_progress.notify_all()

    def _complete_state_commits(self, planned: PlannedBatch) -> None:
        """Every state partition must commit version N+1, even if the sink read only part
        of the batch (``take``) or none of it; run the batch to the end if not."""
        if self._incremental.every_partition_committed():
            return
        log.info("The sink did not run every state partition of batch %d; running the batch "
                 "to the end to commit its state", planned.batch_id)
        self._incremental.reset_metrics()
        planned.df.write.format("noop").mode("append").save()
