"""The step of a transformWithState in a batch: rows hash-partitioned by the grouping
keys, then the task that runs the user's StatefulProcessor per key and per expired timer;
in the query's first batch, the rows of the initial state beside the batch's."""
from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StructField, StructType

from microbatch import spark_internals
from microbatch.operators.base import OperatorBatch, StatefulStep, quoted
from microbatch.operators.pandas_groups import keyed_state_shape
from microbatch.operators.transform_with_state.schema import (ENCODING_FORMAT_CONF, check_nullable_state,
                                                              state_schema_history, state_store_schemas,
                                                              state_value_type)
from microbatch.operators.transform_with_state.task import TransformWithStateTask
from microbatch.operators.transform_with_state.variables import TIMERS_STORE


def with_initial_state(node: Any, df: DataFrame, partitions: int) -> DataFrame:
    """The batch's rows (``__side`` 0) and the initial state's (1) in one DataFrame, hash
    partitioned by the grouping key as every batch is (``__k<i>``, of the batch's key
    types, so a key meets its initial state in its own state partition): the batch's
    columns as ``__in<j>``, the initial state's as ``__st<j>``."""
    # (the user's DataFrame in the batch's session: over Spark Connect a plan joins only
    # DataFrames of one session, and the batch session is a clone of the user's)
    initial = spark_internals.in_session(node.initial_state, df.sparkSession)
    by_name = {f.name.lower(): f for f in df.schema.fields}
    key_types = [by_name[k.lower()].dataType for k in node.keys]
    inputs, states = df.schema.fields, initial.schema.fields

    def side(frame: DataFrame, number: int, keys, own: str) -> DataFrame:
        columns = [F.lit(number).alias("__side")]
        columns += [F.col(quoted(k)).cast(t).alias(f"__k{i}") for i, (k, t) in enumerate(zip(keys, key_types))]
        for prefix, fields in (("__in", inputs), ("__st", states)):
            columns += [(F.col(quoted(f.name)) if prefix == own else F.lit(None).cast(f.dataType)).alias(f"{prefix}{j}")
                        for j, f in enumerate(fields)]
        return frame.select(*columns)

    both = side(df, 0, node.keys, "__in").union(side(initial, 1, node.initial_keys, "__st"))
    return both.repartition(partitions, *[F.col(f"__k{i}") for i in range(len(node.keys))])


#: Spark's conf: the version of a transformWithState's state schema files (3, the only one)
SCHEMA_VERSION_CONF = "spark.sql.streaming.transformWithState.stateSchemaVersion"


class TransformWithStateStep(StatefulStep):
    """``transformWithStateInPandas`` / ``transformWithState`` (Spark's
    TransformWithStateInPySparkExec)."""

    @property
    def name(self) -> str:
        return "transformWithStateInPySparkExec" if self.node.rows_api else "transformWithStateInPandasExec"

    def check_state_conf(self, conf: Any) -> None:
        """Spark's refusal of state variables with nullable fields in its Avro encoding; a
        state schema version other than 3, which Spark 4.3's planning fails on with an
        INTERNAL_ERROR, refused by name."""
        check_nullable_state(self.node.variables, conf.get(ENCODING_FORMAT_CONF, "unsaferow").lower())
        version = str(conf.get(SCHEMA_VERSION_CONF, "3")).strip()
        if version != "3":
            from microbatch.errors import UnsupportedOperationError
            raise UnsupportedOperationError(
                f"{SCHEMA_VERSION_CONF}={version}: transformWithState writes its state schema "
                "in version 3 only (Spark 4.3's engine fails to plan the query with any other, "
                "with an INTERNAL_ERROR). Unset the conf or set it to 3.")

    def stored_schema_check(self, stored: dict, key: StructType, value: StructType,
                            conf: Any) -> tuple[str | None, str | None]:
        """A processor's state variables may evolve by Spark's rules (``state_schema_history``)."""
        if stored.get("operatorName") != self.name:
            return super().stored_schema_check(stored, key, value, conf)
        encoding = conf.get(ENCODING_FORMAT_CONF, "unsaferow").lower()
        history = state_schema_history(stored, self.node.variables, key, value, encoding)
        return None, None if history is None else self.schema_document(key, value, history)

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        node, df = self.node, inputs[0]
        shape = self.cached("shape", lambda: keyed_state_shape(node, df))
        event_time = shape["event_time"]
        first_with_initial = node.initial_state is not None and batch.batch_id == 0
        evolution = "name" if shape["encoding"] == "avro" else "position"
        task = TransformWithStateTask(
            self.state_root, self.operator_id, batch.batch_id,
            dataclasses.replace(batch.store_conf, value_evolution=evolution, snapshot_first_version=True), batch.metrics,
            processor=node.processor, variables=node.variables, rows_api=node.rows_api,
            time_mode=node.time_mode, key_indexes=shape["key_indexes"], key_types=shape["key_types"],
            key_schema=shape["key_schema"], store_schemas=state_store_schemas(node.variables),
            input_names=tuple(shape["input_names"]),
            initial_names=tuple(node.initial_state.columns) if first_with_initial else (),
            pandas=shape["pandas"], batch_timestamp_ms=batch.batch_timestamp_ms,
            watermark_ms=batch.eviction_ms if shape["has_watermark"] else -1,
            late_us=batch.late_ms * 1000 if node.time_mode == "eventtime" and event_time is not None else None,
            event_time_index=event_time,
            output_event_time_index=shape["output_event_time"],
            output_late_us=batch.late_ms * 1000 if shape["output_event_time"] is not None and shape["has_watermark"]
            else None)
        if first_with_initial:   # the query's first batch also reads the initial state
            return spark_internals.map_state_task(with_initial_state(node, df, self.num_partitions), task,
                                                  shape["output"])
        return self.bind([df], task, self.map_by_keys(shape["partition"], shape["output"]))

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        by_lower = {f.name.lower(): f for f in input_schemas[0].fields}
        key = StructType([by_lower[k.lower()] for k in self.node.keys])
        return key, StructType([StructField(v.name, state_value_type(v)) for v in self.node.variables]
                               + [StructField(TIMERS_STORE, ArrayType(LongType(), False))])

    def _document_extras(self) -> dict:
        # what the state reader's stateVarName reads; the modes and TTLs what Spark's operator
        # metadata records (a conversion to Spark's engine writes it)
        return {"stateVariables": [{"name": v.name, "kind": v.kind, "ttl": v.ttl_ms is not None,
                                    **({"ttlMs": int(v.ttl_ms)} if v.ttl_ms is not None else {})}
                                   for v in self.node.variables],
                "timeMode": self.node.time_mode, "outputMode": self.node.output_mode,
                # (its tasks write the change feed's files, and since the next version the
                # TTL evictions' changes in them)
                "changesLogged": True, "ttlEvictionsLogged": True}
