"""The state store contract (Spark's StateStore / StateStoreProvider; docs/design.md, section 4).

A stateful operator keeps its state per ``(operator id, partition id)`` in a store
versioned by batch: batch N reads version N and commits version N+1 (version 0
is empty). Inside a Spark task the operator asks the provider for the store at
version N, reads and changes keys, then ``commit()`` makes version N+1 durable,
or ``abort()`` forgets the changes. A retried or speculative task may commit the
same version again: it writes the same content, so that is harmless.

Keys and values are tuples of plain Python values, in the order of the key and
value schemas (``pyarrow.Schema``), so a store can write them as Arrow.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

Key = tuple
Value = tuple


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

    @property
    def fs(self):
        from microbatch.checkpoint.fs import storage_from_spec
        return storage_from_spec(self.storage)

    @classmethod
    def from_session(cls, spark: Any) -> "StateStoreConf":
        get = spark.conf.get
        codec = get("spark.sql.streaming.stateStore.compression.codec", "lz4").lower()
        return cls(
            min_deltas_for_snapshot=int(get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10")),
            min_versions_to_retain=int(get("spark.sql.streaming.minBatchesToRetain", "100")),
            max_versions_in_memory=int(get("spark.sql.streaming.maxBatchesToRetainInMemory", "2")),
            compression="zstd" if codec == "zstd" else "lz4")


@dataclass
class StateStoreMetrics:
    """What a store reports after a commit (progress ``stateOperators``)."""

    num_keys: int = 0
    num_updated: int = 0
    num_removed: int = 0
    memory_used_bytes: int = 0
    commit_time_ms: int = 0
    custom: dict[str, int] = field(default_factory=dict)


class StateStore(ABC):
    """One version of one store, open for changes until ``commit()`` or ``abort()``."""

    id: StateStoreId
    version: int

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

    def close(self) -> None:
        pass


def task_metrics(partition: int, store_metrics, cache_hit: bool, **counts) -> dict:
    """What a state task adds to its operator's accumulator: Spark's progress fields,
    the partition that committed, and the map cache hit or miss."""
    return {"numRowsTotal": store_metrics.num_keys, "commitTimeMs": store_metrics.commit_time_ms,
            "memoryUsedBytes": store_metrics.memory_used_bytes, "numStateStoreInstances": 1,
            **counts, f"partition_{partition}": 1,
            "loadedMapCacheHitCount": int(cache_hit), "loadedMapCacheMissCount": int(not cache_hit)}


class EventTimeStats:
    """Event-time statistics a state task computes for the watermark right below its
    operator (max, min, sum and count in ms, as ``EventTimeWatermarkExec`` would).
    They go to the operator's accumulator under ``set:`` keys of the partition, which a
    re-run of the partition replaces rather than adds to."""

    def __init__(self) -> None:
        self.high: int | None = None
        self.low: int | None = None
        self.total = 0.0
        self.count = 0

    def add_ms(self, high, low, total: float, count: int) -> None:
        if not count:
            return
        self.high = high if self.high is None else max(self.high, high)
        self.low = low if self.low is None else min(self.low, low)
        self.total += total
        self.count += count

    def add_micros(self, times: pa.Array) -> None:
        """Rows' event times in µs (int64); ms truncate toward zero, as in Spark."""
        import pyarrow.compute as pc
        ms = pc.divide(times, 1000)
        count = len(ms) - ms.null_count
        if count:
            self.add_ms(pc.max(ms).as_py(), pc.min(ms).as_py(), pc.sum(ms.cast(pa.float64())).as_py(), count)

    def report(self, metrics, partition: int) -> None:
        if self.count:
            metrics.add({f"set:eventTime_{partition}_max": self.high, f"set:eventTime_{partition}_min": self.low,
                         f"set:eventTime_{partition}_sum": self.total,
                         f"set:eventTime_{partition}_count": self.count})
