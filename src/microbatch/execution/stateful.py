"""Stateful steps of a micro-batch: event-time observation and operators on the state store.

For each batch the engine makes a ``BatchContext`` and builds the plan with it:

- A watermark node attaches an ``Observation`` of the event-time column (min,
  max, avg, count in ms), read after the sink ran, to move the watermark.
- A stateful node hash-partitions its input by key into the query's fixed number
  of state partitions and runs a Python function per partition inside Spark tasks
  (``mapInArrow``; the task functions are in ``state.dedup_operator`` and
  ``state.aggregate_operator``). The task opens the store ``(operator, partition)`` at version
  N (the batch id), changes it, commits version N+1 and adds its metrics to the
  operator's accumulator. A task run twice (the sink read the batch twice, a
  retried task) steps the store back to version N and commits the same N+1 again.

Two watermarks apply in batch N, as in Spark: rows at or before the *previous*
batch's watermark are late (dropped, counted as ``numRowsDroppedByWatermark``),
and state at or before *this* batch's watermark is evicted.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import pyarrow as pa
from pyspark import AccumulatorParam
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import BooleanType, StructType

from microbatch import spark_internals
from microbatch.plan.incremental import (OperatorWatermarks, PreparedSegment, PreparedStep, operator_name,
                                         state_partitions)
from microbatch.plan.aggregation import final_columns, finalize, grouped_partial, partial_columns
from microbatch.plan.logical import (Aggregate, Deduplicate, FlatMapGroupsWithState, Observe, PlanNode,
                                     StatefulNode, StreamingLimit, StreamJoin, Transform,
                                     TransformWithState, Watermark)
from microbatch.state.aggregate_operator import AggregateTask, SessionAggregateTask
from microbatch.state.dedup_operator import DedupTask
from microbatch.state.group_state_operator import TIMEOUT_FIELD, GroupStateTask, PandasConversion
from microbatch.state.join_operator import JOIN_SIDE_TAGS, JoinTask
from microbatch.state.limit_operator import LimitTask
from microbatch.state.transform_with_state_operator import (TIMERS_STORE, TransformWithStateTask,
                                                            state_store_schemas, state_value_type)
from microbatch.state.files import storage_type
from microbatch.state.store import StateStoreConf

log = logging.getLogger(__name__)

#: Names of the progress fields of a state operator, in Spark's order.
STATE_OPERATOR_FIELDS = ("numRowsTotal", "numRowsUpdated", "allUpdatesTimeMs", "numRowsRemoved",
                         "allRemovalsTimeMs", "commitTimeMs", "memoryUsedBytes",
                         "numRowsDroppedByWatermark")


class DictSum(AccumulatorParam):
    """Adds dicts of numbers key by key: one accumulator carries all of an operator's metrics."""

    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        for k, v in b.items():
            a[k] = v if k.startswith("set:") else a.get(k, 0) + v   # set: a re-run replaces
        return a


#: The event-time statistics an aggregation computes for the watermark below it.
EVENT_TIME_STATS = ("max", "min", "sum", "count")


#: DataFrame methods that may only project a watermark's rows; whether they do, Spark's
#: analysed plan of the steps says (``spark_internals.projections_keep_column``)
PROJECTING_METHODS = frozenset({"select", "selectExpr", "withColumn", "withColumns", "withColumnRenamed",
                                "withColumnsRenamed", "drop", "toDF", "alias", "withMetadata"})


def watermark_below(node: PlanNode) -> tuple[Watermark, tuple[Transform, ...]] | None:
    """The watermark under ``node`` (a stateful operator's input) when only steps that may
    project lie between, with those steps (top-down); else None."""
    steps: list[Transform] = []
    while True:
        if isinstance(node, Watermark):
            return node, tuple(steps)
        if isinstance(node, PreparedSegment):
            node = node.template
        elif type(node) is Transform and node.method in PROJECTING_METHODS:
            steps.append(node)
            node = node.child
        else:
            return None


def stats_in_operator(stateful: list[StatefulNode]) -> dict[Watermark, tuple[Transform, ...]]:
    """Watermarks whose event-time statistics the stateful operator above can compute, with
    the steps between them: right below one side of a stream-stream join (not a self-join
    of one watermark), or below an aggregation (not a session window, which drops late
    rows before aggregating, nor grouping sets, which count a row once per set), a
    deduplication or an applyInPandasWithState through steps that may only project (the
    watermark checks, once per run, that they do and keep its column:
    ``BatchContext.observe_event_time``). Every row of the watermark reaches the
    operator's partial aggregation or its task, which computes the statistics."""
    found: dict[Watermark, tuple[Transform, ...]] = {}
    for n in stateful:
        if isinstance(n, StreamJoin):
            sides = [n.side_watermark(0), n.side_watermark(1)]
            if sides[0] is not sides[1]:
                found.update((side, ()) for side in sides if side is not None)
        elif isinstance(n, (Deduplicate, FlatMapGroupsWithState)) or (
                isinstance(n, Aggregate) and n.session_index is None
                and (n.grouping is None or not n.grouping.has_sets)):
            below = watermark_below(n.child)
            if below is not None:
                found[below[0]] = below[1]
    return found


def aggregated_event_time(metrics: dict, tag: str = "") -> dict | None:
    """The statistics an operator's tasks reported (``set:eventTime<tag>_<partition>_<stat>``;
    a join tags each side's), as an ``Observation`` of the watermark would give them."""
    stats: dict[str, list] = {name: [] for name in EVENT_TIME_STATS}
    prefix = f"set:eventTime{tag}_"
    for key, value in metrics.items():
        if key.startswith(prefix):
            stats[key.rsplit("_", 1)[1]].append(value)
    count = sum(stats["count"])
    if not count:
        return None
    return {"max": max(stats["max"]), "min": min(stats["min"]), "avg": sum(stats["sum"]) / count,
            "count": count}


def stateful_nodes(plan: PlanNode) -> list[StatefulNode]:
    """Stateful nodes in operator-id order (top-down, as Spark numbers them)."""
    return [n for n in plan.nodes() if isinstance(n, StatefulNode)]


def watermark_nodes(plan: PlanNode) -> list[Watermark]:
    return [n for n in plan.nodes() if isinstance(n, Watermark)]


def _us_column(name: str):
    return F.expr(f"unix_micros(CAST(`{name}` AS TIMESTAMP))")


def _ms_column(name: str):
    return F.expr(f"unix_micros(CAST(`{name}` AS TIMESTAMP)) div 1000")


def _store_field(field) -> pa.Field:
    """The Arrow field a key column is stored as (``state.files.storage_type``)."""
    return pa.field(field.name, storage_type(to_arrow_type(field.dataType, timezone="UTC")))


class BatchContext:
    """What the plan of batch N needs to observe event time and run stateful steps."""

    def __init__(self, *, batch_id: int, state_root: str, num_partitions: int,
                 watermarks: dict[StatefulNode, OperatorWatermarks], conf: StateStoreConf,
                 operator_ids: dict[StatefulNode, int], accumulators: dict[int, Any],
                 watermark_ids: dict[Watermark, int], output_mode: str = "append",
                 stats_in_operator: Mapping[Watermark, tuple] | None = None, columns: dict | None = None,
                 batch_timestamp_ms: int = 0):
        self.batch_id = batch_id
        self.state_root = state_root
        self.num_partitions = num_partitions
        self.watermarks = watermarks
        self.conf = conf
        self.operator_ids = operator_ids
        self.accumulators = accumulators
        self.watermark_ids = watermark_ids
        self.output_mode = output_mode
        self.batch_timestamp_ms = batch_timestamp_ms
        self.late_observations: dict[int, Observation] = {}   # operator -> rows dropped before it
        self.observations: dict[Watermark, Observation] = {}
        self.user_observations: dict[str, Observation] = {}   # observe(name, ...) by name
        #: watermarks whose event-time statistics the operator above may compute, with the
        #: steps between (``stats_in_operator``)
        self.stats_in_operator = stats_in_operator or {}
        #: watermark -> (operator reporting them, the tag of its metrics)
        self.stats_operators: dict[Watermark, tuple[int, str]] = {}
        #: What does not change from batch to batch, kept by the engine for the query run:
        #: Column objects (building one costs a py4j round trip or more) and each stateful
        #: step analysed once (``_step``)
        self.columns = columns if columns is not None else {}

    def watermarks_for(self, node: StatefulNode) -> tuple[int, int]:
        """The (late, eviction) watermarks of an operator in ms, as the planner propagated
        them (``plan.incremental``: above a stream-stream join, the join's output watermark)."""
        found = self.watermarks[node]
        return found.late_ms, found.eviction_ms

    def reported_watermark(self, node: StatefulNode) -> Watermark | None:
        """The watermark whose event-time statistics ``node``'s tasks compute this batch:
        one below it in ``stats_in_operator`` that did not observe them itself (it is
        built before the operator)."""
        below = watermark_below(node.child)
        if below is None or below[0] not in self.stats_in_operator or below[0] in self.observations:
            return None
        return below[0]

    def _columns(self, key, make):
        if key not in self.columns:
            self.columns[key] = make()
        return self.columns[key]

    def _step(self, key, inputs: list[DataFrame], task: Any, build) -> DataFrame:
        """The stateful step ``build`` over this batch's ``inputs``, running this batch's
        ``task``: analysed once per run (again only if an input's columns change) and bound
        to each batch's inputs and task (``plan.incremental.PreparedStep``). A step that
        cannot be prepared is built step by step every batch."""
        given = [spark_internals.BatchInput(df) for df in inputs]
        columns_keys = self._columns(("step columns", key), spark_internals.ColumnsKeys)
        prepared_key = ("step", key, columns_keys.key(given))
        prepared = self.columns.get(prepared_key)
        if prepared is None:
            try:
                prepared = PreparedStep(inputs, task, build)
            except Exception:  # noqa: BLE001 - e.g. a Spark whose plans differ: build it per batch
                log.warning("Cannot prepare the stateful step %s once per run; building it every "
                            "batch", key[0], exc_info=True)
                prepared = False
            self.columns[prepared_key] = prepared
        if prepared is False:
            return build(inputs, task)[0]
        return prepared.bind(given, task)

    def observe_event_time(self, node: Watermark, df: DataFrame) -> DataFrame:
        """Event-time statistics of ``df``: by an ``Observation`` (a node at the scan that
        stops code generation: 150-200 ms a 1M-row batch), or, for a watermark right
        below a stateful operator, by that operator (``stats_in_operator``)."""
        if node in self.stats_in_operator and self._columns(
                ("operator reports", id(node)),
                lambda: _operator_can_report(node, df, self.operator_ids, self.stats_in_operator[node])):
            return df
        observation = Observation(f"microbatch_event_time_{self.watermark_ids[node]}_{self.batch_id}")
        self.observations[node] = observation
        ms = _ms_column(node.event_time)
        return df.observe(observation, F.max(ms).alias("max"), F.min(ms).alias("min"),
                          F.avg(ms).alias("avg"), F.count(ms).alias("count"))

    def observe(self, node: Observe, df: DataFrame) -> DataFrame:
        """The user's ``observe(name, *exprs)`` for this batch: an ``Observation`` of the
        batch's DataFrame, read after the sink ran."""
        observation = Observation(node.name)
        self.user_observations[node.name] = observation
        return df.observe(observation, *node.exprs)

    def deduplicate(self, node: Deduplicate, df: DataFrame) -> DataFrame:
        """Rows hash-partitioned by key; an Arrow UDF over the key columns answers, per
        row, whether to keep it (only the keys travel to Python)."""
        schema: StructType = df.schema
        names = schema.fieldNames()
        indexes = tuple(names.index(k) for k in node.keys)
        fields = [_store_field(schema.fields[i]) for i in indexes]
        event_time = node.event_time()
        late_column = event_time[0] if event_time and event_time[0] in names else None
        watermark = node.watermark_column()
        inputs = list(node.keys)
        if late_column is not None and late_column not in inputs:
            inputs.append(late_column)
        reported = self.reported_watermark(node)
        reports_event_time = reported is not None and late_column is not None
        if reports_event_time:
            self.stats_operators[reported] = (self.operator_ids[node], "")
        task = DedupTask(
            state_root=self.state_root, operator_id=self.operator_ids[node], version=self.batch_id,
            key_schema=pa.schema(fields),
            value_schema=pa.schema([pa.field("expiresAtMicros", pa.int64())] if node.within_watermark else []),
            event_time_index=inputs.index(late_column) if late_column else None,
            watermark_key=node.keys.index(watermark) if watermark else None,
            expiry_delay_us=event_time[1] * 1000 if node.within_watermark else None,
            late_us=self.watermarks_for(node)[0] * 1000 if late_column else None,
            evict_us=self.watermarks_for(node)[1] * 1000 if event_time else None,
            conf=self.conf, metrics=self.accumulators[self.operator_ids[node]],
            event_time_stats=reports_event_time)
        keys, arguments = self._columns(("dedup", id(node)), lambda: (
            [F.col(_quoted(k)) for k in node.keys], [F.col(_quoted(c)) for c in inputs]))
        partitions = self.num_partitions

        def build(inputs: list[DataFrame], task: DedupTask):
            keyed = inputs[0].repartition(partitions, *keys).withColumn(
                KEEP_COLUMN, _row_filter_udf(task)(*arguments))
            function = spark_internals.projected_function(keyed, BooleanType())
            return keyed.filter(F.col(KEEP_COLUMN)).drop(KEEP_COLUMN), function

        return self._step(("dedup", id(node)), [df], task, build)

    def stream_join(self, node: StreamJoin, left: DataFrame, right: DataFrame) -> DataFrame:
        """Both sides' rows, tagged by side and hash-partitioned by the join keys into the
        state partitions (as Spark distributes each side of its join), then the join's
        task per partition (``state.join_operator``), then the join's columns by name. The
        columns and schemas are made once per run (``_join_shape``); a batch binds its rows
        and watermarks."""
        shape = self._columns(("join", id(node)), lambda: _join_shape(node, left, right))
        op = self.operator_ids[node]
        times = shape["times"]
        watermarked = any(t is not None for t in times)
        late_ms, evict_ms = self.watermarks_for(node)
        reports = []
        for side, child in enumerate((node.side_watermark(0), node.side_watermark(1))):
            # the side's rows all reach the task, which reports their event-time statistics
            index = shape["stats_columns"][side]
            if child in self.stats_in_operator and child not in self.observations and index is not None:
                self.stats_operators[child] = (op, JOIN_SIDE_TAGS[side])
                reports.append(index)
            else:
                reports.append(None)
        value_watermarks = tuple(None if times[side] is None or node.watermark_key() is not None
                                 else node.value_watermark_ms(side, evict_ms)
                                 for side in (0, 1))
        task = JoinTask(
            state_root=self.state_root, operator_id=op, version=self.batch_id,
            key_schema=shape["key_schema"], row_schemas=shape["row_schemas"],
            output_types=shape["output_types"], event_times=times,
            watermark_key=node.watermark_key(), how=node.how, comparisons=shape["comparisons"],
            value_evict_us=tuple(None if v is None else v * 1000 for v in value_watermarks),
            late_us=late_ms * 1000 if watermarked else None,
            evict_us=evict_ms * 1000 if watermarked else None,
            conf=self.conf, metrics=self.accumulators[op], event_time_stats=tuple(reports))
        partitions = self.num_partitions

        def build(inputs: list[DataFrame], task: JoinTask):
            both = inputs[0].select(*shape["tagged"][0]).union(inputs[1].select(*shape["tagged"][1]))
            mapped = both.repartition(partitions, *shape["partition"]).mapInArrow(task, shape["out"])
            return mapped.select(*shape["result"]), spark_internals.map_in_arrow_function(mapped, shape["out"])

        return self._step(("join", id(node)), [left, right], task, build)

    def flat_map_groups_with_state(self, node: FlatMapGroupsWithState, df: DataFrame) -> DataFrame:
        """Rows hash-partitioned by the grouping keys, then the task that calls the user's
        function per key and per timed-out key (``state.group_state_operator``)."""
        op = self.operator_ids[node]
        late_ms, evict_ms = self.watermarks_for(node)
        shape = self._columns(("group state", id(node)), lambda: _group_state_shape(node, df))
        event_time, has_watermark = shape["event_time"], shape["has_watermark"]
        stats_index = None
        reported = self.reported_watermark(node)
        if reported is not None:
            names = [n.lower() for n in shape["input_names"]]
            if reported.event_time.lower() in names:
                stats_index = names.index(reported.event_time.lower())
                self.stats_operators[reported] = (op, "")
        task = GroupStateTask(
            state_root=self.state_root, operator_id=op, version=self.batch_id, func=node.func,
            key_indexes=shape["key_indexes"], key_types=shape["key_types"],
            input_names=tuple(shape["input_names"]),
            key_schema=shape["key_schema"],
            value_schema=shape["value_schema"], state_type=node.state_schema,
            pandas=shape["pandas"], timeout_conf=node.timeout,
            batch_timestamp_ms=self.batch_timestamp_ms,
            watermark_ms=evict_ms if has_watermark else -1, watermark_present=has_watermark,
            late_us=late_ms * 1000 if node.timeout == "EventTimeTimeout" and event_time is not None else None,
            event_time_index=event_time, conf=self.conf, metrics=self.accumulators[op],
            event_time_stats_index=stats_index)
        return self._step(("group state", id(node)), [df], task,
                          self._map_by_keys(shape["partition"], shape["output"]))

    def _map_by_keys(self, partition_columns: list, output: StructType):
        """A step's build: rows hash-partitioned by ``partition_columns``, then its task."""
        partitions = self.num_partitions

        def build(inputs: list[DataFrame], task: Any):
            mapped = inputs[0].repartition(partitions, *partition_columns).mapInArrow(task, output)
            return mapped, spark_internals.map_in_arrow_function(mapped, output)
        return build

    def transform_with_state(self, node: TransformWithState, df: DataFrame) -> DataFrame:
        """Rows hash-partitioned by the grouping keys, then the task that runs the user's
        StatefulProcessor per key and per expired timer
        (``state.transform_with_state_operator``)."""
        op = self.operator_ids[node]
        late_ms, evict_ms = self.watermarks_for(node)
        shape = self._columns(("transform with state", id(node)), lambda: _group_state_shape(node, df))
        event_time = shape["event_time"]
        first_with_initial = node.initial_state is not None and self.batch_id == 0
        evolution = "name" if shape["encoding"] == "avro" else "position"
        task = TransformWithStateTask(
            state_root=self.state_root, operator_id=op, version=self.batch_id, processor=node.processor,
            variables=node.variables, rows_api=node.rows_api, time_mode=node.time_mode,
            key_indexes=shape["key_indexes"], key_types=shape["key_types"], key_schema=shape["key_schema"],
            store_schemas=state_store_schemas(node.variables), input_names=tuple(shape["input_names"]),
            initial_names=tuple(node.initial_state.columns) if first_with_initial else (),
            pandas=shape["pandas"], batch_timestamp_ms=self.batch_timestamp_ms,
            watermark_ms=evict_ms if shape["has_watermark"] else -1,
            late_us=late_ms * 1000 if node.time_mode == "eventtime" and event_time is not None else None,
            event_time_index=event_time,
            conf=dataclasses.replace(self.conf, value_evolution=evolution), metrics=self.accumulators[op],
            output_event_time_index=shape["output_event_time"],
            output_late_us=late_ms * 1000 if shape["output_event_time"] is not None and shape["has_watermark"]
            else None)
        if first_with_initial:   # the query's first batch also reads the initial state
            return _with_initial_state(node, df, self.num_partitions).mapInArrow(task, shape["output"])
        return self._step(("transform with state", id(node)), [df], task,
                          self._map_by_keys(shape["partition"], shape["output"]))

    def limit(self, node: StreamingLimit, df: DataFrame) -> DataFrame:
        """The batch's first ``n`` rows (a plain limit: one partition, the batch's order),
        then the task that lets through only what the run's total leaves room for."""
        op = self.operator_ids[node]
        task = LimitTask(self.state_root, op, self.batch_id, node.limit, self.conf, self.accumulators[op])

        def build(inputs: list[DataFrame], task: LimitTask):
            schema = inputs[0].schema
            mapped = inputs[0].limit(node.limit).mapInArrow(task, schema)
            return mapped, spark_internals.map_in_arrow_function(mapped, schema)

        return self._step(("limit", id(node)), [df], task, build)

    def aggregate(self, node: Aggregate, df: DataFrame) -> DataFrame:
        """Buffers per key in Spark, merged with the state per partition, then finalised."""
        spec = node.spec
        op = self.operator_ids[node]
        late_ms, evict_ms = self.watermarks_for(node)
        if node.session_index is not None and node.event_time_key is not None:
            # A row's session is late when it ends (event time + the row's gap) at or before
            # the previous batch's watermark: such rows are dropped before the batch's
            # sessions form. Spark's session_window rule drops rows whose gap is not positive.
            end = self._columns(("session end", id(node)), lambda: (
                node.keys[node.session_index].getField("end").alias(SESSION_END_COLUMN)))
            late = _us_column(SESSION_END_COLUMN) <= F.lit(late_ms * 1000)
            observation = Observation(f"microbatch_late_rows_{op}_{self.batch_id}")
            self.late_observations[op] = observation
            df = (df.select("*", end).observe(observation, F.count(F.when(late, 1)).alias("late"))
                  .filter(~late | late.isNull()).drop(SESSION_END_COLUMN))
        watermark = self.reported_watermark(node)
        extra = ()
        if watermark is not None:
            extra = self._columns(("event time stats", id(node)), lambda: _event_time_stats_columns(watermark))
            self.stats_operators[watermark] = (op, "")
        buffers, results = self._columns(("aggregate", id(node)), lambda: (
            partial_columns(spec.calls, spec.buffer_names), final_columns(spec)))
        partition_keys = [k for i, k in enumerate(spec.key_names) if i != node.session_index]
        partition_columns = self._columns(("partition", id(node)), lambda: [
            F.col(_quoted(k)) for k in partition_keys])
        arrow = [pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC"))
                 for f in spec.partial_schema.fields]
        num_keys = len(spec.key_names)
        merges, start = [], 0
        for call, names in zip(spec.calls, spec.buffer_names):
            merges.append((call.merge, start, len(names), call.options))
            start += len(names)
        has_watermark = node.event_time_key is not None
        output_schema = pa.schema([pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC"))
                                   for f in spec.merged_schema.fields])
        if node.session_index is not None:
            task = SessionAggregateTask(
                state_root=self.state_root, operator_id=op, version=self.batch_id,
                key_fields=tuple(arrow[:num_keys]), session_index=node.session_index,
                buffer_fields=tuple(arrow[num_keys:]), merges=tuple(merges), output_schema=output_schema,
                mode=self.output_mode, evict_us=evict_ms * 1000 if has_watermark else None,
                conf=self.conf, metrics=self.accumulators[op])
        else:
            task = AggregateTask(
                state_root=self.state_root, operator_id=op, version=self.batch_id,
                key_fields=tuple(arrow[:num_keys]), buffer_fields=tuple(arrow[num_keys:]),
                merges=tuple(merges), output_schema=output_schema,
                mode=self.output_mode, watermark_key=node.event_time_key,
                watermark_is_window=node.event_time_is_window,
                late_us=late_ms * 1000 if has_watermark else None,
                evict_us=evict_ms * 1000 if has_watermark else None,
                conf=self.conf, metrics=self.accumulators[op],
                event_time_stats=watermark is not None)
        partitions = self.num_partitions

        def build(inputs: list[DataFrame], task: AggregateTask | SessionAggregateTask):
            partial = grouped_partial(inputs[0], node.keys, spec.calls, spec.buffer_names, extra, buffers,
                                      **({} if node.grouping is None else {"grouping": node.grouping}))
            if partition_keys:   # the state partition of a key is fixed: hash of the key, mod N
                partial = partial.repartition(partitions, *partition_columns)
            elif node.session_index is not None:
                partial = partial.repartition(1)
            mapped = partial.mapInArrow(task, spec.merged_schema)
            return (finalize(mapped, spec, results),
                    spark_internals.map_in_arrow_function(mapped, spec.merged_schema))

        return self._step(("aggregate", id(node)), [df], task, build)

    def partitions_of(self, node: StatefulNode) -> int:
        return state_partitions(node, self.num_partitions)


def _join_shape(node: StreamJoin, left: DataFrame, right: DataFrame) -> dict:
    """What a stream-stream join's batches share: each side's tagging columns (``__side``,
    the keys ``__k..``, the left row ``__l..``, the right row ``__r..``), the task's schemas,
    the partitioning columns and the output columns (Spark's USING or condition output)."""
    from pyspark.sql.types import StructField
    schemas = (left.schema, right.schema)
    keys = list(node.keys)
    side_keys = (list(node.keys), list(node.right_keys))
    tagged = []
    for side in (0, 1):
        columns = [F.lit(side).alias("__side")] + [F.col(_quoted(k)).alias(f"__k{i}")
                                                   for i, k in enumerate(side_keys[side])]
        for s, (prefix, schema) in enumerate((("__l", schemas[0]), ("__r", schemas[1]))):
            columns += [(F.col(_quoted(f.name)) if s == side else F.lit(None).cast(f.dataType)).alias(f"{prefix}{j}")
                        for j, f in enumerate(schema.fields)]
        tagged.append(columns)
    both = left.select(*tagged[0]).union(right.select(*tagged[1]))   # the keys' common types
    key_fields = [both.schema[f"__k{i}"] for i in range(len(keys))]
    arrow = [[to_arrow_type(f.dataType, timezone="UTC") for f in schema.fields] for schema in schemas]

    def event_time(side: int, schema: StructType) -> int | None:
        column = node.side_event_time(side)
        names = [n.lower() for n in schema.fieldNames()]
        return names.index(column.lower()) if column and column.lower() in names else None

    left_names, right_names = schemas[0].fieldNames(), schemas[1].fieldNames()
    if not node.using:   # a condition: every column of the left, then of the right
        result = [F.col(f"__l{j}").alias(n) for j, n in enumerate(left_names)]
        if node.how != "semi":
            result += [F.col(f"__r{j}").alias(n) for j, n in enumerate(right_names)]
    else:
        # Spark's USING join output: the keys (the left's; the right's in a right outer join;
        # the one that is there in a full outer join), then the other columns of each side
        lowered = [k.lower() for k in keys]
        left_key = {n.lower(): j for j, n in enumerate(left_names)}
        right_key = {n.lower(): j for j, n in enumerate(right_names)}

        def key_column(k: str):
            if node.how == "right":
                return F.col(f"__r{right_key[k.lower()]}")
            if node.how == "full":
                return F.coalesce(F.col(f"__l{left_key[k.lower()]}"), F.col(f"__r{right_key[k.lower()]}"))
            return F.col(f"__l{left_key[k.lower()]}")
        result = [key_column(k).alias(k) for k in keys]
        result += [F.col(f"__l{j}").alias(n) for j, n in enumerate(left_names) if n.lower() not in lowered]
        if node.how != "semi":   # a left semi join gives the left side's columns only
            result += [F.col(f"__r{j}").alias(n) for j, n in enumerate(right_names) if n.lower() not in lowered]
    return {
        "tagged": tagged,
        "stats_columns": tuple(None if (watermark := node.side_watermark(side)) is None
                               else _join_stats_column(watermark, schemas[side]) for side in (0, 1)),
        "key_schema": pa.schema([pa.field(f.name, storage_type(to_arrow_type(f.dataType, timezone="UTC")))
                                 for f in key_fields]),
        "row_schemas": tuple(pa.schema([pa.field(f.name, storage_type(t)) for f, t in zip(schema.fields, types)])
                             for schema, types in zip(schemas, arrow)),
        "output_types": tuple(tuple(types) for types in arrow),
        "times": (event_time(0, schemas[0]), event_time(1, schemas[1])),
        "comparisons": tuple((op, (a.side, a.index, a.offset_us), (b.side, b.index, b.offset_us))
                             for op, a, b in node.comparisons),
        "out": StructType([StructField(f"{prefix}{j}", f.dataType, True)
                           for prefix, schema in (("__l", schemas[0]), ("__r", schemas[1]))
                           for j, f in enumerate(schema.fields)]),
        "partition": [F.col(f"__k{i}") for i in range(len(keys))],
        "result": result,
    }


def _group_state_shape(node: FlatMapGroupsWithState | TransformWithState, df: DataFrame) -> dict:
    """What an applyInPandasWithState's (or transformWithState's) batches share (made
    once per run)."""
    from pyspark.sql.types import StructField
    schema = df.schema
    names = [n.lower() for n in schema.fieldNames()]
    event_time = node.watermarked_input()
    conf = df.sparkSession.conf
    state_fields = [_store_field(f) for f in getattr(node, "state_schema", StructType()).fields]
    return {
        "key_indexes": tuple(names.index(k.lower()) for k in node.keys),
        # the columns the function gets: without keys added for grouping expressions
        "input_names": schema.fieldNames()[:node.data_columns],
        "key_types": tuple(schema.fields[names.index(k.lower())].dataType for k in node.keys),
        "key_schema": pa.schema([_store_field(schema.fields[names.index(k.lower())]) for k in node.keys]),
        "value_schema": pa.schema([pa.field("groupState", pa.struct(state_fields)),
                                   pa.field(TIMEOUT_FIELD, pa.int64())]),
        "pandas": PandasConversion.of(node.output_schema, pa.schema(
            [pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in node.output_schema.fields]), conf,
            byte_limit=isinstance(node, TransformWithState) and not node.rows_api),
        # Spark widens a stateful operator's output to nullable
        "output": StructType([StructField(f.name, f.dataType, True) for f in node.output_schema.fields]),
        "event_time": names.index(event_time.lower()) if event_time and event_time.lower() in names else None,
        "has_watermark": event_time is not None,
        "encoding": conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow").lower(),
        "output_event_time": node.output_schema.names.index(node.event_time_column)
        if getattr(node, "event_time_column", None) else None,
        "partition": [F.col(_quoted(k)) for k in node.keys],
    }


def _with_initial_state(node: TransformWithState, df: DataFrame, partitions: int) -> DataFrame:
    """The batch's rows (``__side`` 0) and the initial state's (1) in one DataFrame, hash
    partitioned by the grouping key as every batch is (``__k<i>``, of the batch's key
    types, so a key meets its initial state in its own state partition): the batch's
    columns as ``__in<j>``, the initial state's as ``__st<j>``."""
    initial = node.initial_state
    by_name = {f.name.lower(): f for f in df.schema.fields}
    key_types = [by_name[k.lower()].dataType for k in node.keys]
    inputs, states = df.schema.fields, initial.schema.fields

    def side(frame: DataFrame, number: int, keys, own: str) -> DataFrame:
        columns = [F.lit(number).alias("__side")]
        columns += [F.col(_quoted(k)).cast(t).alias(f"__k{i}") for i, (k, t) in enumerate(zip(keys, key_types))]
        for prefix, fields in (("__in", inputs), ("__st", states)):
            columns += [(F.col(_quoted(f.name)) if prefix == own else F.lit(None).cast(f.dataType)).alias(f"{prefix}{j}")
                        for j, f in enumerate(fields)]
        return frame.select(*columns)

    both = side(df, 0, node.keys, "__in").union(side(initial, 1, node.initial_keys, "__st"))
    return both.repartition(partitions, *[F.col(f"__k{i}") for i in range(len(node.keys))])


def _operator_can_report(node: Watermark, df: DataFrame, operators, steps: tuple = ()) -> bool:
    """Whether the operator above can compute ``node``'s statistics from its rows (``df``:
    the watermark's): the ``steps`` between, replayed over ``df``, only project its rows and
    keep its event-time column as it is; an aggregation, dedup or applyInPandasWithState
    computes them from any event time; a join's task from a timestamp column (a window's
    end it leaves to an ``Observation``)."""
    if steps:
        projected = df
        for step in reversed(steps):
            projected = getattr(projected, step.method)(*step.args, **step.kwargs)
        if not spark_internals.projections_keep_column(projected, df, node.event_time):
            return False
    if not any(isinstance(op, StreamJoin) and node in (op.side_watermark(0), op.side_watermark(1))
               for op in operators):
        return True
    return _join_stats_column(node, df.schema) is not None


def _join_stats_column(node: Watermark, schema: StructType) -> int | None:
    """The index of a join side's watermarked timestamp column in the side's row, or None."""
    from pyspark.sql.types import TimestampNTZType, TimestampType
    names = [n.lower() for n in schema.fieldNames()]
    if node.event_time.lower() not in names:
        return None
    index = names.index(node.event_time.lower())
    return index if isinstance(schema.fields[index].dataType, (TimestampType, TimestampNTZType)) else None


def _event_time_stats_columns(watermark: Watermark) -> tuple:
    """Max, min, sum and count of the event time in ms, as partial aggregate columns."""
    ms = _ms_column(watermark.event_time)
    columns = (F.max(ms), F.min(ms), F.sum(ms.cast("double")), F.count(ms))
    return tuple(c.alias(f"__microbatch_event_time_{n}") for c, n in zip(columns, EVENT_TIME_STATS))


#: A row's session end, for the late-row filter of a session window aggregation.
SESSION_END_COLUMN = "__microbatch_session_end"

#: The column a row-filtering UDF answers in, dropped right after the filter.
KEEP_COLUMN = "__microbatch_keep"


def _row_filter_udf(task):
    """``task`` (Iterator[tuple of Arrow arrays] -> Iterator[boolean array]) as a
    nondeterministic scalar-iterator Arrow UDF: Spark evaluates it once per row, in
    the partition's task, and does not move filters across it."""
    import warnings
    from pyspark.sql.functions import ArrowUDFType, arrow_udf
    with warnings.catch_warnings():   # the UDF type is given, not inferred from type hints
        warnings.simplefilter("ignore", UserWarning)
        return arrow_udf(task, "boolean", ArrowUDFType.SCALAR_ITER).asNondeterministic()


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def state_operator_progress(node: StatefulNode, metrics: dict, num_partitions: int) -> dict:
    """One ``stateOperators`` entry with Spark's fields and order."""
    entry: dict[str, Any] = {"operatorName": operator_name(node)}
    for name in STATE_OPERATOR_FIELDS:
        entry[name] = int(metrics.get(name, 0))
    entry["numShufflePartitions"] = num_partitions
    entry["numStateStoreInstances"] = int(metrics.get("numStateStoreInstances", 0))
    known = set(STATE_OPERATOR_FIELDS) | {"numStateStoreInstances"}
    entry["customMetrics"] = {k: int(v) for k, v in sorted(metrics.items())
                              if k not in known and not k.startswith(("partition_", "set:"))}
    return entry


def committed_partitions(metrics: dict) -> set[int]:
    return {int(k[len("partition_"):]) for k in metrics if k.startswith("partition_")}


def state_schema(node: StatefulNode, child_schema: StructType) -> tuple[StructType, StructType]:
    """The key and value schema of an operator's state (Spark types), for the checkpoint."""
    from pyspark.sql.types import LongType, StructField
    if isinstance(node, Aggregate):
        fields = node.spec.partial_schema.fields
        count = len(node.spec.key_names)
        if node.session_index is None:
            return StructType(fields[:count]), StructType(fields[count:])
        # per key without the session: the list of its sessions, each with its buffers
        from pyspark.sql.types import ArrayType
        session = fields[node.session_index].dataType
        keys = [f for i, f in enumerate(fields[:count]) if i != node.session_index]
        sessions = StructType(list(session.fields) + list(fields[count:]))
        return StructType(keys), StructType([StructField("sessions", ArrayType(sessions))])
    if isinstance(node, StreamJoin):   # child_schema: (left, right)
        left, right = child_schema
        by_name = {f.name.lower(): f for f in left.fields}
        key = StructType([by_name[k.lower()] for k in node.keys])
        return key, StructType([StructField("left", left), StructField("right", right)])
    if isinstance(node, FlatMapGroupsWithState):
        by_lower = {f.name.lower(): f for f in child_schema.fields}
        key = StructType([by_lower[k.lower()] for k in node.keys])
        return key, StructType([StructField("groupState", node.state_schema),
                                StructField(TIMEOUT_FIELD, LongType(), False)])
    if isinstance(node, TransformWithState):
        by_lower = {f.name.lower(): f for f in child_schema.fields}
        key = StructType([by_lower[k.lower()] for k in node.keys])
        from pyspark.sql.types import ArrayType
        return key, StructType([StructField(v.name, state_value_type(v)) for v in node.variables]
                               + [StructField(TIMERS_STORE, ArrayType(LongType(), False))])
    if isinstance(node, StreamingLimit):
        from pyspark.sql.types import NullType
        return StructType([StructField("key", NullType())]), StructType([StructField("value", LongType())])
    by_name = {f.name: f for f in child_schema.fields}
    key = StructType([by_name[k] for k in node.keys])
    within = isinstance(node, Deduplicate) and node.within_watermark
    return key, StructType([StructField("expiresAtMicros", LongType(), False)] if within else [])


def schema_document(node: StatefulNode, key: StructType, value: StructType, history: list | None = None) -> str:
    """``state/<op>/_metadata/schema``: JSON text naming the operator and its schemas (a
    transformWithState whose schema evolved: with the earlier value schemas, oldest first)."""
    import json
    doc = {"version": 1, "operatorName": operator_name(node),
           "keySchema": key.jsonValue(), "valueSchema": value.jsonValue()}
    if history:
        doc["valueSchemaHistory"] = history
    if isinstance(node, StreamJoin):
        doc["joinType"] = node.how
    if isinstance(node, Aggregate):   # what the buffers mean: count(1) and sum(x) share a type
        doc["aggregates"] = [call.sql for call in node.spec.calls]
    if isinstance(node, TransformWithState):   # what the state reader's stateVarName reads
        doc["stateVariables"] = [{"name": v.name, "kind": v.kind, "ttl": v.ttl_ms is not None}
                                 for v in node.variables]
    return json.dumps(doc, sort_keys=True)


def schema_difference(stored: str, node: StatefulNode, key: StructType, value: StructType) -> str | None:
    """What differs between a stored schema document and the operator's schemas."""
    import json
    doc = json.loads(stored)
    found = []
    if doc.get("operatorName") != operator_name(node):
        found.append(f"the operator was {doc.get('operatorName')} and is now {operator_name(node)}")
    elif isinstance(node, StreamJoin) and doc.get("joinType", "inner") != node.how:
        found.append(f"the join was {doc.get('joinType', 'inner')} and is now {node.how}")
    elif isinstance(node, Aggregate) and "aggregates" in doc:   # (older checkpoints lack it)
        now = [call.sql for call in node.spec.calls]
        if doc["aggregates"] != now:
            found.append(f"the aggregates were {', '.join(doc['aggregates'])} and are now "
                         f"{', '.join(now)}: the state holds the old ones' buffers")
    for what, now in (("key", key), ("value", value)):
        before = StructType.fromJson(doc[f"{what}Schema"])
        if [(f.name, f.dataType) for f in before.fields] != [(f.name, f.dataType) for f in now.fields]:
            found.append(f"the {what} schema was {before.simpleString()} and is now {now.simpleString()}")
    return "; ".join(found) or None
