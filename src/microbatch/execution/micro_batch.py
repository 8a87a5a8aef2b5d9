"""MicroBatchExecution: the batch runner and its protocol.

The batch protocol (Spark's, step by step; each step is safe to crash in):

1. populate_start_offsets, once per run. Read the latest ``offsets/N``; the
   committed offsets are those of ``offsets/N-1``. If ``commits/N`` exists,
   batch N is done: continue at N+1. Otherwise re-run batch N with the very
   same offsets and batch metadata (timestamp, watermark, confs) it was planned
   with, and give the sink the same batch id.
2. construct_next_batch. Ask every source for its latest offset within its
   read limit; decide whether to run (new data, or the last execution needs a
   no-data batch). Write ``offsets/N`` atomically and create-if-absent: if it
   exists another run owns this checkpoint and the query fails ("Concurrent
   update to the log"). Then tell the sources that batch N-1 is committed and
   purge log entries older than ``minBatchesToRetain``.
   A crash before the write: nothing happened. After it: step 1 re-runs N.
3. run_batch. ``get_batch(start, end]`` per source, build the batch's DataFrame
   (IncrementalExecution; stateful steps read state version N and commit N+1
   inside the sink's Spark job), ``sink.add_batch(N, df)``, make sure every state
   partition committed, move the watermark from the batch's event times, then
   write ``commits/N`` with the next batch's watermark.
   A crash before ``commits/N``: step 1 re-runs N with the same offsets, so an
   idempotent sink (one that skips a batch id it has) gives exactly-once output,
   and the stateful steps re-commit the same state version N+1.
4. Report progress, post listener events, wait for the next trigger.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from microbatch import crash_points, spark_internals
from microbatch.checkpoint.commits import CommitLog, CommitMetadata
from microbatch.checkpoint.offsets import (OFFSET_LOG_VERSION_CONF, SOURCE_EVOLUTION_CONF, OffsetSeq,
                                          OffsetSeqLog, OffsetSeqMetadata, to_json)
from microbatch.checkpoint.progress_log import ENABLED_CONF as PROGRESS_LOG_CONF, ProgressLogWriter
from microbatch.errors import CheckpointError, ConcurrentUpdateError
from microbatch.execution.stateful import (BatchContext, DictSum, aggregated_event_time,
                                           committed_partitions, state_operator_progress,
                                           stateful_nodes, stats_in_operator, watermark_nodes)
from microbatch.execution.progress import format_timestamp
from microbatch.execution.stream_execution import StreamExecution, conf_ms
from microbatch.execution.triggers import (AvailableNow, MultiBatchExecutor, Once,
                                           ProcessingTime, ProcessingTimeExecutor,
                                           SingleBatchExecutor, Trigger)
from microbatch.plan.incremental import IncrementalExecution, operator_name
from microbatch.plan.logical import (Observe, PlanNode, StatefulNode, StreamingRelation, StreamJoin,
                                     TransformWithState)
from microbatch.sinks.base import READS_RDD, READS_SQL, Sink
from microbatch.sources.base import ALL_AVAILABLE, Source, SourceContext
from microbatch.state.store import (DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, SAME_FILES_PROVIDERS,
                                    SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER, StateStoreConf,
                                    provider_class, provider_name)
from microbatch.util import conf_bool

log = logging.getLogger(__name__)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
#: The confs a checkpoint fixes, with the values Spark 4.3 records for a new query.
#: They are written to every ``offsets/N`` and restored from it on restart.
CHECKPOINTED_CONFS = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "spark.sql.dropDuplicates.deterministicKeyOrder.enabled": "true",
    "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion": "2",
    "spark.sql.streaming.stateStore.rocksdb.formatVersion": "5",
    "spark.sql.streaming.queryEvolution.enableSourceEvolution": "false",
    "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
    "spark.sql.streaming.statefulOperator.useStrictDistribution": "true",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion": "2",
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.streaming.stateStore.rowChecksum.enabled": "false",
    "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled": "true",
    "spark.sql.streaming.aggregation.stateFormatVersion": "2",
    "spark.sql.function.protobufExtensions.enabled": "false",
    "spark.sql.shuffle.partitions": "200",
    "spark.sql.streaming.join.stateFormatVersion": "2",
    "spark.sql.streaming.stateStore.compression.codec": "lz4",
    "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan": "false",
}


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
                 **kwargs: Any):
        super().__init__(**kwargs)
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
        self.watermark_ms = 0
        self._available_now: dict[int, AvailableNowPin] = {}
        self._empty_batches: dict[int, DataFrame] = {}
        self._scan_counter: spark_internals.ScanRowCounter | None = None
        self._scan_counting_failed = False
        self._batch_columns: dict = {}   # Column objects of the stateful steps, for the run
        self._batch_session: SparkSession | None = None
        self._incremental: IncrementalExecution | None = None
        self._last_batch_stats: dict | None = None
        self.last_batch_df: DataFrame | None = None
        self._described_batch: int | None = None
        self.stateful = stateful_nodes(plan)
        self.watermark_nodes = watermark_nodes(plan)
        self.observes = any(isinstance(n, Observe) for n in plan.nodes())
        self._operator_watermarks: dict[int, int] = {}
        self._prev_batch_watermark_ms = 0
        self._requires_another_batch = False
        self._state_metrics: dict[int, Any] = {}
        self._state_schemas_written = False
        self._evolved_state_schemas: dict[str, str] = {}   # schema file -> the evolved schema document
        self._store_conf: StateStoreConf | None = None
        if isinstance(trigger, ProcessingTime):
            self.trigger_executor = ProcessingTimeExecutor(trigger, self.clock, self.interrupt)
        elif isinstance(trigger, Once):
            self.trigger_executor = SingleBatchExecutor()
        elif isinstance(trigger, AvailableNow):
            self.trigger_executor = MultiBatchExecutor()
        else:
            raise ValueError(f"Unknown type of trigger: {trigger}")

    def start(self) -> None:
        # Batches run on a clone of the user's session, with the confs the checkpoint fixes.
        # It is made when the query starts, as Spark's StreamExecution clones the session in
        # its constructor: a conf the user changes after start() returns is not the query's.
        spark = self.spark
        self._batch_session = spark_internals.cloned_session(spark)
        self._batch_session.conf.set("spark.sql.adaptive.enabled", "false")
        self._batch_session.conf.set("spark.sql.cbo.enabled", "false")
        super().start()

    # -- initialisation (on the stream thread) ------------------------------
    def initialize(self) -> None:
        spark = self._batch_session
        self.min_batches_to_retain = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100"))
        self.polling_delay_ms = conf_ms(spark, "spark.sql.streaming.pollingDelay", 10)
        self.no_data_batches_enabled = spark.conf.get(
            "spark.sql.streaming.noDataMicroBatches.enabled", "true").lower() == "true"
        self._source_evolution = conf_bool(spark, SOURCE_EVOLUTION_CONF, False)
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

    def _state_provider(self, written: str | None, asked: str | None) -> str:
        """The state store provider of this run: the one the checkpoint's state was written
        with, or for a checkpoint without state the one the session asks for (by default
        microbatch's). microbatch's map and RocksDB providers read each other's files, so a
        run may move from one to the other; any other change of provider is refused,
        naming both."""
        has_state = written is not None and self.fs.exists(f"{self.checkpoint_root}/state")
        if has_state and written in (SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER):
            raise CheckpointError(
                f"The state in checkpoint '{self.checkpoint_root}' was written by the state "
                f"store provider {written} (Spark's own engine), whose files microbatch "
                "cannot read. Start this stateful query with a new checkpoint location.")
        if has_state:
            if asked is not None and {provider_name(asked), written} <= SAME_FILES_PROVIDERS:
                return provider_name(asked)     # microbatch's two providers write the same files
            if asked is not None and provider_name(asked) != written:
                raise CheckpointError(
                    f"The state in checkpoint '{self.checkpoint_root}' was written by the state "
                    f"store provider {written}, but {PROVIDER_CLASS_CONF} is {asked}: one provider "
                    f"does not read another's state. Unset the conf (or set it to {written}), or "
                    "start the query with a new checkpoint location.")
            provider_class(written)   # importable here, or a clear error before any batch
            return written
        chosen = provider_name(asked or DEFAULT_PROVIDER)
        provider_class(chosen)
        return chosen

    def _fix_confs(self, recorded: dict[str, str] | None) -> dict[str, str]:
        """Apply the confs recorded in the checkpoint to the batch session; return the set."""
        conf = self._batch_session.conf
        fixed = {}
        for key, default in CHECKPOINTED_CONFS.items():
            session_value = conf.get(key, default)
            if key == PROVIDER_CLASS_CONF and self.stateful:
                chosen = self._state_provider((recorded or {}).get(key), conf.get(key, None))
                conf.set(key, chosen)
                fixed[key] = chosen
                continue
            if recorded is not None and key in recorded:
                value = recorded[key]
                if value != session_value:
                    log.warning("Updating the value of conf '%s' in current session from '%s' "
                                "to '%s'.", key, session_value, value)
                    conf.set(key, value)
            else:
                value = session_value
            fixed[key] = value
        return fixed

    def stop_sources(self) -> None:
        for source in self.sources:
            try:
                source.stop()
            except Exception:  # noqa: BLE001
                log.warning("Failed to stop streaming source: %s. Resources may have leaked.",
                            source, exc_info=True)
        try:
            self.sink.stop()
        except Exception:  # noqa: BLE001
            log.warning("Failed to stop sink %s", self.sink, exc_info=True)
        if self._scan_counter is not None:
            self._scan_counter.close()
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
                self.spark.sparkContext.setJobDescription(self.batch_description(self.current_batch_id))
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
        stats = self._last_batch_stats if executed and self._last_batch_stats else {}
        kind, payload = self.progress.finish_trigger(
            executed, self.current_batch_id, stats.get("sources", []), stats.get("sink", {}),
            event_time=stats.get("eventTime"), state_operators=stats.get("stateOperators"),
            observed_metrics=stats.get("observedMetrics"))
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
            raise self._torn_last_entry(e) from None
        self._check_commits_have_offsets(None if latest is None else latest[0])
        if latest is None:
            log.info("Starting new streaming query.")
            self.current_batch_id = 0
            configured = int(self._batch_session.conf.get(OFFSET_LOG_VERSION_CONF, "1"))
            self.offset_log_version = max(configured, 2 if self._source_evolution else 1)
            self.offset_seq_metadata = OffsetSeqMetadata(
                0, 0, self._fix_confs(None), {} if self.offset_log_version == 2 else None)
            return
        latest_batch_id, next_offsets = latest
        self.offset_log_version = next_offsets.version
        if self.offset_log_version < 2 and self._source_evolution:
            raise spark_internals.spark_error(
                "AnalysisException", "STREAMING_QUERY_EVOLUTION_ERROR.CANNOT_ENABLE_ON_EXISTING_CHECKPOINT",
                existingVersion=self.offset_log_version)
        self._check_source_count(next_offsets, latest_batch_id)
        self.current_batch_id = latest_batch_id
        self.is_current_batch_constructed = True
        self.available_offsets = self._to_progress(next_offsets)
        if latest_batch_id != 0:
            previous = self.offset_log.get(latest_batch_id - 1)
            if previous is None:
                raise CheckpointError(
                    f"batch {latest_batch_id - 1} doesn't exist: the offset log "
                    f"'{self.offset_log.path}' has batch {latest_batch_id} but not the one "
                    "before it. Restore the missing file or use a new checkpoint location.")
            self._check_source_count(previous, latest_batch_id - 1)
            self.committed_offsets = self._to_progress(previous)
        recorded = next_offsets.metadata
        self.offset_seq_metadata = OffsetSeqMetadata(
            recorded.batch_watermark_ms, recorded.batch_timestamp_ms, self._fix_confs(recorded.conf),
            recorded.source_metadata_info)
        self.watermark_ms = recorded.batch_watermark_ms
        if latest_batch_id != 0:  # the watermark batch N-1 ran with: rows behind it are late in N
            self._prev_batch_watermark_ms = previous.metadata.batch_watermark_ms
        latest_commit = self.commit_log.get_latest()
        if (latest_batch_id != 0 and (latest_commit is None or latest_commit[0] < latest_batch_id)
                and recorded.conf.get(SHUFFLE_PARTITIONS) != previous.metadata.conf.get(SHUFFLE_PARTITIONS)):
            # a state repartition (ops/repartition.py) planned this batch and did not finish
            raise spark_internals.spark_error(
                "SparkRuntimeException", "STREAMING_UNFINISHED_REPARTITION_DETECTED",
                batchId=latest_batch_id, lastCommittedBatchId=-1 if latest_commit is None else latest_commit[0])
        if latest_commit is None:
            log.info("no commit log present")
        else:
            committed_batch_id, commit_metadata = latest_commit
            if committed_batch_id == latest_batch_id:
                self.current_batch_id = committed_batch_id + 1
                self.is_current_batch_constructed = False
                self._prev_batch_watermark_ms = recorded.batch_watermark_ms
                self.committed_offsets.update(self.available_offsets)
                self.watermark_ms = max(self.watermark_ms, commit_metadata.next_batch_watermark_ms)
            elif committed_batch_id < latest_batch_id - 1:
                log.warning("Batch completion log latest batch id is %d, which is not trailing "
                            "batchid %d by one", committed_batch_id, latest_batch_id)
        log.info("Resuming at batch %d with committed offsets %s and available offsets %s",
                 self.current_batch_id, self.committed_offsets, self.available_offsets)

    def _torn_last_entry(self, error: CheckpointError) -> CheckpointError:
        """A damaged last ``offsets/N`` that was never committed: a crash while writing it
        (on a store without atomic writes) or damage. No later batch depends on it, so
        deleting it is safe unless the sink already holds batch N; say so, with the command."""
        ids = self.offset_log.batch_ids()
        last = ids[-1] if ids else None
        path = self.offset_log.batch_file(last) if last is not None else None
        if path is None or path not in str(error) or self.fs.exists(self.commit_log.batch_file(last)):
            return error
        return CheckpointError(
            f"{error} It is the last offsets entry and batch {last} was never committed "
            f"(no {self.commit_log.batch_file(last)}), so no other batch depends on it. If the "
            f"sink did not record batch {last} (the file sink: no _spark_metadata/{last} in its "
            "output; foreachBatch: your table), deleting it is safe and the restart plans "
            f"batch {last} again: rm '{path}'")

    def _check_commits_have_offsets(self, latest_offsets_id: int | None) -> None:
        """A commit names a batch the offset log planned. ``commits/N`` beyond the last
        ``offsets/N`` means the offset log lost entries (a restore, a hand edit): the
        engine would re-run a committed batch. Refuse before anything runs."""
        orphans = [b for b in self.commit_log.batch_ids()
                   if latest_offsets_id is None or b > latest_offsets_id]
        if not orphans:
            return
        files = ", ".join(self.commit_log.batch_file(b) for b in orphans)
        has = (f"its last is offsets/{latest_offsets_id}" if latest_offsets_id is not None
               else "it is empty")
        raise CheckpointError(
            f"The checkpoint '{self.checkpoint_root}' is inconsistent: {files} record(s) batch(es) "
            f"{', '.join(map(str, orphans))} as committed, but the offset log has no entry for "
            f"them ({has}). Nothing was run. Restore the missing offsets file(s) from a backup; "
            "or, if those batches must be planned again, delete the listed commit file(s) "
            "(their output may then be written again by a sink that is not idempotent).")

    def _plan_run(self) -> None:
        """The run's planner, once the checkpoint's confs are fixed (populate_start_offsets)."""
        self._incremental = IncrementalExecution(
            self._batch_session, self.plan, checkpoint_root=self.checkpoint_root,
            shuffle_partitions=int(self._batch_session.conf.get("spark.sql.shuffle.partitions")),
            output_mode=self.output_mode,
            empty_inputs={r: self._empty_batch(i) for i, r in enumerate(self.relations)})
        self.stateful = [op.node for op in self._incremental.operators]
        sc = self.spark.sparkContext
        self._state_metrics = {op.id: sc.accumulator({}, DictSum()) for op in self._incremental.operators}
        self._check_state_operators()
        self._check_state_schemas()

    def explain_string(self) -> str:
        """The run's plan with each stateful operator's state info; before the run is
        planned, the query's plan."""
        if self._incremental is None:
            return self.plan.tree_string()
        return self._incremental.explain_string(self.run_id, self.current_batch_id)

    def _state_schemas(self) -> list[tuple[str, StatefulNode, Any, Any]]:
        """(schema file, operator, key schema, value schema) of every stateful operator."""
        from microbatch.execution.stateful import state_schema
        inputs = {r: self._empty_batch(i) for i, r in enumerate(self.relations)}
        def input_schema(node):
            if isinstance(node, StreamJoin):
                return node.left.build(inputs).schema, node.right.build(inputs).schema
            return node.child.build(inputs).schema
        return [(f"{self.checkpoint_root}/state/{op}/_metadata/schema", node,
                 *state_schema(node, input_schema(node)))
                for op, node in enumerate(self.stateful)]

    def _check_state_schemas(self) -> None:
        """An operator's key and value schema must be those its state was written with;
        a transformWithState's may evolve by Spark's rules (``state_schema_history``), and
        its new schema is recorded when the run's first batch runs."""
        import json

        from microbatch.execution.stateful import schema_difference, schema_document
        from microbatch.state.transform_with_state_operator import (ENCODING_FORMAT_CONF, check_nullable_state,
                                                                    state_schema_history)
        encoding = self._batch_session.conf.get(ENCODING_FORMAT_CONF, "unsaferow").lower()
        for op, (path, node, key, value) in enumerate(self._state_schemas()):
            if isinstance(node, TransformWithState):
                check_nullable_state(node.variables, encoding)
            if not self.fs.exists(path):
                continue
            stored = self.fs.read_text(path)
            if isinstance(node, TransformWithState) and json.loads(stored).get("operatorName") == operator_name(node):
                history = state_schema_history(json.loads(stored), node.variables, key, value, encoding)
                if history is not None:
                    self._evolved_state_schemas[path] = schema_document(node, key, value, history)
                continue
            difference = schema_difference(stored, node, key, value)
            if difference:
                raise CheckpointError(
                    f"The state of stateful operator {op} ({operator_name(node)}) in checkpoint "
                    f"'{self.checkpoint_root}' does not fit the query: {difference} ({path}). "
                    "Changing the grouping keys, the aggregate functions, the deduplication "
                    "columns or a join's keys, columns or type of a running query is not "
                    "supported (as in Spark): restore the "
                    "query as it was, or start it with a new checkpoint location.")

    def _write_state_schemas(self) -> None:
        from microbatch.execution.stateful import schema_document
        for path, node, key, value in self._state_schemas():
            if path in self._evolved_state_schemas:
                self.fs.write(path, self._evolved_state_schemas.pop(path))
            elif not self.fs.exists(path):
                self.fs.mkdirs(path.rsplit("/", 1)[0])
                self.fs.write(path, schema_document(node, key, value))
        self._state_schemas_written = True

    def _check_state_operators(self) -> None:
        """The stateful operators must be those whose state the checkpoint holds."""
        if self.current_batch_id == 0:
            return
        state_root = f"{self.checkpoint_root}/state"
        on_disk = sorted(int(n) for n in self.fs.list(state_root) if n.isdigit())
        wanted = list(range(len(self.stateful)))
        if on_disk == wanted:
            return
        names = ", ".join(f"{i} ({operator_name(n)})" for i, n in enumerate(self.stateful)) or "none"
        raise CheckpointError(
            f"The query's stateful operators [{names}] do not match the state in checkpoint "
            f"'{self.checkpoint_root}', which holds state for operators {on_disk or 'none'} after "
            f"{self.current_batch_id} batches. Adding, removing or reordering stateful operators "
            "of a running query is not supported (as in Spark): restore the query as it was, or "
            "start it with a new checkpoint location.")

    def _check_source_count(self, seq: OffsetSeq, batch_id: int) -> None:
        if seq.version >= 2:
            return   # sources by id: added ones start fresh, removed ones are dropped
        if len(seq.offsets) != len(self.sources):
            raise CheckpointError(
                f"There are [{len(seq.offsets)}] sources in the checkpoint offsets and now there "
                f"are [{len(self.sources)}] sources requested by the query. Cannot continue. "
                f"(checkpoint '{self.checkpoint_root}', offsets/{batch_id}). A checkpoint belongs "
                "to one query: restore the query's sources, or use a new checkpoint location.")

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
            self.watermark_ms, self.clock.get_time_millis(), self.offset_seq_metadata.conf,
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
        with self.await_progress:
            self.no_new_data = False
        return True

    def is_new_data_available(self) -> bool:
        return any(self.committed_offsets.get(i) != offset
                   for i, offset in self.available_offsets.items())

    # -- step 3 --------------------------------------------------------------
    def _empty_batch(self, i: int) -> DataFrame:
        if i not in self._empty_batches:
            self._empty_batches[i] = spark_internals.empty_batch(self._batch_session, self.sources[i].schema)
        return self._empty_batches[i]

    def run_batch(self) -> None:
        batch_id = self.current_batch_id
        progress = self.progress
        log.debug("Running batch %d", batch_id)
        inputs: dict[StreamingRelation, DataFrame] = {}
        row_counts: dict[int, int] = {}
        observations: dict[int, Observation] = {}
        scanned_inputs: dict[int, dict] = {}   # counted from the sink's scans
        with progress.time_phase("getBatch"):
            for i, (relation, source) in enumerate(zip(self.relations, self.sources)):
                end = self.available_offsets.get(i)
                start = self.committed_offsets.get(i)
                if end is None or end == start:
                    inputs[relation] = self._empty_batch(i)
                    row_counts[i] = 0
                    continue
                if start is None:
                    start = source.initial_offset()
                log.debug("Retrieving data from %s: %s -> %s", source, start, end)
                df = source.get_batch(start, end)
                crash_points.reached("source-get-batch")
                count = source.num_rows(start, end)
                if count is not None:
                    row_counts[i] = count
                elif (keys := self._scan_keys(df)) is not None:
                    scanned_inputs[i] = keys
                else:
                    observations[i] = Observation(f"microbatch_input_{i}")
                    df = df.observe(observations[i], F.count(F.lit(1)).alias("rows"))
                inputs[relation] = df
        ctx = self._batch_context(batch_id)
        with progress.time_phase("queryPlanning"):
            batch_df = self._incremental.batch_dataframe(
                inputs, self.offset_seq_metadata.batch_timestamp_ms, ctx)
            self.last_batch_df = batch_df
        if self.stateful and not self._state_schemas_written:
            self._write_state_schemas()
        sc = self.spark.sparkContext
        sc.setLocalProperty("streaming.sql.batchId", str(batch_id))
        reads_through = self.sink.reads_batch_through
        if scanned_inputs and reads_through != READS_RDD:
            self._scan_counter.start()
        with progress.time_phase("addBatch"):
            self.sink.last_num_output_rows = -1
            self.sink.add_batch(batch_id, batch_df)
            if ctx is not None and self.stateful:
                self._complete_state_commits(ctx, batch_df)
            crash_points.reached("sink-added")
        if scanned_inputs:
            executions = self._scan_counter.finish() if reads_through != READS_RDD else []
            if reads_through != READS_SQL:
                executions.append(spark_internals.query_execution(batch_df))
            row_counts.update(self._scan_counter.count(scanned_inputs, executions))
        for i, observation in observations.items():
            row_counts[i] = self._observed_rows(observation)
        event_time = self._update_watermark(ctx) if ctx is not None else None
        with progress.time_phase("commitOffsets"):
            self.lease.check()
            if not self.commit_log.add(batch_id, CommitMetadata(self.watermark_ms)):
                raise ConcurrentUpdateError(
                    "Concurrent update to the log. Multiple streaming jobs detected for "
                    f"{batch_id} (commits/{batch_id} already exists). Another run of this query "
                    f"owns the checkpoint '{self.checkpoint_root}'.")
            crash_points.reached("commit-written")
        self.committed_offsets.update(self.available_offsets)
        self._last_batch_stats = {
            "sources": [self._source_progress(i, row_counts.get(i, 0)) for i in range(len(self.sources))],
            "sink": self._sink_progress(),
            "eventTime": event_time,
            "stateOperators": [state_operator_progress(op.node, self._operator_metrics(ctx, op.id),
                                                       ctx.num_partitions)
                               for op in self._incremental.operators] if ctx is not None else [],
            "observedMetrics": self._user_observed_metrics(ctx),
        }
        log.debug("Completed batch %d", batch_id)
        with self.await_progress:
            self.await_progress.notify_all()

    def _scan_keys(self, df: DataFrame) -> dict | None:
        """How to find ``df``'s scans in the sink's executions, if its rows can be counted
        there (see spark_internals/metrics.py); None: count them with an Observation."""
        if self._scan_counting_failed:
            return None
        try:
            if self._scan_counter is None:
                self._scan_counter = spark_internals.ScanRowCounter(self._batch_session)
            return self._scan_counter.input_keys(df)
        except Exception:  # noqa: BLE001 (a Spark without these internals: count another way)
            log.warning("Cannot count input rows from the scans' metrics; counting them "
                        "with an Observation instead", exc_info=True)
            self._scan_counting_failed = True
            return None

    # -- stateful steps and event time ---------------------------------------------
    def _batch_context(self, batch_id: int) -> BatchContext | None:
        if not self.stateful and not self.watermark_nodes and not self.observes:
            return None
        if self._store_conf is None:
            self._store_conf = dataclasses.replace(StateStoreConf.from_session(self._batch_session),
                                                   run_id=self.run_id, storage=self.fs.spec())
        for accumulator in self._state_metrics.values():
            accumulator.value = {}
        planner = self._incremental
        return BatchContext(
            batch_id=batch_id, state_root=f"{self.checkpoint_root}/state",
            num_partitions=int(self._batch_session.conf.get("spark.sql.shuffle.partitions")),
            watermarks=planner.operator_watermarks(self._prev_batch_watermark_ms,
                                                   self.offset_seq_metadata.batch_watermark_ms),
            conf=self._store_conf, operator_ids={op.node: op.id for op in planner.operators},
            accumulators=self._state_metrics, watermark_ids=planner.watermark_ids,
            output_mode=self.output_mode,
            stats_in_operator=stats_in_operator([op.node for op in planner.operators]),
            columns=self._batch_columns, batch_timestamp_ms=self.offset_seq_metadata.batch_timestamp_ms)

    def _operator_metrics(self, ctx: BatchContext, op: int) -> dict:
        """An operator's metrics from its tasks, plus rows dropped in Spark before it."""
        metrics = dict(self._state_metrics[op].value)
        if op in ctx.late_observations:
            observed = self._observed(ctx.late_observations[op]) or {}
            metrics["numRowsDroppedByWatermark"] = metrics.get("numRowsDroppedByWatermark", 0) \
                + int(observed.get("late") or 0)
        return metrics

    def _complete_state_commits(self, ctx: BatchContext, batch_df: DataFrame) -> None:
        """Every state partition must commit version N+1, even if the sink read only part
        of the batch (``take``) or none of it; run the batch to the end if not."""
        if all(committed_partitions(self._state_metrics[op.id].value) == set(range(op.num_state_stores))
               for op in self._incremental.operators):
            return
        log.info("The sink did not run every state partition of batch %d; running the batch "
                 "to the end to commit its state", ctx.batch_id)
        for accumulator in self._state_metrics.values():
            accumulator.value = {}
        batch_df.write.format("noop").mode("append").save()

    def _update_watermark(self, ctx: BatchContext) -> dict | None:
        """Move the watermark from the batch's event times; return progress ``eventTime``."""
        used_ms = self.offset_seq_metadata.batch_watermark_ms
        merged: dict[str, float] = {}   # the first watermark (plan order) that saw rows
        observed = [(node, self._observed(observation)) for node, observation in ctx.observations.items()]
        observed += [(node, aggregated_event_time(self._state_metrics[op].value, tag))
                     for node, (op, tag) in ctx.stats_operators.items()]
        watermark_ids = self._incremental.watermark_ids
        for node, stats in sorted(observed, key=lambda item: watermark_ids[item[0]]):
            if not stats or not stats.get("count"):
                continue
            index = watermark_ids[node]
            candidate = int(stats["max"]) - node.delay_ms
            self._operator_watermarks[index] = max(self._operator_watermarks.get(index, candidate), candidate)
            if not merged:   # progress shows the first watermark's statistics, as Spark's does
                merged = {"max": int(stats["max"]), "min": int(stats["min"]),
                          "avg": float(stats["avg"]), "count": int(stats["count"])}
        if self._operator_watermarks:
            policy = self._batch_session.conf.get("spark.sql.streaming.multipleWatermarkPolicy", "min")
            values = self._operator_watermarks.values()
            chosen = max(values) if policy.lower() == "max" else min(values)
            if chosen > self.watermark_ms:
                log.info("Updating event-time watermark from %d to %d ms", self.watermark_ms, chosen)
                self.watermark_ms = chosen
            else:
                log.debug("Event time didn't move: %d <= %d", chosen, self.watermark_ms)
        self._prev_batch_watermark_ms = used_ms
        self._requires_another_batch = self._incremental.should_run_another_batch(self.watermark_ms, used_ms)
        if not self.watermark_nodes:
            return None
        event_time = {"watermark": format_timestamp(used_ms)}
        if merged:
            event_time.update(avg=format_timestamp(int(merged["avg"])), max=format_timestamp(merged["max"]),
                              min=format_timestamp(merged["min"]))
        return dict(sorted(event_time.items()))

    def _observed_row(self, observation: Observation) -> Any:
        """The JVM row of an ``Observation`` of the batch, or None if the sink never ran
        the batch's DataFrame.

        Spark fills an ``Observation`` when a SQL action that ran it ends (through a
        listener, so it may lag the action a little). An RDD action (``foreach``,
        ``foreachPartition`` in ``foreachBatch``) never fills it: its metrics are then
        read from the batch DataFrame's own executed plan, which that action ran."""
        reads_through = self.sink.reads_batch_through
        if reads_through != READS_RDD:
            row = spark_internals.observation_row(observation, wait_s=0.5)
            if row is not None:
                return row
        if reads_through == READS_SQL or self.last_batch_df is None:
            return None
        try:
            return spark_internals.executed_observation_row(self.last_batch_df, observation._name)
        except Exception:  # noqa: BLE001 (a plan the sink never ran may not even plan)
            log.debug("No observed metrics in the batch's own plan", exc_info=True)
            return None

    def _observed(self, observation: Observation) -> dict | None:
        """The observed metrics as a dict (Spark's JSON of the row), or None."""
        row = self._observed_row(observation)
        return None if row is None else spark_internals.row_json(row)

    def _user_observed_metrics(self, ctx: BatchContext | None) -> dict[str, tuple[dict, Any]]:
        """The batch's ``observe(name, ...)`` metrics: per name, the row as Spark's JSON
        and as a Python ``Row`` (for progress and listener events)."""
        found = {}
        for name, observation in (ctx.user_observations.items() if ctx is not None else ()):
            row = self._observed_row(observation)
            if row is not None:
                found[name] = (spark_internals.row_json(row), spark_internals.python_row(row))
        return found

    def _observed_rows(self, observation: Observation) -> int:
        """Rows the sink actually read; 0 if the sink never ran the batch's DataFrame."""
        metrics = self._observed(observation)
        return int(metrics.get("rows", 0)) if metrics else 0

    def _source_progress(self, i: int, rows: int) -> dict:
        progress = {"description": str(self.sources[i]),
                    "startOffset": self.trigger_start_offsets.get(i),
                    "endOffset": self.available_offsets.get(i),
                    "latestOffset": self.latest_offsets.get(i),
                    "numInputRows": rows, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0}
        metrics = self.sources[i].metrics(self.available_offsets.get(i))
        if metrics:
            progress["metrics"] = metrics
        return progress

    def _sink_progress(self) -> dict:
        progress = {"description": str(self.sink), "numOutputRows": self.sink.last_num_output_rows}
        metrics = self.sink.progress_metrics()
        if metrics:
            progress["metrics"] = metrics
        return progress
