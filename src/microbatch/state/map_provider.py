"""microbatch's default state store provider: a map in executor memory, a delta file per version.

Like Spark's HDFSBackedStateStoreProvider, with two differences: the files are
Arrow IPC (``state.files``), and a commit never copies the map. The provider keeps
one map at its newest version plus an undo record per recent version, so a commit
and a step back (a batch re-run) cost the keys the batch touched, not the size of
the state. Maintenance (after a commit, when due) writes a snapshot once more than
``minDeltasForSnapshot`` deltas follow the last one, and deletes files no retained
version needs.

When the keys are types Arrow joins on (or structs of them, a window) and the operator
changes a version a batch at a time (``insert_new``, ``remove_at_or_below``:
deduplication; ``matching_rows``, ``put_rows``, ``take_rows_at_or_below``: aggregation), the provider
keeps its memory as Arrow tables instead (``state.table_form``): the same files,
hash joins instead of a Python call per key. A store uses the form its first call
asks for; the provider drops the other form's memory.

The provider lives in the executor-side cache of ``state.store``; its memory is
used only at a version it holds (or can step back to), or that version plus the
deltas other executors committed after it; anything else reads the files.
"""
from __future__ import annotations

import logging
import sys
import time
from collections import deque
from itertools import compress, filterfalse, repeat
from operator import countOf, is_, is_not, itemgetter, or_
from typing import Iterator

import numpy as np
import pyarrow as pa

from microbatch import crash_points
from microbatch.state.files import REMOVED, StateFiles
from microbatch.state.store import (Key, StateStore, StateStoreConf, StateStoreId,
                                    StateStoreMetrics, StateStoreProvider, Value)
from microbatch.state.table_form import TableChanges, TableVersions, table_key

log = logging.getLogger(__name__)

_MISSING = REMOVED
_UNCHANGED = object()     # get_many: a key this version did not change


class MapStateStore(StateStore):
    """One version of a ``MapStateStoreProvider``'s store. Its memory form is chosen by
    the first call: key by key (and the bulk calls of keys Arrow cannot join) on the
    map, ``insert_new``/``remove_at_or_below`` of joinable keys on Arrow tables."""

    def __init__(self, provider: "MapStateStoreProvider", version: int):
        self.provider = provider
        self.id = provider.id
        self.version = version
        self.key_schema = provider.key_schema
        self.value_schema = provider.value_schema
        self._pending: dict[Key, object] = {}     # key -> value tuple, or _MISSING (removed)
        self._removals = False                    # whether _pending holds any _MISSING
        self._table: TableChanges | None = None   # the changes of the table form, once chosen
        self._form: str | None = None
        self._cache_hit = False
        self._committed = False
        self._aborted = False
        self._metrics = StateStoreMetrics()

    def _check_open(self) -> None:
        if self._committed or self._aborted:
            raise RuntimeError(f"State store {self.id} version {self.version} is already "
                               f"{'committed' if self._committed else 'aborted'}")

    def _use(self, form: str) -> None:
        """Load this version in ``form`` ("map" or "table") on the first call."""
        if self._form == form:
            return
        if self._form is not None:
            raise RuntimeError(
                f"State store {self.id} version {self.version} is changed in the {self._form} "
                f"form; it cannot also be changed in the {form} form.")
        self._check_open()
        if form == "map":
            self._cache_hit = self.provider.load_map(self.version)
        else:
            self._cache_hit, self._table = self.provider.load_table(self.version)
        self._form = form

    def _in_tables(self) -> bool:
        return self._form == "table" or (self._form is None and self.provider.tables_fit)

    # -- a batch at a time --------------------------------------------------------------
    def insert_new(self, keys: pa.Table, values: pa.Table | None = None) -> np.ndarray:
        if not self._in_tables():
            return super().insert_new(keys, values)
        self._use("table")
        self._check_open()
        return self._table.insert_new(keys, values)

    def remove_at_or_below(self, bound: int, *, key_field: int | None = None,
                           value_field: int | None = None) -> int:
        if not self._in_tables():
            return super().remove_at_or_below(bound, key_field=key_field, value_field=value_field)
        self._use("table")
        self._check_open()
        names = self._table.versions.key_names if key_field is not None else self._table.versions.value_names
        return self._table.remove_at_or_below(bound, names[key_field if key_field is not None else value_field])

    def in_tables(self) -> bool:
        return self._in_tables()

    def matching_rows(self, keys: pa.Table) -> pa.Table:
        self._use("table")
        return self._table.matching(keys)

    def put_rows(self, rows: pa.Table) -> None:
        self._use("table")
        self._check_open()
        self._table.upsert(rows)

    def take_rows_at_or_below(self, bound: int, *, key_field: int | None = None, struct_field: int | None = None,
                              value_field: int | None = None) -> pa.Table:
        self._use("table")
        self._check_open()
        versions = self._table.versions
        column = versions.key_names[key_field] if key_field is not None else versions.value_names[value_field]
        return self._table.take_at_or_below(bound, column, struct_field)

    def take_rows_where(self, due) -> pa.Table:
        self._use("table")
        self._check_open()
        return self._table.take_where(due)

    def remove_rows(self, keys: pa.Table) -> int:
        self._use("table")
        self._check_open()
        return self._table.remove(keys)

    def rows(self) -> pa.Table:
        self._use("table")
        return self._table.rows()

    def num_keys(self) -> int:
        if self._in_tables():
            self._use("table")
            return self._table.num_keys()
        self._use("map")
        base, pending = self.provider.map, self._pending
        added = sum(1 for k, v in pending.items() if v is not _MISSING and k not in base)
        removed = sum(1 for k, v in pending.items() if v is _MISSING and k in base)
        return len(base) + added - removed

    # -- key by key (on the map) ------------------------------------------------------------
    def get(self, key: Key) -> Value | None:
        self._use("map")
        value = self._pending.get(key, _MISSING)
        if value is _MISSING:
            if key in self._pending:
                return None
            return self.provider.map.get(key)
        return value  # type: ignore[return-value]

    def put(self, key: Key, value: Value) -> None:
        self._use("map")
        self._check_open()
        self._pending[key] = value

    def get_many(self, keys: list[Key]) -> list[Value | None]:
        self._use("map")
        pending, base = self._pending, self.provider.map
        if not pending:       # (an operator's first look at a version: the usual case)
            return list(map(base.get, keys))
        found = list(map(pending.get, keys, repeat(_UNCHANGED)))
        for i in compress(range(len(found)), map(is_, found, repeat(_UNCHANGED))):
            found[i] = base.get(keys[i])
        if self._removals:
            found = [None if v is _MISSING else v for v in found]
        return found

    def put_many(self, keys: list[Key], values: list[Value]) -> None:
        self._use("map")
        self._check_open()
        self._pending.update(zip(keys, values))

    def keys(self) -> list[Key]:
        if self._form == "table":
            return super().keys()
        self._use("map")
        pending, base = self._pending, self.provider.map
        if not pending:
            return list(base)
        kept = list(compress(base, map(is_not, map(pending.get, base), repeat(_MISSING)))) \
            if self._removals else list(base)
        return kept + [k for k, v in pending.items() if v is not _MISSING and k not in base]

    # The bulk operations below iterate with map/zip/compress over C functions
    # (dict.__contains__, itemgetter, ...), about 30 ns a key instead of a Python loop.

    def put_absent(self, keys: list[Key], values: list[Value] | None = None) -> np.ndarray:
        self._use("map")
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
        self._use("map")
        self._check_open()
        pending, base = self._pending, self.provider.map
        held = list(compress(keys, map(or_, map(pending.__contains__, keys), map(base.__contains__, keys))))
        if held:
            pending.update(zip(held, repeat(_MISSING)))
            self._removals = True

    def keys_at_or_below(self, bound: int, *, key_field: int | None = None,
                         value_field: int | None = None) -> list[Key]:
        self._use("map")
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
        self._use("map")
        self._check_open()
        if key in self._pending or key in self.provider.map:
            self._pending[key] = _MISSING
            self._removals = True

    def iterator(self) -> Iterator[tuple[Key, Value]]:
        if self._form == "table":
            from microbatch.state.files import from_struct_array
            versions = self._table.versions
            table = pa.concat_tables([self._table.base, self._table.added])
            keys = from_struct_array(versions._struct(table, versions.key_names, self.key_schema), keys=True)
            values = from_struct_array(versions._struct(table, versions.value_names, self.value_schema))
            yield from zip(keys, values)
            return
        self._use("map")
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
        if self._form is None:
            self._use("table" if self.provider.tables_fit else "map")
        self._check_open()
        started = time.monotonic()
        hits = {"loadedMapCacheHitCount": int(self._cache_hit), "loadedMapCacheMissCount": int(not self._cache_hit)}
        if self._form == "table":
            following, commit_ms = self._table.commit()   # (it snapshots and cleans up when due)
            self._committed = True
            self._metrics = StateStoreMetrics(
                num_keys=following.num_rows, num_updated=self._table.inserted,
                num_removed=self._table.removed_count, memory_used_bytes=following.nbytes,
                commit_time_ms=commit_ms, custom=hits)
            return self.version + 1
        self.provider.commit(self.version, self._pending)
        self._committed = True
        removed = countOf(self._pending.values(), _MISSING)
        self._metrics = StateStoreMetrics(
            num_keys=len(self.provider.map), num_updated=len(self._pending) - removed,
            num_removed=removed, memory_used_bytes=self.provider.estimate_memory(),
            commit_time_ms=int((time.monotonic() - started) * 1000), custom=hits)
        self.provider.maybe_maintain()
        return self.version + 1

    def abort(self) -> None:
        if not self._committed:
            self._aborted = True
            self._pending = {}
            self._table = None

    def metrics(self) -> StateStoreMetrics:
        return self._metrics

    @property
    def has_committed(self) -> bool:
        return self._committed


class MapStateStoreProvider(StateStoreProvider):
    def __init__(self, store_id: StateStoreId, key_schema: pa.Schema, value_schema: pa.Schema,
                 conf: StateStoreConf):
        super().__init__(store_id, key_schema, value_schema, conf)
        self.files = StateFiles(store_id, key_schema, value_schema, conf)
        self.map: dict[Key, Value] = {}
        self.loaded_version = -1                  # the version ``map`` holds; -1: nothing
        self._undo: dict[int, dict[Key, object]] = {}   # v -> how to go from v back to v-1
        self._deltas_since_snapshot = 0
        self._memory_per_entry = 0
        #: whether the table form can hold this store: Arrow joins and groups on every key
        #: type (joins carry only keys and row numbers, so any value type goes)
        self.tables_fit = len(key_schema) > 0 and all(table_key(f.type) for f in key_schema)
        self.tables = TableVersions(self.files)

    # -- the two forms ------------------------------------------------------------------
    def load_map(self, version: int) -> bool:
        """Make the map hold ``version``; whether it held it already."""
        if version < 0:
            raise ValueError(f"Version cannot be less than 0, got {version}")
        if self.tables.tables:
            self.tables.clear()
        hit = self.loaded_version == version
        self._load(version)
        return hit

    def load_table(self, version: int) -> tuple[bool, TableChanges]:
        """The changes of ``version`` in the table form; whether memory held it already."""
        if self.loaded_version >= 0:
            self.map, self._undo, self.loaded_version = {}, {}, -1
        hit = version in self.tables.tables
        return hit, TableChanges(self.tables, version)

    # -- loading --------------------------------------------------------------
    def _load(self, version: int) -> None:
        """Make ``map`` hold ``version``, reading as few files as possible."""
        if version == self.loaded_version:
            return
        if version < self.loaded_version and all(v in self._undo for v in range(version + 1, self.loaded_version + 1)):
            for v in range(self.loaded_version, version, -1):
                for key, previous in self._undo.pop(v).items():
                    if previous is _MISSING:
                        self.map.pop(key, None)
                    else:
                        self.map[key] = previous  # type: ignore[assignment]
            self.loaded_version = version
            self._deltas_since_snapshot = self.files.deltas_since_snapshot(version)
            return
        if version > self.loaded_version >= 0 and all(
                self.files.exists(v, "delta") for v in range(self.loaded_version + 1, version + 1)):
            # other executors committed the versions after ours: read only their deltas
            for v in range(self.loaded_version + 1, version + 1):
                self._apply(v, self.files.read_delta(v, version, 0))
            self._deltas_since_snapshot = self.files.deltas_since_snapshot(version)
            return
        self._load_from_files(version)

    def _load_from_files(self, version: int) -> None:
        self.map = {}
        self._undo = {}
        self.loaded_version = 0
        self._deltas_since_snapshot = 0
        if version == 0:
            return
        start = self.files.newest_snapshot(version)
        if start:
            self.map.update(self.files.read_rows(start, "snapshot"))
            self.loaded_version = start
        for v in range(start + 1, version + 1):
            self._apply(v, self.files.read_delta(v, version, start),
                        keep_undo=v > version - self.conf.max_versions_in_memory)
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
        """The store at ``version``; it loads in the form its first call asks for."""
        if version < 0:
            raise ValueError(f"Version cannot be less than 0, got {version}")
        store = MapStateStore(self, version)
        crash_points.reached("state-loaded")
        return store

    def commit(self, version: int, pending: dict[Key, object]) -> None:
        if self.loaded_version != version:
            raise RuntimeError(f"State store {self.id}: committing version {version + 1} on top "
                               f"of version {self.loaded_version}; another store of the same "
                               "partition was committed meanwhile.")
        self.files.write_rows(version + 1, "delta", list(pending), list(pending.values()))
        self._apply(version + 1, pending)

    def maybe_maintain(self) -> None:
        if self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot:
            self.do_maintenance()

    def do_maintenance(self) -> None:
        version = self.loaded_version
        if version > 0 and self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot:
            started = time.monotonic()
            self.files.write_rows(version, "snapshot", list(self.map), list(self.map.values()))
            self._deltas_since_snapshot = 0
            log.info("Written snapshot file for version %d of %s at %s in %d ms", version, self.id,
                     self.files.path(version, "snapshot"), (time.monotonic() - started) * 1000)
        self.cleanup()

    def cleanup(self) -> None:
        self.files.cleanup()

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
