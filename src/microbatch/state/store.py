"""The state store contract and the executor-side provider cache (Spark's StateStore,
StateStoreProvider and the executor's loaded providers; docs/design.md, section 4).

A stateful operator keeps its state per ``(operator id, partition id)`` in a store
versioned by batch: batch N reads version N and commits version N+1 (version 0
is empty). Inside a Spark task the operator asks ``load_provider`` for the
provider of its store, the provider for the store at version N; the operator
reads and changes keys, then ``commit()`` makes version N+1 durable, or
``abort()`` forgets the changes. A retried or speculative task may commit the
same version again: it writes the same content, so that is harmless.

Keys and values are tuples of plain Python values, in the order of the key and
value schemas (``pyarrow.Schema``; the encoding is ``state.files``). A store is
changed key by key (``get``/``put``/``remove``) or a batch at a time with Arrow
tables (``insert_new``, ``remove_at_or_below``); a provider may keep its memory in
the form that suits the calls it gets, but one version of a store is changed one
way or the other, not both.

The provider is chosen by ``spark.sql.streaming.stateStore.providerClass``: a
Python class path (microbatch's ``MapStateStoreProvider`` by default, its
``RocksDBStateStoreProvider`` for state beyond memory, or a user's ``StateStoreProvider``
subclass importable on the executors). Spark's provider names mean microbatch's
counterparts: ``HDFSBackedStateStoreProvider`` the default, ``RocksDBStateStoreProvider``
microbatch's RocksDB provider.

Executors keep providers in a module-level cache of the Python worker, which
Spark reuses across tasks (``spark.python.worker.reuse``), keyed by provider class
and store id. A provider's memory is trusted only for the query run that filled
it (``StateStoreConf.run_id``) and only at a version it holds or committed; for
any other version it reads the files, so a partition's task may move between
executors (A, then B, then A) without changing an answer.

What a state task does to its Python worker's heap (collection off while it runs, the heap
frozen at its end, unfrozen when a provider is dropped) is ``state.worker_heap``'s.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from microbatch.errors import IllegalArgumentException
from microbatch.state.worker_heap import _unfreeze_worker_heap

Key = tuple
Value = tuple

PROVIDER_CLASS_CONF = "spark.sql.streaming.stateStore.providerClass"
#: microbatch's default provider: a map in executor memory, Arrow delta files.
DEFAULT_PROVIDER = "microbatch.state.map_provider.MapStateStoreProvider"
#: Spark's providers, by the name a ported job sets (or Spark's default records).
SPARK_HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
SPARK_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: microbatch's provider for state beyond memory: RocksDB on the executor's local disk.
ROCKSDB_PROVIDER = "microbatch.state.rocksdb.RocksDBStateStoreProvider"
#: Where checkpoints written before ``state/rocksdb/`` became a package record it.
EARLIER_ROCKSDB_PROVIDER = "microbatch.state.rocksdb_provider.RocksDBStateStoreProvider"
#: Providers that write and read the same files (``state.files``): a checkpoint may change between them.
SAME_FILES_PROVIDERS = {DEFAULT_PROVIDER, ROCKSDB_PROVIDER}


@dataclass(frozen=True)
class StateStoreId:
    """Where one store lives: ``<checkpoint>/state/<operator>/<partition>[/<store name>]``."""

    checkpoint_root: str        # <checkpoint>/state
    operator_id: int
    partition_id: int
    store_name: str = "default"

    @property
    def path(self) -> str:
        base = f"{self.checkpoint_root}/{self.operator_id}/{self.partition_id}"
        return base if self.store_name == "default" else f"{base}/{self.store_name}"


@dataclass(frozen=True)
class StateStoreConf:
    """The confs a store follows; built on the driver from the session, shipped to tasks."""

    min_deltas_for_snapshot: int = 10       # spark.sql.streaming.stateStore.minDeltasForSnapshot
    min_versions_to_retain: int = 100       # spark.sql.streaming.minBatchesToRetain
    max_versions_in_memory: int = 2         # spark.sql.streaming.maxBatchesToRetainInMemory
    compression: str = "lz4"                # spark.sql.streaming.stateStore.compression.codec
    #: The query run the stores serve. Executors cache providers per run, as Spark
    #: keys its providers by the run id: a new run (a restart, or a checkpoint deleted
    #: and made again at the same path) reads the files instead of trusting memory.
    run_id: str = ""
    #: The checkpoint's store, as ``CheckpointFileSystem.spec()``: every state file goes
    #: through it, from the executors too. It may hold credentials: kept out of repr().
    storage: tuple = field(default=("file", ()), repr=False)
    #: The provider class path (``spark.sql.streaming.stateStore.providerClass``).
    provider_class: str = DEFAULT_PROVIDER
    #: The RocksDB provider's memory: a block cache shared by a worker's stores
    #: (spark.sql.streaming.stateStore.rocksdb.blockCacheSizeMB), and per store
    #: memtables of writeBufferSizeMB (-1: 16) times maxWriteBufferNumber (-1: 2).
    rocksdb_block_cache_mb: int = 8
    rocksdb_write_buffer_mb: int = 16
    rocksdb_max_write_buffers: int = 2
    #: The rest of Spark's RocksDB confs (``spark.sql.streaming.stateStore.rocksdb.*``), as
    #: ``RocksDBConfs`` reads them; ``state/rocksdb/database.py`` says how each is honoured.
    rocksdb: "RocksDBConfs" = field(default_factory=lambda: RocksDBConfs())
    #: How files written with an older value schema are read (a transformWithState's state,
    #: whose schema may evolve across restarts): "name" (Avro's rules, fields matched by
    #: name), "position" (Spark's unsafe-row encoding, fields by position), or "" (not at all).
    value_evolution: str = ""
    #: Whether the RocksDB provider snapshots a store's first version at its commit, as
    #: Spark's RocksDB store snapshots the version in which a column family is created
    #: (``shouldForceSnapshot``): a transformWithState's state variables, each a store here,
    #: so ``snapshotStartBatchId`` of that batch reads as on Spark's engine
    snapshot_first_version: bool = False

    @property
    def fs(self):
        from microbatch.checkpoint.stores import storage_from_spec
        return storage_from_spec(self.storage)

    @classmethod
    def from_session(cls, spark: Any) -> "StateStoreConf":
        get = spark.conf.get
        codec = get("spark.sql.streaming.stateStore.compression.codec", "lz4").lower()
        provider = provider_name(get(PROVIDER_CLASS_CONF, DEFAULT_PROVIDER))
        return cls(
            min_deltas_for_snapshot=int(get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10")),
            min_versions_to_retain=int(get("spark.sql.streaming.minBatchesToRetain", "100")),
            max_versions_in_memory=int(get("spark.sql.streaming.maxBatchesToRetainInMemory", "2")),
            compression="zstd" if codec == "zstd" else "lz4",
            provider_class=provider,
            rocksdb_block_cache_mb=_positive(get(f"{_ROCKSDB}.blockCacheSizeMB", "8"), 8),
            rocksdb_write_buffer_mb=_positive(get(f"{_ROCKSDB}.writeBufferSizeMB", "-1"), 16),
            rocksdb_max_write_buffers=_positive(get(f"{_ROCKSDB}.maxWriteBufferNumber", "-1"), 2),
            rocksdb=RocksDBConfs.from_conf(get) if provider == ROCKSDB_PROVIDER else RocksDBConfs())


_ROCKSDB = "spark.sql.streaming.stateStore.rocksdb"


@dataclass(frozen=True)
class RocksDBConfs:
    """Spark's RocksDB state store confs beyond the memory sizes, read and checked as Spark's
    RocksDBConf reads them (its messages for a bad value). Spark reads them only for its
    RocksDB provider, and so does microbatch: ``check`` runs when a query starts with it."""

    compact_on_commit: bool = False          # compactOnCommit
    #: changelogCheckpointing.enabled, checked and kept: microbatch's RocksDB provider writes
    #: every version's changes (its delta file, Spark's changelog) whichever it says, and a
    #: snapshot every minDeltasForSnapshot versions, so the state reader's change feed reads
    #: them either way, and a checkpoint converted for Spark gets a snapshot, which Spark
    #: loads with the setting on or off
    changelog_checkpointing: bool = False
    block_size_kb: int = 4                   # blockSizeKB
    #: lockAcquireTimeoutMs when set: how long a task waits for another Python worker to hand
    #: the store's database over before it builds a private copy (microbatch's 5 s otherwise)
    lock_wait_ms: int = 5000
    max_open_files: int = -1                 # maxOpenFiles
    reset_stats_on_load: bool = True         # resetStatsOnLoad
    track_total_rows: bool = True            # trackTotalNumberOfRows
    bounded_memory: bool = False             # boundedMemoryUsage
    max_memory_mb: int = 500                 # maxMemoryUsageMB
    write_buffer_cache_ratio: float = 0.5    # writeBufferCacheRatio
    high_priority_pool_ratio: float = 0.1    # highPriorityPoolRatio
    high_priority_pool_ratio_set: bool = False
    allow_fallocate: bool = True             # allowFAllocate
    compression: str = "lz4"                 # compression

    @classmethod
    def from_conf(cls, get) -> "RocksDBConfs":
        """The confs as the session has them (``get(name, default)``), unchecked (``check``)."""
        def raw(name: str, default: str) -> str:
            return str(get(name, default)).strip()
        ratio = raw(f"{_ROCKSDB}.highPriorityPoolRatio", "")
        lock = raw(f"{_ROCKSDB}.lockAcquireTimeoutMs", "")
        confs = cls(
            compact_on_commit=_bool(raw(f"{_ROCKSDB}.compactOnCommit", "false"), f"{_ROCKSDB}.compactOnCommit"),
            changelog_checkpointing=_bool(raw(f"{_ROCKSDB}.changelogCheckpointing.enabled", "false"),
                                          f"{_ROCKSDB}.changelogCheckpointing.enabled"),
            block_size_kb=_long(raw(f"{_ROCKSDB}.blockSizeKB", "4"), f"{_ROCKSDB}.blockSizeKB", positive=True),
            lock_wait_ms=_long(lock, f"{_ROCKSDB}.lockAcquireTimeoutMs", positive=True) if lock else 5000,
            max_open_files=_long(raw(f"{_ROCKSDB}.maxOpenFiles", "-1"), f"{_ROCKSDB}.maxOpenFiles",
                                 kind="an integer"),
            reset_stats_on_load=_bool(raw(f"{_ROCKSDB}.resetStatsOnLoad", "true"), f"{_ROCKSDB}.resetStatsOnLoad"),
            track_total_rows=_bool(raw(f"{_ROCKSDB}.trackTotalNumberOfRows", "true"),
                                   f"{_ROCKSDB}.trackTotalNumberOfRows"),
            bounded_memory=_bool(raw(f"{_ROCKSDB}.boundedMemoryUsage", "false"), f"{_ROCKSDB}.boundedMemoryUsage"),
            max_memory_mb=_long(raw(f"{_ROCKSDB}.maxMemoryUsageMB", "500"), f"{_ROCKSDB}.maxMemoryUsageMB",
                                kind="a long"),
            write_buffer_cache_ratio=_ratio(raw(f"{_ROCKSDB}.writeBufferCacheRatio", "0.5"),
                                            f"{_ROCKSDB}.writeBufferCacheRatio"),
            high_priority_pool_ratio=_ratio(ratio or "0.1", f"{_ROCKSDB}.highPriorityPoolRatio"),
            high_priority_pool_ratio_set=bool(ratio),
            allow_fallocate=_bool(raw(f"{_ROCKSDB}.allowFAllocate", "true"), f"{_ROCKSDB}.allowFAllocate"),
            compression=raw(f"{_ROCKSDB}.compression", "lz4"))
        if confs.bounded_memory and confs.high_priority_pool_ratio_set:
            from microbatch.errors import UnsupportedOperationError
            raise UnsupportedOperationError(
                f"{_ROCKSDB}.highPriorityPoolRatio cannot be honoured by microbatch's RocksDB state "
                "store: under boundedMemoryUsage Spark reserves that share of the shared block "
                "cache for index and filter blocks, and the block cache microbatch's RocksDB "
                "(rocksdict) makes takes a capacity only. Unset highPriorityPoolRatio (the cache "
                "then splits as RocksDB's default does), or set boundedMemoryUsage=false.")
        return confs


def _invalid(name: str, what: str) -> IllegalArgumentException:
    """Spark's RocksDBConf message, which names the conf in lower case (its confs map)."""
    return IllegalArgumentException(f"Invalid value for '{name.lower()}', must be {what}")


def _bool(value: str, name: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise _invalid(name, "boolean")
    return value.lower() == "true"


def _long(value: str, name: str, positive: bool = False, kind: str = "a positive integer") -> int:
    try:
        number = int(value)
    except ValueError:
        raise _invalid(name, kind) from None
    if positive and number < 0:   # (Spark's "positive" confs take 0)
        raise _invalid(name, kind)
    return number


def _ratio(value: str, name: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _invalid(name, "a ratio between 0.0 and 1.0") from None
    if not 0.0 <= number <= 1.0:
        raise _invalid(name, "a ratio between 0.0 and 1.0")
    return number


def _positive(value: str, default: int) -> int:
    """A size conf where -1 (Spark's "RocksDB's default") means ``default``."""
    number = int(value)
    return number if number > 0 else default


@dataclass
class StateStoreMetrics:
    """What a store reports after a commit (progress ``stateOperators``)."""

    num_keys: int = 0
    num_updated: int = 0
    num_removed: int = 0
    memory_used_bytes: int = 0
    commit_time_ms: int = 0
    #: Provider-specific metrics (progress ``customMetrics``), e.g. the map cache's hits.
    custom: dict[str, int] = field(default_factory=dict)
    #: False where the provider does not count its rows (Spark's RocksDB provider under
    #: ``trackTotalNumberOfRows=false``): the operator's ``numRowsTotal`` is then 0, as Spark's
    rows_tracked: bool = True


class StateStore(ABC):
    """One version of one store, open for changes until ``commit()`` or ``abort()``."""

    id: StateStoreId
    version: int
    key_schema: pa.Schema
    value_schema: pa.Schema

    @abstractmethod
    def get(self, key: Key) -> Value | None: ...

    @abstractmethod
    def put(self, key: Key, value: Value) -> None: ...

    @abstractmethod
    def remove(self, key: Key) -> None: ...

    def remove_many(self, keys: list[Key]) -> None:
        """Remove every key of ``keys``; stores may override this with a bulk version."""
        for key in keys:
            self.remove(key)

    def get_many(self, keys: list[Key]) -> list[Value | None]:
        """``get`` of each key, in order; stores may override this with a bulk version."""
        return [self.get(key) for key in keys]

    def put_many(self, keys: list[Key], values: list[Value]) -> None:
        """``put`` of each key with its value, in order; stores may override this with a
        bulk version."""
        for key, value in zip(keys, values):
            self.put(key, value)

    def keys(self) -> list[Key]:
        """Every key, this store's uncommitted changes included (``iterator``'s order)."""
        return [key for key, _ in self.iterator()]

    def keys_at_or_below(self, bound: int, *, key_field: int | None = None,
                         value_field: int | None = None) -> list[Key]:
        """The keys whose ``key[key_field]`` (or ``value[value_field]``) is not null and at
        or below ``bound``: what an event-time eviction removes. Stores may override
        this with a faster bulk version."""
        if key_field is not None:
            return [k for k, _ in self.iterator() if k[key_field] is not None and k[key_field] <= bound]
        return [k for k, v in self.iterator() if v[value_field] is not None and v[value_field] <= bound]

    def put_absent(self, keys: list[Key], values: list[Value] | None = None):
        """Put each key that the store does not hold (in order, so a key repeated in
        ``keys`` is new only the first time), with its value from ``values`` or, if
        that is None, the empty value ``()``; a sequence of bools, true where the key
        was new. Stores may override this with a faster bulk version."""
        new = []
        for i, key in enumerate(keys):
            absent = self.get(key) is None
            if absent:
                self.put(key, () if values is None else values[i])
            new.append(absent)
        return new

    # -- a batch at a time, in Arrow ---------------------------------------------------
    def insert_new(self, keys: pa.Table, values: pa.Table | None = None) -> np.ndarray:
        """For each row of ``keys`` (the key schema's columns, in order, storage types):
        true when it is the first row of a key the store does not hold; that key is put,
        with the same row of ``values`` (the value schema's columns) or the empty value.
        Stores may override this with a faster bulk version."""
        key_rows = table_rows(keys, self.key_schema, as_key=True)
        value_rows = table_rows(values, self.value_schema) if values is not None else None
        return np.asarray(self.put_absent(key_rows, value_rows), dtype=bool)

    def remove_at_or_below(self, bound: int, *, key_field: int | None = None,
                           value_field: int | None = None) -> int:
        """Remove the keys ``keys_at_or_below`` names; how many."""
        expired = self.keys_at_or_below(bound, key_field=key_field, value_field=value_field)
        self.remove_many(expired)
        return len(expired)

    # -- a batch at a time, as Arrow tables (an optional form) -----------------------------
    # Rows are tables of the key schema's columns named k0.., then the value schema's,
    # v0.., in storage types. A store offers them only where ``in_tables()`` is true.
    def in_tables(self) -> bool:
        """Whether this version takes the row-table calls below (in Arrow's C++)."""
        return False

    def matching_rows(self, keys: pa.Table) -> pa.Table:
        """The rows held for the keys of ``keys`` (columns k..), in no particular order."""
        raise NotImplementedError(f"{type(self).__name__} does not keep its state as tables")

    def put_rows(self, rows: pa.Table) -> None:
        """Hold ``rows``: each replaces the row of its key."""
        raise NotImplementedError(f"{type(self).__name__} does not keep its state as tables")

    def take_rows_at_or_below(self, bound: int, *, key_field: int | None = None, struct_field: int | None = None,
                              value_field: int | None = None) -> pa.Table:
        """Remove the rows whose key field ``key_field`` (or value field ``value_field``;
        its struct field ``struct_field``) is at or below ``bound``; return them."""
        raise NotImplementedError(f"{type(self).__name__} does not keep its state as tables")

    def take_rows_where(self, due) -> pa.Table:
        """Remove the rows where ``due`` (a function of a table of rows, giving a boolean
        array) is true; return them."""
        raise NotImplementedError(f"{type(self).__name__} does not keep its state as tables")

    def remove_rows(self, keys: pa.Table) -> int:
        """Remove the rows held for the keys of ``keys`` (columns k..); how many."""
        raise NotImplementedError(f"{type(self).__name__} does not keep its state as tables")

    def rows(self) -> pa.Table:
        """Every row held, this version's changes included."""
        raise NotImplementedError(f"{type(self).__name__} does not keep its state as tables")

    def num_keys(self) -> int:
        """How many keys the store holds, its uncommitted changes included."""
        return sum(1 for _ in self.iterator())

    @abstractmethod
    def iterator(self) -> Iterator[tuple[Key, Value]]:
        """Every key and value, this store's uncommitted changes included."""

    @abstractmethod
    def commit(self) -> int:
        """Make the changes durable as version ``version + 1`` and return it."""

    @abstractmethod
    def abort(self) -> None: ...

    @abstractmethod
    def metrics(self) -> StateStoreMetrics: ...

    @property
    @abstractmethod
    def has_committed(self) -> bool: ...


def table_rows(table: pa.Table, schema: pa.Schema, as_key: bool = False) -> list[tuple]:
    """An Arrow table of ``schema``'s columns (in order) as state tuples."""
    from microbatch.state.files import state_values
    columns = [state_values(table.column(i), f.type, as_key=as_key) for i, f in enumerate(schema)]
    return list(zip(*columns)) if columns else [()] * table.num_rows


class StateStoreProvider(ABC):
    """Makes the stores of one ``StateStoreId``; one provider per executor process."""

    def __init__(self, store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                 conf: StateStoreConf):
        self.id = store_id
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.conf = conf

    @abstractmethod
    def get_store(self, version: int) -> StateStore:
        """The store at ``version`` (0: empty), to change and commit as ``version + 1``."""

    @abstractmethod
    def do_maintenance(self) -> None:
        """Snapshot and remove files no retained version needs."""

    def close(self) -> None:  # noqa: B027 - a hook: a provider may hold nothing to release
        pass


# -- choosing a provider, and the executor-side cache ----------------------------------------
def provider_name(conf_value: str) -> str:
    """The provider a ``providerClass`` setting means: Spark's names mean microbatch's
    counterparts (its default, its RocksDB provider), and the path an earlier microbatch
    recorded for its RocksDB provider means the provider's path now."""
    name = (conf_value or DEFAULT_PROVIDER).strip()
    return {SPARK_HDFS_PROVIDER: DEFAULT_PROVIDER, SPARK_ROCKSDB_PROVIDER: ROCKSDB_PROVIDER,
            EARLIER_ROCKSDB_PROVIDER: ROCKSDB_PROVIDER}.get(name, name)


def provider_class(name: str) -> type:
    """The ``StateStoreProvider`` subclass a class path names, or a clear error."""
    name = provider_name(name)
    module_name, _, class_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except ImportError as e:
        cls, reason = None, f"its module cannot be imported ({e})"
    else:
        reason = f"module '{module_name}' has no class '{class_name}'" if module_name else "it is not a class path"
    if cls is None:
        raise IllegalArgumentException(
            f"Cannot load the state store provider '{name}' ({PROVIDER_CLASS_CONF}): {reason}. Set "
            f"it to the path of a microbatch.state.store.StateStoreProvider subclass importable on "
            f"the driver and the executors, or unset it for {DEFAULT_PROVIDER}.")
    if not (isinstance(cls, type) and issubclass(cls, StateStoreProvider)):
        raise IllegalArgumentException(
            f"The state store provider '{name}' ({PROVIDER_CLASS_CONF}) is not a subclass of "
            "microbatch.state.store.StateStoreProvider.")
    return cls


#: (provider class, store id) -> the provider of the latest run, for every provider kind
_LOADED: dict[tuple[type, StateStoreId], StateStoreProvider] = {}


def load_provider(store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                  conf: StateStoreConf) -> StateStoreProvider:
    """The provider of ``store_id`` in this process (``conf.provider_class``), created on
    first use and again for a new query run or changed schemas: another run's memory is
    never trusted."""
    kind = provider_class(conf.provider_class)
    provider = _LOADED.get((kind, store_id))
    if provider is None or provider.key_schema != key_schema or provider.value_schema != value_schema \
            or provider.conf.run_id != conf.run_id:
        if provider is not None:
            provider.close()
            _unfreeze_worker_heap()
        provider = kind(store_id, key_schema, value_schema, conf)
        _LOADED[(kind, store_id)] = provider
    return provider


def unload_all() -> None:
    """Forget every loaded provider (as a new executor process would have none)."""
    for provider in _LOADED.values():
        provider.close()
    _LOADED.clear()
    _unfreeze_worker_heap()


def task_metrics(partition: int, store_metrics: StateStoreMetrics, **counts) -> dict:
    """What a state task adds to its operator's accumulator: Spark's progress fields,
    the provider's custom metrics, and the partition that committed."""
    untracked = {} if store_metrics.rows_tracked else {"numRowsTotal": 0}
    return {"numRowsTotal": store_metrics.num_keys, "commitTimeMs": store_metrics.commit_time_ms,
            "memoryUsedBytes": store_metrics.memory_used_bytes, "numStateStoreInstances": 1,
            **store_metrics.custom, **counts, **untracked, f"partition_{partition}": 1}
