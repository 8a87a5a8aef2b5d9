"""What every stateful operator's home builds on: the planning step, the state task, what
a batch hands the one to the other, and the layout of its state in a checkpoint, in both
engines (``StateLayout``).

An operator is three things, kept together in its own module:

- its **step** (a ``StatefulStep``), made once per query run by the planner
  (``runtime.incremental``): it builds the operator's part of each batch's DataFrame,
  the Spark steps around the Python task that runs on the state store (partial
  aggregation, repartition by key, ``mapInArrow``, final columns). The Spark steps are
  analysed once per run and each batch binds its input and its own task
  (``PreparedStep``), as Spark's IncrementalExecution gives each batch's stateful operators
  their state version and watermarks in an unchanged plan;
- its **task** (a ``StateTask``), the function each Spark task runs per state partition:
  it opens the partition's store at version N (the batch id), changes it, commits version
  N+1 and adds its metrics to the operator's accumulator. A task run twice (the sink read
  the batch twice, a retried task) steps the store back to version N and commits the same
  N+1 again;
- its **state schema**, the key and value of its store (``StatefulStep.state_schema``),
  kept in ``state/<op>/_metadata/schema`` and checked at a restart; and, for what reads a
  checkpoint without the query, that state's layout under the names its schema file gives
  the operator, in microbatch's files and Spark's (a ``StateLayout``).

Two watermarks apply in batch N, as in Spark: rows at or before the *previous* batch's
watermark are late (dropped, counted as ``numRowsDroppedByWatermark``), and state at or
before *this* batch's watermark is evicted (``OperatorBatch.late_ms``, ``eviction_ms``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
from pyspark import AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.planted_bugs import planted
from microbatch.state.files import StateFiles, storage_type
from microbatch.state.store import (StateStore, StateStoreConf, StateStoreId, StateStoreMetrics,
                                    load_provider, task_metrics)
from microbatch.state.worker_heap import begin_task, end_task

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


def state_operator_progress(name: str, metrics: dict, state_partitions: int, shuffle_partitions: int) -> dict:
    """One ``stateOperators`` entry with Spark's fields and order (the name and the
    shuffle partitions as the running Spark reports them)."""
    entry: dict[str, Any] = {"operatorName": spark_internals.progress_operator_name(
        name, state_layout(name).unnamed_in_progress_before_4)}
    for key in STATE_OPERATOR_FIELDS:
        entry[key] = int(metrics.get(key, 0))
    instances = int(metrics.get("numStateStoreInstances", 0))
    entry["numShufflePartitions"] = spark_internals.progress_shuffle_partitions(
        state_partitions, shuffle_partitions, instances)
    entry["numStateStoreInstances"] = instances
    known = set(STATE_OPERATOR_FIELDS) | {"numStateStoreInstances"}
    entry["customMetrics"] = {k: int(v) for k, v in sorted(metrics.items())
                              if k not in known and not k.startswith(("partition_", "set:"))}
    return entry


def committed_partitions(metrics: dict) -> set[int]:
    """The state partitions whose task committed, from an operator's metrics."""
    return {int(k[len("partition_"):]) for k in metrics if k.startswith("partition_")}


# -- the task --------------------------------------------------------------------------------
def task_partition() -> int:
    """The state partition of the running Spark task: its partition number (the planner
    ends a stage with an exchange where a union would offset it: ``_own_stage``)."""
    from pyspark import TaskContext
    partition = TaskContext.get().partitionId()
    return partition + 1 if planted(None, "partition-shift") else partition


@dataclass(frozen=True)
class StateTask:
    """What every state task carries (shipped to Spark's Python workers by cloudpickle):
    where its operator's state is, the version it reads (the batch id), the store confs
    and the operator's accumulator. It opens its partition's stores and ends with
    ``finish`` (the metrics to the accumulator, the worker's heap settled)."""

    state_root: str                    # <checkpoint>/state
    operator_id: int
    version: int                       # the batch id: read version N, commit N+1
    conf: StateStoreConf
    metrics: Any                       # an Accumulator of DictSum

    def store(self, partition: int, key_schema: pa.Schema, value_schema: pa.Schema,
              name: str = "default") -> StateStore:
        """The partition's store ``name`` at this batch's version."""
        begin_task()
        store_id = StateStoreId(self.state_root, self.operator_id, partition, name)
        return load_provider(store_id, key_schema, value_schema, self.conf).get_store(self.version)

    def log_changes(self, partition: int, key_schema: pa.Schema, value_schema: pa.Schema,
                    changes: list[tuple[str, tuple, tuple]], name: str = "default") -> None:
        """This version's changes as Spark's store made them (``StateLayout.logs_changes``:
        the operator's rows are not Spark's), beside the store's files, before its commit:
        a retried task writes them again."""
        if changes:
            store_id = StateStoreId(self.state_root, self.operator_id, partition, name)
            StateFiles(store_id, key_schema, value_schema, self.conf).write_changes(self.version + 1, changes)

    def log_change_table(self, partition: int, key_schema: pa.Schema, value_schema: pa.Schema,
                         kinds: pa.Array, keys: pa.Table, values: pa.Table, name: str = "default") -> None:
        """``log_changes`` from Arrow: a row a change, its kind, key columns and value columns."""
        if len(kinds):
            store_id = StateStoreId(self.state_root, self.operator_id, partition, name)
            StateFiles(store_id, key_schema, value_schema, self.conf).write_change_table(
                self.version + 1, kinds, keys, values)

    def finish(self, partition: int, store_metrics: StateStoreMetrics, **counts) -> None:
        """The task's metrics to the operator's accumulator (Spark's progress fields, the
        provider's custom metrics, the partition that committed), then the worker's heap."""
        end_task(self.metrics, task_metrics(partition, store_metrics, **counts))


# -- the step ---------------------------------------------------------------------------------
@dataclass
class OperatorBatch:
    """What a stateful step gets for one batch, and what it leaves for the runtime to
    collect after the sink ran."""

    batch_id: int
    batch_timestamp_ms: int
    late_ms: int                       # rows at or before this are late
    eviction_ms: int                   # state at or before this is evicted
    output_mode: str
    store_conf: StateStoreConf
    metrics: Any                       # the operator's accumulator
    #: the watermark right below each input (by input index) whose event-time statistics
    #: this step may compute in its task, where the WatermarkTracker chose to leave them to it
    statistics_of: dict = field(default_factory=dict)
    # -- collected after the batch --------------------------------------------------------
    #: watermark -> the tag under which the task reports its statistics (``event_time_stats``)
    reported: dict = field(default_factory=dict)
    #: rows dropped as late before the task, counted by an Observation (session windows)
    late_rows: Any = None
    #: the step's output columns are all nullable (Spark 4.3's
    #: statefulOperator.alwaysNullableOutput, as the checkpoint fixed it)
    nullable_output: bool = False


class PreparedStep:
    """A stateful step's Spark steps, analysed by Spark once per run and bound to each
    batch's inputs and task.

    ``build(inputs, task)`` makes the step's DataFrame over ``inputs`` and returns it with
    the reference of the task's Python function in it (``spark_internals.PythonFunctionRef``).
    It is called once, over an empty placeholder per input; a batch then binds its inputs
    and its own task (``bind``): one DataFrame a batch instead of one per Spark step."""

    def __init__(self, inputs: list[DataFrame], task: Any, build):
        empties = [spark_internals.empty_dataframe(df.sparkSession, df.schema) for df in inputs]
        step, function = build(empties, task)
        self.plan = spark_internals.BindablePlan(spark_internals.analyzed_plan(step),
                                                 [spark_internals.analyzed_plan(df) for df in empties],
                                                 {"task": function})

    def bind(self, inputs: list[spark_internals.BatchInput], task: Any) -> DataFrame:
        return self.plan.bind(inputs, {"task": task})


class StatefulStep:
    """The planning step of one stateful operator for a query run (made by the planner).

    ``build(inputs, batch)`` gives the operator's DataFrame over its inputs' DataFrames for
    one batch; ``state_schema(input_schemas)`` the key and value schema of its state."""

    #: Spark's name of the operator, in progress and in its state schema file
    name = ""

    def __init__(self, node: Any, operator_id: int, state_root: str, num_partitions: int):
        self.node = node
        self.operator_id = operator_id
        self.state_root = state_root            # <checkpoint>/state
        self.num_partitions = num_partitions    # the run's shuffle partitions
        #: what does not change from batch to batch, made once: Column objects (building
        #: one costs a round trip into Spark or more) and the steps analysed once (``bind``)
        self._cache: dict = {}
        self._columns_keys = spark_internals.ColumnsKeys()

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        raise NotImplementedError

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        raise NotImplementedError

    def schema_document(self, key: StructType, value: StructType, history: list | None = None) -> str:
        """``state/<op>/_metadata/schema``: JSON text naming the operator and its schemas."""
        doc = {"version": 1, "operatorName": self.name, "keySchema": key.jsonValue(),
               "valueSchema": value.jsonValue(), **self._document_extras()}
        if history:
            doc["valueSchemaHistory"] = history
        return json.dumps(doc, sort_keys=True)

    def _document_extras(self) -> dict:
        """What the schema file records besides the schemas (what the state means)."""
        return {}

    def schema_difference(self, doc: dict, key: StructType, value: StructType) -> str | None:
        """What differs between a stored schema document and the operator's schemas."""
        found = []
        if doc.get("operatorName") != self.name:
            found.append(f"the operator was {doc.get('operatorName')} and is now {self.name}")
        else:
            found += self._meaning_difference(doc)
        for what, now in (("key", key), ("value", value)):
            before = StructType.fromJson(doc[f"{what}Schema"])
            if [(f.name, f.dataType) for f in before.fields] != [(f.name, f.dataType) for f in now.fields]:
                found.append(f"the {what} schema was {before.simpleString()} and is now {now.simpleString()}")
        return "; ".join(found) or None

    def check_state_conf(self, conf: Any) -> None:
        """Refuse, at start, a state the checkpoint's confs (``conf``: the batch session's)
        cannot keep (a transformWithState's encoding)."""

    def stored_schema_check(self, stored: dict, key: StructType, value: StructType,
                            conf: Any) -> tuple[str | None, str | None]:
        """Against the schema file its state was written with (``stored``): what differs
        (None: the state fits), and the document to write if the schema evolved as Spark
        allows (None: it did not)."""
        return self.schema_difference(stored, key, value), None

    def _meaning_difference(self, doc: dict) -> list[str]:
        """Differences of what the state means (the join type, the aggregates)."""
        return []

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per run."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def bind(self, inputs: list[DataFrame], task: Any, build) -> DataFrame:
        """The Spark steps ``build`` over this batch's ``inputs``, running this batch's
        ``task``: analysed once per run (again only if an input's columns change) and bound
        to each batch's inputs and task. A step that cannot be prepared is built step by
        step every batch."""
        if not spark_internals.binds_plans(inputs[0]):   # Spark Connect: the server analyses each batch
            return build(inputs, task)[0]
        given = [spark_internals.BatchInput(df) for df in inputs]
        prepared_key = ("prepared", self._columns_keys.key(given))
        prepared = self._cache.get(prepared_key)
        if prepared is None:
            try:
                prepared = PreparedStep(inputs, task, build)
            except Exception:  # e.g. a Spark whose plans differ: build it per batch
                log.warning("Cannot prepare the stateful step %s once per run; building it every "
                            "batch", self.name, exc_info=True)
                prepared = False
            self._cache[prepared_key] = prepared
        if prepared is False:
            return build(inputs, task)[0]
        return prepared.bind(given, task)

    def map_by_keys(self, partition_columns: list, output: StructType):
        """A ``build`` for ``bind``: rows hash-partitioned by ``partition_columns`` into the
        state partitions, then the task."""
        partitions = self.num_partitions

        def build(inputs: list[DataFrame], task: Any):
            mapped = spark_internals.map_state_task(inputs[0].repartition(partitions, *partition_columns), task, output)
            return mapped, spark_internals.map_in_arrow_function(mapped, output)
        return build


# -- helpers of the steps --------------------------------------------------------------------
def store_field(field_: Any) -> pa.Field:
    """The Arrow field a Spark column is stored as (``state.files.storage_type``)."""
    return pa.field(field_.name, storage_type(spark_internals.arrow_type(field_.dataType)))


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def us_column(name: str):
    """A timestamp column as µs since the epoch."""
    return F.expr(f"unix_micros(CAST({quoted(name)} AS TIMESTAMP))")


def ms_column(name: str):
    """A timestamp column as ms since the epoch."""
    return F.expr(f"unix_micros(CAST({quoted(name)} AS TIMESTAMP)) div 1000")


#: The column a row-filtering UDF answers in, dropped right after the filter.
KEEP_COLUMN = "__microbatch_keep"


def row_filter_udf(task):
    """``task`` (Iterator[tuple of Arrow arrays] -> Iterator[boolean array]) as a
    nondeterministic scalar-iterator Arrow UDF: Spark evaluates it once per row, in
    the partition's task, and does not move filters across it."""
    import warnings
    from pyspark.sql.functions import ArrowUDFType, arrow_udf
    with warnings.catch_warnings():   # the UDF type is given, not inferred from type hints
        warnings.simplefilter("ignore", UserWarning)
        return arrow_udf(task, "boolean", ArrowUDFType.SCALAR_ITER).asNondeterministic()


# -- the layout of its state in a checkpoint, in both engines -------------------------------
#: Each operator's ``StateLayout``, by the name its schema file gives it (``state_layouts``)
_LAYOUTS: dict[str, type["StateLayout"]] = {}
_homes_imported = False


class StateLayout:
    """How an operator's state is laid out in a checkpoint, in microbatch's files and in
    Spark's engine's (docs/porting.md), for what reads a checkpoint without the query's plan
    (the conversions, the state reader, the checkpoint toolkit, progress): the schema-file
    names it answers for (``StatefulStep.name``), its stores in both engines, and what those
    readers ask of them. An operator's home declares it beside its
    step (a package home in its ``spark_layout`` module, a module home in itself), and the
    subclass registers itself under its ``names`` when it is defined. An operator whose
    state does not move between the engines declares none; the answers of this class are
    the ones it then gets (``state_layout``)."""

    #: the names its schema file gives the operator (Spark's names of the operator)
    names: tuple[str, ...] = ()
    #: the operator as users know it (naming what moves, in a refusal)
    known_as = ""
    #: its state is in Spark's RocksDB column families, one per state variable, not in
    #: stores (a transformWithState's: its home converts them)
    in_column_families = False
    #: its state is one partition's, whatever its key (a limit's null key)
    one_partition = False
    #: its schema file's key and value are those of its one store, ``default`` (not a
    #: join's four stores, a transformWithState's one per state variable)
    one_store = True
    #: the state reader shows Spark's rows, microbatch's being reshaped (a session window's)
    read_as_spark = False
    #: its task logs each version's changes as Spark's store made them (``StateTask.
    #: log_changes``), which its own rows cannot tell: the state reader's change feed reads
    #: them (a session window's: a key's sessions updated then evicted in one batch)
    logs_changes = False
    #: the sides the state reader reads one at a time (option ``joinSide``: ``side_store``)
    sides: tuple[str, ...] = ()
    #: Spark 3.5 gives it no short name in progress (``defaultName``)
    unnamed_in_progress_before_4 = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.names:
            known = _LAYOUTS.get(name, cls)
            if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
                raise TypeError(f"The schema-file name {name} has a layout already: {known.__qualname__}")
            _LAYOUTS[name] = cls

    @classmethod
    def stores(cls, name: str, key: StructType, value: StructType, extras: dict) -> list | None:
        """Its stores in both engines (``operators.spark_stores.SparkStore``), given the
        schema-file name, its state schema (``StatefulStep.state_schema``) and what its
        schema file records besides (``StatefulStep._document_extras``), or None when its
        state does not move as stores (the schema file of an earlier microbatch lacks what
        Spark's rows need; none declared)."""
        return None

    @classmethod
    def side_store(cls, side: str, key: StructType, value: StructType) -> tuple[str, StructType, StructType]:
        """One of ``sides``: the store the state reader reads, and the key and value it shows."""
        raise NotImplementedError


def _import_homes() -> None:
    """Every operator's home (a package home's ``spark_layout`` module, a module home), once:
    its ``StateLayout`` registers when it is defined."""
    global _homes_imported
    if not _homes_imported:
        import importlib
        import importlib.util
        import pkgutil

        import microbatch.operators as operators
        for module in pkgutil.iter_modules(operators.__path__, "microbatch.operators."):
            name = f"{module.name}.spark_layout" if module.ispkg else module.name
            if not module.ispkg or importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        _homes_imported = True


def state_layouts() -> dict[str, type[StateLayout]]:
    """Every operator's ``StateLayout`` by schema-file name, in the order of their homes'
    modules."""
    _import_homes()
    return dict(sorted(_LAYOUTS.items(), key=lambda item: item[1].__module__))


def state_layout(operator_name: str | None) -> type[StateLayout]:
    """The ``StateLayout`` of the operator its schema file names so (``StateLayout`` itself
    for a name none declares)."""
    _import_homes()
    return _LAYOUTS.get(operator_name or "", StateLayout)
