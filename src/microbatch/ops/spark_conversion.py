"""A checkpoint microbatch wrote, made one Spark's engine resumes:
``microbatch checkpoint convert CKPT --to spark`` (docs/porting.md).

Spark's engine reads microbatch's logs as they are (they are Spark's formats); what it
cannot read is the state, which microbatch keeps as Arrow files. The conversion, offline,
with the query stopped (it holds the run lease meanwhile):

1. The last batch ``L`` must be committed (a batch planned and not committed is refused:
   run the query until it commits, or ``checkpoint rollback``). Every stateful operator
   must be one whose state Spark's engine keeps in the same rows
   (``operators/spark_stores.py``: aggregations with or without session windows,
   deduplications, stream-stream joins, limits, applyInPandasWithState); anything else is refused before a file is written.
2. The conversion batch ``B = L + 1`` is planned in the offset log: L's offsets and
   watermark, with ``spark.sql.streaming.stateStore.providerClass`` set to Spark's
   ``HDFSBackedStateStoreProvider``. It reads no input (like Spark's own offline state
   repartition, which also adds a batch).
3. Every store's state after batch L (version L+1) is written as version B+1, in Spark
   tasks (a task per store): Spark's ``<B+1>.snapshot`` (UnsafeRow records, the codec and
   row checksums the checkpoint records; ``state.spark_format``) and microbatch's
   ``<B+1>.snapshot.arrow`` beside it, so microbatch's own reader and a return to
   microbatch find the version too. Spark's schema file
   (``state/<op>/0/_metadata/schema``) and operator metadata (``state/<op>/_metadata/metadata``,
   what ``state-metadata`` reads) are written where they are missing.
4. ``commits/B`` is written with L's commit. Spark's engine resumes at batch B+1 with
   Spark's provider; Spark's ``statestore`` and ``state-metadata`` readers read the
   checkpoint.

No file is rewritten: the conversion adds a batch and files. Interrupted, it is run
again: a last batch that is an unfinished conversion is finished. A checkpoint whose
state Spark's provider already holds, or that holds no state, is left as it is.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqMetadata
from microbatch.checkpoint.run_lease import RunLease
from microbatch.errors import CheckpointError
from microbatch.operators.spark_stores import MOVABLE, SparkStore, spark_stores
from microbatch.ops.checkpoint_reader import CheckpointReader
from microbatch.state.files import StateFiles
from microbatch.state.spark_format import (
    SparkStateStoreFiles, state_schema_path, state_schema_v2, store_options_from_conf,
)
from microbatch.state.store import (
    DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, SPARK_HDFS_PROVIDER, StateStoreConf, StateStoreId, provider_class,
    provider_name,
)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ConversionResult:
    batch: int                 # the conversion batch (Spark's engine resumes after it)
    stores: int                # stores written
    rows: int                  # state rows written
    done_before: bool = False  # the checkpoint's state was Spark's already: nothing written


def _refusal(root: str, problem: str, fix: str) -> CheckpointError:
    return CheckpointError(f"Cannot convert checkpoint '{root}' for Spark's engine: {problem}. Nothing "
                           f"was written. {fix}")


def convert_to_spark(spark: SparkSession, location: str, settings: dict[str, str] | None = None) -> ConversionResult:
    """Convert the checkpoint at ``location`` so Spark's engine resumes it (the module's
    docstring). The query must not run; its run lease is held meanwhile."""
    if settings is None:
        settings = {**dict(spark.sparkContext.getConf().getAll()), **spark.conf.getAll}
    ckpt = CheckpointReader(location, settings)
    if not ckpt.is_checkpoint():
        raise CheckpointError(f"'{location}' is not a checkpoint (no metadata, offsets/ or commits/).")
    lease = RunLease(ckpt.fs, ckpt.root, ckpt.query_id() or "", f"convert-{uuid.uuid4()}")
    lease.acquire()   # refused while the query runs; a start meanwhile is refused
    try:
        return _run(spark, ckpt)
    finally:
        lease.release()


def _provider_of(seq: OffsetSeq | None) -> str:
    return (seq.metadata.conf if seq else {}).get(PROVIDER_CLASS_CONF, DEFAULT_PROVIDER)


def is_conversion_batch(ckpt: CheckpointReader, batch_id: int) -> bool:
    """A batch whose offsets are the batch before it's, recorded with Spark's provider after
    a batch recorded with microbatch's: the conversion's batch."""
    if batch_id <= 0:
        return False
    now, before = ckpt.offsets.get(batch_id), ckpt.offsets.get(batch_id - 1)
    return (now is not None and before is not None and _provider_of(now) == SPARK_HDFS_PROVIDER
            and _provider_of(before) != SPARK_HDFS_PROVIDER and now.offsets == before.offsets)


def _run(spark: SparkSession, ckpt: CheckpointReader) -> ConversionResult:
    root = ckpt.root
    planned, committed = ckpt.offsets.batch_ids(), ckpt.commits.batch_ids()
    if not committed:
        raise _refusal(root, "it has no committed batch", "Run the query until it commits a batch.")
    last, last_committed = planned[-1], committed[-1]
    if last == last_committed and _provider_of(ckpt.offsets.get(last)) == SPARK_HDFS_PROVIDER:
        return ConversionResult(last, 0, 0, done_before=True)
    if last == last_committed and not ckpt.operators():
        return ConversionResult(last, 0, 0, done_before=True)     # no state: Spark's engine resumes it as it is
    finishing = last != last_committed and last == last_committed + 1 and is_conversion_batch(ckpt, last)
    if last != last_committed and not finishing:
        raise _refusal(root, f"its last batch {last} was planned and not committed (the last committed "
                             f"is {last_committed})",
                       "Run the query on microbatch until it commits that batch, or roll it back "
                       f"(microbatch checkpoint rollback {root} --to-batch {last_committed}), then convert.")
    source = last_committed
    seq = ckpt.offsets.get(source)
    recorded = seq.metadata.conf
    provider = provider_name(_provider_of(seq))
    operators = _operators(ckpt, recorded.get("spark.sql.shuffle.partitions"))
    batch = last if finishing else last + 1
    if not finishing:
        metadata = OffsetSeqMetadata(seq.metadata.batch_watermark_ms, seq.metadata.batch_timestamp_ms,
                                     {**recorded, PROVIDER_CLASS_CONF: SPARK_HDFS_PROVIDER},
                                     seq.metadata.source_metadata_info)
        # (planned first: a conversion cut short is known by its batch and finished by a re-run)
        if not ckpt.offsets.add(batch, OffsetSeq(seq.offsets, metadata, seq.source_ids)):
            raise CheckpointError(f"Batch {batch} of checkpoint '{root}' was planned meanwhile by another "
                                  "process; nothing more was written.")
    options = store_options_from_conf({k: v for k, v in recorded.items() if k != PROVIDER_CLASS_CONF})
    tasks = [_StoreTask(ckpt.fs.spec(), root, op.id, partition, store, source + 1, batch + 1, provider,
                        options["codec"], options["row_checksum"])
             for op in operators for partition in op.partitions for store in op.stores]
    stores, rows = _write_stores(spark, tasks)
    for op in operators:
        _write_spark_metadata(ckpt, op)
    if not ckpt.commits.add(batch, ckpt.commits.get(source)):
        raise CheckpointError(f"Batch {batch} of checkpoint '{root}' was committed meanwhile by another process.")
    log.info("Converted checkpoint %s for Spark's engine in batch %d: %d stores, %d rows", root, batch,
             stores, rows)
    return ConversionResult(batch, stores, rows)


@dataclass
class _Operator:
    id: int
    name: str
    stores: list[SparkStore]
    partitions: list[int]
    num_partitions: int


def _operators(ckpt: CheckpointReader, shuffle_partitions: str | None) -> list[_Operator]:
    """Every stateful operator, checked convertible before anything is written."""
    found = []
    for operator in ckpt.operators():
        doc = ckpt.schema_document(operator)
        if doc is None:
            raise _refusal(ckpt.root, f"the state of operator {operator} was not written by microbatch "
                                      "(it has no state/<op>/_metadata/schema)",
                           "Only checkpoints microbatch wrote are converted.")
        name = doc.get("operatorName")
        stores = spark_stores(name, StructType.fromJson(doc["keySchema"]), StructType.fromJson(doc["valueSchema"]),
                              doc)
        if stores is None and name in MOVABLE:
            raise _refusal(ckpt.root, f"the schema file of stateful operator {operator} ({name}) was written "
                                      "by an earlier microbatch, which did not record what Spark's rows need "
                                      "(the session window's place among the grouping columns, or the timeout)",
                           "Keep the query on microbatch, or start it on Spark's engine with a new "
                           "checkpoint location.")
        if stores is None:
            raise _refusal(ckpt.root, f"stateful operator {operator} is {name}, whose state is not converted "
                                      f"yet (converted: {', '.join(MOVABLE.values())})",
                           "Keep the query on microbatch, or start it on Spark's engine with a new "
                           "checkpoint location.")
        partitions = ckpt.partitions(operator)
        count = int(shuffle_partitions) if shuffle_partitions else max(partitions, default=0) + 1
        if stores[0].key.fields and name != "globalLimit":
            # Spark's engine loads every partition's store of a keyed operator: one microbatch
            # never wrote (no row ever hashed to it) gets an empty snapshot
            partitions = sorted(set(partitions) | set(range(count)))
        found.append(_Operator(operator, name, stores, partitions, count))
    return found


def _nullable(data_type):
    """A Spark JSON type with every field nullable: Spark's schema check takes a stored
    nullable field for the query's field either way."""
    if isinstance(data_type, dict):
        out = {k: _nullable(v) for k, v in data_type.items()}
        for flag in ("nullable", "containsNull", "valueContainsNull"):
            if flag in out:
                out[flag] = True
        return out
    if isinstance(data_type, list):
        return [_nullable(v) for v in data_type]
    return data_type


@dataclass(frozen=True)
class _StoreTask:
    """One store's version ``read_version`` written as ``write_version`` in Spark's files and
    microbatch's (runs in a Spark task: the storage goes as its spec)."""

    storage: tuple
    root: str
    operator: int
    partition: int
    store: SparkStore
    read_version: int
    write_version: int
    provider: str
    codec: str                 # spark.sql.streaming.stateStore.compression.codec, both engines' files
    row_checksum: bool

    def run(self) -> int:
        conf = StateStoreConf(storage=self.storage, provider_class=self.provider, compression=self.codec)
        store = self.store
        key, value = store.storage()
        store_id = StateStoreId(f"{self.root}/state", self.operator, self.partition, store.name)
        rows: list = []
        if StateFiles(store_id, key, value, conf).list():     # (a store never written holds nothing)
            provider = provider_class(self.provider)(store_id, key, value, conf)
            try:
                rows = list(provider.get_store(self.read_version).iterator())
            finally:
                provider.close()
        SparkStateStoreFiles(store_id.path, *store.spark_storage(), codec=self.codec,
                             fs=conf.fs, row_checksum=self.row_checksum).write_snapshot(
            self.write_version, store.to_spark(rows))
        StateFiles(store_id, key, value, conf).write_rows(self.write_version, "snapshot", [k for k, _ in rows],
                                                         [v for _, v in rows])
        return len(rows)


def _write_stores(spark: SparkSession, tasks: list[_StoreTask]) -> tuple[int, int]:
    if not tasks:
        return 0, 0
    result = pa.schema([("rows", pa.int64())])

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for index in b.column(0).to_pylist():
                yield pa.RecordBatch.from_pydict({"rows": [tasks[index].run()]}, schema=result)

    rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(convert, "rows LONG").collect()
    return len(rows), sum(r.rows for r in rows)


def _write_spark_metadata(ckpt: CheckpointReader, op: _Operator) -> None:
    """Spark's schema files and operator metadata of an operator, where missing."""
    for store in op.stores:
        schema = state_schema_path(ckpt.root, op.id, store.name)
        if not ckpt.fs.exists(schema):
            ckpt.fs.write_bytes(schema, state_schema_v2(json.dumps(_nullable(store.spark_key.jsonValue())),
                                                        json.dumps(_nullable(store.spark_value.jsonValue()))))
    metadata = f"{ckpt.root}/state/{op.id}/_metadata/metadata"
    if not ckpt.fs.exists(metadata):
        info = {"operatorInfo": {"operatorId": op.id, "operatorName": op.name},
                "stateStoreInfo": [{"storeName": store.name, "numColsPrefixKey": store.prefix_key_columns,
                                    "numPartitions": op.num_partitions}
                                   for store in op.stores]}
        ckpt.fs.write_bytes(metadata, b"v1\n" + json.dumps(info, separators=(",", ":")).encode())
