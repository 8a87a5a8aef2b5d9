"""The step of a streaming aggregation in a batch: buffers per key in Spark, merged with
the state per partition (``task``), then finalised (``spec``)."""
from __future__ import annotations

import re

import pyarrow as pa
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StructField, StructType

from microbatch import spark_internals
from microbatch.operators.aggregate.spec import final_columns, finalize, grouped_partial, partial_columns
from microbatch.operators.aggregate.task import AggregateTask, SessionAggregateTask
from microbatch.operators.base import OperatorBatch, StatefulStep, ms_column, quoted, us_column
from microbatch.operators.event_time_stats import EVENT_TIME_STATS
from microbatch.plan.logical import rebound

#: A row's session end, for the late-row filter of a session window aggregation.
SESSION_END_COLUMN = "__microbatch_session_end"


def event_time_statistics_columns(event_time: str) -> tuple:
    """Max, min, sum and count of the event time in ms, as partial aggregate columns (the
    aggregate task reports them for the watermark below and strips them)."""
    ms = ms_column(event_time)
    columns = (F.max(ms), F.min(ms), F.sum(ms.cast("double")), F.count(ms))
    return tuple(c.alias(f"__microbatch_event_time_{n}") for c, n in zip(columns, EVENT_TIME_STATS))


#: Whether a row of a batch's buffers passes the aggregation's key filter, for its task.
KEPT_COLUMN = "__microbatch_kept"


def key_filtered(partial: DataFrame, key_filter, statistics: int) -> DataFrame:
    """``partial`` (a batch's buffers per key) without the keys ``key_filter`` rejects, as
    Spark filters the rows of grouping sets before their aggregation. With the event-time
    statistics (its last ``statistics`` columns, computed over every row, as Spark's
    watermark counts them below the filter), the task drops them after reading those: a
    boolean column before the statistics says which it keeps."""
    if not statistics:
        return partial.where(key_filter)
    columns = [F.col(quoted(c)) for c in partial.columns]
    kept = F.coalesce(key_filter, F.lit(False)).alias(KEPT_COLUMN)
    return partial.select(*columns[:-statistics], kept, *columns[-statistics:])


class AggregateStep(StatefulStep):
    """``groupBy(keys).agg(...)`` (Spark's StateStoreSaveExec, or
    SessionWindowStateStoreSaveExec for a session window)."""

    @property
    def name(self) -> str:
        return "stateStoreSave" if self.node.session_index is None else "sessionWindowStateStoreSaveExec"

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        node, df = self.node, inputs[0]
        spec = node.spec
        op = self.operator_id
        if node.session_index is not None and node.event_time_key is not None:
            # A row's session is late when it ends (event time + the row's gap) at or before
            # the previous batch's watermark: such rows are dropped before the batch's
            # sessions form. Spark's session_window rule drops rows whose gap is not positive.
            end = self.cached("session end", lambda: (
                node.keys[node.session_index].getField("end").alias(SESSION_END_COLUMN)))
            end = rebound(end, [(df, node.positions)])   # (a key bound to the frame's column)
            late = us_column(SESSION_END_COLUMN) <= F.lit(batch.late_ms * 1000)
            observation = Observation(f"microbatch_late_rows_{op}_{batch.batch_id}")
            batch.late_rows = observation
            # Spark drops them after the expansion into grouping sets: a late row counts once
            # per set that keeps its session (a set without it never reaches the sessions)
            copies = 1 if node.grouping is None else node.grouping.sets_with(node.keys, node.session_index)
            df = (df.select("*", end).observe(observation, (F.count(F.when(late, 1)) * copies).alias("late"))
                  .filter(~late | late.isNull()).drop(SESSION_END_COLUMN))
        watermark = batch.statistics_of.get(0)
        extra = ()
        if watermark is not None:
            extra = self.cached("event time statistics",
                                lambda: event_time_statistics_columns(watermark.event_time))
            batch.reported[watermark] = ""
        buffers, results = self.cached("aggregate", lambda: (
            partial_columns(spec.calls, spec.buffer_names), final_columns(spec)))
        # (over session windows too: Spark's optimizer runs the filter on the batch's rows
        # below the aggregation, before its sessions merge, as in the stream's plan; a set
        # without a session, which the merge refuses, never reaches it)
        key_filter = node.key_filter
        partition_keys = [k for i, k in enumerate(spec.key_names) if i != node.session_index]
        partition_columns = self.cached("partition", lambda: [F.col(quoted(k)) for k in partition_keys])
        arrow = [pa.field(f.name, spark_internals.arrow_type(f.dataType))
                 for f in spec.partial_schema.fields]
        num_keys = len(spec.key_names)
        merges, start = [], 0
        for call, names in zip(spec.calls, spec.buffer_names):
            merges.append((call.merge, start, len(names), call.options))
            start += len(names)
        has_watermark = node.event_time_key is not None
        output_schema = pa.schema([pa.field(f.name, spark_internals.arrow_type(f.dataType))
                                   for f in spec.merged_schema.fields])
        common = (self.state_root, op, batch.batch_id, batch.store_conf, batch.metrics)
        if node.session_index is not None:
            task = SessionAggregateTask(
                *common, key_fields=tuple(arrow[:num_keys]), session_index=node.session_index,
                buffer_fields=tuple(arrow[num_keys:]), merges=tuple(merges), output_schema=output_schema,
                mode=batch.output_mode, evict_us=batch.eviction_ms * 1000 if has_watermark else None)
        else:
            task = AggregateTask(
                *common, key_fields=tuple(arrow[:num_keys]), buffer_fields=tuple(arrow[num_keys:]),
                merges=tuple(merges), output_schema=output_schema,
                mode=batch.output_mode, watermark_key=node.event_time_key,
                watermark_is_window=node.event_time_is_window,
                late_us=batch.late_ms * 1000 if has_watermark else None,
                evict_us=batch.eviction_ms * 1000 if has_watermark else None,
                event_time_stats=watermark is not None, key_filtered=key_filter is not None and bool(extra))
        partitions = self.num_partitions
        nullable = batch.nullable_output

        def build(inputs: list[DataFrame], task: AggregateTask | SessionAggregateTask):
            partial = grouped_partial(inputs[0], rebound(node.keys, [(inputs[0], node.positions)]), spec.calls, spec.buffer_names, extra, buffers,
                                      **({} if node.grouping is None else {"grouping": node.grouping}))
            if key_filter is not None:
                partial = key_filtered(partial, key_filter, len(extra))
            if partition_keys:   # the state partition of a key is fixed: hash of the key, mod N
                partial = partial.repartition(partitions, *partition_columns)
            elif node.session_index is not None:
                partial = partial.repartition(1)
            mapped = spark_internals.map_state_task(partial, task, spec.merged_schema)
            result = finalize(mapped, spec, results)
            return (spark_internals.nullable_output(result) if nullable else result,
                    spark_internals.map_in_arrow_function(mapped, spec.merged_schema))

        return self.bind([df], task, build)

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        node = self.node
        fields = node.spec.partial_schema.fields
        count = len(node.spec.key_names)
        if node.session_index is None:
            return StructType(fields[:count]), StructType(fields[count:])
        # per key without the session: the list of its sessions, each with its buffers
        session = fields[node.session_index].dataType
        keys = [f for i, f in enumerate(fields[:count]) if i != node.session_index]
        sessions = StructType(list(session.fields) + list(fields[count:]))
        return StructType(keys), StructType([StructField("sessions", ArrayType(sessions))])

    def _document_extras(self) -> dict:
        # what the buffers mean: count(1) and sum(x) share a type; where the session window
        # is among the grouping columns (what Spark's rows of sessions hold, aggregate/spark_layout.py)
        extras = {"aggregates": [call.sql for call in self.node.spec.calls]}
        if self.node.session_index is not None:
            extras["sessionIndex"] = self.node.session_index
            session = self.node.spec.partial_schema.fields[self.node.session_index]
            extras["sessionColumn"] = session.name
            if session.metadata:   # (Spark's marks: spark.sessionWindow, the watermark's delay)
                extras["sessionMetadata"] = session.metadata
            extras["changesLogged"] = True   # (its tasks write the change feed's files since this version)
        return extras

    def _meaning_difference(self, doc: dict) -> list[str]:
        if "aggregates" not in doc:   # (older checkpoints lack it)
            return []
        now = [call.sql for call in self.node.spec.calls]
        if [_unquoted(sql) for sql in doc["aggregates"]] != [_unquoted(sql) for sql in now]:
            return [f"the aggregates were {', '.join(doc['aggregates'])} and are now "
                    f"{', '.join(now)}: the state holds the old ones' buffers"]
        return []


def _unquoted(sql: str) -> str:
    """An aggregate call's text without back quotes around plain names, as Spark prints
    them (``sum(v)``), and without casts of a name or a number (``CAST(1 AS BIGINT)``): a
    Spark Connect client's reads ``sum(`v`)`` and has no types to print the casts Spark's
    analysis adds (``w + 1`` of a bigint ``w``), and a checkpoint moves between the two;
    in lower case (the client printed cast types in lower case before)."""
    plain = re.sub(r"`([A-Za-z_][A-Za-z0-9_]*)`", r"\1", sql).lower()
    return re.sub(r"CAST\(([A-Za-z_][A-Za-z0-9_]*|-?[0-9.]+[A-Z]?) AS [A-Za-z]+(\([0-9, ]+\))?\)", r"\1", plain,
                  flags=re.IGNORECASE)
