"""The confs a checkpoint fixes (Spark's OffsetSeqMetadata confs): recorded in every
``offsets/N`` when the batch is planned and restored from the checkpoint at a restart, so a
query keeps, for example, its number of state partitions and its state store provider."""
from __future__ import annotations

import logging
from typing import Any

from microbatch import spark_internals
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.errors import CheckpointError
from microbatch.state.store import (DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, SAME_FILES_PROVIDERS,
                                    SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER, provider_class, provider_name)

log = logging.getLogger(__name__)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
#: The confs a checkpoint fixes, with the values Spark 4.3 records for a new query.
#: They are written to every ``offsets/N`` and restored from it on restart; an older Spark
#: records fewer (``spark_internals.records_conf``), as its own engine does.
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


#: The value of a conf a checkpoint does not record, because the Spark that wrote it did
#: not have it yet: the behaviour the query had then (Spark's relevantSQLConfDefaultValues).
LEGACY_VALUES = {
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion": "1",
    "spark.sql.streaming.aggregation.stateFormatVersion": "1",
    "spark.sql.streaming.join.stateFormatVersion": "1",
    "spark.sql.streaming.stateStore.compression.codec": "lz4",
    "spark.sql.streaming.statefulOperator.useStrictDistribution": "false",
    "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan": "true",
    "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
    "spark.sql.streaming.stateStore.rowChecksum.enabled": "false",
    "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion": "1",
    "spark.sql.dropDuplicates.deterministicKeyOrder.enabled": "false",
    "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled": "false",
}


def checkpointed_confs() -> dict[str, str]:
    """The confs the running Spark's engine fixes in a checkpoint, with 4.3's defaults."""
    return {key: value for key, value in CHECKPOINTED_CONFS.items() if spark_internals.records_conf(key)}


def state_provider(fs: CheckpointFileSystem, checkpoint_root: str, written: str | None,
                   asked: str | None) -> str:
    """The state store provider of this run: the one the checkpoint's state was written
    with, or for a checkpoint without state the one the session asks for (by default
    microbatch's). microbatch's map and RocksDB providers read each other's files, so a
    run may move from one to the other; state Spark's providers wrote is adopted into
    their files; any other change of provider is refused, naming both."""
    has_state = written is not None and fs.exists(f"{checkpoint_root}/state")
    if has_state and written in (SPARK_HDFS_PROVIDER, SPARK_ROCKSDB_PROVIDER):
        # Spark's engine wrote the state: the run adopts it (runtime/spark_state.py) into
        # the files of microbatch's providers; by default the counterpart of Spark's
        # (its RocksDB provider for state Spark kept in RocksDB)
        asked_name = provider_name(asked) if asked is not None else provider_name(written)
        if asked_name not in SAME_FILES_PROVIDERS:
            raise CheckpointError(
                f"The state in checkpoint '{checkpoint_root}' was written by {written} (Spark's own "
                f"engine); microbatch adopts it into the files of its own providers "
                f"({', '.join(sorted(SAME_FILES_PROVIDERS))}), but {PROVIDER_CLASS_CONF} is {asked}, "
                "which does not read them. Unset the conf (or set it to one of those), or start the "
                "query with a new checkpoint location.")
        return asked_name
    if has_state:
        written = provider_name(written)    # (an earlier path of microbatch's RocksDB provider)
        if asked is not None and {provider_name(asked), written} <= SAME_FILES_PROVIDERS:
            return provider_name(asked)     # microbatch's two providers write the same files
        if asked is not None and provider_name(asked) != written:
            raise CheckpointError(
                f"The state in checkpoint '{checkpoint_root}' was written by the state "
                f"store provider {written}, but {PROVIDER_CLASS_CONF} is {asked}: one provider "
                f"does not read another's state. Unset the conf (or set it to {written}), or "
                "start the query with a new checkpoint location.")
        provider_class(written)   # importable here, or a clear error before any batch
        return written
    chosen = provider_name(asked or DEFAULT_PROVIDER)
    provider_class(chosen)
    return chosen


def pin_confs(conf: Any, recorded: dict[str, str] | None, stateful: bool, fs: CheckpointFileSystem,
              checkpoint_root: str) -> dict[str, str]:
    """Apply the confs recorded in the checkpoint (``recorded``; None for a new one) to the
    batch session's ``conf``; return the confs the checkpoint fixes, as recorded in
    ``offsets/N``."""
    fixed = {}
    for key, default in checkpointed_confs().items():
        session_value = conf.get(key, default)
        if key == PROVIDER_CLASS_CONF and stateful:
            chosen = state_provider(fs, checkpoint_root, (recorded or {}).get(key), conf.get(key, None))
            conf.set(key, chosen)
            fixed[key] = chosen
            continue
        if key == SHUFFLE_PARTITIONS and recorded is not None and key in recorded:
            # Spark 4.1+ (OffsetSeqMetadata's rebinding): the recorded value is the state's
            # partitions (its STATEFUL_SHUFFLE_PARTITIONS_INTERNAL), recorded again in every
            # offsets/N; the session keeps its own spark.sql.shuffle.partitions for every
            # other shuffle, so a stateless query's partitions change on a restart
            fixed[key] = recorded[key]
            continue
        if recorded is not None and (key in recorded or key in LEGACY_VALUES):
            value = recorded.get(key, LEGACY_VALUES.get(key))
            if value != session_value:
                log.warning("Updating the value of conf '%s' in current session from '%s' "
                            "to '%s'.", key, session_value, value)
                conf.set(key, value)
        else:
            value = session_value
        fixed[key] = value
    return fixed
