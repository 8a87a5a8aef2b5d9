"""A checkpoint microbatch wrote, made one Spark's engine resumes:
``microbatch checkpoint convert CKPT --to spark`` (docs/porting.md).

Spark's engine reads microbatch's logs as they are (they are Spark's formats); what it
cannot read is the state, which microbatch keeps as Arrow files. The conversion, offline,
with the query stopped (it holds the run lease meanwhile):

1. The last batch ``L`` must be committed (a batch planned and not committed is refused:
   run the query until it commits, or ``checkpoint rollback``). Every stateful operator
   must be one whose state Spark's engine keeps in the same rows (each operator's
   ``StateLayout`` in its home, ``operators/spark_stores.py`` says where: aggregations with
   or without session windows, deduplications, stream-stream joins, limits,
   applyInPandasWithState, transformWithState); anything else is refused before a file is
   written.
2. Spark's provider is chosen: the one matching microbatch's (its RocksDB provider: Spark's
   ``RocksDBStateStoreProvider``; else Spark's ``HDFSBackedStateStoreProvider``), Spark's
   RocksDB provider whenever a transformWithState is among the operators (Spark runs it on
   no other), or the one asked for (``state_provider``).
3. The conversion batch ``B = L + 1`` is planned in the offset log: L's offsets and
   watermark, with ``spark.sql.streaming.stateStore.providerClass`` set to that provider
   (and, for RocksDB, the merge operator's and the SST format's versions Spark records).
   It reads no input (like Spark's own offline state repartition, which also adds a batch).
4. Every store's state after batch L (version L+1) is written as version B+1, in Spark
   tasks (a task per store; a transformWithState's per partition): Spark's ``<B+1>.snapshot``
   (UnsafeRow records, the codec and row checksums the checkpoint records;
   ``state.spark_format``) or RocksDB's ``<B+1>.zip`` with its SST files (a
   transformWithState's state variables, timers and TTL indexes as Spark's column families;
   ``state/spark_format/rocksdb_writer.py``), and microbatch's ``<B+1>.snapshot.arrow``
   beside it, so microbatch's own reader and a return to microbatch find the version too.
   Spark's schema files (``state/<op>/0/_metadata/schema``; a transformWithState's v3 file in
   ``state/<op>/_stateSchema/default/``) and operator metadata (``state/<op>/_metadata/metadata``,
   a transformWithState's v2 in ``_metadata/v2/<B>``: what ``state-metadata`` reads) are
   written where they are missing.
5. ``commits/B`` is written with L's commit. Spark's engine resumes at batch B+1 with
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

from microbatch import spark_internals
from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqMetadata
from microbatch.checkpoint.run_lease import RunLease
from microbatch.errors import CheckpointError
from microbatch.operators.base import state_layout, store_field
from microbatch.operators.spark_stores import SparkStore, movable, spark_stores
from microbatch.operators.transform_with_state.spark_layout import (
    TIMER_FAMILY_PREFIX, tws_rows_to_spark, tws_spark_families,
)
from microbatch.operators.transform_with_state.schema import (
    ENCODING_FORMAT_CONF, state_store_schemas, variables_from_document,
)
from microbatch.ops.checkpoint_reader import CheckpointReader
from microbatch.state.files import StateFiles
from microbatch.state.spark_format import (
    SparkStateStoreFiles, all_nullable, state_schema_path, state_schema_v2, store_options_from_conf,
)
from microbatch.state.spark_format.rocksdb_families import MERGE_DELIMITERS, FamilyEncoding
from microbatch.state.spark_format.rocksdb_writer import (
    DEFAULT_FAMILY, FamilyEncoder, operator_metadata_v2, state_schema_v3, write_rocksdb_snapshot,
)
from microbatch.state.store import (
    DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, ROCKSDB_PROVIDER, SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER,
    StateStoreConf, StateStoreId, provider_class, provider_name,
)

log = logging.getLogger(__name__)

#: Spark's providers, by the name ``state_provider`` (and the command's ``--state-provider``) takes
SPARK_PROVIDERS = {"hdfs": SPARK_HDFS_PROVIDER, "rocksdb": SPARK_ROCKSDB_PROVIDER}
MERGE_OPERATOR_CONF = "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion"
ROCKSDB_FORMAT_CONF = "spark.sql.streaming.stateStore.rocksdb.formatVersion"
#: Spark's names of the time and output modes, in its operator properties
_TIME_MODES = {"none": "NoTime", "processingtime": "ProcessingTime", "eventtime": "EventTime"}
_OUTPUT_MODES = {"append": "Append", "update": "Update", "complete": "Complete"}


@dataclass(frozen=True)
class ConversionResult:
    batch: int                 # the conversion batch (Spark's engine resumes after it)
    stores: int                # stores written
    rows: int                  # state rows written (microbatch's)
    done_before: bool = False  # the checkpoint's state was Spark's already: nothing written
    provider: str = ""         # Spark's provider the state was written for


def _refusal(root: str, problem: str, fix: str) -> CheckpointError:
    return CheckpointError(f"Cannot convert checkpoint '{root}' for Spark's engine: {problem}. Nothing "
                           f"was written. {fix}")


def convert_to_spark(spark: SparkSession, location: str, settings: dict[str, str] | None = None,
                     state_provider: str | None = None) -> ConversionResult:
    """Convert the checkpoint at ``location`` so Spark's engine resumes it (the module's
    docstring). The query must not run; its run lease is held meanwhile. ``state_provider``:
    ``hdfs`` or ``rocksdb`` (Spark's provider to write for), or None for the one matching
    the checkpoint's."""
    if state_provider is not None and state_provider not in SPARK_PROVIDERS:
        raise ValueError(f"state_provider is one of {', '.join(SPARK_PROVIDERS)}, not {state_provider!r}.")
    if settings is None:
        settings = spark_internals.session_settings(spark)
    ckpt = CheckpointReader(location, settings)
    if not ckpt.is_checkpoint():
        raise CheckpointError(f"'{location}' is not a checkpoint (no metadata, offsets/ or commits/).")
    lease = RunLease(ckpt.fs, ckpt.root, ckpt.query_id() or "", f"convert-{uuid.uuid4()}")
    lease.acquire()   # refused while the query runs; a start meanwhile is refused
    try:
        return _run(spark, ckpt, state_provider)
    finally:
        lease.release()


def _provider_of(seq: OffsetSeq | None) -> str:
    return (seq.metadata.conf if seq else {}).get(PROVIDER_CLASS_CONF, DEFAULT_PROVIDER)


def is_conversion_batch(ckpt: CheckpointReader, batch_id: int) -> bool:
    """A batch whose offsets are the batch before it's, recorded with one of Spark's
    providers after a batch recorded with microbatch's: the conversion's batch."""
    if batch_id <= 0:
        return False
    now, before = ckpt.offsets.get(batch_id), ckpt.offsets.get(batch_id - 1)
    spark_providers = SPARK_PROVIDERS.values()
    return (now is not None and before is not None and _provider_of(now) in spark_providers
            and _provider_of(before) not in spark_providers and now.offsets == before.offsets)


def _run(spark: SparkSession, ckpt: CheckpointReader, state_provider: str | None) -> ConversionResult:
    root = ckpt.root
    planned, committed = ckpt.offsets.batch_ids(), ckpt.commits.batch_ids()
    if not committed:
        raise _refusal(root, "it has no committed batch", "Run the query until it commits a batch.")
    last, last_committed = planned[-1], committed[-1]
    if last == last_committed and _provider_of(ckpt.offsets.get(last)) in SPARK_PROVIDERS.values():
        return ConversionResult(last, 0, 0, done_before=True, provider=_provider_of(ckpt.offsets.get(last)))
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
    operators = _operators(ckpt, recorded)
    if finishing:    # (the provider the cut-short conversion chose)
        target = _provider_of(ckpt.offsets.get(last))
    else:
        target = _target_provider(root, provider, operators, state_provider)
    batch = last if finishing else last + 1
    conf = {**recorded, PROVIDER_CLASS_CONF: target}
    if target == SPARK_ROCKSDB_PROVIDER:   # (what Spark's engine records for its RocksDB provider)
        conf.setdefault(MERGE_OPERATOR_CONF, "2")
        conf.setdefault(ROCKSDB_FORMAT_CONF, "5")
    if not finishing:
        metadata = OffsetSeqMetadata(seq.metadata.batch_watermark_ms, seq.metadata.batch_timestamp_ms, conf,
                                     seq.metadata.source_metadata_info)
        # (planned first: a conversion cut short is known by its batch and finished by a re-run)
        if not ckpt.offsets.add(batch, OffsetSeq(seq.offsets, metadata, seq.source_ids)):
            raise CheckpointError(f"Batch {batch} of checkpoint '{root}' was planned meanwhile by another "
                                  "process; nothing more was written.")
    else:
        conf = ckpt.offsets.get(last).metadata.conf
    options = store_options_from_conf({k: v for k, v in recorded.items() if k != PROVIDER_CLASS_CONF})
    common = dict(storage=ckpt.fs.spec(), root=root, read_version=source + 1, write_version=batch + 1,
                  provider=provider, codec=options["codec"], row_checksum=options["row_checksum"],
                  rocksdb=target == SPARK_ROCKSDB_PROVIDER, rocksdb_format=int(conf.get(ROCKSDB_FORMAT_CONF, "5")),
                  merge_delimiter=MERGE_DELIMITERS.get(int(conf.get(MERGE_OPERATOR_CONF, "2")), b""))
    tasks: list = []
    for op in operators:
        if op.variables is not None:
            tasks += [_TransformWithStateTask(operator=op.id, partition=p, variables=op.variables,
                                              key_json=op.key.json(), time_mode=op.time_mode, **common)
                      for p in op.partitions]
        else:
            tasks += [_StoreTask(operator=op.id, partition=p, store=store, **common)
                      for p in op.partitions for store in op.stores]
    stores, rows = _write_stores(spark, tasks)
    for op in operators:
        _write_spark_metadata(ckpt, op, batch)
    if not ckpt.commits.add(batch, ckpt.commits.get(source)):
        raise CheckpointError(f"Batch {batch} of checkpoint '{root}' was committed meanwhile by another process.")
    log.info("Converted checkpoint %s for Spark's engine (%s) in batch %d: %d stores, %d rows", root, target,
             batch, stores, rows)
    return ConversionResult(batch, stores, rows, provider=target)


def _target_provider(root: str, provider: str, operators: list, asked: str | None) -> str:
    """Spark's provider the state is written for (the module's docstring, step 2)."""
    transforms = [op for op in operators if op.variables is not None]
    if asked == "hdfs" and transforms:
        raise _refusal(root, f"stateful operator {transforms[0].id} is a transformWithState, which Spark's "
                             "engine runs on its RocksDB provider only",
                       "Convert with --state-provider rocksdb (or without the option).")
    if asked is not None:
        return SPARK_PROVIDERS[asked]
    if transforms or provider == ROCKSDB_PROVIDER:
        return SPARK_ROCKSDB_PROVIDER
    return SPARK_HDFS_PROVIDER


@dataclass
class _Operator:
    id: int
    name: str
    stores: list[SparkStore]
    partitions: list[int]
    num_partitions: int
    key: StructType | None = None
    variables: tuple | None = None     # a transformWithState's state variables
    time_mode: str = "none"
    output_mode: str = "append"


def _operators(ckpt: CheckpointReader, recorded: dict[str, str]) -> list[_Operator]:
    """Every stateful operator, checked convertible before anything is written."""
    found = []
    shuffle_partitions = recorded.get("spark.sql.shuffle.partitions")
    earlier = ("Keep the query on microbatch, or start it on Spark's engine with a new checkpoint location.")
    for operator in ckpt.operators():
        doc = ckpt.schema_document(operator)
        if doc is None:
            raise _refusal(ckpt.root, f"the state of operator {operator} was not written by microbatch "
                                      "(it has no state/<op>/_metadata/schema)",
                           "Only checkpoints microbatch wrote are converted.")
        name = doc.get("operatorName")
        layout = state_layout(name)
        key = StructType.fromJson(doc["keySchema"])
        partitions = ckpt.partitions(operator)
        count = int(shuffle_partitions) if shuffle_partitions else max(partitions, default=0) + 1
        if layout.in_column_families:
            variables = variables_from_document(doc) if "timeMode" in doc else None
            if variables is None:
                raise _refusal(ckpt.root, f"the schema file of stateful operator {operator} ({name}) was written "
                                          "by an earlier microbatch, which did not record what Spark's operator "
                                          "metadata needs (the time and output modes, the TTLs)", earlier)
            encoding = recorded.get(ENCODING_FORMAT_CONF, "unsaferow").lower()
            if encoding != "unsaferow":
                raise _refusal(ckpt.root, f"the query keeps its transformWithState state in the {encoding} "
                                          f"encoding ({ENCODING_FORMAT_CONF}); the conversion writes Spark's "
                                          "UnsafeRow encoding", earlier)
            found.append(_Operator(operator, name, [], sorted(set(partitions) | set(range(count))), count, key,
                                   variables, doc["timeMode"], doc.get("outputMode", "append")))
            continue
        stores = spark_stores(name, key, StructType.fromJson(doc["valueSchema"]), doc)
        if stores is None and name in movable():
            raise _refusal(ckpt.root, f"the schema file of stateful operator {operator} ({name}) was written "
                                      "by an earlier microbatch, which did not record what Spark's rows need "
                                      "(the session window's place among the grouping columns, or the timeout)",
                           earlier)
        if stores is None:
            raise _refusal(ckpt.root, f"stateful operator {operator} is {name}, whose state is not converted "
                                      f"yet (converted: {', '.join(dict.fromkeys(movable().values()))})",
                           earlier)
        if stores[0].key.fields and not layout.one_partition:
            # Spark's engine loads every partition's store of a keyed operator: one microbatch
            # never wrote (no row ever hashed to it) gets an empty snapshot
            partitions = sorted(set(partitions) | set(range(count)))
        found.append(_Operator(operator, name, stores, partitions, count))
    return found


@dataclass(frozen=True)
class _Task:
    """Stores of one partition at ``read_version`` written as ``write_version`` in Spark's
    files and microbatch's (runs in a Spark task: the storage goes as its spec)."""

    storage: tuple
    root: str
    operator: int
    partition: int
    read_version: int
    write_version: int
    provider: str              # microbatch's, that wrote the state
    codec: str                 # spark.sql.streaming.stateStore.compression.codec, both engines' files
    row_checksum: bool
    rocksdb: bool              # Spark's RocksDB provider's files (else its HDFS-backed provider's)
    rocksdb_format: int        # spark.sql.streaming.stateStore.rocksdb.formatVersion
    merge_delimiter: bytes     # of spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion

    def conf(self) -> StateStoreConf:
        return StateStoreConf(storage=self.storage, provider_class=self.provider, compression=self.codec)

    def read(self, name: str, key: pa.Schema, value: pa.Schema) -> list:
        """The rows of one of microbatch's stores at ``read_version``."""
        conf = self.conf()
        store_id = StateStoreId(f"{self.root}/state", self.operator, self.partition, name)
        if not StateFiles(store_id, key, value, conf).list():     # (a store never written holds nothing)
            return []
        provider = provider_class(self.provider)(store_id, key, value, conf)
        try:
            return list(provider.get_store(self.read_version).iterator())
        finally:
            provider.close()

    def write_ours(self, name: str, key: pa.Schema, value: pa.Schema, rows: list) -> None:
        store_id = StateStoreId(f"{self.root}/state", self.operator, self.partition, name)
        StateFiles(store_id, key, value, self.conf()).write_rows(self.write_version, "snapshot",
                                                                 [k for k, _ in rows], [v for _, v in rows])


@dataclass(frozen=True)
class _StoreTask(_Task):
    """One store of an operator (``SparkStore``) in a partition."""

    store: SparkStore

    def run(self) -> int:
        store = self.store
        key, value = store.storage()
        rows = self.read(store.name, key, value)
        path = f"{self.root}/state/{self.operator}/{self.partition}" + (
            "" if store.name == "default" else f"/{store.name}")
        fs = self.conf().fs
        if self.rocksdb:
            spark_key, spark_value = store.spark_storage()
            enc = FamilyEncoding(spark_key, spark_value, "prefix" if store.prefix_key_columns else "none",
                                 num_prefix=store.prefix_key_columns)
            encoder = FamilyEncoder(enc, row_checksum=self.row_checksum)
            records = []
            for k, v in store.to_spark(rows):
                encoded = encoder.key(tuple(k))
                records.append((encoded, encoder.value(encoded, tuple(v))))
            write_rocksdb_snapshot(path, self.write_version, records, fs, format_version=self.rocksdb_format)
        else:
            SparkStateStoreFiles(path, *store.spark_storage(), codec=self.codec, fs=fs,
                                 row_checksum=self.row_checksum).write_snapshot(self.write_version,
                                                                                store.to_spark(rows))
        self.write_ours(store.name, key, value, rows)
        return len(rows)


@dataclass(frozen=True)
class _TransformWithStateTask(_Task):
    """One partition of a transformWithState: microbatch's store per state variable and its
    timers' as Spark's column families in one RocksDB snapshot, and as microbatch's."""

    variables: tuple
    key_json: str
    time_mode: str

    def run(self) -> int:
        key_struct = StructType.fromJson(json.loads(self.key_json))
        key = pa.schema([store_field(f) for f in key_struct.fields])
        ours = {name: self.read(name, key, value) for name, value in state_store_schemas(self.variables).items()}
        families = [f for f in tws_spark_families(key_struct, self.variables, self.time_mode) if f.stored]
        ids = {DEFAULT_FAMILY: (1, False)}
        ids.update({f.name: (i + 2, f.internal) for i, f in enumerate(families)})
        rows = tws_rows_to_spark(self.variables, ours, self.time_mode)
        records = []
        for family in families:
            enc = FamilyEncoding.from_schema(_state_schema(family), family.multi_value)
            encoder = FamilyEncoder(enc, ids[family.name][0], self.row_checksum, self.merge_delimiter)
            for k, v in rows.get(family.name, ()):
                encoded = encoder.key(k)
                records.append((encoded, encoder.values(encoded, v) if family.multi_value
                                else encoder.value(encoded, v)))
        path = f"{self.root}/state/{self.operator}/{self.partition}"
        write_rocksdb_snapshot(path, self.write_version, records, self.conf().fs, ids, self.rocksdb_format)
        for name, value in state_store_schemas(self.variables).items():
            self.write_ours(name, key, value, ours[name])
        return sum(len(r) for r in ours.values())


def _state_schema(family):
    from microbatch.state.spark_format import StateSchema
    return StateSchema(family.name, family.key.jsonValue(), family.value.jsonValue(), family.spec)


def _write_stores(spark: SparkSession, tasks: list[_Task]) -> tuple[int, int]:
    if not tasks:
        return 0, 0
    result = pa.schema([("rows", pa.int64())])

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for index in b.column(0).to_pylist():
                yield pa.RecordBatch.from_pydict({"rows": [tasks[index].run()]}, schema=result)

    rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(convert, "rows LONG").collect()
    return len(rows), sum(r.rows for r in rows)


def _qualified(path: str) -> str:
    """A path as Spark's engine records it in operator metadata: a URI."""
    return path if "://" in path or path.startswith("file:") else f"file:{path}"


def _write_spark_metadata(ckpt: CheckpointReader, op: _Operator, batch: int) -> None:
    """Spark's schema files and operator metadata of an operator, where missing."""
    if op.variables is not None:
        _write_transform_with_state_metadata(ckpt, op, batch)
        return
    for store in op.stores:
        schema = state_schema_path(ckpt.root, op.id, store.name)
        if not ckpt.fs.exists(schema):
            ckpt.fs.write_bytes(schema, state_schema_v2(json.dumps(all_nullable(store.spark_key.jsonValue())),
                                                        json.dumps(all_nullable(store.spark_value.jsonValue()))))
    metadata = f"{ckpt.root}/state/{op.id}/_metadata/metadata"
    if not ckpt.fs.exists(metadata):
        info = {"operatorInfo": {"operatorId": op.id, "operatorName": op.name},
                "stateStoreInfo": [{"storeName": store.name, "numColsPrefixKey": store.prefix_key_columns,
                                    "numPartitions": op.num_partitions}
                                   for store in op.stores]}
        ckpt.fs.write_bytes(metadata, b"v1\n" + json.dumps(info, separators=(",", ":")).encode())


def _write_transform_with_state_metadata(ckpt: CheckpointReader, op: _Operator, batch: int) -> None:
    """A transformWithState's v3 schema file and operator metadata v2, as Spark's engine
    writes them in the query's first batch, named after the conversion batch."""
    directory = f"{ckpt.root}/state/{op.id}/_metadata/v2"
    if ckpt.fs.exists(f"{directory}/{batch}"):
        return
    families = tws_spark_families(op.key, op.variables, op.time_mode)
    schema_dir = f"{ckpt.root}/state/{op.id}/_stateSchema/{DEFAULT_FAMILY}"
    schema_path = f"{schema_dir}/{batch}_{uuid.uuid4()}"
    ckpt.fs.mkdirs(schema_dir)
    ckpt.fs.write_bytes(schema_path, state_schema_v3(
        (f.name, f.key.jsonValue(), f.value.jsonValue(), f.spec, None if f.user_key is None else f.user_key.jsonValue())
        for f in families))
    ckpt.fs.mkdirs(directory)
    ckpt.fs.write_bytes(f"{directory}/{batch}", operator_metadata_v2(
        op.id, op.name, op.num_partitions, _qualified(schema_path),
        tws_operator_properties(op.variables, op.time_mode, op.output_mode)))


def tws_operator_properties(variables, time_mode: str, output_mode: str) -> dict:
    """A transformWithState's operator properties as Spark's engine records them in its
    operator metadata v2 (``operatorPropertiesJson``, which ``state-metadata`` shows): its
    modes and state variables, its timers among them."""
    kinds = {"value": "ValueState", "list": "ListState", "map": "MapState"}
    found = [{"stateName": v.name, "stateVariableType": kinds[v.kind], "ttlEnabled": v.ttl_ms is not None}
             for v in variables]
    if time_mode in TIMER_FAMILY_PREFIX:
        found.append({"stateName": f"{TIMER_FAMILY_PREFIX[time_mode]}_keyToTimestamp",
                      "stateVariableType": "TimerState", "ttlEnabled": False})
    return {"timeMode": _TIME_MODES[time_mode], "outputMode": _OUTPUT_MODES[output_mode], "stateVariables": found}

