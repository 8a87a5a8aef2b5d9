"""PySpark's Python Data Source API as a streaming sink: ``writeStream.format(name)`` for
a ``pyspark.sql.datasource.DataSource`` registered with ``spark.dataSource.register``.

As Spark's PythonStreamingWrite runs it: ``streamWriter(schema, overwrite)`` (overwrite
in complete mode) on the driver; per batch, ``write`` in each Spark task over the
task's rows (PySpark ``Row`` objects, or Arrow record batches for a
``DataSourceStreamArrowWriter``) returning a ``WriterCommitMessage``; then, on the
driver, ``commit(messages, batchId)`` — or ``abort(messages, batchId)`` if a task
failed, and the batch fails. Over Spark Connect (no RDD) a row writer's rows are made
from the tasks' Arrow batches, as Spark's own write worker makes them. A batch run
again after a crash calls ``write`` and ``commit`` again with the same batch id: the
writer makes that idempotent, as for Spark's engine.
"""
from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from microbatch import spark_internals
from microbatch.sinks.base import READS_ANY, Sink, SinkContext, SinkProvider
from microbatch.python_datasource.source import instantiate

log = logging.getLogger(__name__)

#: Spark's conf: whether a Python row gets a binary column's values as ``bytes`` (else ``bytearray``)
_BINARY_AS_BYTES = "spark.sql.execution.pyspark.binaryAsBytes"


def _counted(items, count: list, size=lambda item: 1):
    for item in items:
        count[0] += size(item)
        yield item


def _arrow_write_task(writer):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark.serializers import CloudPickleSerializer
        count = [0]
        message = writer.write(_counted(batches, count, lambda batch: batch.num_rows))
        yield pa.RecordBatch.from_pydict(
            {"message": pa.array([CloudPickleSerializer().dumps(message)], pa.binary()),
             "rows": pa.array([count[0]], pa.int64())})
    return run


def _row_write_task(writer):
    def run(rows):
        count = [0]
        message = writer.write(_counted(rows, count))
        yield message, count[0]
    return run


def _arrow_rows_write_task(writer, schema, binary_as_bytes: bool):
    """A row writer's task where the batch has no RDD (over Spark Connect): the task's Arrow
    record batches made ``Row`` objects as Spark's own write worker makes them
    (``pyspark.sql.worker.write_into_data_source``)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark.serializers import CloudPickleSerializer
        from pyspark.sql.conversion import ArrowTableToRowsConversion
        from pyspark.sql.types import _create_row
        converters = [ArrowTableToRowsConversion._create_converter(f.dataType, binary_as_bytes=binary_as_bytes)
                      for f in schema.fields]
        names = schema.fieldNames()

        def rows():
            for batch in batches:
                columns = [ArrowTableToRowsConversion._to_pylist(c) for c in batch.columns]
                for i in range(batch.num_rows):
                    yield _create_row(names, [convert(column[i]) for convert, column in zip(converters, columns)])
        count = [0]
        message = writer.write(_counted(rows(), count))
        yield pa.RecordBatch.from_pydict(
            {"message": pa.array([CloudPickleSerializer().dumps(message)], pa.binary()),
             "rows": pa.array([count[0]], pa.int64())})
    return run


class PythonDataSourceSink(Sink):
    reads_batch_through = READS_ANY

    def __init__(self, name: str, data_source, context: SinkContext):
        from pyspark.sql.datasource import DataSourceStreamArrowWriter
        self._name = name
        self.writer = data_source.streamWriter(context.schema, context.output_mode == "complete")
        self._arrow = isinstance(self.writer, DataSourceStreamArrowWriter)

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        writer = self.writer
        try:
            if self._arrow or spark_internals.is_connect(df):   # (a Connect DataFrame has no RDD)
                from pyspark.serializers import CloudPickleSerializer
                task = _arrow_write_task(writer) if self._arrow else _arrow_rows_write_task(
                    writer, df.schema, df.sparkSession.conf.get(_BINARY_AS_BYTES, "true").lower() == "true")
                results = df.mapInArrow(task, "message BINARY, rows LONG").collect()
                messages = [CloudPickleSerializer().loads(r["message"]) for r in results]
                self.last_num_output_rows = sum(r["rows"] for r in results)
            else:
                results = df.rdd.mapPartitions(_row_write_task(writer)).collect()
                messages = [message for message, _ in results]
                self.last_num_output_rows = sum(rows for _, rows in results)
        except Exception:
            log.error("Aborting batch %d of the Python data source sink '%s'", batch_id, self._name)
            writer.abort([], batch_id)
            raise
        writer.commit(messages, batch_id)

    def __str__(self) -> str:
        return f"PythonStreamingWrite[{self._name}]"


class PythonDataSourceSinkProvider(SinkProvider):
    runs_over_connect = True   # (its writer runs in the client, its tasks in mapInArrow)

    def __init__(self, name: str, data_source_class: type):
        self.short_name = name
        self.data_source_class = data_source_class

    def create(self, context: SinkContext) -> Sink:
        data_source = instantiate(self.data_source_class, context.options)
        return PythonDataSourceSink(self.short_name, data_source, context)
