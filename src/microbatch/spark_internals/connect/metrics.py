"""Observations and the operators' task metrics over Spark Connect.

Connect fills an ``Observation`` from the response of the action that ran it (no
listener, no wait), and has no accumulators. So a state task's metrics travel in band:
the task's ``mapInArrow`` function yields, after its rows, one "metrics row" (its
metrics as JSON in an extra column, every data column null); an ``observe`` of
``collect_list`` over that column gathers the rows of the successful task attempts, a
filter drops them, and ``OperatorMetrics.value`` merges them on the client as the
classic accumulator would."""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import uuid
from typing import Any, Iterator

import pyarrow as pa

#: the column of a state task's metrics row
METRICS_COLUMN = "__microbatch_task_metrics"


class ObservedRow(dict):
    """The values an ``Observation`` received (Connect gives Python values, not a row)."""


def observation_row(observation: Any, wait_s: float) -> ObservedRow | None:
    """What ``observation`` received from the last action that ran it; None if none did."""
    try:
        values = observation.get
    except Exception:  # noqa: BLE001 - never observed (no action ran it)
        return None
    return ObservedRow(values) if values else None


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat(timespec="milliseconds")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if hasattr(value, "asDict"):
        return _json_value(value.asDict())
    return value


def row_json(row: ObservedRow) -> dict:
    """The observed values as Spark's ``Row.json`` would give them (parsed)."""
    return {k: _json_value(v) for k, v in row.items()}


def python_row(row: ObservedRow) -> Any:
    from pyspark.sql import Row
    return Row(**row)


def executed_observation_row(df: Any, name: str) -> None:
    """Connect runs no RDD actions: every observation is filled by its action."""
    return None


class ScanRowCounter:
    """Over Connect the input rows are counted by an Observation (no listener bus)."""

    def __init__(self, session: Any):
        pass

    def input_keys(self, df: Any) -> None:
        return None

    def start(self) -> None:
        pass

    def finish(self) -> list:
        return []

    def count(self, scanned: dict, executions: list, engine_scans: dict | None = None) -> dict:
        return {}

    def close(self) -> None:
        pass


class _TaskMetrics:
    """What a state task's ``metrics`` is inside the executor over Connect: it keeps
    what the task adds (as the accumulator's ``add``), for the metrics row."""

    def __init__(self, param: Any):
        self.param = param
        self.value: dict = {}

    def add(self, metrics: dict) -> None:
        self.param.addInPlace(self.value, metrics)


class OperatorMetrics:
    """An operator's metrics on the client over Connect, read as its accumulator is
    classically (``value``; ``value = {}`` forgets them): the merged metrics rows the
    batch's observation gathered from its tasks."""

    def __init__(self, param: Any):
        self.param = param
        self._observation: Any = None

    def observe(self, observation: Any) -> None:
        self._observation = observation

    @property
    def value(self) -> dict:
        total: dict = {}
        row = None if self._observation is None else observation_row(self._observation, 0)
        for text in (row or {}).get("metrics") or []:
            self.param.addInPlace(total, json.loads(text))
        return total

    @value.setter
    def value(self, value: dict) -> None:
        if value:
            raise ValueError("an operator's metrics are only reset (value = {})")
        self._observation = None


def operator_accumulator(spark: Any, param: Any) -> OperatorMetrics:
    return OperatorMetrics(param)


@dataclasses.dataclass(frozen=True)
class WithMetricsRow:
    """A state task's ``mapInArrow`` function over Connect: the task's batches with a
    null metrics column, then its metrics row."""

    task: Any                  # the task, its ``metrics`` None (set in the executor)
    param: Any                 # how metrics merge (the accumulator's param)
    schema: pa.Schema          # the task's output + the metrics column, every field nullable

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = _TaskMetrics(self.param)
        task = dataclasses.replace(self.task, metrics=collected)
        for batch in task(batches):
            if batch.num_rows:
                columns = list(batch.columns) + [pa.nulls(batch.num_rows, pa.string())]
                yield pa.RecordBatch.from_arrays(columns, schema=self.schema)
        columns = [pa.nulls(1, f.type) for f in self.schema][:-1]
        columns.append(pa.array([json.dumps(collected.value)], pa.string()))
        yield pa.RecordBatch.from_arrays(columns, schema=self.schema)


def map_state_task(df: Any, task: Any, output: Any) -> Any:
    """``df.mapInArrow(task, output)`` over Connect, with the task's metrics in band into
    its operator's ``OperatorMetrics`` (``task.metrics``), then dropped from the rows."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from microbatch.spark_internals.versions import arrow_type

    metrics = task.metrics
    if not isinstance(metrics, OperatorMetrics):
        raise TypeError(f"a state task over Spark Connect reports to an OperatorMetrics, not {metrics!r}")
    spark_schema = StructType([StructField(f.name, f.dataType, True, f.metadata) for f in output.fields]
                              + [StructField(METRICS_COLUMN, StringType(), True)])
    arrow = pa.schema([pa.field(f.name, arrow_type(f.dataType), True) for f in spark_schema.fields])
    function = WithMetricsRow(dataclasses.replace(task, metrics=None), metrics.param, arrow)
    observation = Observation(f"microbatch_task_metrics_{uuid.uuid4().hex}")
    metrics.observe(observation)
    mapped = df.mapInArrow(function, spark_schema)
    column = F.col(METRICS_COLUMN)
    return (mapped.observe(observation, F.collect_list(column).alias("metrics"))
            .filter(column.isNull()).drop(METRICS_COLUMN))


def run_to_end(df: Any) -> int:
    """Runs ``df`` to the end, dropping its rows (Spark's ``noop`` writer, on the server);
    how many there were, counted by an ``Observation`` the same action fills (the batch's
    own observations with it)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    counted = Observation(f"__microbatch_rows_{uuid.uuid4().hex}")
    df.observe(counted, F.count(F.lit(1)).alias("rows")).write.format("noop").mode("overwrite").save()
    return int(counted.get["rows"])


def reset_observations(df: Any) -> None:
    """Over Connect no plan is kept across batches: each batch's observations are new."""
