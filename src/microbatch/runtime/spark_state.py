"""State Spark's engine wrote, adopted at a restart: a query Spark's engine ran moves to
microbatch with its state (docs/porting.md).

When the checkpoint's state was written by Spark's ``HDFSBackedStateStoreProvider`` or its
``RocksDBStateStoreProvider`` (the provider its offset log records), the run's planning
step reads each store's version the next batch starts from out of Spark's files
(``state.spark_format``: UnsafeRow records in lz4 or zstd delta and snapshot files; RocksDB
snapshots and changelogs), and writes it as microbatch's snapshot of that version
(``<v>.snapshot.arrow``, beside Spark's files, which are never changed). The batch then
runs on microbatch's provider, which records itself in the offset log. The conversion is
eager, at the start of the first run: a store already converted (a run that failed part
way) is not converted again.

Adopted: every stateful operator. Those whose stores microbatch keeps as Spark does
(each operator's ``StateLayout`` in its home, ``operators/spark_stores.py`` says where:
aggregations, session windows included, deduplications, stream-stream joins, limits,
applyInPandasWithState) store by store; a transformWithState from the column families of
Spark's RocksDB (``operators/transform_with_state/spark_layout.py``). A schema that
differs from the query's, a format this reader does not know, or Spark's Avro encoding is
refused before anything is written.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

import pyarrow as pa

from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.errors import CheckpointError
from microbatch.operators.base import state_layout, store_field
from microbatch.operators.spark_stores import movable, spark_stores
from microbatch.operators.transform_with_state.spark_layout import tws_rows_from_spark
from microbatch.operators.transform_with_state.schema import state_store_schemas
from microbatch.state.files import StateFiles
from microbatch.state.spark_format import (
    SparkRocksDBFamilies, SparkRocksDBStoreFiles, SparkStateFormatError, SparkStateStoreFiles, read_state_schema,
    rocksdb_store_options_from_conf, store_options_from_conf,
)
from microbatch.state.store import (
    PROVIDER_CLASS_CONF, SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER, StateStoreConf, StateStoreId,
)

SPARK_PROVIDERS = (SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER)

log = logging.getLogger(__name__)


def written_by_spark(recorded_provider: str | None, fs: CheckpointFileSystem, checkpoint_root: str) -> bool:
    """Whether the checkpoint holds state one of Spark's providers wrote."""
    return recorded_provider in SPARK_PROVIDERS and fs.exists(f"{checkpoint_root}/state")


def _refusal(checkpoint_root: str, problem: str, provider: str = SPARK_HDFS_PROVIDER,
             written: str = "Nothing was written.") -> CheckpointError:
    return CheckpointError(
        f"The state in checkpoint '{checkpoint_root}' was written by Spark's engine "
        f"({provider}), and microbatch cannot adopt it: {problem}. {written} Keep running this "
        "query on Spark's engine, or start it on microbatch with a new checkpoint location.")


def _spark_files(provider: str, recorded_conf: dict[str, str]):
    """The reader of the stores ``provider`` wrote, and its options from the recorded conf."""
    if provider == SPARK_ROCKSDB_PROVIDER:
        return SparkRocksDBStoreFiles, rocksdb_store_options_from_conf(recorded_conf)
    return SparkStateStoreFiles, store_options_from_conf(recorded_conf)


def _shape(t: pa.DataType):
    """A type as its values are laid out, without field names or nullability (Spark's
    schema file and the query may name or null a nested field differently)."""
    if pa.types.is_struct(t):
        return ("struct", tuple(_shape(f.type) for f in t))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ("list", _shape(t.value_type))
    if pa.types.is_map(t):
        return ("map", _shape(t.key_type), _shape(t.item_type))
    return str(t)


def _same_types(spark: pa.Schema, ours: pa.Schema) -> bool:
    return [_shape(f.type) for f in spark] == [_shape(f.type) for f in ours]


def adopt_spark_state(fs: CheckpointFileSystem, checkpoint_root: str, schemas: list[tuple[str, Any, Any, Any]],
                      version: int, recorded_conf: dict[str, str], store_conf: StateStoreConf) -> None:
    """Convert every store of every operator (``schemas``: ``StateSchemas.schemas()``) at
    ``version`` from Spark's files (its HDFS-backed or its RocksDB provider's, as
    ``recorded_conf`` names) to microbatch's; refuse before writing anything if one cannot be."""
    provider = recorded_conf.get(PROVIDER_CLASS_CONF, SPARK_HDFS_PROVIDER)

    def refuse(problem: str) -> CheckpointError:
        return _refusal(checkpoint_root, problem, provider)
    try:
        files_class, options = _spark_files(provider, recorded_conf)
    except SparkStateFormatError as e:
        raise refuse(str(e)) from e
    plans, transforms = [], []
    for _, op, key, value in schemas:
        node = op.node
        refusal = node.spark_state_refusal(recorded_conf, provider)
        if refusal is not None:
            raise refuse(f"stateful operator {op.id} ({op.name}): {refusal}")
        if state_layout(op.name).in_column_families:   # (a transformWithState, on Spark's RocksDB provider)
            transforms.append((op, key))
            continue
        stores = spark_stores(op.name, key, value, json.loads(op.step.schema_document(key, value)))
        if stores is None:
            raise refuse(f"stateful operator {op.id} ({op.name}, {node.describe()}) is "
                         "not among those adopted so far (" + ", ".join(dict.fromkeys(movable().values())) + ")")
        for store in stores:
            where = f"operator {op.id}" + ("" if store.name == "default" else f", store {store.name}")
            try:
                spark_schema = read_state_schema(checkpoint_root, op.id, fs=fs, store_name=store.name)[0]
                spark_key, spark_value = spark_schema.key_arrow(), spark_schema.value_arrow()
            except Exception as e:  # a missing or unreadable schema file, said as such
                raise refuse(f"the state schema of {where} cannot be read ({e})") from e
            expected_key, expected_value = store.spark_storage()
            if not (_same_types(spark_key, expected_key) and _same_types(spark_value, expected_value)):
                raise refuse(f"the state of {where} ({op.name}) has key {spark_key.types} "
                             f"and value {spark_value.types} in Spark's schema file, and the "
                             f"query's is key {expected_key.types}, value {expected_value.types}")
            plans.append((op, store, spark_key, spark_value))
    for op, store, spark_key, spark_value in plans:
        started, rows = time.monotonic(), 0
        our_key, our_value = store.storage()
        for partition in range(op.num_state_stores):
            ours = StateFiles(StateStoreId(f"{checkpoint_root}/state", op.id, partition, store.name), our_key,
                              our_value, store_conf)
            # (converted already, or microbatch's own files hold the version: a conversion to
            # Spark's engine that was cut short after it planned its batch)
            if version <= 0 or ours.exists(version, "snapshot") or ours.exists(version, "delta"):
                continue
            theirs = files_class.for_store(checkpoint_root, op.id, partition, spark_key, spark_value,
                                           store_name=store.name, fs=fs, **options)
            try:
                state = theirs.load(version) if theirs.versions() else {}
            except SparkStateFormatError as e:
                # (stores converted before stay beside Spark's files, which Spark's engine
                # does not read, and are not converted again)
                raise _refusal(checkpoint_root, f"the state of operator {op.id}, partition {partition} "
                                                f"cannot be read: {e}", provider,
                               "The stores converted before it stay beside Spark's files (Spark's engine "
                               "reads none of them); nothing else was written.") from e
            fs.mkdirs(ours.id.path)
            converted = list(store.from_spark(state.items()))
            ours.write_rows(version, "snapshot", [k for k, _ in converted], [v for _, v in converted])
            rows += len(state)
        log.info("Adopted version %d of the state of operator %d (%s, store %s) from Spark's files: %d rows "
                 "in %d ms", version, op.id, op.name, store.name, rows, (time.monotonic() - started) * 1000)
    for op, key in transforms:
        _adopt_transform_with_state(fs, checkpoint_root, op, key, version, store_conf, refuse)


def _adopt_transform_with_state(fs: CheckpointFileSystem, checkpoint_root: str, op: Any, key: Any, version: int,
                                store_conf: StateStoreConf, refuse) -> None:
    """A transformWithState's state: Spark's column families of each partition's RocksDB
    (``SparkRocksDBFamilies``) as microbatch's store per state variable and its timers'."""
    started, rows = time.monotonic(), 0
    key_schema = pa.schema([store_field(f) for f in key.fields])
    schemas = state_store_schemas(op.node.variables)
    for partition in range(op.num_state_stores):
        files = {name: StateFiles(StateStoreId(f"{checkpoint_root}/state", op.id, partition, name), key_schema,
                                  schema, store_conf) for name, schema in schemas.items()}
        if version <= 0 or all(f.exists(version, "snapshot") or f.exists(version, "delta") for f in files.values()):
            continue
        try:
            theirs = SparkRocksDBFamilies.for_store(checkpoint_root, op.id, partition, fs=fs)
            if theirs.versions():
                records = theirs.load_records(version)
                held = set(theirs.families(version))
                missing = [v.name for v in op.node.variables if v.name not in held]
                if missing and records:
                    raise refuse(f"the processor's state variables {', '.join(missing)} (operator {op.id}) "
                                 f"are not in Spark's state, which holds {', '.join(sorted(held))}")
                converted = tws_rows_from_spark(op.node.variables, lambda name, theirs=theirs, records=records, held=held:
                                                theirs.load_family(version, name, records=records)
                                                if name in held else {})
            else:
                converted = {name: [] for name in schemas}
            for name, store_files in files.items():
                fs.mkdirs(store_files.id.path)
                store_files.write_rows(version, "snapshot", [k for k, _ in converted[name]],
                                       [v for _, v in converted[name]])
                rows += len(converted[name])
        except (SparkStateFormatError, pa.ArrowException, TypeError, ValueError) as e:
            raise _refusal(checkpoint_root, f"the state of operator {op.id} ({op.name}), partition {partition} "
                                            f"cannot be read as the processor's: {e}", SPARK_ROCKSDB_PROVIDER,
                           "The stores converted before it stay beside Spark's files (Spark's engine reads "
                           "none of them); nothing else was written.") from e
    log.info("Adopted version %d of the state of operator %d (%s) from Spark's column families: %d rows in %d ms",
             version, op.id, op.name, rows, (time.monotonic() - started) * 1000)

