"""Reading a query's state as a DataFrame: ``ss.read.format("statestore")``.

Like Spark's state data source, with its option names: ``batchId`` (default: the
latest committed batch; the state *after* that batch), ``operatorId`` (default 0),
``storeName`` (default ``default``) and, for a stream-stream join, ``joinSide``
(``left`` or ``right``: that side's rows, keyed by the join key as ``field0..``). The result has Spark's columns ``key``
and ``value`` (structs of the operator's key and value schema) and
``partition_id``. An aggregation's value holds its merge buffers (e.g. the sum
and count of an ``avg``). The state is read on the driver: this is an inspection
tool, not a path for big data.
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, StructField, StructType

from microbatch import spark_internals
from microbatch.checkpoint.commits import CommitLog
from microbatch.checkpoint.fs import CheckpointFileSystem, storage_for
from microbatch.errors import AnalysisException, CheckpointError, IllegalArgumentException
from microbatch.checkpoint.offsets import OffsetSeqLog
from microbatch.operators.base import state_layout
from microbatch.operators.spark_stores import spark_stores
from microbatch.state.store import (DEFAULT_PROVIDER, PROVIDER_CLASS_CONF, StateStoreConf, StateStoreId,
                                    provider_class)
from microbatch.util import option_value

class SessionReader:
    """``ss.read``: Spark's DataFrameReader, plus the ``statestore`` format."""

    def __init__(self, spark: SparkSession):
        self._spark = spark

    def format(self, source: str) -> Any:
        if source.lower() == "statestore":
            spark_internals.require("the state data source (format 'statestore')")
            return StateStoreReader(self._spark)
        return self._spark.read.format(source)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark.read, name)


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

    def _int_option(self, name: str, default: int | None) -> int | None:
        text = self._options.get(name.lower())
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise IllegalArgumentException(
                f"Invalid value '{text}' for option '{name}': it must be an integer >= 0.")
        return value

    def load(self, path: str | None = None) -> DataFrame:
        path = path or self._options.get("path")
        if not path:
            raise IllegalArgumentException("'path' (the query's checkpoint location) is not specified.")
        settings = spark_internals.session_settings(self._spark)
        fs = storage_for(path, settings)
        root = fs.resolve(path)
        operator = self._int_option("operatorId", 0)
        store_name = self._options.get("storename", "default")
        latest = CommitLog(f"{root}/commits", fs).get_latest()
        if latest is None:
            raise AnalysisException(f"The checkpoint '{path}' has no committed batch, so no state to read.")
        batch_id = self._int_option("batchId", latest[0])
        if batch_id > latest[0]:
            raise IllegalArgumentException(
                f"batchId {batch_id} is not committed in checkpoint '{path}': the latest committed "
                f"batch is {latest[0]}.")
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
        join_side = self._options.get("joinside")
        if join_side is not None:   # one side of a stream-stream join: its rows per key
            join_side = join_side.lower()
            if join_side not in ("left", "right"):
                raise IllegalArgumentException(
                    f"Invalid value '{self._options['joinside']}' for option 'joinSide': it must be "
                    "'left' or 'right'.")
            if join_side not in layout.sides:
                raise IllegalArgumentException(
                    f"Option 'joinSide' reads a stream-stream join's state, but operator {operator} "
                    f"is {doc.get('operatorName')}. Give the join's operatorId, or drop the option.")
            store_name, key_type, value_type = layout.side_store(join_side, key_type, value_type)
        # a session window's sessions are one row per key here and one per session in Spark's
        # store: the reader shows Spark's rows (StateLayout.read_as_spark)
        as_spark = spark_stores(doc["operatorName"], key_type, value_type, doc) \
            if layout.read_as_spark and join_side is None else None
        if as_spark:
            key_type, value_type = as_spark[0].spark_key, as_spark[0].spark_value
        variable = None
        if layout.in_column_families:
            variable, store_name, key_type, value_type = self._state_variable(doc, key_type, value_type, operator)
        partitions = sorted(int(n) for n in fs.list(op_dir) if n.isdigit())
        if "storename" in self._options:   # a name the user gave, not one derived above
            self._check_store_name(fs, op_dir, partitions, self._options["storename"], operator)
        offsets = OffsetSeqLog(f"{root}/offsets", fs).get(batch_id)
        confs = offsets.metadata.conf if offsets else {}
        provider_name = confs.get(PROVIDER_CLASS_CONF, DEFAULT_PROVIDER)
        # a transformWithState's state may have evolved: older files read in the newest schema
        evolution = "" if variable is None else \
            "name" if confs.get("spark.sql.streaming.stateStore.encodingFormat") == "avro" else "position"
        kind = provider_class(provider_name)
        keys: list = []
        tws_rows: list = []
        values: list = []
        partition_ids: list[int] = []
        storage: tuple[pa.DataType, pa.DataType] | None = None
        for partition in partitions:
            store_id = StateStoreId(f"{root}/state", operator, partition, store_name)
            file_schema = _file_schema(fs, store_id.path)
            if file_schema is None:
                continue
            storage = (file_schema.field("key").type, file_schema.field("value").type)
            provider = kind(store_id, pa.schema(list(storage[0])), pa.schema(list(storage[1])),
                            StateStoreConf(storage=fs.spec(), provider_class=provider_name,
                                           value_evolution=evolution))
            try:
                rows = list(provider.get_store(batch_id + 1).iterator())
            except CheckpointError as e:
                raise CheckpointError(
                    f"The state of operator {operator} after batch {batch_id} is not available: {e} "
                    "(state older than spark.sql.streaming.minBatchesToRetain batches is removed).") from e
            finally:
                provider.close()
            if join_side is not None:   # (join key, index) -> (row, matched): the key and the row
                storage = (pa.struct([pa.field(f"field{i}", f.type) for i, f in enumerate(list(storage[0])[:-1])]),
                           pa.struct(list(storage[1])[:-1]))
                rows = [(key[:-1], value[:-1]) for key, value in rows]
            if variable is not None:
                tws_rows += [row + (partition,) for key, value in rows for row in variable(key, value)]
                continue
            if as_spark:
                rows = list(as_spark[0].to_spark(rows))
                storage = tuple(pa.struct(list(schema)) for schema in as_spark[0].spark_storage())
            for key, value in rows:
                keys.append(key)
                values.append(value)
                partition_ids.append(partition)
        if variable is not None:
            return spark_internals.dataframe_of_arrow(self._spark, _tws_table(tws_rows, value_type), value_type)
        spark_schema = StructType([StructField("key", key_type), StructField("value", value_type),
                                   StructField("partition_id", IntegerType())])
        if storage is None:
            return spark_internals.empty_batch(self._spark, spark_schema)
        columns = [_struct(keys, storage[0], key_type), _struct(values, storage[1], value_type),
                   pa.array(partition_ids, type=pa.int32())]
        table = pa.Table.from_arrays(columns, names=["key", "value", "partition_id"])
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

    def _state_variable(self, doc: dict, key_type: StructType, value_type: StructType, operator: int):
        """For a transformWithState operator (Spark's options ``stateVarName``,
        ``flattenCollectionTypes``, ``readRegisteredTimers``): a function turning a stored
        (key, value) into the reader's rows, the store to read, the key type, and the
        rows' schema (Spark's columns for each kind of state variable)."""
        from pyspark.sql.types import ArrayType, LongType, MapType

        from microbatch.operators.transform_with_state.variables import TIMERS_STORE
        variables = {v["name"]: v for v in doc.get("stateVariables", [])}
        types = {f.name: f.dataType for f in value_type.fields}
        flatten = self._options.get("flattencollectiontypes", "true").lower() == "true"
        key_field = StructField("key", key_type)
        partition = StructField("partition_id", IntegerType())
        if self._options.get("readregisteredtimers", "false").lower() == "true":
            schema = StructType([key_field, StructField("expiration_timestamp_ms", LongType()), partition])
            return (lambda key, value: [(key, ts) for ts in value[0] or []]), TIMERS_STORE, key_type, schema
        name = self._options.get("statevarname")
        if name is None or name not in variables:
            given = "no 'stateVarName'" if name is None else f"stateVarName '{name}'"
            raise IllegalArgumentException(
                f"Operator {operator} is {doc['operatorName']}: read one of its state variables with "
                f"option 'stateVarName' ({', '.join(sorted(variables))}), or its timers with "
                f"'readRegisteredTimers', not {given}.")
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
            value = (_fields(parts[1]), parts[2]) if ttl else _fields(parts[1])
            return _fields(parts[0]), value
        if flatten:
            schema = StructType([key_field, StructField("user_map_key", user_key),
                                 StructField("user_map_value", shown(user_value)), partition])
            return (lambda key, value: [(key, *entry(e)) for e in value[0] or []]), name, key_type, schema
        schema = StructType([key_field, StructField("map_value", MapType(user_key, shown(user_value))), partition])
        return (lambda key, value: [(key, [entry(e) for e in value[0] or []])]), name, key_type, schema


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


def _struct(rows: list[tuple], storage: pa.StructType, spark_type: StructType) -> pa.Array:
    columns = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(storage)]
    array = pa.StructArray.from_arrays(columns, fields=list(storage)) if columns else \
        pa.array([{}] * len(rows), type=pa.struct([]))
    target = spark_internals.arrow_type(spark_type)
    return array if array.type == target else array.cast(target)

