"""The RocksDB provider: one store's database on this executor, loaded to the version a
task asks for, committed delta first, snapshotted in the background, handed between
worker processes (see the package's docstring)."""
from __future__ import annotations

import hashlib
import logging
import marshal
import os
import shutil
import threading
import time

import pyarrow as pa

from microbatch import crash_points
from microbatch.state.files import REMOVED, StateFiles
from microbatch.state.rocksdb import database
from microbatch.state.rocksdb.codec import TupleCodec
from microbatch.state.rocksdb.store import RocksDBStateStore
from microbatch.state.store import Key, StateStore, StateStoreConf, StateStoreId, StateStoreProvider

log = logging.getLogger(__name__)

_MISSING = REMOVED
#: rows decoded and written per record batch of a snapshot
_SNAPSHOT_CHUNK = 100_000


class RocksDBStateStoreProvider(StateStoreProvider):
    def __init__(self, store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                 conf: StateStoreConf):
        super().__init__(store_id, key_schema, value_schema, conf)
        self.files = StateFiles(store_id, key_schema, value_schema, conf)
        self.keys = TupleCodec(key_schema)
        self.values = TupleCodec(value_schema)
        digest = hashlib.sha1(f"{store_id.path}\0{conf.run_id}\0{key_schema}\0{value_schema}".encode())
        #: the store's database on this executor, shared by its Python worker processes
        self.shared_path = os.path.join(database.local_root(), digest.hexdigest()[:20])
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
        #: gets and puts since this provider was made: what the store metrics report under
        #: resetStatsOnLoad=false, as Spark's RocksDB instance's statistics, never reset
        self.ops_since_made = {"get": 0, "put": 0}

    # -- the database ------------------------------------------------------------------
    def _open(self) -> None:
        """Open the store's database, or keep the one this process kept open since its last
        task of the partition (nobody else could write it meanwhile). Another worker
        process that holds it open is asked to release it (a request file its watcher
        thread answers between tasks); if it does not within ``lockAcquireTimeoutMs`` (it runs
        a task of the partition: a speculative or retried one), this task works on a
        private copy built from the files. Reads the version it holds from its own record."""
        with self._lock:
            self._in_use = True
            self.opened = {"opened": 0, "handOverWaitMs": 0, "openMs": 0, "privateCopy": 0}
            if self.db is not None:
                return
        started = time.monotonic()
        deadline = started + self.conf.rocksdb.lock_wait_ms / 1000   # (lockAcquireTimeoutMs)
        asked = None                      # when this process first found the database held
        while True:
            try:
                attempt = time.monotonic()
                self.db, self.path = database.open_database(self.shared_path, self.conf), self.shared_path
                break
            except Exception as e:
                if "lock" not in str(e).lower():
                    raise
                asked = asked or time.monotonic()
                if time.monotonic() >= deadline:
                    private = f"{self.shared_path}-{os.getpid()}-{next(database.INSTANCES)}"
                    shutil.rmtree(private, ignore_errors=True)
                    attempt = time.monotonic()
                    self.db, self.path = database.open_database(private, self.conf), private
                    self.opened["privateCopy"] = 1
                    break
                with open(self.shared_path + database.RELEASE_REQUEST, "w"):
                    pass
                time.sleep(0.005)
        done = time.monotonic()
        self.opened.update(opened=1, openMs=int((done - attempt) * 1000),
                           handOverWaitMs=int((attempt - asked) * 1000) if asked else 0)
        database.forget_request(self.shared_path)
        record = self.db.get(database.META)
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
            if self._snapshot_due():     # (a store's first version, where its conf asks: at once)
                self.do_maintenance(background=not self._first_version_due())
            if self.path != self.shared_path:    # a private copy serves one task
                self.db.close()
                self.db = None
                shutil.rmtree(self.path, ignore_errors=True)
                self._token = None
            self._in_use = False
        if self.db is not None:
            database.watch(self)

    def _release_if_asked(self) -> None:
        """The watcher's call: close the database if another process asked and no task of
        this process uses it."""
        with self._lock:
            if self._in_use or self.db is None or not os.path.exists(self.shared_path + database.RELEASE_REQUEST):
                return
            self.db.close()
            self.db = None
        database.forget_request(self.shared_path)

    def _fresh_db(self) -> None:
        """Empty the open database (drop it and make it again at the same path)."""
        path = self.path
        self.db.close()
        shutil.rmtree(path, ignore_errors=True)
        self.db = database.open_database(path, self.conf)
        self.loaded_version, self.num_keys, self._undo = 0, 0, {}
        self._deltas_since_snapshot = self._delta_rows = self._snapshot_rows = self._last_non_insert = 0

    def close(self) -> None:
        """Forget the store in this process (a new run, or the provider unloaded). The
        database goes with it if this process holds it; one another worker holds goes
        when that worker closes its provider (and Spark's local directories at the end)."""
        self._wait_for_maintenance()
        database.KEPT_OPEN.discard(self)
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
            if self.loaded_version != start:     # an empty snapshot: the database holds its version all the same
                self._write({}, start, 0)
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
        put(database.META, marshal.dumps((version, num_keys, self._deltas_since_snapshot, self._delta_rows,
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
        if self.conf.rocksdb.compact_on_commit:   # Spark's compactOnCommit: the whole range, every commit
            self.db.compact_range(None, None)
        compacted = time.monotonic()
        return {"changelog": int((changelog - started) * 1000), "writeBatch": int((done - changelog) * 1000),
                "compact": int((compacted - done) * 1000)}

    # -- maintenance --------------------------------------------------------------------------
    def _snapshot_due(self) -> bool:
        """At least ``minDeltasForSnapshot`` deltas since the last snapshot, and as many rows
        in them as the snapshot held: a snapshot costs the whole state, so they come at
        geometrically growing intervals while the state grows, and the work per batch stays
        flat; a reload reads at most about twice the state."""
        return (self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot
                and self._delta_rows >= self._snapshot_rows) or self._first_version_due()

    def _first_version_due(self) -> bool:
        """The store's first version, where its conf asks for its snapshot
        (``StateStoreConf.snapshot_first_version``): one delta and no snapshot."""
        return self.conf.snapshot_first_version and self._deltas_since_snapshot == 1 and \
            self.loaded_version > 0 and self.files.newest_snapshot(self.loaded_version) == 0

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
            copy = f"{self.path}.snapshot-{version}-{os.getpid()}-{next(database.INSTANCES)}"
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
            for key, value in view.items(from_key=database.FIRST_KEY):
                keys.append(decode_key(key))
                values.append(decode_value(value))
                if len(keys) == _SNAPSHOT_CHUNK:
                    yield keys, values
                    keys, values, written = [], [], True
            if keys or not written:
                yield keys, values
        try:
            database.ONE_SNAPSHOT.acquire()
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
            database.ONE_SNAPSHOT.release()
            shutil.rmtree(copy, ignore_errors=True)

    def _merged_snapshot(self, version: int, base: int) -> None:
        """Snapshot ``version`` as snapshot ``base`` followed by deltas ``base+1..version``,
        each of which only added keys: no row is read from the database or decoded."""
        started = time.monotonic()
        sources = ([(base, "snapshot")] if base else []) + [(v, "delta") for v in range(base + 1, version + 1)]
        try:
            database.ONE_SNAPSHOT.acquire()
            self.files.write_concatenated(version, "snapshot", sources)
            log.info("Written snapshot file for version %d of %s at %s from snapshot %d and %d deltas "
                     "in %d ms", version, self.id, self.files.path(version, "snapshot"), base,
                     version - base, (time.monotonic() - started) * 1000)
            self.files.cleanup()
        except Exception:   # the deltas still hold every version; a later snapshot replaces it
            log.warning("Error writing the snapshot of version %d of state store %s", version,
                        self.id, exc_info=True)
        finally:
            database.ONE_SNAPSHOT.release()

    def _wait_for_maintenance(self) -> None:
        thread = self._maintenance
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._maintenance = None
