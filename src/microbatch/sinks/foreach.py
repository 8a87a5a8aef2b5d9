"""``foreach(f)``: run a function or writer object on every row, inside Spark tasks.

``f`` is either a function of one row, or an object with ``process(row)`` and
optional ``open(partition_id, epoch_id) -> bool`` and ``close(error)``, as in
PySpark. ``epoch_id`` is the batch id, so a writer can skip a batch it already
wrote; without that the guarantee is at-least-once (a re-run batch is processed
again).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, Row

from pyspark.errors import PySparkAttributeError
from microbatch import spark_internals
from microbatch.errors import pyspark_error
from microbatch.sinks.base import READS_RDD, Sink, SinkContext, SinkProvider


def check_foreach_writer(f: Any) -> None:
    """PySpark's checks: a callable is a function of one row; otherwise ``process`` must
    be callable, and ``open`` and ``close`` too when present."""
    if callable(f):
        return
    for name, required in (("process", True), ("open", False), ("close", False)):
        present = hasattr(f, name)
        if (required and not present) or (present and not callable(getattr(f, name))):
            raise pyspark_error(PySparkAttributeError, "ATTRIBUTE_NOT_CALLABLE", {"attr_name": name, "obj_name": "f"})


def _partition_writer(f: Any, batch_id: int):
    """A partition's function: the user's on each row; yields how many rows it got."""
    def run(rows):
        from pyspark import TaskContext

        count = 0
        if callable(f):
            for row in rows:
                f(row)
                count += 1
            yield count
            return
        partition_id = TaskContext.get().partitionId()
        should_process = f.open(partition_id, batch_id) if hasattr(f, "open") else True
        error = None
        try:
            if should_process:
                for row in rows:
                    f.process(row)
                    count += 1
        except BaseException as e:
            error = e
            raise
        finally:
            if hasattr(f, "close"):
                f.close(error)
        yield count
    return run


@dataclass(frozen=True)
class RealTimeForeach:
    """The foreach sink's writer in a real-time task (``Sink.real_time_writer``): the
    writer opened once for the task's batch, each row processed as its records arrive."""

    f: Any
    batch_id: int
    names: tuple

    wants_positions = False

    def written_before(self) -> tuple[set, dict]:
        return set(), {}

    def __call__(self, batches: Iterator[pa.RecordBatch], skip: Any = ()) -> tuple[int, int]:
        rows = (_row(self.names, values) for batch in batches for values in zip(*batch.to_pydict().values()))
        return sum(_partition_writer(self.f, self.batch_id)(rows)), 0


@dataclass(frozen=True)
class _ArrowPartitionWriter:
    """A partition's function over Arrow batches (over Spark Connect, which has no RDDs):
    the user's writer on each row, as PySpark gives it; one row out, how many it got."""

    f: Any
    batch_id: int
    names: tuple

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = (_row(self.names, values) for batch in batches for values in zip(*batch.to_pydict().values()))
        count = sum(_partition_writer(self.f, self.batch_id)(rows))
        yield pa.RecordBatch.from_pydict({"rows": pa.array([count], pa.int64())})


def _row(names: tuple, values: tuple) -> Row:
    """A row as PySpark gives it to a foreach writer: structs as Rows, timestamps as naive
    local datetimes."""
    return Row(**{n: _python_value(v) for n, v in zip(names, values)})


def _python_value(value: Any) -> Any:
    if isinstance(value, dict):
        return Row(**{k: _python_value(v) for k, v in value.items()})
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    return value


class ForeachSink(Sink):
    reads_batch_through = READS_RDD

    def __init__(self, f: Any):
        self.f = f

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        if spark_internals.is_connect(df):   # (no RDDs: the rows reach the writer through mapInArrow)
            written = df.mapInArrow(_ArrowPartitionWriter(self.f, batch_id, tuple(df.columns)), "rows LONG")
            self.last_num_output_rows = sum(r["rows"] for r in written.collect())
            return
        self.last_num_output_rows = sum(df.rdd.mapPartitions(_partition_writer(self.f, batch_id)).collect())

    def real_time_writer(self, df: DataFrame, batch_id: int, query_id: str) -> tuple[DataFrame, RealTimeForeach]:
        return df, RealTimeForeach(self.f, batch_id, tuple(df.columns))

    def __str__(self) -> str:
        return "ForeachWriterTable"


class ForeachSinkProvider(SinkProvider):
    short_name = "foreach"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        return ForeachSink(context.extra["foreach"])
