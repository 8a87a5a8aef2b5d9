"""One version of a RocksDB provider's store: reads go to the version's own changes,
then to the database; changes stay in memory until ``commit`` writes the delta file and
then the database."""
from __future__ import annotations

from typing import Iterator, Protocol

import numpy as np
import pyarrow as pa

from microbatch.state.files import REMOVED, to_struct_array
from microbatch.state.rocksdb import database
from microbatch.state.rocksdb.codec import TupleCodec
from microbatch.state.store import Key, StateStore, StateStoreConf, StateStoreId, StateStoreMetrics, Value, table_rows

_MISSING = REMOVED


class StoreDatabase(Protocol):
    """What a version's store asks of its provider (``RocksDBStateStoreProvider``): the
    database at a version, its codecs, and the commit of a version's changes."""

    id: StateStoreId
    key_schema: pa.Schema
    value_schema: pa.Schema
    keys: TupleCodec
    values: TupleCodec
    db: object
    num_keys: int
    opened: dict
    ops_since_made: dict
    conf: StateStoreConf

    def load(self, version: int) -> bool: ...
    def commit(self, version: int, pending: dict, held: dict, arrays=None) -> dict: ...
    def release(self) -> None: ...
    def memory_used_bytes(self) -> int: ...
    def sst_bytes(self) -> int: ...


class RocksDBStateStore(StateStore):
    """One version of a ``RocksDBStateStoreProvider``'s store: reads go to the open
    version's changes, then to the database; changes stay in memory until ``commit``."""

    def __init__(self, provider: StoreDatabase, version: int):
        self.provider = provider
        self.id = provider.id
        self.version = version
        self.key_schema = provider.key_schema
        self.value_schema = provider.value_schema
        self._pending: dict[Key, object] = {}    # key -> value tuple, or _MISSING (removed)
        #: what the database held for keys this version read (encoded value, or None):
        #: the commit's undo record needs no second read of them
        self._held: dict[Key, bytes | None] = {}
        #: the Arrow rows ``insert_new`` added, while it is the only change: the delta is
        #: then written from them, not from Python tuples
        self._inserted: list | None = []
        self._loaded = False
        self._cache_hit = False
        self._committed = False
        self._aborted = False
        self._gets = self._puts = 0
        self._metrics = StateStoreMetrics()

    def _open(self):
        """The database at this store's version: loaded on the first call; a store is not
        read after its commit or abort (its database belongs to the next task then)."""
        self._check_open()
        if not self._loaded:
            self._cache_hit = self.provider.load(self.version)
            self._loaded = True
        return self.provider.db

    def _check_open(self) -> None:
        if self._committed or self._aborted:
            raise RuntimeError(f"State store {self.id} version {self.version} is already "
                               f"{'committed' if self._committed else 'aborted'}")

    def _stored(self, key: Key) -> bytes | None:
        held = self._held
        if key in held:
            return held[key]
        data = self._open().get(self.provider.keys.encode(key))
        held[key] = data
        self._gets += 1
        return data

    # -- key by key -------------------------------------------------------------------
    def get(self, key: Key) -> Value | None:
        self._open()
        value = self._pending.get(key, _MISSING)
        if value is not _MISSING:
            return value  # type: ignore[return-value]
        if key in self._pending:
            return None
        data = self._stored(key)
        return None if data is None else self.provider.values.decode(data)

    def put(self, key: Key, value: Value) -> None:
        self._open()
        self._check_open()
        self._pending[key] = value
        self._inserted = None

    def remove(self, key: Key) -> None:
        self._open()
        self._check_open()
        if key in self._pending or self._stored(key) is not None:
            self._pending[key] = _MISSING
            self._inserted = None

    def insert_new(self, keys: pa.Table, values: pa.Table | None = None) -> np.ndarray:
        key_rows = table_rows(keys, self.key_schema, as_key=True)
        value_rows = table_rows(values, self.value_schema) if values is not None else None
        new = self._put_absent(key_rows, value_rows)
        if self._inserted is not None and new.any():
            mask = pa.array(new)
            self._inserted.append((keys.filter(mask), values.filter(mask) if values is not None else None))
        return new

    def put_absent(self, keys: list[Key], values: list[Value] | None = None) -> np.ndarray:
        self._inserted = None
        return self._put_absent(keys, values)

    def _put_absent(self, keys: list[Key], values: list[Value] | None) -> np.ndarray:
        db = self._open()
        self._check_open()
        pending, held = self._pending, self._held
        encode, lookup = self.provider.keys.encode, db.get
        n = len(keys)
        first = dict(zip(reversed(keys), range(n - 1, -1, -1)))   # key -> its first row
        new = np.zeros(n, bool)
        for key, row in first.items():
            if key in pending:
                absent = pending[key] is _MISSING
            else:
                if key in held:
                    data = held[key]
                else:
                    data = held[key] = lookup(encode(key))
                    self._gets += 1
                absent = data is None
            if absent:
                pending[key] = () if values is None else values[row]
                new[row] = True
        return new

    def remove_many(self, keys: list[Key]) -> None:
        for key in keys:
            self.remove(key)

    def keys_at_or_below(self, bound: int, *, key_field: int | None = None,
                         value_field: int | None = None) -> list[Key]:
        found = []
        for key, value in self.iterator():
            t = key[key_field] if key_field is not None else value[value_field]
            if t is not None and t <= bound:
                found.append(key)
        return found

    def num_keys(self) -> int:
        self._open()
        count = self.provider.num_keys
        for key, value in self._pending.items():
            was_held = self._stored(key) is not None
            count += (value is not _MISSING) - was_held
        return count

    def iterator(self) -> Iterator[tuple[Key, Value]]:
        db = self._open()
        pending, provider = self._pending, self.provider
        decode_key, decode_value = provider.keys.decode, provider.values.decode
        for data, value in db.items(from_key=database.FIRST_KEY):
            key = decode_key(data)
            if key in pending:
                continue
            yield key, decode_value(value)
        for key, value in pending.items():
            if value is not _MISSING:
                yield key, value  # type: ignore[misc]

    # -- the end of a version ---------------------------------------------------------------
    def commit(self) -> int:
        self._open()
        self._check_open()
        pending = self._pending
        for key in pending:          # the database's value of every changed key, for the undo record
            if key not in self._held:
                self._stored(key)
        self._puts = len(pending)
        timings = self.provider.commit(self.version, pending, self._held, self._inserted_arrays())
        self._committed = True
        removed = sum(1 for v in pending.values() if v is _MISSING)
        provider = self.provider
        ops = provider.ops_since_made
        ops["get"] += self._gets
        ops["put"] += self._puts
        if not provider.conf.rocksdb.reset_stats_on_load:   # counted since the provider was made, as Spark's
            self._gets, self._puts = ops["get"], ops["put"]
        self._metrics = StateStoreMetrics(
            num_keys=provider.num_keys, num_updated=len(pending) - removed, num_removed=removed,
            memory_used_bytes=provider.memory_used_bytes(), commit_time_ms=sum(timings.values()),
            custom={"rocksdbGetCount": self._gets, "rocksdbPutCount": self._puts,
                    "rocksdbCommitWriteBatchLatency": timings["writeBatch"],
                    "rocksdbCommitChangelogLatency": timings["changelog"],
                    "rocksdbCommitCompactLatency": timings["compact"],
                    "rocksdbSstFileSize": provider.sst_bytes(),
                    "rocksdbLoadedFromMemoryCount": int(self._cache_hit),
                    "rocksdbLoadedFromCheckpointCount": int(not self._cache_hit),
                    # microbatch's own: the database opened by this task's worker process
                    # (its block cache cold), after waiting for the worker that held it
                    "rocksdbOpenedCount": provider.opened["opened"],
                    "rocksdbOpenLatencyMs": provider.opened["openMs"],
                    "rocksdbHandOverWaitMs": provider.opened["handOverWaitMs"],
                    "rocksdbPrivateCopyCount": provider.opened["privateCopy"]},
            rows_tracked=provider.conf.rocksdb.track_total_rows)
        provider.release()
        return self.version + 1

    def _inserted_arrays(self):
        """The delta's key and value struct arrays from the rows ``insert_new`` added, when
        those are all the changes; None otherwise (the delta is then written from tuples)."""
        if not self._inserted or not len(self.key_schema):
            return None
        try:
            keys = pa.concat_tables([k for k, _ in self._inserted])
            key_struct = pa.StructArray.from_arrays(
                [keys.column(i).combine_chunks().cast(f.type) for i, f in enumerate(self.key_schema)],
                fields=list(self.key_schema))
            if self._inserted[0][1] is not None and len(self.value_schema):
                values = pa.concat_tables([v for _, v in self._inserted])
                value_struct = pa.StructArray.from_arrays(
                    [values.column(i).combine_chunks().cast(f.type) for i, f in enumerate(self.value_schema)],
                    fields=list(self.value_schema))
            else:
                value_struct = to_struct_array([()] * keys.num_rows, self.value_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        return (key_struct, value_struct) if len(key_struct) == len(self._pending) else None

    def abort(self) -> None:
        if not self._committed:
            self._aborted = True
            self._pending = {}
            self._held = {}
            if self._loaded:
                self.provider.release()

    def metrics(self) -> StateStoreMetrics:
        return self._metrics

    @property
    def has_committed(self) -> bool:
        return self._committed
