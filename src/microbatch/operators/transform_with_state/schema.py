"""A transformWithState's state schemas: each variable's store, the operator's schema
file, and Spark's rules for a schema that changed across a restart (evolution with Avro
encoding, Spark's errors otherwise)."""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from microbatch import spark_internals
from microbatch.operators.transform_with_state.variables import EXPIRATION, LIST, MAP, TIMERS_STORE, VALUE, StateVariable

#: Spark's conf of how state rows are encoded; "avro" lets transformWithState's schemas evolve.
ENCODING_FORMAT_CONF = "spark.sql.streaming.stateStore.encodingFormat"

#: A Spark type as Avro writes it (Spark's SchemaConverters), for Avro's rules of which
#: written type a reader of another type can read.
_AVRO_KINDS = {"ByteType": "int", "ShortType": "int", "IntegerType": "int", "DateType": "int",
               "LongType": "long", "TimestampType": "long", "TimestampNTZType": "long",
               "FloatType": "float", "DoubleType": "double", "StringType": "string",
               "BinaryType": "bytes", "BooleanType": "boolean"}
#: Avro's promotions: (written, read)
_AVRO_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
                    ("long", "double"), ("float", "double"), ("string", "bytes"), ("bytes", "string")}


def avro_readable(written: Any, reading: Any) -> bool:
    """Whether state written as ``written`` can be read as ``reading`` by Avro's schema
    resolution, as Spark checks a transformWithState's evolved state (every field is
    nullable with a null default there, so a field may be added or dropped; fields match
    by name)."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    if written == reading:
        return True
    if isinstance(written, StructType) and isinstance(reading, StructType):
        old = {f.name: f.dataType for f in written.fields}
        return all(avro_readable(old[f.name], f.dataType) for f in reading.fields if f.name in old)
    if isinstance(written, ArrayType) and isinstance(reading, ArrayType):
        return avro_readable(written.elementType, reading.elementType)
    if isinstance(written, MapType) and isinstance(reading, MapType):
        return avro_readable(written.keyType, reading.keyType) and avro_readable(written.valueType, reading.valueType)
    kinds = (_AVRO_KINDS.get(type(written).__name__), _AVRO_KINDS.get(type(reading).__name__))
    return None not in kinds and (kinds[0] == kinds[1] or kinds in _AVRO_PROMOTIONS)


def _same_by_position(a: Any, b: Any) -> bool:
    """Spark's unsafe-row rule: the same number of fields of the same types, names aside."""
    return len(a.fields) == len(b.fields) and all(
        x.dataType == y.dataType for x, y in zip(a.fields, b.fields))


def check_nullable_state(variables: tuple, encoding: str) -> None:
    """With Avro encoding, Spark needs every field of a state variable's schema nullable
    (TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE), checked when the query is planned."""
    from microbatch import spark_internals
    if encoding != "avro":
        return
    for v in variables:
        if any(not f.nullable for f in v.schema.fields):
            raise spark_internals.spark_error(
                "SparkUnsupportedOperationException", "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE",
                columnFamilyName=v.name, schema=spark_internals.schema_string(v.schema))


def state_schema_history(doc: dict, variables: tuple, key: Any, value: Any, encoding: str) -> list | None:
    """Spark's checks of a transformWithState's state schemas at a restart
    (StateSchemaCompatibilityChecker), against the operator's stored schema document:
    the grouping key (and a map's user key) of the same types; no state variable of
    another kind; each variable's value schema the same, or, with Avro encoding, one Avro
    can read every earlier version of as (fields added, dropped, reordered, widened).
    Raises Spark's error; returns the history of value schemas to record when the value
    schema changed (None when it did not)."""
    from pyspark.sql.types import StructType

    from microbatch import spark_internals
    stored_key = StructType.fromJson(doc["keySchema"])
    if not _same_by_position(stored_key, key):
        raise spark_internals.spark_error(
            "SparkUnsupportedOperationException", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
            storedKeySchema=spark_internals.schema_string(stored_key), newKeySchema=spark_internals.schema_string(key))
    history = [StructType.fromJson(d) for d in doc.get("valueSchemaHistory", [])]
    stored_value = StructType.fromJson(doc["valueSchema"])
    if stored_value == value:
        return None
    kinds = {v["name"]: v["kind"] for v in doc.get("stateVariables", [])}
    versions = history + [stored_value]
    for v in variables:
        if v.name not in kinds:
            continue   # a new state variable: a new store
        if kinds[v.name] != v.kind:
            raise spark_internals.spark_error(
                "SparkUnsupportedOperationException", "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE", stateVarName=v.name,
                newType=f"{v.kind.capitalize()}State", oldType=f"{kinds[v.name].capitalize()}State")
        written = [_variable_schemas(version, v) for version in versions]
        written = [w for w in written if w is not None]
        if v.kind == MAP and written and not _same_by_position(written[-1][1], v.key_schema):
            raise spark_internals.spark_error(
                "SparkUnsupportedOperationException", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
                storedKeySchema=spark_internals.schema_string(written[-1][1]),
                newKeySchema=spark_internals.schema_string(v.key_schema))
        for schema, _ in reversed(written):   # the newest first, as Spark checks them
            if schema == v.schema:
                continue
            if encoding == "avro":
                if not avro_readable(schema, v.schema):
                    raise spark_internals.spark_error(
                        "SparkUnsupportedOperationException", "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
                        oldValueSchema=spark_internals.schema_string(schema),
                        newValueSchema=spark_internals.schema_string(v.schema))
            elif not _same_by_position(schema, v.schema):
                raise spark_internals.spark_error(
                    "SparkUnsupportedOperationException", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
                    storedValueSchema=spark_internals.schema_string(schema),
                    newValueSchema=spark_internals.schema_string(v.schema))
    return [d.jsonValue() for d in versions]


def _variable_schemas(value: Any, variable: StateVariable) -> tuple | None:
    """A state variable's (value schema, map user key schema) in an operator's value schema
    as ``state_value_type`` records it, or None when the variable is not in it."""
    field = next((f for f in value.fields if f.name == variable.name), None)
    if field is None:
        return None
    stored = field.dataType
    if variable.kind == VALUE:
        return stored, None
    element = getattr(stored, "elementType", None)
    if variable.kind == LIST:
        return element, None
    names = getattr(element, "names", [])
    if names != ["key", "value"]:
        return None
    return element["value"].dataType, element["key"].dataType


def _arrow_field(field: Any) -> pa.Field:
    from microbatch.state.files import storage_type
    return pa.field(field.name, storage_type(spark_internals.arrow_type(field.dataType)))


def _arrow_struct(schema: Any) -> pa.DataType:
    return pa.struct([_arrow_field(f) for f in schema.fields])


def state_store_schemas(variables: tuple) -> dict[str, pa.Schema]:
    """Each state variable's store value schema, and the timers'."""
    schemas = {}
    for v in variables:
        expiry = [pa.field(EXPIRATION, pa.int64())] if v.ttl_ms is not None else []
        if v.kind == VALUE:
            schemas[v.name] = pa.schema([_arrow_field(f) for f in v.schema.fields] + expiry)
        elif v.kind == LIST:
            element = pa.struct(list(_arrow_struct(v.schema)) + expiry)
            schemas[v.name] = pa.schema([pa.field("values", pa.list_(element))])
        else:
            entry = pa.struct([pa.field("key", _arrow_struct(v.key_schema)),
                               pa.field("value", _arrow_struct(v.schema))] + expiry)
            schemas[v.name] = pa.schema([pa.field("entries", pa.list_(entry))])
    schemas[TIMERS_STORE] = pa.schema([pa.field("timestamps", pa.list_(pa.int64()))])
    return schemas


def state_value_type(variable: StateVariable) -> Any:
    """A state variable's type in the state schema file (Spark types)."""
    from pyspark.sql.types import ArrayType, StructField, StructType
    if variable.kind == VALUE:
        return variable.schema
    if variable.kind == LIST:
        return ArrayType(variable.schema)
    return ArrayType(StructType([StructField("key", variable.key_schema), StructField("value", variable.schema)]))


def variables_from_document(doc: dict) -> tuple[StateVariable, ...] | None:
    """A transformWithState's state variables as its schema document records them (their
    kinds, TTLs and, in the value schema, their schemas), or None for a document from
    before the TTLs' durations were recorded."""
    from pyspark.sql.types import StructType
    value = StructType.fromJson(doc["valueSchema"])
    found = []
    for entry in doc.get("stateVariables", []):
        if entry.get("ttl") and "ttlMs" not in entry:
            return None
        probe = StateVariable(entry["name"], entry["kind"], None)
        schemas = _variable_schemas(value, probe)
        if schemas is None:
            return None
        found.append(StateVariable(entry["name"], entry["kind"], schemas[0], schemas[1], entry.get("ttlMs")))
    return tuple(found)
