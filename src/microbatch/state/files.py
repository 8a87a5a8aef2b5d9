"""The state files and the one encoding of keys and values (docs/design.md, section 4).

Every provider writes the same files, so each reads what another wrote and the
state reader reads them all. In ``<checkpoint>/state/<op>/<partition>[/<store>]/``:

- ``<v>.delta.arrow``: the changes that make version v from v-1: columns ``key``
  (a struct of the key schema) and ``value`` (a struct of the value schema; null
  marks a removed key).
- ``<v>.snapshot.arrow``: every key and value of version v, same columns.
- ``<v>.changes.arrow``: for an operator whose state rows are not Spark's (a session
  window's, a transformWithState's), the changes of version v as Spark's store made them,
  for the state reader's change feed: columns ``change_type`` (``update``, ``delete``, a
  list's ``append``), ``key``, ``value`` (in the store's form, one session, list element or
  map entry), one row per change in order (a key may change twice), written by the
  operator's task before the delta (``StateLayout.logs_changes``), only when there are changes.

Both are Arrow IPC streams (lz4 or zstd, ``spark.sql.streaming.stateStore.compression.codec``),
written whole through the checkpoint's storage layer (``checkpoint/fs.py``), so a
reader never sees a partial file. A version is loaded from the newest snapshot at
or below it plus the deltas after that; clean-up deletes the files no version
among the last ``minBatchesToRetain`` needs.

In memory a key or a value is a tuple of plain Python values in the order of its
schema: timestamps as int64 microseconds, structs and lists as tuples in keys
(so they hash). ``state_values`` turns an Arrow column into such values; every
operator and provider goes through it and through ``to_struct_array`` /
``from_struct_array``.
"""
from __future__ import annotations

import re
from itertools import repeat
from operator import countOf, is_
from typing import Any

import pyarrow as pa
import pyarrow.compute  # pa.compute
import pyarrow.ipc as ipc

from microbatch import crash_points
from microbatch.errors import CheckpointError

#: The value of a key removed in a version (a null ``value`` in a file).
REMOVED = object()
_FILE = re.compile(r"^(\d+)\.(delta|snapshot|changes)\.arrow$")


# -- the encoding of keys and values ------------------------------------------------
def storage_type(t: pa.DataType) -> pa.DataType:
    """How a value of Arrow type ``t`` is kept in the state: timestamps as int64 micros."""
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, storage_type(f.type), f.nullable) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        field = t.value_field
        return pa.list_(pa.field(field.name, storage_type(field.type), field.nullable))
    if pa.types.is_map(t):
        return pa.map_(storage_type(t.key_type), storage_type(t.item_type))
    return t


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable, nested ones too (a change's value may lack
    what the state's never does: a removed map entry's value)."""
    def nullable(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(kind):
            return pa.struct([pa.field(f.name, nullable(f.type)) for f in kind])
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return pa.list_(pa.field(kind.value_field.name, nullable(kind.value_type)))
        return kind
    return pa.schema([pa.field(f.name, nullable(f.type)) for f in schema])


def hashable(value):
    """A nested value as a key can hold it: structs (dicts) and lists become tuples."""
    if isinstance(value, dict):
        return tuple(hashable(v) for v in value.values())
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    return value


def _flat(kind: pa.DataType) -> bool:
    return pa.types.is_primitive(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind) \
        or pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_decimal(kind)


def state_values(column: pa.Array, storage: pa.DataType | None = None, as_key: bool = False) -> list:
    """An Arrow column as state values: cast to its storage type (timestamps become int64
    µs), numbers through numpy when they have no nulls, nested values of a key as tuples."""
    storage = storage_type(column.type) if storage is None else storage
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.type != storage:
        column = column.cast(storage)
    if column.null_count == 0 and (pa.types.is_integer(storage) or pa.types.is_floating(storage)):
        return column.to_numpy().tolist()
    if as_key and column.null_count == 0 and pa.types.is_struct(storage) and storage.num_fields \
            and all(_flat(f.type) for f in storage):
        # a struct of flat fields (a window): its tuples zipped from the fields, a column each
        return list(zip(*[state_values(child, f.type) for child, f in zip(column.flatten(), storage)]))
    values = column.to_pylist()
    if as_key and not _flat(storage):
        values = [hashable(v) for v in values]
    return values


def from_state_values(values: list, storage: pa.DataType, target: pa.DataType) -> pa.Array:
    """State values back to an Arrow column of ``target`` (their storage type cast back)."""
    array = pa.array(values, type=storage)
    return array if storage == target else array.cast(target)


def _nested_tuples(value: Any, kind: pa.DataType) -> Any:
    """``value`` with its structs as tuples, at every depth (pyarrow takes a column's
    structs as all dicts or all tuples, not a mix)."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        fields = list(kind)
        items = [value[f.name] for f in fields] if isinstance(value, dict) else value
        return tuple(_nested_tuples(v, f.type) for v, f in zip(items, fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_nested_tuples(v, kind.value_type) for v in value]
    return value


def _column(values, kind: pa.DataType) -> pa.Array:
    """A column of state values. Values loaded from a state file carry their structs as
    dicts, values a task built carry tuples; a column holding both is made uniform."""
    try:
        return pa.array(values, type=kind)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        if not (pa.types.is_struct(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise
        return pa.array([_nested_tuples(v, kind) for v in values], type=kind)


def to_struct_array(rows: list, schema: pa.Schema) -> pa.Array:
    """Tuples (None or ``REMOVED`` for a null struct) -> a struct array of ``schema``, column
    by column (``zip(*rows)`` transposes at C speed)."""
    if REMOVED in rows:
        rows = [None if r is REMOVED else r for r in rows]
    nulls = countOf(rows, None)
    mask = pa.array(list(map(is_, rows, repeat(None))), type=pa.bool_()) if nulls else None
    if nulls:
        empty = (None,) * len(schema)
        rows = [empty if r is None else r for r in rows]
    transposed = list(zip(*rows)) if rows else [()] * len(schema)
    columns = [_column(values, f.type) for values, f in zip(transposed, schema)]
    if not columns:   # a struct without fields: only its length and validity
        return pa.StructArray.from_arrays([], fields=[], mask=mask if mask is not None
                                          else pa.array([False] * len(rows), type=pa.bool_()))
    return pa.StructArray.from_arrays(columns, fields=list(schema), mask=mask)


def from_struct_array(array: pa.Array, keys: bool = False) -> list:
    """A struct array -> tuples (None for a null struct); ``keys``: nested values as tuples."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    valid = array.is_valid().to_pylist()
    columns = [state_values(column, column.type, as_key=keys) for column in array.flatten()]
    return [tuple(values) if ok else None for ok, values in zip(valid, zip(*columns))] \
        if columns else [() if ok else None for ok in valid]


def evolved(array: pa.Array, target: pa.DataType, by_name: bool) -> pa.Array:
    """Values written with an older schema, read as ``target`` (a state whose schema evolved
    across restarts): struct fields matched by name, a field the old schema lacks read as
    null (Avro's rules), or matched by position (``by_name`` False); lists and maps
    element by element; other values cast (Avro's promotions: int to long, ...)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.type == target:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        children = array.flatten()
        old = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        fields = []
        for i, f in enumerate(target):
            j = old.get(f.name) if by_name else (i if i < len(children) else None)
            fields.append(pa.nulls(len(array), f.type) if j is None else evolved(children[j], f.type, by_name))
        return pa.StructArray.from_arrays(fields, fields=list(target), mask=mask)
    if pa.types.is_map(target) and pa.types.is_map(array.type):
        offsets = pa.compute.subtract(array.offsets, array.offsets[0])
        start, end = array.offsets[0].as_py(), array.offsets[-1].as_py()
        keys = evolved(array.keys.slice(start, end - start), target.key_type, by_name)
        items = evolved(array.items.slice(start, end - start), target.item_type, by_name)
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=mask)
    if pa.types.is_list(target) and (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        offsets = pa.compute.subtract(array.offsets, array.offsets[0]).cast(pa.int32())
        start, end = array.offsets[0].as_py(), array.offsets[-1].as_py()
        values = evolved(array.values.slice(start, end - start), target.value_type, by_name)
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)
    return array.cast(target)


# -- the files of one store ---------------------------------------------------------------
class StateFiles:
    """The delta and snapshot files of one store, read and written through the
    checkpoint's storage layer (``conf.fs``)."""

    def __init__(self, store_id, key_schema: pa.Schema, value_schema: pa.Schema, conf):
        self.id = store_id
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.conf = conf
        self.schema = pa.schema([pa.field("key", pa.struct(list(key_schema))),
                                 pa.field("value", pa.struct(list(value_schema)))])

    def path(self, version: int, kind: str) -> str:
        return f"{self.id.path}/{version}.{kind}.arrow"

    def exists(self, version: int, kind: str) -> bool:
        return self.conf.fs.exists(self.path(version, kind))

    def list(self) -> list[tuple[int, str]]:
        """(version, kind) of every state file, oldest first, snapshots before deltas."""
        files = []
        for name in self.conf.fs.list(self.id.path):
            m = _FILE.match(name)
            if m:
                files.append((int(m.group(1)), m.group(2)))
        return sorted(files, key=lambda f: (f[0], f[1] != "snapshot"))

    def newest_snapshot(self, version: int) -> int:
        """The newest snapshot at or below ``version`` (0: none)."""
        return max((v for v, kind in self.list() if kind == "snapshot" and v <= version), default=0)

    def deltas_since_snapshot(self, version: int) -> int:
        """How many deltas ``version`` has on top of its newest snapshot. A provider that
        caught up with versions another executor committed counts from here, not from its
        own commits: the other may have written a snapshot meanwhile, and a checkpoint's
        snapshots must be where one provider would put them, wherever the tasks ran."""
        return version - self.newest_snapshot(version)

    def write_rows(self, version: int, kind: str, keys: list, values: list) -> None:
        """Write key tuples and value tuples (``REMOVED``: a removed key) as one file."""
        self.write_arrays(version, kind, to_struct_array(keys, self.key_schema),
                          to_struct_array(values, self.value_schema))

    def write_arrays(self, version: int, kind: str, keys: pa.Array, values: pa.Array) -> None:
        """Write a state file from its ``key`` and ``value`` struct arrays, whole: a
        reader sees the old file or the new one. A re-commit writes the same content."""
        batch = pa.RecordBatch.from_arrays([keys, values], schema=self.schema)
        options = ipc.IpcWriteOptions(compression=self.conf.compression)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self.schema, options=options) as writer:
            writer.write_batch(batch)
        self.conf.fs.write_bytes(self.path(version, kind), sink.getvalue())
        crash_points.reached(f"state-{kind}-written")   # delta: a commit; snapshot: maintenance

    def write_changes(self, version: int, changes: list[tuple[str, tuple, tuple]]) -> None:
        """Write version ``version``'s changes as Spark's store made them: (``update`` or
        ``delete``, key tuple, value tuple) each, in order; whole, as ``write_arrays``."""
        self._write_change_arrays(version, pa.array([c[0] for c in changes], pa.string()),
                                  to_struct_array([c[1] for c in changes], self.key_schema),
                                  to_struct_array([c[2] for c in changes], self.value_schema))

    def write_change_table(self, version: int, kinds: pa.Array, keys: pa.Table, values: pa.Table) -> None:
        """``write_changes`` from Arrow: each change's kind (``update`` or ``delete``), and
        its key's and value's columns in the store's schemas' order, a row a change."""
        def struct(table: pa.Table, schema: pa.Schema) -> pa.Array:
            return pa.StructArray.from_arrays([table.column(i).combine_chunks().cast(f.type)
                                               for i, f in enumerate(schema)], fields=list(schema))
        self._write_change_arrays(version, kinds, struct(keys, self.key_schema), struct(values, self.value_schema))

    def _write_change_arrays(self, version: int, kinds: pa.Array, keys: pa.Array, values: pa.Array) -> None:
        """The changes file of ``version``: each change's kind, key struct and value struct."""
        schema = pa.schema([pa.field("change_type", pa.string()), *self.schema])
        batch = pa.RecordBatch.from_arrays([kinds, keys, values], schema=schema)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, schema, options=ipc.IpcWriteOptions(compression=self.conf.compression)) as writer:
            writer.write_batch(batch)
        self.conf.fs.write_bytes(self.path(version, "changes"), sink.getvalue())

    def read_changes(self, version: int) -> list[tuple[str, tuple, tuple]]:
        """Version ``version``'s changes (``write_changes``); none when it has no file.
        The version's delta must be there: else it was removed with old state, or never
        written (a clear error, as ``read_delta``'s)."""
        if not self.exists(version, "delta"):
            self.read_delta(version, version, self.newest_snapshot(version))   # (raises, naming the file)
        try:
            table = ipc.open_stream(pa.py_buffer(self.conf.fs.read_bytes(self.path(version, "changes")))).read_all()
        except FileNotFoundError:
            return []
        except (OSError, pa.ArrowInvalid) as e:
            raise CheckpointError(
                f"Error reading state file {self.path(version, 'changes')} of state store {self.id}: {e}. "
                "The file is damaged; the state is not (the change feed alone reads it).") from e
        return list(zip(table.column("change_type").to_pylist(),
                        from_struct_array(table.column("key"), keys=True), from_struct_array(table.column("value"))))

    def write_chunks(self, version: int, kind: str, chunks) -> None:
        """Write a state file from ``(keys, values)`` tuple lists, one record batch each,
        so a caller streaming a large store holds one chunk of Python rows at a time.
        The file is still written whole, as ``write_arrays`` does."""
        options = ipc.IpcWriteOptions(compression=self.conf.compression)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self.schema, options=options) as writer:
            for keys, values in chunks:
                writer.write_batch(pa.RecordBatch.from_arrays(
                    [to_struct_array(keys, self.key_schema), to_struct_array(values, self.value_schema)],
                    schema=self.schema))
        self.conf.fs.write_bytes(self.path(version, kind), sink.getvalue())
        crash_points.reached(f"state-{kind}-written")

    def write_concatenated(self, version: int, kind: str, sources: list[tuple[int, str]]) -> None:
        """Write a state file holding the rows of the files ``sources`` ((version, kind)
        each), in order, one source's record batches at a time, none decoded to Python."""
        options = ipc.IpcWriteOptions(compression=self.conf.compression)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self.schema, options=options) as writer:
            for source_version, source_kind in sources:
                writer.write_table(self.read_table(source_version, source_kind))
        self.conf.fs.write_bytes(self.path(version, kind), sink.getvalue())
        crash_points.reached(f"state-{kind}-written")

    def read_chunks(self, version: int, kind: str):
        """(key, value) pairs of a file, one record batch at a time (``read_rows`` of each)."""
        for batch in self.read_table(version, kind).to_batches():
            keys = from_struct_array(batch.column(0), keys=True)
            values = from_struct_array(batch.column(1))
            if None in values:
                values = [REMOVED if v is None else v for v in values]
            yield list(zip(keys, values))

    def read_table(self, version: int, kind: str) -> pa.Table:
        """A state file as an Arrow table (columns ``key``, ``value``), checked;
        FileNotFoundError when it does not exist."""
        path = self.path(version, kind)
        try:
            table = ipc.open_stream(pa.py_buffer(self.conf.fs.read_bytes(path))).read_all()
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowInvalid) as e:
            raise CheckpointError(
                f"Error reading state file {path} of state store {self.id}: {e}. The file is "
                "damaged; restore it from a backup, or start the query with a new checkpoint "
                "location.") from e
        if table.schema != self.schema and self.conf.value_evolution \
                and table.schema.field("key").type == self.schema.field("key").type:
            value = evolved(table.column("value"), self.schema.field("value").type,
                            self.conf.value_evolution == "name")
            table = pa.Table.from_arrays([table.column("key"), value], schema=self.schema)
        if table.schema != self.schema:
            raise CheckpointError(
                f"The state file {path} has the schema {table.schema}, but the operator's state "
                f"has {self.schema}. The query's stateful operator changed since the "
                "checkpoint was written; use a new checkpoint location.")
        return table

    def read_rows(self, version: int, kind: str) -> list[tuple]:
        """(key, value) pairs of a file; a removed key's value is ``REMOVED``."""
        table = self.read_table(version, kind)
        keys = from_struct_array(table.column("key"), keys=True)
        values = from_struct_array(table.column("value"))
        if None in values:
            values = [REMOVED if v is None else v for v in values]
        return list(zip(keys, values))

    def read_delta(self, version: int, wanted: int, snapshot: int, rows: bool = True):
        """Delta ``version`` (rows, or the table), or a clear error naming the file
        when it is missing though version ``wanted`` needs it."""
        try:
            return self.read_rows(version, "delta") if rows else self.read_table(version, "delta")
        except FileNotFoundError:
            raise CheckpointError(
                f"Error reading delta file {self.path(version, 'delta')} of state store {self.id}: "
                f"the file does not exist, but version {wanted} needs it (the newest snapshot at "
                f"or below it is {snapshot or 'none'}). The state of this checkpoint is "
                "incomplete; restore the file or use a new checkpoint location.") from None

    def cleanup(self) -> None:
        """Delete files no version among the last ``minBatchesToRetain`` needs."""
        files = self.list()
        if not files:
            return
        earliest = files[-1][0] - self.conf.min_versions_to_retain
        if earliest <= 0:
            return
        snapshots = [v for v, kind in files if kind == "snapshot" and v <= earliest]
        keep_from = max(snapshots) if snapshots else 0
        for v, kind in files:
            if v < keep_from or (v == keep_from and kind != "snapshot" and snapshots):
                self.conf.fs.delete(self.path(v, kind))
                crash_points.reached("state-cleanup")
