"""Offline state repartitioning: rewrite a stopped query's state into N partitions.

``microbatch checkpoint state repartition CKPT --partitions N``, or from Python
``ss._streamingCheckpointManager.repartition(ckpt, N)`` (PySpark 4.2+'s
``StreamingCheckpointManager``, same arguments), as Spark's OfflineStateRepartitionRunner:

1. The last batch must be committed (else Spark's
   ``STATE_REPARTITION_INVALID_CHECKPOINT.LAST_BATCH_FAILED``; with
   ``enforce_exactly_once_sink=False`` its uncommitted batches are skipped with empty
   commits, and their input is read again by the next run). A last batch that is an
   unfinished repartition to the same N is finished; to another N it is refused
   (``LAST_BATCH_ABANDONED_REPARTITION``). Asking for the partitions the checkpoint has is
   refused (``SHUFFLE_PARTITIONS_ALREADY_MATCH``).
2. The repartition batch ``B = last + 1`` is written to the offset log: the offsets of the
   last committed batch ``L``, with ``spark.sql.shuffle.partitions`` = N. It reads no input.
3. Every stateful operator's state after batch L (version L+1) is read in Spark tasks
   (one per partition and store, through the checkpoint's state store provider),
   hash-partitioned by the same columns and the same hash (``repartition(N, key columns)``,
   Spark's Murmur3) as the engine partitions the operator's rows, and written by a task
   per new partition as version B+1's snapshot, for every partition 0..N-1 (empty ones
   too). Operators with one state partition (a global aggregation, a limit) keep it.
4. ``commits/B`` is written with L's commit. The next run continues at B+1 with N
   partitions and the same answers.

A restart that finds B planned but not committed is refused with Spark's
``STREAMING_UNFINISHED_REPARTITION_DETECTED``: run the repartition again to finish it.
Older versions stay, so ``rollback`` to a batch before B restores the old partitions.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from microbatch import spark_internals
from microbatch.checkpoint.commits import CommitMetadata
from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqMetadata
from microbatch.checkpoint.run_lease import RunLease
from microbatch.errors import CheckpointError
from microbatch.operators.base import state_layout
from microbatch.ops.checkpoint_reader import SHUFFLE_PARTITIONS, CheckpointReader
from microbatch.state.files import StateFiles, from_struct_array, to_struct_array
from microbatch.state.store import (DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, SPARK_HDFS_PROVIDER,
                                    SPARK_ROCKSDB_PROVIDER, StateStoreConf, StateStoreId, provider_class)

log = logging.getLogger(__name__)

INVALID_CHECKPOINT = "STATE_REPARTITION_INVALID_CHECKPOINT"
_KEY_PREFIX = "__partition_key_"


def _invalid(location: str, sub_class: str, **parameters: Any):
    return spark_internals.spark_error("SparkIllegalStateException", f"{INVALID_CHECKPOINT}.{sub_class}",
                                       checkpointLocation=location, **parameters)


def is_repartition_batch(ckpt: CheckpointReader, batch_id: int) -> bool:
    """Spark's rule: a batch whose shuffle partitions differ from the batch before it."""
    if batch_id <= 0:
        return False
    now, before = ckpt.shuffle_partitions(batch_id), ckpt.shuffle_partitions(batch_id - 1)
    return now is not None and before is not None and now != before


def repartition(spark: SparkSession, location: str, num_partitions: int,
                enforce_exactly_once_sink: bool = True, settings: dict[str, str] | None = None) -> int:
    """Repartition the state of the checkpoint at ``location``; return the repartition
    batch's id. The query must not run (its run lease is taken meanwhile)."""
    if location is None:
        raise spark_internals.spark_error("SparkIllegalArgumentException",
                                          "STATE_REPARTITION_INVALID_PARAMETER.IS_NULL",
                                          parameter="checkpointLocation")
    if not str(location).strip():
        raise spark_internals.spark_error("SparkIllegalArgumentException",
                                          "STATE_REPARTITION_INVALID_PARAMETER.IS_EMPTY",
                                          parameter="checkpointLocation")
    if num_partitions <= 0:
        raise spark_internals.spark_error("SparkIllegalArgumentException",
                                          "STATE_REPARTITION_INVALID_PARAMETER.IS_NOT_GREATER_THAN_ZERO",
                                          parameter="numPartitions")
    if settings is None:
        settings = spark_internals.session_settings(spark)
    ckpt = CheckpointReader(location, settings)
    lease = RunLease(ckpt.fs, ckpt.root, ckpt.query_id() or "", f"repartition-{uuid.uuid4()}")
    lease.acquire()   # refused while the query runs; a start meanwhile is refused
    try:
        return _run(spark, ckpt, location, num_partitions, enforce_exactly_once_sink)
    finally:
        lease.release()


def _run(spark: SparkSession, ckpt: CheckpointReader, location: str, num_partitions: int,
         enforce: bool) -> int:
    committed = ckpt.commits.batch_ids()
    planned = ckpt.offsets.batch_ids()
    if not planned:
        raise _invalid(location, "NO_BATCH_FOUND")
    if not committed:
        raise _invalid(location, "NO_COMMITTED_BATCH")
    last, last_committed = planned[-1], committed[-1]
    written = _provider(ckpt, last_committed)
    if written in (SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER):
        raise CheckpointError(
            f"Cannot repartition the state of checkpoint '{location}': its state was last written by "
            f"Spark's engine ({written}), in files this tool does not rewrite. Nothing was changed. Run "
            "the query on microbatch once (it adopts Spark's state, docs/porting.md) and repartition "
            "then, or use Spark's own offline repartition.")
    if last == last_committed:
        new_batch = _new_batch(ckpt, location, last, last_committed, num_partitions)
    elif is_repartition_batch(ckpt, last):
        partitions = ckpt.shuffle_partitions(last)
        if partitions != num_partitions:
            raise _invalid(location, "LAST_BATCH_ABANDONED_REPARTITION", lastBatchId=last,
                           lastBatchShufflePartitions=partitions, numPartitions=num_partitions)
        log.info("The last batch %d is a repartition batch that did not finish: finishing it", last)
        new_batch = last
    elif enforce:
        raise _invalid(location, "LAST_BATCH_FAILED", lastBatchId=last)
    else:
        for skipped in range(last_committed + 1, last + 1):
            if not ckpt.commits.add(skipped, CommitMetadata()):
                raise spark_internals.spark_error("SparkRuntimeException", "CONCURRENT_STREAM_LOG_UPDATE",
                                                  batchId=skipped)
        log.info("Skipped the uncommitted batches %d..%d", last_committed + 1, last)
        new_batch = _new_batch(ckpt, location, last, last_committed, num_partitions)
    _rewrite_state(spark, ckpt, read_version=last_committed + 1, write_version=new_batch + 1,
                   old_partitions=ckpt.shuffle_partitions(last_committed), num_partitions=num_partitions,
                   provider=_provider(ckpt, last_committed))
    if not ckpt.commits.add(new_batch, ckpt.commits.get(last_committed)):
        raise spark_internals.spark_error("SparkRuntimeException", "CONCURRENT_STREAM_LOG_UPDATE",
                                          batchId=new_batch)
    log.info("Repartitioned the state of checkpoint %s to %d partitions in batch %d",
             ckpt.root, num_partitions, new_batch)
    return new_batch


def _new_batch(ckpt: CheckpointReader, location: str, last: int, last_committed: int,
               num_partitions: int) -> int:
    seq = ckpt.offsets.get(last_committed)
    if seq is None:
        raise _invalid(location, "OFFSET_SEQ_NOT_FOUND", batchId=last_committed)
    if ckpt.shuffle_partitions(last_committed) == num_partitions:
        raise _invalid(location, "SHUFFLE_PARTITIONS_ALREADY_MATCH", batchId=last_committed,
                       numPartitions=num_partitions)
    metadata = OffsetSeqMetadata(seq.metadata.batch_watermark_ms, seq.metadata.batch_timestamp_ms,
                                 {**seq.metadata.conf, SHUFFLE_PARTITIONS: str(num_partitions)},
                                 seq.metadata.source_metadata_info)
    new_batch = last + 1
    if not ckpt.offsets.add(new_batch, OffsetSeq(seq.offsets, metadata, seq.source_ids)):
        raise spark_internals.spark_error("SparkRuntimeException", "CONCURRENT_STREAM_LOG_UPDATE",
                                          batchId=new_batch)
    return new_batch


def _provider(ckpt: CheckpointReader, batch_id: int) -> str:
    seq = ckpt.offsets.get(batch_id)
    return (seq.metadata.conf if seq else {}).get(PROVIDER_CLASS_CONF, DEFAULT_PROVIDER)


def _rewrite_state(spark: SparkSession, ckpt: CheckpointReader, read_version: int, write_version: int,
                   old_partitions: int, num_partitions: int, provider: str) -> None:
    """Every operator's state of ``read_version`` in its ``old_partitions`` (the ones the last
    committed batch used: a repartition cut short may have left others), written as
    ``write_version`` in ``num_partitions``."""
    for operator in ckpt.operators():
        doc = ckpt.schema_document(operator)
        if doc is None:
            raise _invalid(ckpt.root, "UNSUPPORTED_STATEFUL_OPERATOR",
                           operatorName=f"operator {operator} (its state was not written by microbatch)")
        single = not doc["keySchema"].get("fields") or state_layout(doc["operatorName"]).one_partition
        key_count = len(doc["keySchema"].get("fields", []))
        stores = ckpt.stores(operator)
        for store_name in sorted({s.store for s in stores}):
            sources = [s for s in stores if s.store == store_name and s.files
                       and s.partition < (1 if single else old_partitions)]
            if not sources:
                continue
            schema = _file_schema(ckpt, sources)
            task = _StoreTask(ckpt.fs.spec(), f"{ckpt.root}/state", operator, store_name, schema,
                              read_version, write_version, key_count, provider)
            targets = 1 if single else num_partitions
            _rewrite_store(spark, task, [s.partition for s in sources], targets)


def _file_schema(ckpt: CheckpointReader, stores) -> pa.Schema:
    import pyarrow.ipc as ipc
    store = stores[0]
    version = max(store.files)
    kind = sorted(store.files[version] - {"changes"})[0]   # (a state file, not the change feed's)
    return ipc.open_stream(pa.py_buffer(ckpt.fs.read_bytes(store.file(version, kind)))).schema


class _StoreTask:
    """Reads a store's partitions at one version and writes the new partitions' snapshots
    (runs in Spark tasks: the storage is shipped as its spec)."""

    def __init__(self, storage: tuple, state_root: str, operator: int, store: str, schema: pa.Schema,
                 read_version: int, write_version: int, key_count: int, provider: str):
        self.storage, self.state_root, self.operator, self.store = storage, state_root, operator, store
        self.key_type: pa.StructType = schema.field("key").type
        self.value_type: pa.StructType = schema.field("value").type
        self.read_version, self.write_version = read_version, write_version
        self.key_count, self.provider = key_count, provider

    def conf(self) -> StateStoreConf:
        return StateStoreConf(storage=self.storage, provider_class=self.provider)

    def rows_schema(self) -> pa.Schema:
        partition_keys = [pa.field(f"{_KEY_PREFIX}{i}", self.key_type[i].type)
                          for i in range(self.key_count)]
        return pa.schema(partition_keys + [pa.field("key", self.key_type), pa.field("value", self.value_type)])

    def read(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """For each old partition id in the input: its rows at ``read_version``."""
        schema = self.rows_schema()
        key_schema, value_schema = pa.schema(list(self.key_type)), pa.schema(list(self.value_type))
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                store_id = StateStoreId(self.state_root, self.operator, partition, self.store)
                provider = provider_class(self.provider)(store_id, key_schema, value_schema, self.conf())
                try:
                    rows = list(provider.get_store(self.read_version).iterator())
                finally:
                    provider.close()
                if not rows:
                    continue
                keys = to_struct_array([k for k, _ in rows], key_schema)
                values = to_struct_array([v for _, v in rows], value_schema)
                columns = [keys.field(i) for i in range(self.key_count)] + [keys, values]
                yield pa.RecordBatch.from_arrays(columns, schema=schema)

    def write(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The rows of one new partition, written as its snapshot; yields (partition, rows)."""
        from pyspark import TaskContext
        partition = TaskContext.get().partitionId()
        keys, values = [], []
        for batch in batches:
            keys += from_struct_array(batch.column("key"), keys=True)
            values += from_struct_array(batch.column("value"))
        files = StateFiles(StateStoreId(self.state_root, self.operator, partition, self.store),
                           pa.schema(list(self.key_type)), pa.schema(list(self.value_type)), self.conf())
        files.write_rows(self.write_version, "snapshot", keys, values)
        yield pa.RecordBatch.from_pydict({"partition": [partition], "rows": [len(keys)]},
                                         schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64())]))


def _rewrite_store(spark: SparkSession, task: _StoreTask, old_partitions: list[int], targets: int) -> None:
    rows_type = from_arrow_schema(task.rows_schema())
    old = spark.createDataFrame([(p,) for p in old_partitions], "partition INT").repartition(
        max(1, len(old_partitions)))
    rows = old.mapInArrow(task.read, rows_type)
    if task.key_count and targets > 1:
        rows = rows.repartition(targets, *[F.col(f"{_KEY_PREFIX}{i}") for i in range(task.key_count)])
    else:
        rows = rows.repartition(1)
    written = {r["partition"] for r in rows.mapInArrow(task.write, "partition INT, rows LONG").collect()}
    for partition in range(targets):
        if partition not in written:   # a partition no key hashes to: an empty snapshot
            StateFiles(StateStoreId(task.state_root, task.operator, partition, task.store),
                       pa.schema(list(task.key_type)), pa.schema(list(task.value_type)),
                       task.conf()).write_rows(task.write_version, "snapshot", [], [])


class StreamingCheckpointManager:
    """PySpark's ``StreamingCheckpointManager`` (``spark._streamingCheckpointManager``) for
    microbatch's checkpoints."""

    def __init__(self, spark: SparkSession):
        self._spark = spark

    def repartition(self, checkpoint_location: str, num_partitions: int,
                    enforce_exactly_once_sink: bool = True) -> None:
        repartition(self._spark, checkpoint_location, num_partitions, enforce_exactly_once_sink)
