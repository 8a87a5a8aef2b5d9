"""The default state store: a map in executor memory, a delta file per version.

Like Spark's HDFSBackedStateStoreProvider, with two differences: the files are
Arrow IPC (lz4 or zstd compressed), and a commit never copies the map. The
provider keeps one map at its newest version plus an undo record per recent
version, so a commit and a step back (a batch re-run) cost the keys the batch
touched, not the size of the state.

Files in ``<checkpoint>/state/<op>/<partition>/``:

- ``<v>.delta.arrow``: the changes that make version v from v-1: columns ``key``
  (a struct of the key schema) and ``value`` (a struct of the value schema; null
  marks a removed key).
- ``<v>.snapshot.arrow``: every key and value of version v, same columns.

A version is loaded from the newest snapshot at or below it plus the deltas
after that. Maintenance (run after a commit when due) writes a snapshot once more
than ``minDeltasForSnapshot`` deltas follow the last one, and deletes files that
no version among the last ``minBatchesToRetain`` needs.

Providers live in a module-level cache of the Python worker, which Spark reuses
across tasks (``spark.python.worker.reuse``), so the map usually survives from
one batch to the next; any miss (another worker, a restart) reloads from files.
"""
from __future__ import annotations

import logging
import re
import sys
import time
from collections import deque
from itertools import compress, filterfalse, repeat
from operator import countOf, is_, itemgetter, or_
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from microbatch.errors import CheckpointError
from microbatch.state.store import (Key, StateStore, StateStoreConf, StateStoreId,
                                    StateStoreMetrics, StateStoreProvider, Value)

log = logging.getLogger(__name__)

_MISSING = object()
_ABSENT = object()
_FILE = re.compile(r"^(\d+)\.(delta|snapshot)\.arrow$")


def _struct_type(schema: pa.Schema) -> pa.StructType:
    return pa.struct(list(schema))


def _to_struct_array(rows: list[tuple | None], schema: pa.Schema) -> pa.Array:
    """Tuples (or None for a null struct) -> a struct array of ``schema``, column by
    column (``zip(*rows)`` transposes at C speed)."""
    nulls = countOf(rows, None)
    mask = pa.array(list(map(is_, rows, repeat(None))), type=pa.bool_()) if nulls else None
    if nulls:
        empty = (None,) * len(schema)
        rows = [empty if r is None else r for r in rows]
    transposed = list(zip(*rows)) if rows else [()] * len(schema)
    columns = [pa.array(values, type=f.type) for values, f in zip(transposed, schema)]
    if not columns:   # a struct without fields: only its length and validity
        return pa.StructArray.from_arrays([], fields=[], mask=mask if mask is not None
                                          else pa.array([False] * len(rows), type=pa.bool_()))
    return pa.StructArray.from_arrays(columns, fields=list(schema), mask=mask)


def hashable(value):
    """A nested value as a key can hold it: structs (dicts) and lists become tuples."""
    if isinstance(value, dict):
        return tuple(hashable(v) for v in value.values())
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    return value


def _from_struct_array(array: pa.Array, keys: bool = False) -> list[tuple | None]:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    valid = array.is_valid().to_pylist()
    columns = []
    for column in array.flatten():
        values = column.to_pylist()
        if keys and not (pa.types.is_primitive(column.type) or pa.types.is_string(column.type)):
            values = [hashable(v) for v in values]
        columns.append(values)
    return [tuple(values) if ok else None for ok, values in zip(valid, zip(*columns))] \
        if columns else [() if ok else None for ok in valid]


class MapStateStore(StateStore):
    def __init__(self, provider: "MapStateStoreProvider", version: int):
        self.provider = provider
        self.id = provider.id
        self.version = version
        self._pending: dict[Key, object] = {}     # key -> value tuple, or _MISSING (removed)
        self._removals = False                    # whether _pending holds any _MISSING
        self._committed = False
        self._aborted = False
        self._metrics = StateStoreMetrics()

    def _check_open(self) -> None:
        if self._committed or self._aborted:
            raise RuntimeError(f"State store {self.id} version {self.version} is already "
                               f"{'committed' if self._committed else 'aborted'}")

    def get(self, key: Key) -> Value | None:
        value = self._pending.get(key, _MISSING)
        if value is _MISSING:
            if key in self._pending:
                return None
            return self.provider.map.get(key)
        return value  # type: ignore[return-value]

    def put(self, key: Key, value: Value) -> None:
        self._check_open()
        self._pending[key] = value

    # The bulk operations below iterate with map/zip/compress over C functions
    # (dict.__contains__, itemgetter, ...), about 30 ns a key instead of a Python loop.

    def put_absent(self, keys: list[Key], values: list[Value] | None = None) -> np.ndarray:
        self._check_open()
        pending, base = self._pending, self.provider.map
        n = len(keys)
        first = dict(zip(reversed(keys), range(n - 1, -1, -1)))   # key -> its first row
        distinct = list(first)
        if self._removals:   # a key removed in this version counts as absent
            absent = np.fromiter(((pending[k] is _MISSING) if k in pending else (k not in base)
                                  for k in distinct), bool, len(distinct))
        else:
            held = np.fromiter(map(or_, map(pending.__contains__, distinct),
                                   map(base.__contains__, distinct)), bool, len(distinct))
            absent = ~held
        rows = np.fromiter(first.values(), np.int64, len(distinct))[absent]
        new_keys = compress(distinct, absent)
        if values is None:
            pending.update(zip(new_keys, repeat(())))
        else:
            pending.update(zip(new_keys, map(values.__getitem__, rows.tolist())))
        new = np.zeros(n, bool)
        new[rows] = True
        return new

    def remove_many(self, keys: list[Key]) -> None:
        self._check_open()
        pending, base = self._pending, self.provider.map
        held = list(compress(keys, map(or_, map(pending.__contains__, keys), map(base.__contains__, keys))))
        if held:
            pending.update(zip(held, repeat(_MISSING)))
            self._removals = True

    def keys_at_or_below(self, bound: int, *, key_field: int | None = None,
                         value_field: int | None = None) -> list[Key]:
        pending, base = self._pending, self.provider.map
        found = []
        for source in (base, pending):
            keys = list(source)
            if source is pending and self._removals:
                keys = [k for k in keys if pending[k] is not _MISSING]
            if key_field is not None:
                times = list(map(itemgetter(key_field), keys))
            else:
                times = list(map(itemgetter(value_field), map(source.__getitem__, keys)))
            if None in times:
                times = [t if t is not None else bound + 1 for t in times]
            selected = compress(keys, np.array(times, dtype=np.int64) <= bound) if keys else iter(())
            if source is base and pending:   # a key changed in this version: its new value decides
                selected = filterfalse(pending.__contains__, selected)
            found.extend(selected)
        return found

    def remove(self, key: Key) -> None:
        self._check_open()
        if key in self._pending or key in self.provider.map:
            self._pending[key] = _MISSING
            self._removals = True

    def iterator(self) -> Iterator[tuple[Key, Value]]:
        pending = self._pending
        for key, value in self.provider.map.items():
            if key in pending:
                changed = pending[key]
                if changed is not _MISSING:
                    yield key, changed  # type: ignore[misc]
            else:
                yield key, value
        for key, value in pending.items():
            if value is not _MISSING and key not in self.provider.map:
                yield key, value  # type: ignore[misc]

    def commit(self) -> int:
        self._check_open()
        started = time.monotonic()
        self.provider.commit(self.version, self._pending)
        self._committed = True
        removed = countOf(self._pending.values(), _MISSING)
        self._metrics = StateStoreMetrics(
            num_keys=len(self.provider.map), num_updated=len(self._pending) - removed,
            num_removed=removed, memory_used_bytes=self.provider.estimate_memory(),
            commit_time_ms=int((time.monotonic() - started) * 1000))
        self.provider.maybe_maintain()
        return self.version + 1

    def abort(self) -> None:
        if not self._committed:
            self._aborted = True
            self._pending = {}

    def metrics(self) -> StateStoreMetrics:
        return self._metrics

    @property
    def has_committed(self) -> bool:
        return self._committed


class MapStateStoreProvider(StateStoreProvider):
    def __init__(self, store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                 conf: StateStoreConf):
        super().__init__(store_id, key_schema, value_schema, conf)
        self.map: dict[Key, Value] = {}
        self.loaded_version = -1                  # the version ``map`` holds; -1: nothing
        self._undo: dict[int, dict[Key, object]] = {}   # v -> how to go from v back to v-1
        self._file_schema = pa.schema([pa.field("key", _struct_type(key_schema)),
                                       pa.field("value", _struct_type(value_schema))])
        self._deltas_since_snapshot = 0
        self._memory_per_entry = 0

    # -- files --------------------------------------------------------------
    def _file(self, version: int, kind: str) -> str:
        return f"{self.id.path}/{version}.{kind}.arrow"

    def _list_files(self) -> list[tuple[int, str]]:
        """(version, kind) of every state file, oldest first, snapshots before deltas."""
        names = self.conf.fs.list(self.id.path)
        files = []
        for name in names:
            m = _FILE.match(name)
            if m:
                files.append((int(m.group(1)), m.group(2)))
        return sorted(files, key=lambda f: (f[0], f[1] != "snapshot"))

    def _write(self, path: str, keys: list[Key], values: list[object]) -> None:
        """Write ``keys`` and ``values`` (_MISSING: removed, a null value) as one Arrow file."""
        if _MISSING in values:
            values = [None if v is _MISSING else v for v in values]
        self._write_arrays(path, _to_struct_array(keys, self.key_schema),
                           _to_struct_array(values, self.value_schema))

    def _write_arrays(self, path: str, keys: pa.Array, values: pa.Array) -> None:
        """Write a state file from its ``key`` and ``value`` struct arrays, atomically."""
        batch = pa.RecordBatch.from_arrays([keys, values], schema=self._file_schema)
        options = ipc.IpcWriteOptions(compression=self.conf.compression)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self._file_schema, options=options) as writer:
            writer.write_batch(batch)
        self.conf.fs.write_bytes(path, sink.getvalue())   # atomic; a re-commit writes the same

    def _read_table(self, path: str) -> pa.Table:
        """A state file as an Arrow table (columns ``key``, ``value``), checked."""
        try:
            table = ipc.open_stream(pa.py_buffer(self.conf.fs.read_bytes(path))).read_all()
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowInvalid) as e:
            raise CheckpointError(
                f"Error reading state file {path} of state store {self.id}: {e}. The file is "
                "damaged; restore it from a backup, or start the query with a new checkpoint "
                "location.") from e
        if table.schema != self._file_schema:
            raise CheckpointError(
                f"The state file {path} has the schema {table.schema}, but the operator's state "
                f"has {self._file_schema}. The query's stateful operator changed since the "
                "checkpoint was written; use a new checkpoint location.")
        return table

    def _read(self, path: str) -> list[tuple[Key, Value | None]]:
        table = self._read_table(path)
        keys = _from_struct_array(table.column("key"), keys=True)
        values = _from_struct_array(table.column("value"))
        if None in values:   # a removed key: the same marker as in a store's changes
            values = [_MISSING if v is None else v for v in values]
        return list(zip(keys, values))

    def _missing_delta(self, path: str, version: int, snapshot: int) -> CheckpointError:
        return CheckpointError(
            f"Error reading delta file {path} of state store {self.id}: the file does not "
            f"exist, but version {version} needs it (the newest snapshot at or below it "
            f"is {snapshot or 'none'}). The state of this checkpoint is incomplete; restore "
            "the file or use a new checkpoint location.")

    # -- loading --------------------------------------------------------------
    def _load(self, version: int) -> None:
        """Make ``map`` hold ``version``, reading as few files as possible."""
        if version == self.loaded_version:
            return
        if version < self.loaded_version and all(v in self._undo for v in range(version + 1, self.loaded_version + 1)):
            self._deltas_since_snapshot = max(0, self._deltas_since_snapshot - (self.loaded_version - version))
            for v in range(self.loaded_version, version, -1):
                for key, previous in self._undo.pop(v).items():
                    if previous is _MISSING:
                        self.map.pop(key, None)
                    else:
                        self.map[key] = previous  # type: ignore[assignment]
            self.loaded_version = version
            return
        if version > self.loaded_version >= 0 and all(
                self.conf.fs.exists(self._file(v, "delta"))
                for v in range(self.loaded_version + 1, version + 1)):
            for v in range(self.loaded_version + 1, version + 1):
                self._apply(v, self._read(self._file(v, "delta")))
            return
        self._load_from_files(version)

    def _load_from_files(self, version: int) -> None:
        self.map = {}
        self._undo = {}
        self.loaded_version = 0
        self._deltas_since_snapshot = 0
        if version == 0:
            return
        files = self._list_files()
        snapshots = [v for v, kind in files if kind == "snapshot" and v <= version]
        start = 0
        if snapshots:
            start = max(snapshots)
            for key, value in self._read(self._file(start, "snapshot")):
                self.map[key] = value  # type: ignore[assignment]
            self.loaded_version = start
        for v in range(start + 1, version + 1):
            path = self._file(v, "delta")
            try:
                changes = self._read(path)
            except FileNotFoundError:
                raise self._missing_delta(path, version, start) from None
            self._apply(v, changes, keep_undo=v > version - self.conf.max_versions_in_memory)
        self._deltas_since_snapshot = version - start
        log.info("Loaded state store %s version %d (snapshot %d + %d deltas, %d keys)",
                 self.id, version, start, version - start, len(self.map))

    def _apply(self, version: int, changes, keep_undo: bool = True) -> None:
        """Apply a version's changes (a dict, or (key, value) pairs read from a file;
        a value of _MISSING removes the key), keeping an undo record."""
        if not isinstance(changes, dict):
            changes = dict(changes)
        data = self.map
        if keep_undo:
            self._undo[version] = dict(zip(changes, map(data.get, changes, repeat(_MISSING))))
            for old in [v for v in self._undo if v <= version - self.conf.max_versions_in_memory]:
                del self._undo[old]
        removed = list(compress(changes, map(is_, changes.values(), repeat(_MISSING))))
        data.update(changes)          # C speed; the removed keys are deleted right after
        deque(map(data.__delitem__, removed), maxlen=0)
        self.loaded_version = version
        self._deltas_since_snapshot += 1

    # -- the contract ---------------------------------------------------------
    def get_store(self, version: int) -> StateStore:
        if version < 0:
            raise ValueError(f"Version cannot be less than 0, got {version}")
        self._load(version)
        return MapStateStore(self, version)

    def commit(self, version: int, pending: dict[Key, object]) -> None:
        if self.loaded_version != version:
            raise RuntimeError(f"State store {self.id}: committing version {version + 1} on top "
                               f"of version {self.loaded_version}; another store of the same "
                               "partition was committed meanwhile.")
        self._write(self._file(version + 1, "delta"), list(pending), list(pending.values()))
        self._apply(version + 1, pending)

    def maybe_maintain(self) -> None:
        if self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot:
            self.do_maintenance()

    def do_maintenance(self) -> None:
        version = self.loaded_version
        if version > 0 and self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot:
            started = time.monotonic()
            self._write(self._file(version, "snapshot"), list(self.map), list(self.map.values()))
            self._deltas_since_snapshot = 0
            log.info("Written snapshot file for version %d of %s at %s in %d ms", version, self.id,
                     self._file(version, "snapshot"), (time.monotonic() - started) * 1000)
        self.cleanup()

    def cleanup(self) -> None:
        """Delete files no version among the last ``minBatchesToRetain`` needs."""
        files = self._list_files()
        if not files:
            return
        earliest = files[-1][0] - self.conf.min_versions_to_retain
        if earliest <= 0:
            return
        snapshots = [v for v, kind in files if kind == "snapshot" and v <= earliest]
        keep_from = max(snapshots) if snapshots else 0
        for v, kind in files:
            if v < keep_from or (v == keep_from and kind == "delta" and snapshots):
                self.conf.fs.delete(self._file(v, kind))

    def estimate_memory(self) -> int:
        """Bytes the map uses, estimated from a sample of entries."""
        if not self.map:
            return 0
        if not self._memory_per_entry or len(self.map) % 64 == 0:
            sample = list(zip(range(32), self.map.items()))
            per = sum(sys.getsizeof(k) + sys.getsizeof(v)
                      + sum(sys.getsizeof(x) for x in k) + sum(sys.getsizeof(x) for x in v)
                      for _, (k, v) in sample) / len(sample)
            self._memory_per_entry = int(per) + 100  # + the dict slot and hash
        return self._memory_per_entry * len(self.map)


# -- the executor-side cache ------------------------------------------------------
#: (provider class, store id) -> the provider of the latest run, for every provider kind
_LOADED: dict[tuple[type, StateStoreId], StateStoreProvider] = {}


def cached_provider(kind: type, store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                    conf: StateStoreConf):
    """The ``kind`` provider of ``store_id`` in this process, created on first use and
    again for a new query run or changed schemas."""
    provider = _LOADED.get((kind, store_id))
    if provider is None or provider.key_schema != key_schema or provider.value_schema != value_schema \
            or provider.conf.run_id != conf.run_id:   # another run's memory is not trusted
        provider = kind(store_id, key_schema, value_schema, conf)
        _LOADED[(kind, store_id)] = provider
    return provider


def get_provider(store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                 conf: StateStoreConf) -> MapStateStoreProvider:
    """The map provider of ``store_id`` in this process."""
    return cached_provider(MapStateStoreProvider, store_id, key_schema, value_schema, conf)


def unload_all() -> None:
    """Forget every loaded provider, of every kind (as a new executor process would have none)."""
    _LOADED.clear()
