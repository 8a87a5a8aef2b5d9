"""``console``: print each batch, as Spark's console sink.

Options ``numRows`` (default 20) and ``truncate`` (default true). No delivery
guarantee: a batch re-run after a crash is printed again.

Attached to a terminal, the sink also keeps a live line per query below the batches
(``microbatch.terminal``: batch, rows per second, watermark, state rows), updated from each
batch's progress; in a log or a pipe its output is Spark's, plain.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, MapType, StructType

from microbatch.terminal import is_terminal, progress_line, shared_live_lines
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider


class ConsoleSink(Sink):
    reads_batch_through = READS_SQL

    def __init__(self, num_rows: int, truncate: bool, query_name: str | None = None,
                 live: bool | None = None):
        self.num_rows = num_rows
        self.truncate = truncate
        self.query_name = query_name
        self.live = is_terminal() if live is None else live
        self._live_key = f"console sink {id(self)}"
        #: real-time mode: the session and schema the batch's answered rows are shown with
        self._real_time_output: tuple | None = None

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        # As Spark's console sink: every row comes to the driver (and is counted), the first
        # numRows are shown
        rows = df.collect()
        self.last_num_output_rows = len(rows)
        self._show(batch_id, rows, df.sparkSession, df.schema)

    def _show(self, batch_id: int, rows: list, spark, schema) -> None:
        print("-------------------------------------------")
        print(f"Batch: {batch_id}")
        print("-------------------------------------------")
        shown = spark.createDataFrame(rows[:self.num_rows], schema, verifySchema=False)
        shown.show(self.num_rows, self.truncate)

    # -- real-time mode: the tasks hand their rows back, shown when the batch ends ---------
    def real_time_writer(self, df: DataFrame, batch_id: int, query_id: str) -> tuple[DataFrame, "RealTimeRows"]:
        self._real_time_output = (df.sparkSession, df.schema)
        return df, RealTimeRows()

    def real_time_batch_ended(self, batch_id: int, answered: list[bytes | None]) -> None:
        """Spark's console sink in real-time mode prints a batch's rows when it commits the
        batch's write: the rows each task answered, shown as a micro-batch's."""
        spark, schema = self._real_time_output
        rows = []
        for data in answered:
            if data:
                table = pa.ipc.open_stream(data).read_all()
                columns = [[_python(v, f.dataType) for v in column.to_pylist()]
                           for column, f in zip(table.columns, schema.fields)]
                rows.extend(zip(*columns))
        self.last_num_output_rows = len(rows)
        self._show(batch_id, rows, spark, schema)

    def report_progress(self, progress) -> None:
        if self.live:
            shared_live_lines().update(self._live_key, progress_line(
                self.query_name or str(progress.id), json.loads(progress.json)))

    def stop(self) -> None:
        if self.live:
            shared_live_lines().remove(self._live_key)

    def __str__(self) -> str:
        return f"ConsoleSink[numRows={self.num_rows}, truncate={str(self.truncate).lower()}]"


@dataclass(frozen=True)
class RealTimeRows:
    """The console sink's writer in a real-time task: the rows, kept as they come and
    answered at the batch's end (Arrow IPC), for the driver to show."""

    wants_positions = False

    def written_before(self) -> tuple[set, dict]:
        return set(), {}

    def __call__(self, batches: Iterator[pa.RecordBatch], skip: Any = ()) -> tuple[int, int, bytes | None]:
        kept = [b for b in batches if b.num_rows]
        if not kept:
            return 0, 0, None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, kept[0].schema) as stream:
            for batch in kept:
                stream.write_batch(batch)
        return sum(b.num_rows for b in kept), 0, sink.getvalue().to_pybytes()


def _python(value: Any, data_type: Any) -> Any:
    """An Arrow value as PySpark's ``createDataFrame`` takes one of ``data_type`` (a map's
    entries as a dict)."""
    if value is None:
        return None
    if isinstance(data_type, MapType):
        return {_python(k, data_type.keyType): _python(v, data_type.valueType) for k, v in value}
    if isinstance(data_type, ArrayType):
        return [_python(v, data_type.elementType) for v in value]
    if isinstance(data_type, StructType):
        return tuple(_python(value.get(f.name), f.dataType) for f in data_type.fields)
    return value


class ConsoleSinkProvider(SinkProvider):
    short_name = "console"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        num_rows = context.options.get_int("numRows", 20)
        if num_rows <= 0:
            raise ValueError(f"Invalid value '{num_rows}' for option 'numRows': it must be positive.")
        return ConsoleSink(num_rows, context.options.get_bool("truncate", True), context.query_name)
