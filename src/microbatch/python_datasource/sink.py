"""PySpark's Python Data Source API as a streaming sink: ``writeStream.format(name)`` for
a ``pyspark.sql.datasource.DataSource`` registered with ``spark.dataSource.register``.

As Spark's PythonStreamingWrite runs it: ``streamWriter(schema, overwrite)`` (overwrite
in complete mode) on the driver; per batch, ``write`` in each Spark task over the
task's rows (PySpark ``Row`` objects, or Arrow record batches for a
``DataSourceStreamArrowWriter``) returning a ``WriterCommitMessage``; then, on the
driver, ``commit(messages, batchId)`` — or ``abort(messages, batchId)`` if a task
failed, and the batch fails. A batch run again after a crash calls ``write`` and
``commit`` again with the same batch id: the writer makes that idempotent, as for
Spark's engine.
"""
from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

from microbatch.sinks.base import READS_ANY, Sink, SinkContext, SinkProvider
from microbatch.python_datasource.source import instantiate

log = logging.getLogger(__name__)


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
            if self._arrow:
                from pyspark.serializers import CloudPickleSerializer
                results = df.mapInArrow(_arrow_write_task(writer), "message BINARY, rows LONG").collect()
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
    def __init__(self, name: str, data_source_class: type):
        self.short_name = name
        self.data_source_class = data_source_class

    def create(self, context: SinkContext) -> Sink:
        data_source = instantiate(self.data_source_class, context.options)
        return PythonDataSourceSink(self.short_name, data_source, context)
