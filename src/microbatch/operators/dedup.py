"""Deduplication, its home: its plan node and policy, its step, its task, its state and
that state's layout in Spark's engine (``DedupLayout``, ``DedupWithinWatermarkLayout``).

``dropDuplicates`` and ``dropDuplicatesWithinWatermark`` (Spark's
``StreamingDeduplicateExec`` and ``StreamingDeduplicateWithinWatermarkExec``). The step
hash-partitions the rows by key into the state partitions; the task is a scalar-iterator Arrow UDF over the key columns (and the event-time
column): only those columns travel to Python, the rows stay in the JVM, and the
UDF answers one boolean per row, true for a row to keep (before Spark 4.1, which has no
Arrow UDFs, a ``mapInArrow`` of the whole rows: ``DedupRowsTask``). It opens the store of its
partition at version N (the batch id), keeps each row whose key it has not seen,
evicts, commits N+1 and adds its metrics to the operator's accumulator. Keys are
tuples of plain values; timestamps are int64 microseconds.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, NullType, StructField, StructType

from microbatch import spark_internals
from microbatch.operators.base import (KEEP_COLUMN, OperatorBatch, StatefulStep, StateLayout, StateTask, quoted,
                                       task_partition, row_filter_udf, store_field)
from microbatch.operators.event_time_stats import EventTimeStats
from microbatch.operators.spark_stores import SparkStore, values_mapped
from microbatch.plan.checks import unsupported_operation
from microbatch.plan.logical import Apply, PlanNode, StatefulNode, children_replaced

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Deduplicate(StatefulNode):
    """``dropDuplicates(keys)``: the first row of each key ever seen. With a watermark,
    rows whose event time is at or before it are dropped as late; with the event-time
    column among the keys, keys behind the watermark are also evicted (Spark's rules).

    ``within_watermark``: ``dropDuplicatesWithinWatermark(keys)``, where a key is kept
    until the watermark passes the event time of its first row plus the delay."""

    child: PlanNode
    keys: tuple[str, ...]
    within_watermark: bool = False
    #: the input's event-time column and its delay, as Spark's analysis marks it (the first
    #: column with ``spark.watermarkDelayMs``: a renamed event time too; none when the
    #: column was computed anew, ``ts + INTERVAL 1 SECOND AS ts``), found at definition
    marked_event_time: tuple[str, int] | None = None
    #: whether Spark's optimizer prunes the event time from the input of its Deduplicate
    #: (``dedups_times_pruned``): nothing above reads it and it is no key
    time_pruned: bool = False

    def event_time(self) -> tuple[str, int] | None:
        """The event-time column of this node's input and its watermark's delay."""
        return self.marked_event_time

    def exec_event_time(self) -> str | None:
        """The event time as Spark's StreamingDeduplicateExec sees it in its input: None
        where Spark's optimizer prunes it (ColumnPruning: a Deduplicate reads only its
        keys, so an event time that is no key and that nothing above reads never reaches
        the exec, which then drops no late row)."""
        found = self.event_time()
        return None if found is None or self.time_pruned else found[0]

    def watermark_column(self) -> str | None:
        found = self.event_time()
        if found and not self.within_watermark and found[0] in self.keys:
            return found[0]
        return None

    # -- its policy (plan.logical.StatefulNode) ----------------------------------------------
    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> "DedupStep":
        return DedupStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        return shuffle_partitions

    def output_watermark_ms(self, input_ms: int) -> int | None:
        return input_ms

    def evicts_with(self, output_mode: str) -> bool:
        return True

    def runs_every_batch(self) -> bool:
        return False

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        below = watermark_below(self.child)
        return {} if below is None else {0: below}

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        if self.within_watermark and self.event_time() is None:
            return unsupported_operation("dropDuplicatesWithinWatermark is not supported on streaming "
                                         "DataFrames/DataSets without watermark;")
        return None

    def affected_by_late_rows(self) -> bool:
        return self.watermark_column() is not None

    def connect_refusal(self, output_mode: str) -> str | None:
        return None     # (its task over the batch runs as the aggregation's does there)

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        return None

    def hidden_column_children(self) -> tuple[tuple[int, int | None], ...]:
        return ((0, None),)    # (its rows are its input's: Spark's Deduplicate keeps its child's metadataOutput)

    def scan_filter_stand_in(self) -> PlanNode:
        """A limit: a batch's optimizer makes a deduplication an aggregation and pushes
        filters on its keys through it; Spark's streaming Deduplicate stops them, as a limit
        does."""
        return Apply(self.child, lambda df: df.limit(2147483647), "deduplication")

    def pruning_stand_in(self) -> PlanNode:
        """The limit, over a repartition by the keys: Spark's streaming Deduplicate reads
        its keys, which a limit does not (a join below would find them pruned); within a
        watermark, its event time too."""
        keys = list(self.keys) + ([self.event_time()[0]] if self.within_watermark and self.event_time() else [])

        def stand_in(df: DataFrame) -> DataFrame:
            return df.repartition(*[F.col(quoted(k)) for k in keys or df.columns]).limit(2147483647)
        return Apply(self.child, stand_in, "deduplication")

    def build(self, inputs):
        df = self.child.build(inputs)
        if self.within_watermark:
            return df.dropDuplicatesWithinWatermark(list(self.keys))
        return df.dropDuplicates(list(self.keys))

    def describe(self) -> str:
        name = "DeduplicateWithinWatermark" if self.within_watermark else "Deduplicate"
        return f"{name} [{', '.join(self.keys)}]"


def dedups_times_pruned(plan: PlanNode, empty_inputs: Mapping[Any, DataFrame]) -> PlanNode:
    """A rewrite the planner makes once per run: each ``dropDuplicates`` whose event time
    (no key) Spark's optimizer prunes from its input (``time_pruned``), read from the
    query built as a batch (each stateful node what stands for it in Spark's optimizer,
    ``scan_filter_stand_in``; a deduplication also a repartition by its keys, marked by its
    number of partitions, so that its input is found in the optimized plan). Spark's
    ColumnPruning gives a Deduplicate an input of its keys and the columns read above
    it only (``rollup("k").count()`` over ``dropDuplicates(["k"])`` reads no ``ts``), and
    its exec drops late rows only by a watermarked column of its input."""
    asked = [n for n in plan.nodes() if isinstance(n, Deduplicate) and not n.within_watermark
             and n.event_time() is not None and n.event_time()[0] not in n.keys]
    if not asked:
        return plan
    marks = {node: _PRUNING_MARK + i for i, node in enumerate(asked)}
    inputs: dict[Deduplicate, list[DataFrame]] = {node: [] for node in asked}

    def batch_plan(node: PlanNode) -> PlanNode:
        replaced = children_replaced(node, [batch_plan(c) for c in node.children])
        if node in marks:
            def stand_in(df: DataFrame, node=node) -> DataFrame:
                inputs[node].append(df)
                keys = [F.col(quoted(k)) for k in node.keys]
                return df.repartition(marks[node], *keys).limit(2147483647)
            return Apply(replaced.child, stand_in, "deduplication")
        return replaced.scan_filter_stand_in() if replaced.stateful else replaced

    try:
        whole = batch_plan(plan).build(empty_inputs)
        pruned = spark_internals.pruned_below_repartitions(
            whole, [(inputs[node][-1], node.event_time()[0], marks[node]) for node in asked])
    except Exception:  # a plan that does not build as a batch: the deduplications stay as they are
        log.debug("No pruned event times read for the deduplications of %s", plan.describe(), exc_info=True)
        return plan
    found = {node for node, gone in zip(asked, pruned) if gone}
    if not found:
        return plan

    def with_pruned(node: PlanNode) -> PlanNode:
        replaced = children_replaced(node, [with_pruned(c) for c in node.children])
        if node in found:
            log.debug("%s: Spark's optimizer prunes its event time", node.describe())
            return dataclasses.replace(replaced, time_pruned=True)
        return replaced
    return with_pruned(plan)


#: the number of partitions of the repartition marking a deduplication's input in
#: ``dedups_times_pruned`` (plus the deduplication's index): one no query asks for
_PRUNING_MARK = 1_900_317


@dataclass(frozen=True)
class DedupTask(StateTask):
    """The per-partition function of a ``Deduplicate`` (shipped to tasks by cloudpickle).

    Its input columns are the key columns, in key order, then the event-time column
    when it is not a key. Spark's rules (``StreamingDeduplicateExec``,
    ``...WithinWatermarkExec``): a row whose event time is at or before the previous
    batch's watermark is late and dropped; a row whose key is in the store is a
    duplicate; otherwise its key is stored. After the rows, keys are evicted: by the
    event-time key (plain, when it is a key) or by the stored expiry, event time +
    delay (within watermark), at or before this batch's watermark.
    """

    key_schema: pa.Schema = None
    value_schema: pa.Schema = None
    event_time_index: int | None = None  # index among the input columns of the event time
    watermark_key: int | None = None     # index in the key of the event-time column
    expiry_delay_us: int | None = None   # within watermark: the delay
    late_us: int | None = None           # rows at or before this are late
    evict_us: int | None = None          # state at or before this is evicted
    event_time_stats: bool = False       # report the event-time statistics of the watermark below

    def __call__(self, batches: Iterator[Any]) -> Iterator[pa.Array]:
        """The whole partition at once, through the store's batch calls: a row is kept
        when ``insert_new`` finds its key new; then ``remove_at_or_below`` evicts."""
        partition = task_partition()
        store = self.store(partition, self.key_schema, self.value_schema)
        started = time.monotonic()
        lengths, chunks = [], []
        for columns in batches:   # the UDF may read ahead: it answers as many rows in the end
            columns = columns if isinstance(columns, (tuple, list)) else (columns,)
            lengths.append(len(columns[0]))
            chunks.append(columns)
        total = sum(lengths)
        width = len(chunks[0]) if chunks else len(self.key_schema)
        arrays = [pa.chunked_array([c[i] for c in chunks], type=chunks[0][i].type) if chunks
                  else pa.chunked_array([], self.key_schema[i].type) for i in range(width)]
        on_time = None
        late = 0
        times = None
        if chunks and self.event_time_index is not None:
            times = arrays[self.event_time_index].cast(pa.int64())
            if self.event_time_stats:
                stats = EventTimeStats()
                for chunk in times.chunks:
                    stats.add_micros(chunk)
                stats.report(self.metrics, partition)
            if self.late_us is not None:
                on_time = pc.invert(pc.fill_null(pc.less_equal(times, self.late_us), False))
                late = total - (pc.sum(on_time).as_py() or 0)
                if not late:
                    on_time = None
        keys = pa.table([arrays[i] for i in range(len(self.key_schema))], names=self.key_schema.names)
        values = None
        if self.expiry_delay_us is not None:
            values = pa.table([pc.add(times, self.expiry_delay_us) if times is not None
                               else pa.chunked_array([], pa.int64())], names=["expiry"])
        rows = np.arange(total, dtype=np.int64)
        if on_time is not None:
            keys, rows = keys.filter(on_time), rows[on_time.to_numpy(zero_copy_only=False)]
            values = values.filter(on_time) if values is not None else None
        new = store.insert_new(keys, values)
        keep = np.zeros(total, bool)
        keep[rows[new]] = True
        offset = 0
        for length in lengths:
            yield pa.array(keep[offset:offset + length], type=pa.bool_())
            offset += length
        inserted = int(np.count_nonzero(new))
        updates_ms = (time.monotonic() - started) * 1000
        started = time.monotonic()
        removed = read = 0
        if self.evict_us is not None and (self.expiry_delay_us is not None or self.watermark_key is not None):
            read = store.num_keys()   # every key is read, as in Spark
            if self.expiry_delay_us is not None:
                removed = store.remove_at_or_below(self.evict_us, value_field=0)
            else:
                removed = store.remove_at_or_below(self.evict_us, key_field=self.watermark_key)
        removals_ms = (time.monotonic() - started) * 1000
        store.commit()
        self.finish(partition, store.metrics(), numRowsUpdated=inserted, numRowsRemoved=removed,
                    allUpdatesTimeMs=int(updates_ms), allRemovalsTimeMs=int(removals_ms),
                    numRowsDroppedByWatermark=late, numDroppedDuplicateRows=keys.num_rows - inserted,
                    numRowsReadDuringEviction=read)


@dataclass(frozen=True)
class DedupRowsTask:
    """A ``DedupTask`` over whole rows, for Spark before 4.1 (no scalar Arrow UDFs): a
    ``mapInArrow`` of the partition's rows hands the task its columns, then yields the
    rows it keeps. The partition's rows are held until the task has answered them all
    (it answers after reading the whole partition anyway)."""

    task: DedupTask
    columns: tuple[int, ...]    # the task's input columns, as indexes of the row's columns
    #: where the task's metrics go: an accumulator, or over Spark Connect the in-band
    #: channel ``spark_internals.map_state_task`` puts here (``task`` carries none)
    metrics: Any = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = dataclasses.replace(self.task, metrics=self.metrics)
        batches = [b for b in batches if b.num_rows]
        keeps = list(task(tuple(b.column(i) for i in self.columns) for b in batches))
        for batch, keep in zip(batches, keeps):
            kept = batch.filter(keep)
            if kept.num_rows:
                yield kept


class DedupStep(StatefulStep):
    """Rows hash-partitioned by key; an Arrow UDF over the key columns answers, per row,
    whether to keep it (only the keys travel to Python)."""

    @property
    def name(self) -> str:
        return "dedupeWithinWatermark" if self.node.within_watermark else "dedupe"

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        node, df = self.node, inputs[0]
        schema: StructType = df.schema
        names = schema.fieldNames()
        indexes = tuple(names.index(k) for k in node.keys)
        fields = [store_field(schema.fields[i]) for i in indexes]
        event_time = node.event_time()
        late_column = event_time[0] if event_time and event_time[0] in names else None
        drops_late = late_column is not None and node.exec_event_time() is not None
        watermark = node.watermark_column()
        columns = list(node.keys)
        if late_column is not None and late_column not in columns:
            columns.append(late_column)
        below = batch.statistics_of.get(0)
        reports_event_time = below is not None and late_column is not None
        if reports_event_time:
            batch.reported[below] = ""
        task = DedupTask(
            self.state_root, self.operator_id, batch.batch_id, batch.store_conf, batch.metrics,
            key_schema=pa.schema(fields),
            value_schema=pa.schema([pa.field("expiresAtMicros", pa.int64())] if node.within_watermark else []),
            event_time_index=columns.index(late_column) if late_column else None,
            watermark_key=node.keys.index(watermark) if watermark else None,
            expiry_delay_us=event_time[1] * 1000 if node.within_watermark else None,
            late_us=batch.late_ms * 1000 if drops_late else None,
            evict_us=batch.eviction_ms * 1000 if event_time else None,
            event_time_stats=reports_event_time)
        keys, arguments = self.cached("columns", lambda: (
            [F.col(quoted(k)) for k in node.keys], [F.col(quoted(c)) for c in columns]))
        partitions = self.num_partitions
        if not spark_internals.has_arrow_udf() or not spark_internals.binds_plans(df):
            # (before Spark 4.1, no scalar Arrow UDFs; over Spark Connect, whose state tasks
            # report their metrics in band, a task over whole rows: map_state_task)
            def build_rows(inputs: list[DataFrame], task: DedupRowsTask):
                mapped = spark_internals.map_state_task(inputs[0].repartition(partitions, *keys), task, schema)
                return mapped, spark_internals.map_in_arrow_function(mapped, schema)

            rows_task = DedupRowsTask(dataclasses.replace(task, metrics=None), tuple(names.index(c) for c in columns),
                                      task.metrics)
            return self.bind([df], rows_task, build_rows)

        def build(inputs: list[DataFrame], task: DedupTask):
            keyed = inputs[0].repartition(partitions, *keys).withColumn(
                KEEP_COLUMN, row_filter_udf(task)(*arguments))
            function = spark_internals.projected_function(keyed, BooleanType())
            return keyed.filter(F.col(KEEP_COLUMN)).drop(KEEP_COLUMN), function

        return self.bind([df], task, build)

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        by_name = {f.name: f for f in input_schemas[0].fields}
        key = StructType([by_name[k] for k in self.node.keys])
        within = self.node.within_watermark
        return key, StructType([StructField("expiresAtMicros", LongType(), False)] if within else [])


# -- its state in Spark's engine (operators.spark_stores) ---------------------------------
_DUMMY = StructType([StructField("__dummy__", NullType(), True)])


def _null_value(_: tuple) -> tuple:
    return (None,)


def _no_value(_: tuple) -> tuple:
    return ()


class DedupLayout(StateLayout):
    """``dropDuplicates``: the key -> nothing (Spark: one null ``__dummy__``)."""

    names = ("dedupe",)
    known_as = "dropDuplicates"

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        return [SparkStore("default", key, value, key, _DUMMY, partial(values_mapped, _null_value),
                           partial(values_mapped, _no_value))]


class DedupWithinWatermarkLayout(StateLayout):
    """``dropDuplicatesWithinWatermark``: the key -> its expiry, in both engines."""

    names = ("dedupeWithinWatermark",)
    known_as = "dropDuplicatesWithinWatermark"

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list[SparkStore] | None:
        return [SparkStore("default", key, value, key, value)]
