"""The Arrow-table form of a store's memory, for changes a batch at a time.

For operators whose state is a set of keys with a few fixed-width values, all
changed a batch at a time (deduplication, through ``StateStore.insert_new`` and
``remove_at_or_below``): lookups are hash joins and evictions are filters, in
Arrow's C++ (Acero), never a Python call per key. On this machine a Python dict
of tuple keys costs 300-500 ns per lookup or insert once it holds a few hundred
thousand keys; a join costs about 0.3 µs per row for all of its work.

``MapStateStoreProvider`` keeps its memory in this form when its keys are types
Arrow joins on and its operator changes the store in bulk. The files are the same
(``state.files``). A version's table is immutable: version N+1 is version N minus
the removed keys plus the added rows. The last ``maxBatchesToRetainInMemory``
versions stay in memory, so a re-run of batch N starts from table N without
reading a file.

Keys compare as Spark groups them: a null equals a null (joins get a "filled"
column and an is-null flag per nullable key column).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from microbatch.state.files import StateFiles

log = logging.getLogger(__name__)


def joinable(kind: pa.DataType) -> bool:
    """Whether Arrow's hash join and group-by take this type as a key."""
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_date(kind) or pa.types.is_decimal(kind))


def _fill_value(kind: pa.DataType) -> pa.Scalar:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar("", kind)
    if pa.types.is_binary(kind):
        return pa.scalar(b"", kind)
    if pa.types.is_boolean(kind):
        return pa.scalar(False)
    return pa.array([0]).cast(kind)[0]


def table_key(kind: pa.DataType) -> bool:
    """Whether the table form holds a key column of this type: one Arrow joins and groups
    on, or a struct of such (a window), which joins and groups field by field."""
    if pa.types.is_struct(kind):
        return kind.num_fields > 0 and all(joinable(f.type) for f in kind)
    return joinable(kind)


def flat_keys(table: pa.Table, names: list[str], null_flags: frozenset = frozenset()) -> tuple[pa.Table, list[str]]:
    """``table`` with a column per field of each struct key column (and a null flag where
    the struct itself has nulls, or is named in ``null_flags``: a join's two sides need
    the same columns), and the names of the key columns to join or group on."""
    keys = []
    for name in names:
        column = table.column(name)
        if not pa.types.is_struct(column.type):
            keys.append(name)
            continue
        for i, child in enumerate(column.flatten()):
            table = table.append_column(f"__{name}_{i}", child)
            keys.append(f"__{name}_{i}")
        if column.null_count or name in null_flags:
            table = table.append_column(f"__{name}_null", pc.is_null(column))
            keys.append(f"__{name}_null")
    return table, keys


def _join_ready(left: pa.Table, right: pa.Table, names: list[str]) -> tuple[pa.Table, pa.Table, list[str]]:
    """Both sides with the key columns a hash join compares as Spark groups: struct keys
    field by field, and a null equal to a null (a "filled" column and an is-null flag
    per nullable key column)."""
    flags = frozenset(n for n in names if pa.types.is_struct(left.schema.field(n).type)
                      and (left.column(n).null_count or right.column(n).null_count))
    left, flat = flat_keys(left, names, flags)
    right, _ = flat_keys(right, names, flags)
    keys = []
    for name in flat:
        if left.column(name).null_count == 0 and right.column(name).null_count == 0:
            keys.append(name)
            continue
        filled, flag, fill = f"__filled_{name}", f"__null_{name}", _fill_value(left.column(name).type)
        left = left.append_column(filled, pc.fill_null(left.column(name), fill)) \
                   .append_column(flag, pc.is_null(left.column(name)))
        right = right.append_column(filled, pc.fill_null(right.column(name), fill)) \
                     .append_column(flag, pc.is_null(right.column(name)))
        keys += [filled, flag]
    return left, right, keys


def anti_join(left: pa.Table, right: pa.Table, names: list[str]) -> pa.Table:
    """The rows of ``left`` whose key (columns ``names``) is not in ``right``, in their
    order; a null equals a null, as in Spark's grouping. Only the record batches of
    ``left`` that lose a row are copied (``without_rows``): a store's table keeps its
    state in the batches its versions added, and a version that replaces a few keys
    copies those batches, not the whole state."""
    if left.num_rows == 0 or right.num_rows == 0:
        return left
    return without_rows(left, _filtered_by_join(left, right, names, "semi", indexes=True))


def without_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table`` without the rows numbered ``rows``: its record batches that lose none
    are kept as they are (no copy), the others filtered."""
    if len(rows) == 0:
        return table
    rows = np.sort(rows)
    kept, start = [], 0
    for batch in table.to_batches():
        end = start + batch.num_rows
        low, high = np.searchsorted(rows, [start, end])
        if low == high:
            kept.append(batch)
        else:
            mask = np.ones(batch.num_rows, bool)
            mask[rows[low:high] - start] = False
            kept.append(batch.filter(pa.array(mask)))
        start = end
    return pa.Table.from_batches(kept, schema=table.schema)


def compacted(table: pa.Table, most: int = 64) -> pa.Table:
    """``table`` in one record batch once it is spread over more than ``most`` (each
    version adds one; ``without_rows`` keeps them)."""
    return table.combine_chunks() if table.num_rows and len(table.to_batches()) > most else table


def semi_join(left: pa.Table, right: pa.Table, names: list[str]) -> pa.Table:
    """The rows of ``left`` whose key (columns ``names``) is in ``right``."""
    if left.num_rows == 0 or right.num_rows == 0:
        return left.slice(0, 0)
    return _filtered_by_join(left, right, names, "semi")


def join_pairs(left: pa.Table, right: pa.Table, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of rows of ``left`` and ``right`` whose keys (columns ``names``) are
    equal, a null equal to a null: their row numbers, in no particular order."""
    if left.num_rows == 0 or right.num_rows == 0 or _ranges_apart(left, right, names):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    a = left.select(names).append_column("__a", pa.array(np.arange(left.num_rows, dtype=np.int64)))
    b = right.select(names).append_column("__b", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    a, b, keys = _join_ready(a, b, names)
    a, b = a.select(keys + ["__a"]), b.select(keys + ["__b"])
    # (Acero builds its hash table on the right input: the smaller side)
    joined = a.join(b, keys=keys, join_type="inner", use_threads=False) if a.num_rows >= b.num_rows \
        else b.join(a, keys=keys, join_type="inner", use_threads=False)
    return (joined.column("__a").to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
            joined.column("__b").to_numpy(zero_copy_only=False).astype(np.int64, copy=False))


def row_of_key(table: pa.Table, held: pa.Table, names: list[str]) -> np.ndarray:
    """For each row of ``table``, the row of ``held`` (whose keys are unique) with its key
    (columns ``names``; a null equals a null), or -1."""
    found = np.full(table.num_rows, -1, np.int64)
    rows, at = join_pairs(table, held, names)
    found[rows] = at
    return found


def key_groups(table: pa.Table, names: list[str]) -> np.ndarray:
    """Each row's key as a number, 0.. in the order of the keys' first rows."""
    if table.num_rows == 0:
        return np.empty(0, np.int64)
    numbered = table.select(names).append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    flat, keys = flat_keys(numbered, names)
    firsts = flat.group_by(keys, use_threads=False).aggregate([("__row", "min")]).column("__row_min")
    firsts = np.sort(firsts.to_numpy(zero_copy_only=False))
    return row_of_key(table, table.take(pa.array(firsts)), names)


def ranks_within(groups: np.ndarray) -> np.ndarray:
    """Each row's place among the rows of its group (``key_groups``), in row order."""
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.r_[0, np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1] if len(groups) else \
        np.empty(0, np.int64)
    first = np.repeat(starts, np.diff(np.r_[starts, len(groups)]))
    ranks = np.empty(len(groups), np.int64)
    ranks[order] = np.arange(len(groups)) - first
    return ranks


def _leaves(column: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    """A key column's values compared one by one: a struct's fields (none where the struct
    itself is null somewhere: that is left to the join), else the column."""
    if not pa.types.is_struct(column.type):
        return [column]
    if column.null_count:
        return []
    return [pc.struct_field(column, [i]) for i in range(column.type.num_fields)]


def _ranges_apart(left: pa.Table, right: pa.Table, names: list[str]) -> bool:
    """Whether some integer or date key field takes values in ``left`` and in ``right``
    that lie in disjoint ranges, so that no key of the one equals a key of the other (a
    null equals only a null: a field with nulls on both sides says nothing). A
    windowed aggregation's new windows against the windows it holds, most batches."""
    for name in names:
        for a, b in zip(_leaves(left.column(name)), _leaves(right.column(name))):
            if not (pa.types.is_integer(a.type) or pa.types.is_date(a.type)) or (a.null_count and b.null_count):
                continue
            x, y = pc.min_max(a), pc.min_max(b)
            if not (x["min"].is_valid and y["min"].is_valid):   # all null against no null
                return True
            if x["max"].as_py() < y["min"].as_py() or y["max"].as_py() < x["min"].as_py():
                return True
    return False


def _filtered_by_join(left: pa.Table, right: pa.Table, names: list[str], kind: str,
                      indexes: bool = False) -> pa.Table | np.ndarray:
    """The rows of ``left`` a ``kind`` ("semi" or "anti") join with ``right`` keeps, or
    (``indexes``) their row numbers."""
    if _ranges_apart(left, right, names):
        if indexes:
            return np.arange(left.num_rows) if kind == "anti" else np.empty(0, np.int64)
        return left if kind == "anti" else left.slice(0, 0)
    # The join carries only the keys and a row number (Acero carries no struct column),
    # then the rows are taken from ``left``.
    numbered = left.append_column("__index", pa.array(np.arange(left.num_rows, dtype=np.int64)))
    numbered, right, keys = _join_ready(numbered, right, names)
    numbered, right = numbered.select(keys + ["__index"]), right.select(keys)
    # Acero builds its hash table on the right input: build on the smaller side (a
    # batch's keys against a big state: 16 ms instead of 210 ms at 12k against 1.25M)
    if numbered.num_rows <= right.num_rows:
        joined = right.join(numbered, keys=keys, join_type=f"right {kind}", use_threads=False)
    else:
        joined = numbered.join(right, keys=keys, join_type=f"left {kind}", use_threads=False)
    if indexes:
        return joined.column("__index").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return left.take(joined.column("__index"))


def _hash_ordered(kind: pa.DataType) -> bool:
    """Whether Arrow's hash min/max orders this type as Spark's min/max do."""
    return pa.types.is_integer(kind) or pa.types.is_date(kind)


def sort_ordered(kind: pa.DataType) -> bool:
    """Whether a sort orders this type as Spark's min/max do (a float's NaN above every
    number; a struct field by field, a null field first; strings by their UTF-8 bytes)."""
    def flat(t: pa.DataType) -> bool:
        return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_date(t))
    if pa.types.is_struct(kind):
        return kind.num_fields > 0 and all(flat(f.type) for f in kind)
    return flat(kind)


#: Spark's error where a bigint sum overflows in ANSI mode (a task's: the batch fails)
OVERFLOW = ("[ARITHMETIC_OVERFLOW] long overflow. Use 'try_add' to tolerate overflow and return NULL "
            "instead. If necessary set \"spark.sql.ansi.enabled\" to \"false\" to bypass this error. SQLSTATE: 22003")


def foldable(function: str, kind: pa.DataType) -> bool:
    """Whether ``group_rows`` folds a column of this type with ``function`` as Spark does."""
    if function == "sum":
        return pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if function == "sum_checked":   # (a bigint sum that fails on overflow, ANSI's)
        return pa.types.is_int64(kind)
    return function in ("min", "max") and (_hash_ordered(kind) or sort_ordered(kind))


def _ranks(column: pa.ChunkedArray, function: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's place in the order of its values (ascending; a struct field by field,
    null fields first, NaN last). Ties rank the earlier row as the one max/min keeps (the
    first, as Spark's buffer keeps its value unless a later one is strictly greater or
    less). A null value ranks -1 for max and n for min: never chosen unless all are null."""
    n = len(column)
    values = column.combine_chunks()
    parts = values.flatten() if pa.types.is_struct(values.type) else [values]
    columns, sort_keys = {}, []
    for i, part in enumerate(parts):
        if pa.types.is_floating(part.type):   # Arrow places NaN with the nulls: sort on is-NaN first
            columns[f"nan{i}"] = pc.is_nan(part)
            sort_keys.append((f"nan{i}", "ascending", "at_start"))
        columns[f"f{i}"] = part
        sort_keys.append((f"f{i}", "ascending", "at_start"))
    columns["row"] = pa.array(np.arange(n, dtype=np.int64))
    sort_keys.append(("row", "descending" if function == "max" else "ascending", "at_start"))
    order = pc.sort_indices(pa.table(columns), sort_keys=sort_keys).to_numpy()
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.arange(n, dtype=np.int64)
    if values.null_count:
        ranks[values.is_null().to_numpy(zero_copy_only=False)] = -1 if function == "max" else n
    return ranks, order


def group_rows(table: pa.Table, names: list[str], aggregates: list[tuple[str, str]]) -> pa.Table:
    """One row per key (columns ``names``, structs included) of ``table``: each value
    column of ``aggregates`` (name, "sum", "min" or "max"; ``foldable``) folded over the
    key's rows, nulls skipped (all null: null). Columns keep their names and types.

    Sums, and min/max of integers and dates, are Arrow's hash aggregates. Min/max of
    other types (floats, strings, structs) rank the rows by a sort and keep the row of
    the key's highest (lowest) rank, in the same group-by."""
    flat, keys = flat_keys(table, names)
    ranked = {}
    requests = []
    for name, function in aggregates:
        if function in ("min", "max") and not _hash_ordered(table.schema.field(name).type):
            ranks, order = _ranks(table.column(name), function)
            ranked[name] = order
            flat = flat.append_column(f"__rank_{name}", pa.array(ranks))
            requests.append((f"__rank_{name}", function))
        elif function == "sum_checked":
            # Arrow's sum wraps around: a float sum beside it tells an overflow (a wrapped
            # sum is 2^64 away from it, a float's rounding far less)
            flat = flat.append_column(f"__float_{name}", pc.cast(table.column(name), pa.float64(), safe=False))
            requests += [(name, "sum"), (f"__float_{name}", "sum")]
        else:
            requests.append((name, function))
    grouped = flat.group_by(keys, use_threads=False).aggregate(requests)
    for name, function in aggregates:
        if function == "sum_checked":
            exact = grouped.column(f"{name}_sum").to_numpy(zero_copy_only=False).astype(np.float64)
            rounded = grouped.column(f"__float_{name}_sum").to_numpy(zero_copy_only=False)
            if np.any(np.abs(np.nan_to_num(rounded) - np.nan_to_num(exact)) > 2.0 ** 62):
                raise ArithmeticError(OVERFLOW)
    columns = []
    for name in names:
        kind = table.schema.field(name).type
        if not pa.types.is_struct(kind):
            columns.append(grouped.column(name))
            continue
        children = [grouped.column(f"__{name}_{i}").combine_chunks() for i in range(kind.num_fields)]
        mask = grouped.column(f"__{name}_null").combine_chunks() if f"__{name}_null" in grouped.column_names \
            else None
        columns.append(pa.StructArray.from_arrays(children, fields=list(kind), mask=mask))
    n = table.num_rows
    for name, function in aggregates:
        kind = table.schema.field(name).type
        if name in ranked:
            rank = grouped.column(f"__rank_{name}_{function}").to_numpy()
            chosen = pa.array(np.where((rank < 0) | (rank >= n), 0, rank), mask=(rank < 0) | (rank >= n))
            by_rank = table.column(name).take(pa.array(ranked[name]))
            columns.append(by_rank.take(chosen))
        else:
            columns.append(grouped.column(f"{name}_{'sum' if function == 'sum_checked' else function}").cast(kind))
    return pa.Table.from_arrays(columns, names=names + [name for name, _ in aggregates])


def _true_rows(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The row numbers where ``mask`` is true."""
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


class TableVersions:
    """The Arrow tables of one store's recent versions: columns ``k0..`` (the key
    fields) and ``v0..`` (the value fields), in the order of the key and value schemas."""

    def __init__(self, files: StateFiles):
        self.files = files
        self.conf = files.conf
        key_schema, value_schema = files.key_schema, files.value_schema
        self.key_names = [f"k{i}" for i in range(len(key_schema))]
        self.value_names = [f"v{i}" for i in range(len(value_schema))]
        self.schema = pa.schema(
            [pa.field(n, f.type) for n, f in zip(self.key_names, key_schema)]
            + [pa.field(n, f.type) for n, f in zip(self.value_names, value_schema)])
        self.tables: dict[int, pa.Table] = {}
        self.loaded_version = -1
        self._deltas_since_snapshot = 0

    def empty(self) -> pa.Table:
        return self.schema.empty_table()

    def clear(self) -> None:
        self.tables = {}
        self.loaded_version = -1

    def table(self, version: int) -> pa.Table:
        """The state at ``version`` (0: empty): a version in memory, or the newest one in
        memory plus the deltas after it, or the files."""
        if version < 0:
            raise ValueError(f"Version cannot be less than 0, got {version}")
        if version not in self.tables:
            base = self.loaded_version
            if base in self.tables and base < version and all(
                    self.files.exists(v, "delta") for v in range(base + 1, version + 1)):
                # another worker committed the versions after ours: read only their deltas
                table = self.tables[base]
                for v in range(base + 1, version + 1):
                    table = self._apply_delta(table, self.files.read_delta(v, version, 0, rows=False))
                self._deltas_since_snapshot = self.files.deltas_since_snapshot(version)
                self.tables = {version: table}
            else:
                self.tables = {version: self._load(version)}
        elif version < self.loaded_version:   # a re-run: forget the versions after it
            self._deltas_since_snapshot = self.files.deltas_since_snapshot(version)
            self.tables = {v: t for v, t in self.tables.items() if v <= version}
        self.loaded_version = version
        return self.tables[version]

    def _load(self, version: int) -> pa.Table:
        if version == 0:
            self._deltas_since_snapshot = 0
            return self.empty()
        start = self.files.newest_snapshot(version)
        table = self._rows(self.files.read_table(start, "snapshot")) if start else self.empty()
        for v in range(start + 1, version + 1):
            table = self._apply_delta(table, self.files.read_delta(v, version, start, rows=False))
        self._deltas_since_snapshot = version - start
        log.info("Loaded state store %s version %d (snapshot %d + %d deltas, %d keys)",
                 self.files.id, version, start, version - start, table.num_rows)
        return table

    def _apply_delta(self, table: pa.Table, delta: pa.Table) -> pa.Table:
        """``table`` changed by a delta file: its keys replaced, its removed keys gone."""
        table = anti_join(table, self._rows(delta, keys_only=True), self.key_names)
        added = self._rows(delta.filter(delta.column("value").is_valid()))
        return compacted(pa.concat_tables([table, added.combine_chunks()]))

    def _rows(self, file_table: pa.Table, keys_only: bool = False) -> pa.Table:
        """A state file's struct columns as flat ``k..``/``v..`` columns."""
        keys = file_table.column("key").combine_chunks().flatten()
        columns, names = list(keys), list(self.key_names)
        if not keys_only:
            columns += list(file_table.column("value").combine_chunks().flatten())
            names += self.value_names
        if not columns:
            return self.empty()
        return pa.Table.from_arrays(columns, names=names)

    def commit(self, version: int, table: pa.Table, added: pa.Table, removed: pa.Table) -> int:
        """Make ``table`` version ``version + 1``: its delta file holds the ``added`` rows
        and the ``removed`` keys (null values). Returns the commit time in ms."""
        started = time.monotonic()
        keys = pa.concat_tables([added.select(self.key_names), removed.select(self.key_names)])
        values = added.select(self.value_names)
        valid = pa.array(np.arange(added.num_rows + removed.num_rows) < added.num_rows)
        self.files.write_arrays(version + 1, "delta",
                                self._struct(keys, self.key_names, self.files.key_schema),
                                self._struct(values, self.value_names, self.files.value_schema,
                                             length=len(valid), mask=pc.invert(valid)))
        self.tables[version + 1] = table
        for old in [v for v in self.tables if v <= version + 1 - max(1, self.conf.max_versions_in_memory)]:
            del self.tables[old]
        self.loaded_version = version + 1
        self._deltas_since_snapshot += 1
        if self._deltas_since_snapshot > self.conf.min_deltas_for_snapshot:
            self._snapshot(version + 1, table)
            self.files.cleanup()
        return int((time.monotonic() - started) * 1000)

    def _struct(self, table: pa.Table, names: list[str], schema: pa.Schema, length: int | None = None,
                mask: pa.Array | None = None) -> pa.Array:
        """Columns of ``table`` as one struct array of ``schema`` (padded with nulls to
        ``length`` under ``mask``)."""
        size = table.num_rows if length is None else length
        columns = []
        for name, field in zip(names, schema):
            column = table.column(name).combine_chunks() if table.num_rows else pa.array([], field.type)
            if size > len(column):
                column = pa.concat_arrays([column, pa.nulls(size - len(column), field.type)])
            columns.append(column)
        if mask is None:
            mask = pa.array(np.zeros(size, bool))
        return pa.StructArray.from_arrays(columns, fields=list(schema), mask=mask)

    def _snapshot(self, version: int, table: pa.Table) -> None:
        started = time.monotonic()
        self.files.write_arrays(version, "snapshot",
                                self._struct(table, self.key_names, self.files.key_schema),
                                self._struct(table, self.value_names, self.files.value_schema))
        self._deltas_since_snapshot = 0
        log.info("Written snapshot file for version %d of %s at %s in %d ms", version, self.files.id,
                 self.files.path(version, "snapshot"), (time.monotonic() - started) * 1000)


class TableChanges:
    """One version of a store changed a batch at a time in the table form: the rows of
    the version not removed yet (``base``), the rows added, the rows removed."""

    def __init__(self, versions: TableVersions, version: int):
        self.versions = versions
        self.version = version
        self.base = versions.table(version)
        self.added = versions.empty()
        self.removed = versions.empty()
        self.inserted = 0
        self.removed_count = 0
        #: rows were added after rows were removed: a key may be in both (see ``commit``)
        self._added_after_removal = False

    def insert_new(self, keys: pa.Table, values: pa.Table | None) -> np.ndarray:
        """``StateStore.insert_new``: a group-by finds each key's first row, an anti join
        against the store the new ones."""
        names, files = self.versions.key_names, self.versions.files
        n = keys.num_rows
        table = pa.Table.from_arrays([keys.column(i).cast(f.type) for i, f in enumerate(files.key_schema)],
                                     names=names)
        table = table.append_column("__row", pa.array(np.arange(n, dtype=np.int64)))
        first = table
        if n:
            flat, keys = flat_keys(table, names)
            firsts = flat.group_by(keys, use_threads=False).aggregate([("__row", "min")]).column("__row_min")
            first = table.take(firsts)
        current = pa.concat_tables([self.base, self.added]) if self.added.num_rows else self.base
        new = anti_join(first, current, names)
        rows = new.column("__row")
        new = new.select(names)
        for i, (name, field) in enumerate(zip(self.versions.value_names, files.value_schema)):
            column = values.column(i).take(rows) if values is not None else pa.nulls(len(rows), field.type)
            new = new.append_column(name, column.cast(field.type))
        self.added = pa.concat_tables([self.added, new]) if self.added.num_rows else new
        self.inserted += new.num_rows
        self._added_after_removal = self._added_after_removal or bool(self.removed.num_rows)
        keep = np.zeros(n, bool)
        keep[rows.to_numpy()] = True
        return keep

    def remove_at_or_below(self, bound: int, column: str) -> int:
        def due(t: pa.Table) -> pa.Array:
            return pc.fill_null(pc.less_equal(t.column(column), bound), False)
        base_due = due(self.base)
        expired = self.base.filter(base_due)
        count = expired.num_rows
        if count:
            self.removed = pa.concat_tables([self.removed, expired])
            self.base = without_rows(self.base, _true_rows(base_due))
        if self.added.num_rows:
            added_due = due(self.added)
            added_count = pc.sum(added_due).as_py() or 0
            if added_count:
                self.added = self.added.filter(pc.invert(added_due))
                count += added_count
        self.removed_count += count
        return count

    def matching(self, keys: pa.Table) -> pa.Table:
        """The rows held (key and value columns) for the keys of ``keys`` (columns ``k..``)."""
        names = self.versions.key_names
        held = semi_join(self.base, keys, names)
        if self.added.num_rows:
            held = pa.concat_tables([held, semi_join(self.added, keys, names)])
        return held

    def upsert(self, rows: pa.Table) -> None:
        """Hold ``rows`` (the table's columns and types): each replaces its key's row."""
        names = self.versions.key_names
        self.base = anti_join(self.base, rows, names)
        self.added = pa.concat_tables([anti_join(self.added, rows, names), rows]) if self.added.num_rows \
            else rows
        self.inserted += rows.num_rows
        self._added_after_removal = self._added_after_removal or bool(self.removed.num_rows)

    def take_at_or_below(self, bound: int, column: str, field: int | None = None) -> pa.Table:
        """Remove the rows whose ``column`` (its struct field ``field``) is at or below
        ``bound``, and return them. Unlike ``remove_at_or_below``, a row added in this
        version is recorded as removed too: it may replace a row of the version."""
        def due(t: pa.Table) -> pa.Array:
            values = t.column(column)
            if field is not None:
                values = pc.struct_field(values, [field])
            return pc.fill_null(pc.less_equal(values, bound), False)
        return self.take_where(due)

    def take_where(self, due) -> pa.Table:
        """Remove the rows where ``due(table)`` is true, and return them (as
        ``take_at_or_below``)."""
        taken = []
        for name in ("base", "added"):
            table = getattr(self, name)
            if not table.num_rows:
                continue
            mask = due(table)
            expired = table.filter(mask)
            if expired.num_rows:
                taken.append(expired)
                setattr(self, name, without_rows(table, _true_rows(mask)))
        if not taken:
            return self.versions.empty()
        expired = pa.concat_tables(taken)
        self.removed = pa.concat_tables([self.removed, expired])
        self.removed_count += expired.num_rows
        return expired

    def remove(self, keys: pa.Table) -> int:
        """Remove the rows held for the keys of ``keys`` (columns ``k..``); how many."""
        names = self.versions.key_names
        count = 0
        for name in ("base", "added"):
            table = getattr(self, name)
            if table.num_rows == 0 or keys.num_rows == 0:
                continue
            rows = _filtered_by_join(table, keys, names, "semi", indexes=True)
            if len(rows):
                self.removed = pa.concat_tables([self.removed, table.take(pa.array(rows))])
                setattr(self, name, without_rows(table, rows))
                count += len(rows)
        self.removed_count += count
        return count

    def rows(self) -> pa.Table:
        return pa.concat_tables([self.base, self.added]) if self.added.num_rows else self.base

    def num_keys(self) -> int:
        return self.base.num_rows + self.added.num_rows

    def commit(self) -> tuple[pa.Table, int]:
        """Commit version ``version + 1``: the new table and the commit time in ms."""
        following = compacted(pa.concat_tables([self.base, self.added.combine_chunks()]))
        removed = self.removed
        if removed.num_rows and self.added.num_rows and self._added_after_removal:
            # a key removed, then added again: added (a removal takes its key out of the
            # added rows too, so without an addition after it none is in both)
            removed = anti_join(removed, self.added, self.versions.key_names)
        return following, self.versions.commit(self.version, following, self.added, removed)
