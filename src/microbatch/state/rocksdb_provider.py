"""State beyond memory: a provider whose working copy of a store is a RocksDB database on
the executor's local disk (through ``rocksdict``), as Spark's RocksDBStateStoreProvider.

Chosen by ``spark.sql.streaming.stateStore.providerClass`` set to this class or to
Spark's ``...state.RocksDBStateStoreProvider`` (a ported job keeps its conf).

The checkpoint holds what every provider writes (``state.files``), so the state reader,
the toolkit, repartition and a change of provider between runs read it alike:

- A commit writes the version's delta file first (the changelog: Spark's changelog
  checkpointing), then applies the same changes to the local database in one write
  batch. A delta costs the keys the batch touched, however large the state.
- Every ``minDeltasForSnapshot`` versions a background thread of the Python worker
  writes an Arrow snapshot from a RocksDB checkpoint of the committed version (hard
  links to its files, so the database may close and change meanwhile), chunk by chunk,
  then deletes the files no retained version needs. A batch does not wait for it (unless the previous
  snapshot is still being written when the next one is due).
- Loading a version: the one the database holds (a hit); an earlier one within
  ``maxBatchesToRetainInMemory`` by undo records (a re-run of a batch); a later one
  by applying the deltas other executors committed since; anything else rebuilds the
  database from the newest snapshot and the deltas after it.

The database lives in ``<SPARK_LOCAL_DIRS>/microbatch-rocksdb/<store digest>``, one per
store and executor, like Spark's. RocksDB lets one process open a database, and Spark
may run a partition's next task in any Python worker process of the executor: a worker
keeps the database open after its task, and another that needs it creates
``<db>.release`` and retries; the holder's watcher thread closes it between tasks. The
database keeps its own record (version, keys, a token of the last write) in the write
batch of every version, so whoever opens it knows what it holds; undo records are
trusted only if the token is the one this provider wrote. A task that cannot get the
database (another task of the partition holds it: a speculative or retried one) builds
a private copy from the files. The database is a working copy, never the checkpoint;
Spark deletes its local directories at the end.

In the database a key or value is the tuple ``state.files`` defines, encoded with
``marshal`` format 0 (no interning flags or back-references, so equal keys are equal
bytes); dates, times, decimals and durations become numbers or text first. The
memory a worker spends is RocksDB's: its memtables (``writeBufferSizeMB`` times
``maxWriteBufferNumber`` a store), one block cache shared by the worker's stores
(``blockCacheSizeMB``), and the open batch's changes.
"""
from __future__ import annotations

import datetime
import decimal
import hashlib
import itertools
import logging
import marshal
import os
import shutil
import tempfile
import threading
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

from microbatch import crash_points
from microbatch.state.files import REMOVED, StateFiles, storage_type, to_struct_array
from microbatch.state.store import (Key, StateStore, StateStoreConf, StateStoreId,
                                    StateStoreMetrics, StateStoreProvider, Value, table_rows)

log = logging.getLogger(__name__)

_MISSING = REMOVED
#: rows decoded and written per record batch of a snapshot
_SNAPSHOT_CHUNK = 100_000


# -- the encoding of tuples in the database ----------------------------------------------
def _needs_conversion(t: pa.DataType) -> bool:
    """Whether values of ``t`` hold Python objects ``marshal`` cannot write."""
    if pa.types.is_struct(t):
        return any(_needs_conversion(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _needs_conversion(t.value_type)
    if pa.types.is_map(t):
        return _needs_conversion(t.key_type) or _needs_conversion(t.item_type)
    return pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_decimal(t) or pa.types.is_duration(t)


def _to_plain(value, t: pa.DataType):
    if value is None:
        return None
    if pa.types.is_struct(t):
        if isinstance(value, dict):
            return {f.name: _to_plain(value[f.name], f.type) for f in t}
        return tuple(_to_plain(v, f.type) for v, f in zip(value, t))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = type(value)
        return kind(_to_plain(v, t.value_type) for v in value)
    if pa.types.is_map(t):
        kind = type(value)
        return kind((_to_plain(k, t.key_type), _to_plain(v, t.item_type)) for k, v in value)
    if pa.types.is_date(t):
        return value.toordinal()
    if pa.types.is_time(t):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if pa.types.is_decimal(t):
        return str(value)
    if pa.types.is_duration(t):
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    return value


def _from_plain(value, t: pa.DataType):
    if value is None:
        return None
    if pa.types.is_struct(t):
        if isinstance(value, dict):
            return {f.name: _from_plain(value[f.name], f.type) for f in t}
        return tuple(_from_plain(v, f.type) for v, f in zip(value, t))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = type(value)
        return kind(_from_plain(v, t.value_type) for v in value)
    if pa.types.is_map(t):
        kind = type(value)
        return kind((_from_plain(k, t.key_type), _from_plain(v, t.item_type)) for k, v in value)
    if pa.types.is_date(t):
        return datetime.date.fromordinal(value)
    if pa.types.is_time(t):
        seconds, micros = divmod(value, 1_000_000)
        minutes, second = divmod(seconds, 60)
        return datetime.time(minutes // 60, minutes % 60, second, micros)
    if pa.types.is_decimal(t):
        return decimal.Decimal(value)
    if pa.types.is_duration(t):
        return datetime.timedelta(microseconds=value)
    return value


class TupleCodec:
    """A schema's tuples to bytes and back; equal tuples give equal bytes."""

    def __init__(self, schema: pa.Schema):
        types = [storage_type(f.type) for f in schema]
        if any(_needs_conversion(t) for t in types):
            def encode(row, _types=types):
                return marshal.dumps(tuple(_to_plain(v, t) for v, t in zip(row, _types)), 0)

            def decode(data, _types=types):
                return tuple(_from_plain(v, t) for v, t in zip(marshal.loads(data), _types))
            self.encode, self.decode = encode, decode
        else:
            self.encode = lambda row, _dumps=marshal.dumps: _dumps(row, 0)
            self.decode = marshal.loads


# -- the local database ----------------------------------------------------------------------
_SHARED: dict = {}
_INSTANCES = itertools.count()
#: The database's own record, in the write batch of every version: (version, number of
#: keys, token of the write). It sorts before every encoded tuple (marshal's tuples start
#: with "("), so reading from ``_FIRST_KEY`` skips it.
_META = b"\x00microbatch"
_FIRST_KEY = b"\x01"
#: A process that wants a database another process keeps open creates ``<path>.release``
#: and retries for this long; the holder's watcher thread closes it between tasks.
_RELEASE_REQUEST = ".release"
_RELEASE_WAIT_S = 5.0
_KEPT_OPEN: set = set()       # providers of this process keeping their database open
#: One snapshot at a time in a worker process: each holds a chunk of rows and its whole
#: compressed file in memory until the write (a worker killed at 50M keys under a 1 GB
#: address-space cap when its four partitions snapshotted together).
_ONE_SNAPSHOT = threading.Semaphore(1)


def _watch(provider) -> None:
    """Watch for requests to release ``provider``'s database (one daemon thread a process)."""
    _KEPT_OPEN.add(provider)
    if _SHARED.get("watcher") is None or not _SHARED["watcher"].is_alive():
        def run():
            while True:
                time.sleep(0.005)
                for kept in list(_KEPT_OPEN):
                    if kept.db is None:
                        _KEPT_OPEN.discard(kept)
                    else:
                        kept._release_if_asked()
        _SHARED["watcher"] = threading.Thread(target=run, name="rocksdb-release-watcher", daemon=True)
        _SHARED["watcher"].start()


def _forget_request(path: str) -> None:
    try:
        os.remove(path + _RELEASE_REQUEST)
    except FileNotFoundError:
        pass


def _local_root() -> str:
    """``<first of SPARK_LOCAL_DIRS, or the temp dir>/microbatch-rocksdb``."""
    root = _SHARED.get("root")
    if root is None:
        base = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or tempfile.gettempdir()
        root = os.path.join(base, "microbatch-rocksdb")
        os.makedirs(root, exist_ok=True)
        _SHARED["root"] = root
    return root


def _options(conf: StateStoreConf):
    from rocksdict import BlockBasedOptions, Cache, Options
    cache = _SHARED.get("cache")
    if cache is None:   # one block cache for every store of this worker process
        cache = _SHARED["cache"] = Cache(conf.rocksdb_block_cache_mb << 20)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)   # a new key (most of a dedup's) is decided in memory
    table.set_block_cache(cache)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(conf.rocksdb_write_buffer_mb << 20)
    options.set_max_write_buffer_number(conf.rocksdb_max_write_buffers)
    options.set_compression_type(_compression(conf.compression))
    options.increase_parallelism(2)
    # Level 1 of half a memtable (RocksDB's default is 256 MB): a partition's database
    # is tens to hundreds of MB, so with the default all of it sat in level 1 and every
    # compaction of level 0 (every few memtables, and each hand-over flushes one)
    # rewrote the whole database, a cost growing with the state. With a small level 1
    # the data moves down levels and a compaction rewrites a bounded slice: the 50M-key
    # deduplication's last tenth went from 1.3-2.1 to 1.13-1.14 times its second.
    level_base = max(1, conf.rocksdb_write_buffer_mb // 2)
    options.set_max_bytes_for_level_base(level_base << 20)
    options.set_target_file_size_base(max(1, level_base // 4) << 20)
    return options


def _open_database(path: str, conf: StateStoreConf):
    """The database at ``path``, made or opened with ``_options``. The default column
    family's options are named too: rocksdict opens the families of an existing database
    with the options its OPTIONS file records, which lose the table settings, so a
    database opened again (handed over by another worker) had no bloom filter, and every
    lookup of an absent key read blocks from disk: 3-4x slower, for as long as it lived."""
    from rocksdict import Rdict
    return Rdict(path, _options(conf), column_families={"default": _options(conf)})


def _compression(codec: str):
    from rocksdict import DBCompressionType
    return DBCompressionType.zstd() if codec == "zstd" else DBCompressionType.lz4()


class RocksDBStateStore(StateStore):
    """One version of a ``RocksDBStateStoreProvider``'s store: reads go to the open
    version's changes, then to the database; changes stay in memory until ``commit``."""

    def __init__(self, provider: "RocksDBStateStoreProvider", version: int):
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
        for data, value in db.items(from_key=_FIRST_KEY):
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
        self._metrics = StateStoreMetrics(
            num_keys=provider.num_keys, num_updated=len(pending) - removed, num_removed=removed,
            memory_used_bytes=provider.memory_used_bytes(), commit_time_ms=sum(timings.values()),
            custom={"rocksdbGetCount": self._gets, "rocksdbPutCount": self._puts,
                    "rocksdbCommitWriteBatchLatency": timings["writeBatch"],
                    "rocksdbCommitChangelogLatency": timings["changelog"],
                    "rocksdbSstFileSize": provider.sst_bytes(),
                    "rocksdbLoadedFromMemoryCount": int(self._cache_hit),
                    "rocksdbLoadedFromCheckpointCount": int(not self._cache_hit),
                    # microbatch's own: the database opened by this task's worker process
                    # (its block cache cold), after waiting for the worker that held it
                    "rocksdbOpenedCount": provider.opened["opened"],
                    "rocksdbOpenLatencyMs": provider.opened["openMs"],
                    "rocksdbHandOverWaitMs": provider.opened["handOverWaitMs"],
                    "rocksdbPrivateCopyCount": provider.opened["privateCopy"]})
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


class RocksDBStateStoreProvider(StateStoreProvider):
    def __init__(self, store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                 conf: StateStoreConf):
        super().__init__(store_id, key_schema, value_schema, conf)
        self.files = StateFiles(store_id, key_schema, value_schema, conf)
        self.keys = TupleCodec(key_schema)
        self.values = TupleCodec(value_schema)
        digest = hashlib.sha1(f"{store_id.path}\0{conf.run_id}\0{key_schema}\0{value_schema}".encode())
        #: the store's database on this executor, shared by its Python worker processes
        self.shared_path = os.path.join(_local_root(), digest.hexdigest()[:20])
        self.path: str | None = None      # the database open now (the shared one, or a private copy)
        self.db = None
        self.loaded_version = -1          # the version the open database holds
        self.num_keys = 0
        self._token: str | None = None    # the token of the last write this provider made or saw
        self._undo: dict[int, tuple[dict[bytes, bytes | None], int]] = {}   # v -> (v-1's values, keys)
        self._deltas_since_snapshot = 0
        self._delta_rows = 0              # rows written in the deltas since the last snapshot
        self._snapshot_rows = 0           # keys in the last snapshot
        self._last_non_insert = 0         # the newest version whose delta updated or removed a key
        self._maintenance: threading.Thread | None = None
        self._lock = threading.Lock()     # a task's use of the database against the release watcher
        self._in_use = False
        self._hit = False
        #: how the last task got the database: opened it (not kept open by this process
        #: since its last task of the partition), waiting for another worker to hand it
        #: over, in how long, or on a private copy (the store metrics' ``rocksdbOpen*``)
        self.opened = {"opened": 0, "handOverWaitMs": 0, "openMs": 0, "privateCopy": 0}

    # -- the database ------------------------------------------------------------------
    def _open(self) -> None:
        """Open the store's database, or keep the one this process kept open since its last
        task of the partition (nobody else could write it meanwhile). Another worker
        process that holds it open is asked to release it (a request file its watcher
        thread answers between tasks); if it does not within ``_RELEASE_WAIT_S`` (it runs
        a task of the partition: a speculative or retried one), this task works on a
        private copy built from the files. Reads the version it holds from its own record."""
        with self._lock:
            self._in_use = True
            self.opened = {"opened": 0, "handOverWaitMs": 0, "openMs": 0, "privateCopy": 0}
            if self.db is not None:
                return
        started = time.monotonic()
        deadline = started + _RELEASE_WAIT_S
        asked = None                      # when this process first found the database held
        while True:
            try:
                attempt = time.monotonic()
                self.db, self.path = _open_database(self.shared_path, self.conf), self.shared_path
                break
            except Exception as e:
                if "lock" not in str(e).lower():
                    raise
                asked = asked or time.monotonic()
                if time.monotonic() >= deadline:
                    private = f"{self.shared_path}-{os.getpid()}-{next(_INSTANCES)}"
                    shutil.rmtree(private, ignore_errors=True)
                    attempt = time.monotonic()
                    self.db, self.path = _open_database(private, self.conf), private
                    self.opened["privateCopy"] = 1
                    break
                with open(self.shared_path + _RELEASE_REQUEST, "w"):
                    pass
                time.sleep(0.005)
        done = time.monotonic()
        self.opened.update(opened=1, openMs=int((done - attempt) * 1000),
                           handOverWaitMs=int((attempt - asked) * 1000) if asked else 0)
        _forget_request(self.shared_path)
        record = self.db.get(_META)
        fields = marshal.loads(record) if record is not None else (0, 0, 0, 0, 0, None, 0)
        if len(fields) == 6:   # written before the record kept the last non-insert: assume it is now
            fields = (*fields, fields[0])
        version, keys, deltas, delta_rows, snapshot_rows, token, last_non_insert = fields
        if token is None or token != self._token:   # another process wrote since: our undo records are stale
            self._undo = {}
        self.loaded_version, self.num_keys, self._token = version, keys, token
        self._deltas_since_snapshot, self._delta_rows, self._snapshot_rows = deltas, delta_rows, snapshot_rows
        self._last_non_insert = last_non_insert

    def release(self) -> None:
        """The end of a task's store: start a snapshot when due, and keep the database open
        for this process's next task of the partition, until another process asks for it.
        (Closing it at every commit measured 4x slower lookups at 10M keys: each reopen
        flushes and compacts a small file and starts with cold table readers.)"""
        with self._lock:
            if self.db is None:
                self._in_use = False
                return
            if self._snapshot_due():
                self.do_maintenance(background=True)
            if self.path != self.shared_path:    # a private copy serves one task
                self.db.close()
                self.db = None
                shutil.rmtree(self.path, ignore_errors=True)
                self._token = None
            self._in_use = False
        if self.db is not None:
            _watch(self)

    def _release_if_asked(self) -> None:
        """The watcher's call: close the database if another process asked and no task of
        this process uses it."""
        with self._lock:
            if self._in_use or self.db is None or not os.path.exists(self.shared_path + _RELEASE_REQUEST):
                return
            self.db.close()
            self.db = None
        _forget_request(self.shared_path)

    def _fresh_db(self) -> None:
        """Empty the open database (drop it and make it again at the same path)."""
        path = self.path
        self.db.close()
        shutil.rmtree(path, ignore_errors=True)
        self.db = _open_database(path, self.conf)
        self.loaded_version, self.num_keys, self._undo = 0, 0, {}
        self._deltas_since_snapshot = self._delta_rows = self._snapshot_rows = self._last_non_insert = 0

    def close(self) -> None:
        """Forget the store in this process (a new run, or the provider unloaded). The
        database goes with it if this process holds it; one another worker holds goes
        when that worker closes its provider (and Spark's local directories at the end)."""
        self._wait_for_maintenance()
        _KEPT_OPEN.discard(self)
        with self._lock:
            held, path = self.db is not None, self.path
            if held:
                try:
                    self.db.close()
                except Exception:       # its files may be gone already (the directory was removed)
                    log.debug("Closing the RocksDB database of %s", self.id, exc_info=True)
                self.db = None
        if held or (path and path != self.shared_path):
            shutil.rmtree(path, ignore_errors=True)
        self.loaded_version, self._token, self._undo = -1, None, {}

    def memory_used_bytes(self) -> int:
        db = self.db
        total = 0
        for name in ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem",
                     "rocksdb.block-cache-usage"):
            total += db.property_int_value(name) or 0
        return total

    def sst_bytes(self) -> int:
        return self.db.property_int_value("rocksdb.total-sst-files-size") or 0

    # -- loading a version ----------------------------------------------------------------
    def load(self, version: int) -> bool:
        """Open the database and make it hold ``version``; whether it held it already."""
        if version < 0:
            raise ValueError(f"Version cannot be less than 0, got {version}")
        try:
            self._load(version)
        except BaseException:
            self._in_use = False      # the database may be released to another process
            raise
        return self._hit

    def _load(self, version: int) -> None:
        self._hit = False
        self._open()
        loaded = self.loaded_version
        if version == loaded:
            self._hit = True
            return
        if 0 <= version < loaded and all(v in self._undo for v in range(version + 1, loaded + 1)):
            for v in range(loaded, version, -1):     # a re-run: step back by the undo records
                previous, keys = self._undo.pop(v)
                self._last_non_insert = max(self._last_non_insert, v)   # (its redo may differ)
                self._deltas_since_snapshot = max(0, self._deltas_since_snapshot - 1)
                self._delta_rows = max(0, self._delta_rows - len(previous))
                self._write(previous, v - 1, keys)
            return
        if loaded < version <= loaded + max(1, self.conf.min_deltas_for_snapshot) and \
                all(self.files.exists(v, "delta") for v in range(loaded + 1, version + 1)):
            for v in range(loaded + 1, version + 1):   # other executors committed since
                self._apply_rows(v, self.files.read_delta(v, version, 0))
            self._deltas_since_snapshot = self.files.deltas_since_snapshot(version)
            return
        self._rebuild(version)

    def _rebuild(self, version: int) -> None:
        started = time.monotonic()
        self._fresh_db()
        if version == 0:
            return
        start = self.files.newest_snapshot(version)
        if start:
            for rows in self.files.read_chunks(start, "snapshot"):
                encode_key, encode_value = self.keys.encode, self.values.encode
                self._snapshot_rows += len(rows)
                self._write({encode_key(k): encode_value(v) for k, v in rows}, start, self.num_keys + len(rows))
        for v in range(start + 1, version + 1):
            self._apply_rows(v, self.files.read_delta(v, version, start),
                             keep_undo=v > version - self.conf.max_versions_in_memory)
        log.info("Loaded state store %s version %d into RocksDB at %s (snapshot %d + %d deltas, "
                 "%d keys) in %d ms", self.id, version, self.path, start, version - start,
                 self.num_keys, (time.monotonic() - started) * 1000)

    def _apply_rows(self, version: int, rows, keep_undo: bool = True) -> None:
        """A delta file's (key, value) rows (value ``REMOVED``: the key goes) as ``version``."""
        encode_key, encode_value, get = self.keys.encode, self.values.encode, self.db.get
        changes = {encode_key(k): (None if v is _MISSING else encode_value(v)) for k, v in rows}
        previous = {k: get(k) for k in changes}
        self._apply(version, changes, previous, keep_undo)

    def _apply(self, version: int, changes: dict[bytes, bytes | None], previous: dict[bytes, bytes | None],
               keep_undo: bool = True) -> None:
        if keep_undo:
            self._undo[version] = (previous, self.num_keys)
            for old in [v for v in self._undo if v <= version - self.conf.max_versions_in_memory]:
                del self._undo[old]
        added = sum(1 for k, v in changes.items() if v is not None and previous[k] is None)
        gone = sum(1 for k, v in changes.items() if v is None and previous[k] is not None)
        if added != len(changes):
            self._last_non_insert = version
        self._deltas_since_snapshot += 1
        self._delta_rows += len(changes)
        self._write(changes, version, self.num_keys + added - gone)

    def _write(self, changes: dict[bytes, bytes | None], version: int, num_keys: int) -> None:
        """Changes and the database's record of ``version`` in one write batch."""
        from rocksdict import WriteBatch
        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        for key, value in changes.items():
            if value is None:
                delete(key)
            else:
                put(key, value)
        token = os.urandom(8).hex()
        put(_META, marshal.dumps((version, num_keys, self._deltas_since_snapshot, self._delta_rows,
                                  self._snapshot_rows, token, self._last_non_insert), 0))
        self.db.write(batch)
        self.loaded_version, self.num_keys, self._token = version, num_keys, token

    # -- the contract ---------------------------------------------------------------------
    def get_store(self, version: int) -> StateStore:
        if version < 0:
            raise ValueError(f"Version cannot be less than 0, got {version}")
        store = RocksDBStateStore(self, version)
        crash_points.reached("state-loaded")
        return store

    def commit(self, version: int, pending: dict[Key, object], held: dict[Key, bytes | None],
               arrays=None) -> dict:
        """Write ``version + 1``'s delta (the changelog: ``arrays``' key and value structs
        when given, else the pending rows), then apply it to the database."""
        if self.loaded_version != version:
            raise RuntimeError(f"State store {self.id}: committing version {version + 1} on top "
                               f"of version {self.loaded_version}; another store of the same "
                               "partition was committed meanwhile.")
        started = time.monotonic()
        if arrays is not None:
            self.files.write_arrays(version + 1, "delta", *arrays)
        else:
            self.files.write_rows(version + 1, "delta", list(pending), list(pending.values()))
        changelog = time.monotonic()
        encode_key, encode_value = self.keys.encode, self.values.encode
        changes, previous = {}, {}
        for key, value in pending.items():
            data = encode_key(key)
            changes[data] = None if value is _MISSING else encode_value(value)
            previous[data] = held[key]
        self._apply(version + 1, changes, previous)
        done = time.monotonic()
        return {"changelog": int((changelog - started) * 1000), "writeBatch": int((done - changelog) * 1000)}

    # -- maintenance --------------------------------------------------------------------------
    def _snapshot_due(self) -> bool:
        """At least ``minDeltasForSnapshot`` deltas since the last snapshot, and as many rows
        in them as the snapshot held: a snapshot costs the whole state, so they come at
        geometrically growing intervals while the state grows, and the work per batch stays
        flat; a reload reads at most about twice the state."""
        return self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot and \
            self._delta_rows >= self._snapshot_rows

    def do_maintenance(self, background: bool = False) -> None:
        """Snapshot the open database's version, in a background thread when asked, and
        delete the files no retained version needs. If every delta since the newest
        snapshot only added keys (a deduplication's, a count of new keys), the new snapshot
        is that snapshot's file and the deltas' files one after the other, record batch by
        record batch (``_merged_snapshot``); otherwise it is written from a RocksDB
        checkpoint of the database (hard links to its files, so the database may close and
        change meanwhile), decoding every row (``_snapshot``)."""
        if self.db is None or self.loaded_version <= 0 or not self._snapshot_due():
            self.files.cleanup()
            return
        from rocksdict import Checkpoint
        self._wait_for_maintenance()
        version = self.loaded_version
        base = self.files.newest_snapshot(version)
        if self._last_non_insert <= base:
            target, args = self._merged_snapshot, (version, base)
        else:
            copy = f"{self.path}.snapshot-{version}-{os.getpid()}-{next(_INSTANCES)}"
            shutil.rmtree(copy, ignore_errors=True)
            Checkpoint(self.db).create_checkpoint(copy)
            target, args = self._snapshot, (version, copy)
        self._deltas_since_snapshot, self._delta_rows, self._snapshot_rows = 0, 0, self.num_keys
        self._write({}, version, self.num_keys)    # the next process to open it knows the snapshot is made
        if not background:
            target(*args)
            return
        self._maintenance = threading.Thread(target=target, args=args,
                                             name=f"state-snapshot-{self.id.operator_id}-{self.id.partition_id}",
                                             daemon=True)
        self._maintenance.start()

    def _snapshot(self, version: int, copy: str) -> None:
        from rocksdict import AccessType, Options, Rdict
        started = time.monotonic()
        decode_key, decode_value = self.keys.decode, self.values.decode
        view = None

        def chunks():
            keys, values, written = [], [], False
            for key, value in view.items(from_key=_FIRST_KEY):
                keys.append(decode_key(key))
                values.append(decode_value(value))
                if len(keys) == _SNAPSHOT_CHUNK:
                    yield keys, values
                    keys, values, written = [], [], True
            if keys or not written:
                yield keys, values
        try:
            _ONE_SNAPSHOT.acquire()
            view = Rdict(copy, Options(raw_mode=True), access_type=AccessType.read_only())
            self.files.write_chunks(version, "snapshot", chunks())
            log.info("Written snapshot file for version %d of %s at %s in %d ms", version, self.id,
                     self.files.path(version, "snapshot"), (time.monotonic() - started) * 1000)
            self.files.cleanup()
        except Exception:   # the deltas still hold every version; a later snapshot replaces it
            log.warning("Error writing the snapshot of version %d of state store %s", version,
                        self.id, exc_info=True)
        finally:
            if view is not None:
                view.close()
            _ONE_SNAPSHOT.release()
            shutil.rmtree(copy, ignore_errors=True)

    def _merged_snapshot(self, version: int, base: int) -> None:
        """Snapshot ``version`` as snapshot ``base`` followed by deltas ``base+1..version``,
        each of which only added keys: no row is read from the database or decoded."""
        started = time.monotonic()
        sources = ([(base, "snapshot")] if base else []) + [(v, "delta") for v in range(base + 1, version + 1)]
        try:
            _ONE_SNAPSHOT.acquire()
            self.files.write_concatenated(version, "snapshot", sources)
            log.info("Written snapshot file for version %d of %s at %s from snapshot %d and %d deltas "
                     "in %d ms", version, self.id, self.files.path(version, "snapshot"), base,
                     version - base, (time.monotonic() - started) * 1000)
            self.files.cleanup()
        except Exception:   # the deltas still hold every version; a later snapshot replaces it
            log.warning("Error writing the snapshot of version %d of state store %s", version,
                        self.id, exc_info=True)
        finally:
            _ONE_SNAPSHOT.release()

    def _wait_for_maintenance(self) -> None:
        thread = self._maintenance
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._maintenance = None
