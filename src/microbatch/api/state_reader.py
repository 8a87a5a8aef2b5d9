"""Reading a query's state as a DataFrame: ``ss.read.format("statestore")`` and
``ss.read.format("state-metadata")``, on microbatch's own checkpoints.

Like Spark's state data source, with its options and their checks in Spark's order, each
refusal Spark's own exception (``StateSourceOptions``: ``STDS_CONFLICT_OPTIONS``,
``STDS_INVALID_OPTION_VALUE``, ``STDS_REQUIRED_OPTION_UNSPECIFIED``, ...): ``batchId``
(default: the latest committed batch; the state *after* that batch), ``operatorId``
(default 0), ``storeName`` (default ``default``); for a stream-stream join ``joinSide``
(``left`` or ``right``: that side's rows, keyed by the join key as ``field0..``); for a
transformWithState ``stateVarName``, ``readRegisteredTimers`` and
``flattenCollectionTypes``; ``snapshotStartBatchId`` with ``snapshotPartitionId`` (one
partition's state rebuilt from the snapshot written after that batch, which must exist,
plus the deltas after it); ``readChangeFeed`` with ``changeStartBatchId`` and
``changeEndBatchId`` (each batch's changes, from the delta files, or for an operator
whose rows are not Spark's from the changes its tasks logged: Spark's columns
``batch_id``, ``change_type`` (``update`` or ``delete``), ``key``, ``value`` (null for a
delete), ``partition_id``). The result has Spark's columns ``key`` and ``value`` (structs
of the operator's key and value schema) and ``partition_id``. An aggregation's value holds
its merge buffers (e.g. the sum and count of an ``avg``). Options Spark's source does not
know, Spark ignores, and so does this reader. The state is read on the driver: this is an
inspection tool, not a path for big data.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from microbatch import spark_internals
from microbatch.checkpoint.commits import CommitLog
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.stores import storage_for
from microbatch.errors import AnalysisException, CheckpointError, IllegalArgumentException, UnsupportedOperationError
from microbatch.checkpoint.offsets import OffsetSeqLog
from microbatch.operators.base import state_layout
from microbatch.operators.spark_stores import same_rows, spark_stores
from microbatch.state.files import REMOVED, StateFiles
from microbatch.state.spark_format import all_nullable
from microbatch.state.store import (DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, StateStoreConf, StateStoreId,
                                    provider_class)
from microbatch.util import option_value


def _state_store_reader(spark):
    spark_internals.require("the state data source (format 'statestore')")
    return StateStoreReader(spark)


def _state_metadata_reader(spark):
    spark_internals.require("the state data source (format 'statestore')")
    return StateMetadataReader(spark)


#: microbatch's own read formats, by lower-case name: the state data sources over its checkpoints
#: (``ss.read``, and a query's batch session's ``read``: ``runtime.micro_batch``)
READ_FORMATS = {"statestore": _state_store_reader, "state-metadata": _state_metadata_reader}


class SessionReader:
    """``ss.read``: Spark's DataFrameReader, plus the ``statestore`` and ``state-metadata``
    formats."""

    def __init__(self, spark: SparkSession):
        self._spark = spark

    def format(self, source: str) -> Any:
        made = READ_FORMATS.get(source.lower())
        return made(self._spark) if made is not None else self._spark.read.format(source)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark.read, name)


_INTEGER = re.compile(r"[+-]?\d+")


def _source_error(method: str, *args):
    return spark_internals.state_reader_error("source", method, *args)


@dataclass
class StateSourceOptions:
    """The options of a state read, checked as Spark's ``StateSourceOptions.apply`` checks
    them (``StateDataSource.scala``), in its order."""
    path: str
    location: str             # the checkpoint as Spark names it in its errors (a URI)
    batch_id: int
    operator: int
    store_name: str
    join_side: str | None
    read_change_feed: bool
    change_start: int | None
    change_end: int | None
    snapshot_start: int | None
    snapshot_partition: int | None
    state_var: str | None
    read_timers: bool
    flatten: bool

    @classmethod
    def parse(cls, options: dict[str, str], latest_committed: Callable[[], int | None],
              location: str) -> "StateSourceOptions":
        path = options.get("path")
        if path is None:
            raise _source_error("requiredOptionUnspecified", "path")
        operator = _number(options, "operatorId", 0)
        if operator < 0:
            raise _source_error("invalidOptionValueIsNegative", "operatorId")
        store_name = options.get("storename", "default").strip()
        if not store_name:
            raise _source_error("invalidOptionValueIsEmpty", "storeName")
        state_var = options.get("statevarname")
        state_var = None if state_var is None else state_var.strip()
        read_timers = _flag(options, "readRegisteredTimers", False, checked=True)
        if read_timers and state_var is not None:
            raise _source_error("conflictOptions", ["readRegisteredTimers", "stateVarName"])
        flatten = _flag(options, "flattenCollectionTypes", True, checked=True)
        join_side = options.get("joinside", "none")
        if join_side not in ("left", "right", "none"):   # (Spark's Enumeration.withName: case matters)
            raise _source_error("invalidOptionValue", "joinSide", "Valid values are left,right,none")
        if join_side != "none" and store_name != "default":
            raise _source_error("conflictOptions", ["joinSide", "storeName"])
        batch_id = _number(options, "batchId", None)
        snapshot_start = _number(options, "snapshotStartBatchId", None)
        snapshot_partition = _number(options, "snapshotPartitionId", None)
        read_change_feed = _flag(options, "readChangeFeed", False, checked=False)
        change_start = _number(options, "changeStartBatchId", None)
        change_end = _number(options, "changeEndBatchId", None)

        def latest() -> int:
            found = latest_committed()
            if found is None:
                raise _source_error("committedBatchUnavailable", location)
            return found
        if read_change_feed:
            batch_id = _change_range(join_side, batch_id, snapshot_start, snapshot_partition, change_start,
                                     change_end, latest)
            change_end = batch_id
        else:
            batch_id = _snapshot_range(batch_id, snapshot_start, snapshot_partition, change_start, change_end,
                                       latest)
        return cls(path, location, batch_id, operator, store_name, None if join_side == "none" else join_side,
                   read_change_feed, change_start, change_end, snapshot_start, snapshot_partition, state_var,
                   read_timers, flatten)


def _change_range(join_side: str, batch_id: int | None, snapshot_start: int | None,
                  snapshot_partition: int | None, change_start: int | None, change_end: int | None,
                  latest: Callable[[], int]) -> int:
    """Spark's checks of a change feed's options; the last batch it reads."""
    for name, value in (("joinSide", None if join_side == "none" else join_side), ("batchId", batch_id),
                        ("snapshotStartBatchId", snapshot_start), ("snapshotPartitionId", snapshot_partition)):
        if value is not None:
            raise _source_error("conflictOptions", [name, "readChangeFeed"])
    if change_start is None:
        raise _source_error("requiredOptionUnspecified", "changeStartBatchId")
    change_end = latest() if change_end is None else change_end
    if change_start < 0:
        raise _source_error("invalidOptionValueIsNegative", "changeStartBatchId")
    if change_end < change_start:
        raise _source_error(
            "invalidOptionValue", "changeEndBatchId",
            "changeEndBatchId cannot be smaller than changeStartBatchId. Please check the input to "
            "changeEndBatchId, or if you are using its default value, make sure that "
            f"changeStartBatchId is less than {change_end}.")
    return change_end


def _snapshot_range(batch_id: int | None, snapshot_start: int | None, snapshot_partition: int | None,
                    change_start: int | None, change_end: int | None, latest: Callable[[], int]) -> int:
    """Spark's checks of a read's batch and snapshot options; the batch it reads."""
    for name, value in (("changeStartBatchId", change_start), ("changeEndBatchId", change_end)):
        if value is not None:
            raise _source_error("invalidOptionValue", name,
                                "Only specify this option when readChangeFeed is set to true.")
    batch_id = latest() if batch_id is None else batch_id
    if batch_id < 0:
        raise _source_error("invalidOptionValueIsNegative", "batchId")
    if snapshot_start is not None and snapshot_start < 0:
        raise _source_error("invalidOptionValueIsNegative", "snapshotStartBatchId")
    if snapshot_start is not None and snapshot_start > batch_id:
        raise _source_error("invalidOptionValue", "snapshotStartBatchId",
                            f"value should be less than or equal to {batch_id}")
    if snapshot_partition is not None and snapshot_partition < 0:
        raise _source_error("invalidOptionValueIsNegative", "snapshotPartitionId")
    if snapshot_partition is not None and snapshot_start is None:
        raise _source_error("requiredOptionUnspecified", "snapshotStartBatchId")
    if snapshot_partition is None and snapshot_start is not None:
        raise _source_error("requiredOptionUnspecified", "snapshotPartitionId")
    return batch_id


def _number(options: dict[str, str], name: str, default: int | None) -> int | None:
    """An integer option as Scala's ``toInt``/``toLong`` reads it."""
    text = options.get(name.lower())
    if text is None:
        return default
    if not _INTEGER.fullmatch(text):
        raise IllegalArgumentException(f'For input string: "{text}"')   # (NumberFormatException's words)
    return int(text)


def _flag(options: dict[str, str], name: str, default: bool, checked: bool) -> bool:
    """A boolean option as Scala's ``toBoolean`` reads it; Spark names the option in its
    error for some (``checked``), not for ``readChangeFeed``."""
    text = options.get(name.lower())
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        if checked:
            raise _source_error("invalidOptionValue", name, "Boolean value is expected")
        raise IllegalArgumentException(f'For input string: "{text}"')
    return text.lower() == "true"


class StateStoreReader:
    def __init__(self, spark: SparkSession):
        self._spark = spark
        self._options: dict[str, str] = {}

    def option(self, key: str, value: Any) -> "StateStoreReader":
        self._options[key.lower()] = option_value(value)
        return self

    def options(self, **options: Any) -> "StateStoreReader":
        for k, v in options.items():
            self.option(k, v)
        return self

    def load(self, path: str | None = None) -> DataFrame:
        if path is not None:
            self._options["path"] = path
        settings = spark_internals.session_settings(self._spark)
        given = self._options.get("path")
        fs = storage_for(given or ".", settings)
        root = fs.resolve(given or ".")
        opts = StateSourceOptions.parse(
            self._options, lambda: (CommitLog(f"{root}/commits", fs).get_latest() or (None,))[0],
            _qualified(root))
        path, operator, store_name = opts.path, opts.operator, opts.store_name
        op_dir = f"{root}/state/{operator}"
        schema_path = f"{op_dir}/_metadata/schema"
        if not fs.exists(schema_path):
            raise AnalysisException(
                f"The checkpoint '{path}' has no state for operator {operator} ({schema_path} does "
                "not exist). Operators are numbered from 0 in the order of the query plan, top down.")
        doc = json.loads(fs.read_text(schema_path))
        key_type = StructType.fromJson(doc["keySchema"])
        value_type = StructType.fromJson(doc["valueSchema"])
        layout = state_layout(doc.get("operatorName"))
        _check_state_variable_options(opts, doc, layout.in_column_families)
        confs = _recorded_confs(fs, root, opts)
        join_side = opts.join_side
        _check_layout(opts, layout, doc)
        if join_side is not None:   # one side of a stream-stream join: its rows per key
            store_name, key_type, value_type = layout.side_store(join_side, key_type, value_type)
        as_spark, key_type, value_type = _shown_types(doc, layout, join_side, key_type, value_type)
        variable = None
        if layout.in_column_families:
            variable, store_name, key_type, value_type = self._state_variable(doc, key_type, value_type, opts)
        partitions = sorted(int(n) for n in fs.list(op_dir) if n.isdigit())
        if "storename" in self._options:   # a name the user gave, not one derived above
            self._check_store_name(fs, op_dir, partitions, opts.store_name, operator)
        if opts.snapshot_partition is not None:
            if opts.snapshot_partition not in partitions:
                raise spark_internals.state_reader_error(
                    "store", "stateStoreSnapshotPartitionNotFound", opts.snapshot_partition, operator,
                    _qualified(f"{root}/state"))
            partitions = [opts.snapshot_partition]
        provider_name = confs.get(PROVIDER_CLASS_CONF, DEFAULT_PROVIDER)
        # a transformWithState's state may have evolved: older files read in the newest schema
        evolution = "" if variable is None else \
            "name" if confs.get("spark.sql.streaming.stateStore.encodingFormat") == "avro" else "position"
        kind = provider_class(provider_name)
        keys: list = []
        tws_rows: list = []
        values: list = []
        partition_ids: list[int] = []
        changes: list[tuple[int, str]] = []
        storage: tuple[pa.DataType, pa.DataType] | None = None
        for partition in partitions:
            store_id = StateStoreId(f"{root}/state", operator, partition, store_name)
            file_schema = _file_schema(fs, store_id.path)
            if file_schema is None:
                continue
            storage = (file_schema.field("key").type, file_schema.field("value").type)
            conf = StateStoreConf(storage=fs.spec(), provider_class=provider_name, value_evolution=evolution)
            files = StateFiles(store_id, pa.schema(list(storage[0])), pa.schema(list(storage[1])), conf)
            first_change = len(changes)
            rows = _store_rows(files, opts, changes, kind, provider_name, layout.logs_changes)
            own = changes[first_change:] if opts.read_change_feed else None   # (this store's, row by row)
            if join_side is not None:   # (join key, index) -> (row, matched): the key and the row
                storage = (pa.struct([pa.field(f"field{i}", f.type) for i, f in enumerate(list(storage[0])[:-1])]),
                           pa.struct(list(storage[1])[:-1]))
                rows = [(key[:-1], value[:-1]) for key, value in rows]
            if variable is not None:
                tws_rows += _variable_rows(variable, rows, own, len(value_type.fields) - 1, partition)
                continue
            if as_spark:
                rows = _as_sparks(as_spark[0], rows, own)
                storage = tuple(pa.struct(list(schema)) for schema in as_spark[0].spark_storage())
            for key, value in rows:
                keys.append(key)
                values.append(value)
                partition_ids.append(partition)
        if variable is not None:
            if opts.read_change_feed:
                value_type = StructType([StructField("batch_id", LongType()), StructField("change_type", StringType()),
                                         *value_type.fields])
            return spark_internals.dataframe_of_arrow(self._spark, _tws_table(tws_rows, value_type), value_type)
        fields = [StructField("key", key_type), StructField("value", value_type),
                  StructField("partition_id", IntegerType())]
        if opts.read_change_feed:
            fields = [StructField("batch_id", LongType()), StructField("change_type", StringType()), *fields]
        spark_schema = StructType(fields)
        if storage is None:
            return spark_internals.empty_batch(self._spark, spark_schema)
        columns = [_struct(keys, storage[0], key_type), _struct(values, storage[1], value_type),
                   pa.array(partition_ids, type=pa.int32())]
        if opts.read_change_feed:
            columns = [pa.array([c[0] for c in changes], type=pa.int64()),
                       pa.array([c[1] for c in changes], type=pa.string()), *columns]
        table = pa.Table.from_arrays(columns, names=spark_schema.fieldNames())
        if None in values:   # a delete's null value: PySpark's Arrow path refuses a null struct of required fields
            return self._spark.createDataFrame(table.to_pylist(), spark_schema)
        return spark_internals.dataframe_of_arrow(self._spark, table, spark_schema)

    def _check_store_name(self, fs, op_dir: str, partitions: list[int], store_name: str,
                          operator: int) -> None:
        """A store is a directory of the operator's partitions: the name cannot lead out of
        the checkpoint (``..``, ``/``) or to a store that does not exist."""
        if store_name == "default":
            return
        stores = set()
        for partition in partitions[:1]:
            stores = {n for n in fs.list(f"{op_dir}/{partition}") if not n[0].isdigit()}
        if "/" in store_name or "\\" in store_name or store_name not in stores:
            raise IllegalArgumentException(
                f"Invalid value '{store_name}' for option 'storeName': operator {operator} of this "
                f"checkpoint has no state store of that name (its stores: "
                f"{', '.join(['default', *sorted(stores)])}). The reader reads only the stores "
                "inside the checkpoint it is given.")

    def _state_variable(self, doc: dict, key_type: StructType, value_type: StructType, opts: StateSourceOptions):
        """For a transformWithState operator (Spark's options ``stateVarName``,
        ``flattenCollectionTypes``, ``readRegisteredTimers``, checked before by
        ``_check_state_variable_options``): a function turning a stored (key, value) into
        the reader's rows, the store to read, the key type, and the rows' schema (Spark's
        columns for each kind of state variable)."""
        from pyspark.sql.types import ArrayType, MapType

        from microbatch.operators.transform_with_state.variables import TIMERS_STORE
        variables = {v["name"]: v for v in doc.get("stateVariables", [])}
        types = {f.name: f.dataType for f in value_type.fields}
        flatten = opts.flatten
        key_field = StructField("key", key_type)
        partition = StructField("partition_id", IntegerType())
        if opts.read_change_feed and opts.read_timers:
            raise UnsupportedOperationError(
                "Option 'readChangeFeed' does not read the changes of a transformWithState's "
                "timers in microbatch (Spark's reader fails on them). Read the timers after each "
                "batch with option 'batchId'.")
        if opts.read_timers:
            schema = StructType([key_field, StructField("expiration_timestamp_ms", LongType()), partition])
            return (lambda key, value: [(key, ts) for ts in value[0] or []]), TIMERS_STORE, key_type, schema
        name = opts.state_var
        if opts.read_change_feed and variables[name].get("ttl") and not doc.get("ttlEvictionsLogged"):
            raise UnsupportedOperationError(
                f"Option 'readChangeFeed' cannot read the changes of state variable {name!r} in this "
                "checkpoint: the variable has a TTL, and its state was started by an earlier microbatch, "
                "whose tasks did not log the TTL evictions' changes. Read the state after each batch with "
                "option 'batchId', or start the query with a new checkpoint location to have them logged.")
        kind = variables[name]["kind"]
        stored = types[name]
        # with a TTL, Spark's reader shows each value as Spark keeps it: the value and when
        # it expires (expired values not yet evicted included)
        ttl = bool(variables[name].get("ttl"))

        def shown(value_type):
            if not ttl:
                return value_type
            return StructType([StructField("value", value_type), StructField("ttlExpirationMs", LongType())])

        def element_of(fields: tuple, width: int) -> tuple:
            return (fields[:width], fields[width]) if ttl else fields[:width]
        if kind == "value":
            width = len(stored.fields)
            schema = StructType([key_field, StructField("value", shown(stored)), partition])
            return (lambda key, value: [(key, element_of(tuple(value), width))]), name, key_type, schema
        element = stored.elementType
        if opts.read_change_feed and not flatten:
            if kind == "map":   # (Spark 4.3's reader fails so: it looks for the column it did not make)
                raise _source_error(
                    "internalError", "No such field named as 'map_value' during state source reader schema "
                    "initialization. Internal exception message: field map_value not found from given schema")
            flatten = True   # (Spark's change feed of a list is flat whatever the option)
        if kind == "list":
            width = len(element.fields)
            if flatten:
                schema = StructType([key_field, StructField("list_element", shown(element)), partition])
                return (lambda key, value: [(key, element_of(_fields(e), width)) for e in value[0] or []]), \
                    name, key_type, schema
            schema = StructType([key_field, StructField("list_value", ArrayType(shown(element))), partition])
            return (lambda key, value: [(key, [element_of(_fields(e), width) for e in value[0] or []])]), \
                name, key_type, schema
        user_key, user_value = element["key"].dataType, element["value"].dataType

        def entry(e) -> tuple:
            parts = _fields(e)
            value = None if parts[1] is None else (_fields(parts[1]), parts[2]) if ttl else _fields(parts[1])
            return _fields(parts[0]), value
        if flatten:
            schema = StructType([key_field, StructField("user_map_key", user_key),
                                 StructField("user_map_value", shown(user_value)), partition])
            return (lambda key, value: [(key, *entry(e)) for e in value[0] or []]), name, key_type, schema
        schema = StructType([key_field, StructField("map_value", MapType(user_key, shown(user_value))), partition])
        return (lambda key, value: [(key, [entry(e) for e in value[0] or []])]), name, key_type, schema


#: Spark's ``state-metadata`` columns (``StateMetadataTableEntry.schema``)
STATE_METADATA_SCHEMA = StructType([
    StructField("operatorId", LongType()), StructField("operatorName", StringType()),
    StructField("stateStoreName", StringType()), StructField("numPartitions", IntegerType()),
    StructField("minBatchId", LongType()), StructField("maxBatchId", LongType()),
    StructField("operatorProperties", StringType())])


class StateMetadataReader(StateStoreReader):
    """``ss.read.format("state-metadata")``: a row per stateful operator and store, with
    Spark's columns: the operator's id and name (Spark's), the store's name (a join's four,
    ``default`` otherwise), its partitions, the first and last committed batch, and a
    transformWithState's properties (its modes and state variables, as Spark records them;
    null for other operators). microbatch's checkpoints keep their own schema file per
    operator, not Spark's operator metadata; a checkpoint whose every operator has Spark's
    (Spark's engine wrote it, or it was converted for it) is read by Spark's own reader.
    Spark's hidden column ``_numColsPrefixKey`` is not there. Option ``batchId`` chooses
    Spark's metadata of a transformWithState that changed; microbatch's file is the newest."""

    def load(self, path: str | None = None) -> DataFrame:
        from microbatch.ops.spark_conversion import tws_operator_properties
        from microbatch.operators.transform_with_state.schema import variables_from_document
        path = path or self._options.get("path")
        if path is None:
            raise _source_error("requiredOptionUnspecified", "path")
        fs = storage_for(path, spark_internals.session_settings(self._spark))
        root = fs.resolve(path)
        state = f"{root}/state"
        operators = sorted(int(n) for n in fs.list(state) if n.isdigit()) if fs.exists(state) else []
        docs = {op: f"{state}/{op}/_metadata/schema" for op in operators}
        if operators and all(not fs.exists(docs[op]) and (fs.exists(f"{state}/{op}/_metadata/metadata")
                                                          or fs.exists(f"{state}/{op}/_metadata/v2"))
                             for op in operators):
            reader = spark_internals.sparks_own_reader(self._spark).format("state-metadata")
            for key, value in self._options.items():
                reader = reader.option(key, value)
            return reader.load(path)
        committed = sorted(int(n) for n in fs.list(f"{root}/commits") if n.isdigit()) \
            if fs.exists(f"{root}/commits") else []
        first, last = (committed[0], committed[-1]) if committed else (-1, -1)
        latest = OffsetSeqLog(f"{root}/offsets", fs).get_latest()
        recorded = latest[1].metadata.conf if latest and latest[1].metadata else {}
        rows = []
        for op in operators:
            if not fs.exists(docs[op]):
                continue
            doc = json.loads(fs.read_text(docs[op]))
            name = doc.get("operatorName")
            partitions = sorted(int(n) for n in fs.list(f"{state}/{op}") if n.isdigit())
            shuffle = recorded.get("spark.sql.shuffle.partitions")
            count = int(shuffle) if shuffle else max(partitions, default=-1) + 1
            if state_layout(name).in_column_families:
                variables = variables_from_document(doc) or ()
                properties = json.dumps(tws_operator_properties(
                    variables, str(doc.get("timeMode", "none")).lower(), str(doc.get("outputMode", "append")).lower()),
                    separators=(",", ":"))
                rows.append((op, name, "default", count, first, last, properties))
                continue
            stores = spark_stores(name, StructType.fromJson(doc["keySchema"]),
                                  StructType.fromJson(doc["valueSchema"]), doc)
            for store in stores or []:
                rows.append((op, name, store.name, count, first, last, None))
            if stores is None:
                rows.append((op, name, "default", count, first, last, None))
        return self._spark.createDataFrame(rows, STATE_METADATA_SCHEMA)


def _check_state_variable_options(opts: StateSourceOptions, doc: dict, transform_with_state: bool) -> None:
    """Spark's checks of ``stateVarName`` and ``readRegisteredTimers`` against the
    operator (``StateDataSource.runStateVarChecks``)."""
    if opts.state_var is None and not opts.read_timers:
        if transform_with_state:
            raise _source_error("requiredOptionUnspecified", "stateVarName")
        return
    if not transform_with_state:
        raise _source_error(
            "invalidOptionValue", "stateVarName",
            "Providing state variable names is only supported with the transformWithState operator. "
            f"Found operator={doc.get('operatorName')}. Please remove this option and re-run the query.")
    variables = {v["name"] for v in doc.get("stateVariables", [])}
    if not variables:
        raise _source_error("invalidOptionValue", "stateVarName",
                            "No state variable names are defined for the transformWithState operator")
    if opts.read_timers:
        if str(doc.get("timeMode", "none")).lower() == "none":
            raise _source_error("invalidOptionValue", "readRegisteredTimers",
                                "Registered timers are not available in TimeMode=None.")
        return
    if opts.state_var not in variables:
        raise _source_error("invalidOptionValue", "stateVarName",
                            f"State variable {opts.state_var} is not defined for the transformWithState operator.")


def _shown_types(doc: dict, layout: Any, join_side: str | None, key_type: StructType,
                 value_type: StructType) -> tuple[list | None, StructType, StructType]:
    """The stores whose rows the reader turns into Spark's (a session window's sessions are
    one row per key here and one per session in Spark's store: ``StateLayout.read_as_spark``),
    and the key and value types shown: Spark's, every field nullable as in Spark's reader."""
    as_spark = spark_stores(doc["operatorName"], key_type, value_type, doc) \
        if layout.read_as_spark and join_side is None else None
    if join_side is not None or layout.in_column_families:
        return as_spark, key_type, value_type
    if as_spark:
        key_type, value_type = as_spark[0].spark_key, as_spark[0].spark_value
    else:
        key_type, value_type = _spark_columns(doc, key_type, value_type)
    return as_spark, _nullable(key_type), _nullable(value_type)


def _spark_columns(doc: dict, key_type: StructType, value_type: StructType) -> tuple[StructType, StructType]:
    """The key and value types Spark's store of the operator has, where its one store keeps
    the same rows as microbatch's (an aggregation's buffers as Spark names them: ``count``,
    ``sum``, not microbatch's own names); else microbatch's."""
    stores = spark_stores(doc["operatorName"], key_type, value_type, doc)
    if not stores or len(stores) != 1 or stores[0].to_spark is not same_rows:
        return key_type, value_type
    store = stores[0]
    if len(store.spark_key.fields) != len(key_type.fields) or len(store.spark_value.fields) != len(value_type.fields):
        return key_type, value_type
    if any(len(set(t.fieldNames())) < len(t.fields) for t in (store.spark_key, store.spark_value)):
        return key_type, value_type   # (Spark's buffers of sum and avg are both "sum": no Arrow struct has that)
    return store.spark_key, store.spark_value


def _nullable(data_type: StructType) -> StructType:
    """``data_type`` with every field, element and map value nullable."""
    return StructType.fromJson(all_nullable(data_type.jsonValue()))


def _recorded_confs(fs: CheckpointFileSystem, root: str, opts: StateSourceOptions) -> dict[str, str]:
    """The confs the offset log recorded for the batch read. The batch must be committed
    and in the offset log (Spark 4.3's errors otherwise)."""
    latest = CommitLog(f"{root}/commits", fs).get_latest()
    if latest is None or opts.batch_id > latest[0]:
        raise _source_error("committedBatchUnavailable", opts.location)
    offsets = OffsetSeqLog(f"{root}/offsets", fs).get(opts.batch_id)
    if offsets is None:
        raise _source_error("offsetLogUnavailable", opts.batch_id, opts.location)
    return offsets.metadata.conf


def _check_layout(opts: StateSourceOptions, layout: Any, doc: dict) -> None:
    """The options that read only some operators' state, against the operator's."""
    if opts.join_side is not None and opts.join_side not in layout.sides:
        raise IllegalArgumentException(
            f"Option 'joinSide' reads a stream-stream join's state, but operator {opts.operator} "
            f"is {doc.get('operatorName')}. Give the join's operatorId, or drop the option.")
    if opts.read_change_feed and layout.logs_changes and not doc.get("changesLogged"):
        raise UnsupportedOperationError(
            f"Option 'readChangeFeed' cannot read the changes of operator {opts.operator} "
            f"({doc.get('operatorName')}) in this checkpoint: its state was started by an earlier microbatch, "
            "whose tasks did not log the changes Spark's store would have made (microbatch's rows are not "
            "Spark's: a session window's sessions per key, a transformWithState's lists and maps). Read the "
            "state after each batch with option 'batchId', or start the query with a new checkpoint "
            "location to have its changes logged.")
    if opts.read_change_feed and (layout.read_as_spark or layout.in_column_families) and not layout.logs_changes:
        raise UnsupportedOperationError(
            f"Option 'readChangeFeed' of the state data source does not read the state of operator "
            f"{opts.operator} ({doc.get('operatorName')}) in microbatch yet: microbatch keeps it in other rows "
            "than Spark's store, and its changes are not translated. Read the state after each batch with "
            "option 'batchId'.")


def _as_sparks(store: Any, rows: list[tuple], changes: list | None) -> list[tuple]:
    """A store's rows as Spark's store has them (``store``: the ``SparkStore``); for a change
    feed, its logged changes (``changes``: each row's batch and type), each one session, one
    row of Spark's, a delete's value null."""
    rows = list(store.to_spark(rows))
    if changes is None:
        return rows
    return [(key, None if t[1] == "delete" else value) for (key, value), t in zip(rows, changes)]


def _variable_rows(variable: Callable, rows: list[tuple], changes: list | None, width: int,
                   partition: int) -> list[tuple]:
    """A transformWithState store's rows as the reader's (``variable``: ``_state_variable``'s
    function), or, for a change feed, its logged changes (``changes``: each row's batch and
    type) each as one row after its batch and type."""
    if changes is None:
        return [row + (partition,) for key, value in rows for row in variable(key, value)]
    return [change + _changed(variable, key, value, width) + (partition,) for (key, value), change in zip(rows, changes)]


def _changed(variable: Callable, key: tuple, value: tuple | None, width: int) -> tuple:
    """A transformWithState's logged change as the reader's row (``width`` columns after
    the batch and type): a removed value or list has only its key; a removed map entry, its
    key and user key."""
    if value is None:
        return (key,) + (None,) * (width - 1)
    return variable(key, value)[0]


def _store_rows(files: StateFiles, opts: StateSourceOptions, changes: list, kind: type,
                provider_name: str, logged: bool) -> list[tuple]:
    """One store's (key, value) rows as the options ask: its changes (each one's batch and
    type appended to ``changes``; ``logged``: the ones its task logged, a delete's value
    still there to be turned into Spark's key), its state rebuilt from a snapshot, or its
    state after the batch through its provider."""
    if opts.read_change_feed and logged:
        rows = []
        for version in range(opts.change_start + 1, opts.change_end + 2):
            for change_type, key, value in files.read_changes(version):
                rows.append((key, value))
                changes.append((version - 1, change_type))
        return rows
    if opts.read_change_feed:
        rows = []
        for version in range(opts.change_start + 1, opts.change_end + 2):
            for key, value in files.read_delta(version, version, files.newest_snapshot(version)):
                removed = value is REMOVED
                rows.append((key, None if removed else value))
                changes.append((version - 1, "delete" if removed else "update"))
        return rows
    if opts.snapshot_start is not None:
        return _replayed(files, opts.snapshot_start + 1, opts.batch_id + 1, provider_name)
    opened = kind(files.id, files.key_schema, files.value_schema, files.conf)
    try:
        return list(opened.get_store(opts.batch_id + 1).iterator())
    except CheckpointError as e:
        raise CheckpointError(
            f"The state of operator {opts.operator} after batch {opts.batch_id} is not available: {e} "
            "(state older than spark.sql.streaming.minBatchesToRetain batches is removed).") from e
    finally:
        opened.close()


def _replayed(files: StateFiles, snapshot: int, version: int, provider_name: str) -> list[tuple]:
    """A store's rows at ``version`` rebuilt from its snapshot at ``snapshot`` and the
    deltas after it (Spark's ``replayReadStateFromSnapshot``); Spark's error when that
    snapshot is not there."""
    if not files.exists(snapshot, "snapshot"):
        raise spark_internals.state_reader_error(
            "store", "stateStoreSnapshotFileNotFound", _qualified(files.path(snapshot, "snapshot")),
            f"{provider_name}[id = {files.id}]")
    state = dict(files.read_rows(snapshot, "snapshot"))
    for delta in range(snapshot + 1, version + 1):
        for key, value in files.read_delta(delta, version, snapshot):
            if value is REMOVED:
                state.pop(key, None)
            else:
                state[key] = value
    return list(state.items())


def _qualified(path: str) -> str:
    """A local path as Spark names it in its errors: a URI."""
    return path if "://" in path or path.startswith("file:") else f"file:{path}"


def _fields(value) -> tuple:
    return tuple(value.values()) if isinstance(value, dict) else tuple(value)


def _tws_table(rows: list[tuple], schema: StructType) -> pa.Table:
    """The reader's rows (stored values: timestamps as µs) as an Arrow table of ``schema``."""
    from microbatch.state.files import storage_type
    columns = []
    for i, field in enumerate(schema.fields):
        target = spark_internals.arrow_type(field.dataType)
        storage = storage_type(target)
        array = pa.array([r[i] for r in rows], type=storage)
        columns.append(array if storage == target else array.cast(target))
    return pa.Table.from_arrays(columns, names=schema.fieldNames())


def _file_schema(fs: CheckpointFileSystem, directory: str) -> pa.Schema | None:
    """The Arrow schema of a state directory's newest file (the files share it, but for a
    transformWithState whose schema evolved: older files are read in the newest schema)."""
    names = sorted((n for n in fs.list(directory) if n.endswith(".arrow")),
                   key=lambda n: (int(n.split(".")[0]) if n.split(".")[0].isdigit() else -1, n))
    if not names:
        return None
    return ipc.open_stream(pa.py_buffer(fs.read_bytes(f"{directory}/{names[-1]}"))).schema


def _struct(rows: list[tuple | None], storage: pa.StructType, spark_type: StructType) -> pa.Array:
    """Rows as a struct array (a row None: a null struct, a deleted key's value), its
    fields named as ``spark_type``'s."""
    if len(storage) == len(spark_type.fields):
        storage = pa.struct([pa.field(name, f.type, f.nullable) for f, name in zip(storage, spark_type.fieldNames())])
    columns = [pa.array([None if r is None else r[i] for r in rows], type=f.type) for i, f in enumerate(storage)]
    mask = pa.array([r is None for r in rows], type=pa.bool_()) if None in rows else None
    array = pa.StructArray.from_arrays(columns, fields=list(storage), mask=mask) if columns else \
        pa.array([None if r is None else {} for r in rows], type=pa.struct([]))
    target = spark_internals.arrow_type(spark_type)
    if array.type == target:
        return array
    if mask is None or not columns:
        return array.cast(target)
    # (a null struct's fields are null: cast them one by one, as a non-nullable field refuses nulls)
    return pa.StructArray.from_arrays([column.cast(f.type) for column, f in zip(columns, target)],
                                      fields=list(target), mask=mask)

