"""PySpark's Python Data Source API as a streaming source: a user's
``pyspark.sql.datasource.DataSource`` registered with ``spark.dataSource.register``
works under ``readStream.format(name)``.

As Spark's PythonMicroBatchStream runs it: ``streamReader(schema)`` gives the reader
(PySpark's own fallback to ``simpleStreamReader`` wrapped in its prefetching wrapper,
``_streamReader``); the driver asks ``initialOffset``, ``latestOffset(start, limit)``
(the read limit as PySpark's ``ReadLimit`` classes; a reader with the pre-4.2
``latestOffset()`` is called without them), ``partitions(start, end)`` and ``commit``;
each ``InputPartition`` is read by ``read`` in a Spark task of its own, its rows made
Arrow by PySpark's own conversion. A simple reader's rows are read on the driver, as
Spark reads them. The offsets (the reader's dicts) go to microbatch's offset log as
JSON.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.sources.base import (ALL_AVAILABLE, ReadAllAvailable,
                                     ReadLimit, ReadMaxBytes, ReadMaxFiles, ReadMaxRows,
                                     ReadMinRows, Source, SourceProvider)

try:     # PySpark 4.2+: read limits and availableNow for Python streaming readers
    from pyspark.sql.streaming import datasource as pyspark_limits
except ImportError:   # before 4.2 a Python reader has neither: latestOffset() takes no limit
    pyspark_limits = None

_MAX_ARROW_BATCH = 10_000


def instantiate(data_source_class: type, options) -> Any:
    from pyspark.sql.datasource import CaseInsensitiveDict
    return data_source_class(CaseInsensitiveDict(dict(options.items())))


def resolve_schema(spark, data_source, user_schema: StructType | None) -> StructType:
    if user_schema is not None:
        return user_schema
    schema = data_source.schema()
    if isinstance(schema, str):
        from microbatch.spark_internals import parse_schema_ddl
        return parse_schema_ddl(schema)
    return schema


def to_pyspark_limit(limit: ReadLimit):
    """microbatch's read limit as PySpark's class (what a Python reader is given)."""
    if isinstance(limit, ReadAllAvailable):
        return pyspark_limits.ReadAllAvailable()
    if isinstance(limit, ReadMaxRows):
        return pyspark_limits.ReadMaxRows(limit.rows)
    if isinstance(limit, ReadMinRows):
        return pyspark_limits.ReadMinRows(limit.rows)
    if isinstance(limit, ReadMaxFiles):
        return pyspark_limits.ReadMaxFiles(limit.files)
    if isinstance(limit, ReadMaxBytes):
        return pyspark_limits.ReadMaxBytes(limit.bytes)
    raise TypeError(f"A Python data source cannot be given the read limit {limit}")


def from_pyspark_limit(limit) -> ReadLimit:
    if limit is None or isinstance(limit, pyspark_limits.ReadAllAvailable):
        return ALL_AVAILABLE
    if isinstance(limit, pyspark_limits.ReadMaxRows):
        return ReadMaxRows(limit.max_rows)
    if isinstance(limit, pyspark_limits.ReadMinRows):
        return ReadMinRows(limit.min_rows, 2**62)
    if isinstance(limit, pyspark_limits.ReadMaxFiles):
        return ReadMaxFiles(limit.max_files)
    if isinstance(limit, pyspark_limits.ReadMaxBytes):
        return ReadMaxBytes(limit.max_bytes)
    raise TypeError(f"getDefaultReadLimit returned {limit!r}, which is not one of PySpark's "
                    "ReadLimit classes (pyspark.sql.streaming.datasource)")


def _arrow_batches(rows: Iterator, schema: StructType, data_source) -> Iterator[pa.RecordBatch]:
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches
    return records_to_arrow_batches(iter(rows), _MAX_ARROW_BATCH, schema, data_source)


def _read_partitions_task(reader, partitions: list, schema: StructType, data_source):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from _arrow_batches(reader.read(partitions[index]), schema, data_source)
    return run


class PythonDataSourceStream(Source):
    def __init__(self, spark, data_source, schema: StructType, name: str):
        from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper, _streamReader
        self._spark = spark
        self._data_source = data_source
        self._schema = schema
        self._name = name
        self.reader = _streamReader(data_source, schema)
        self._simple = isinstance(self.reader, _SimpleStreamReaderWrapper)
        inner = self.reader.simple_reader if self._simple else self.reader
        self.supports_available_now = pyspark_limits is not None and isinstance(
            inner, pyspark_limits.SupportsTriggerAvailableNow)
        self._admission_control = pyspark_limits is not None and (self._simple or bool(
            inspect.signature(self.reader.latestOffset).parameters))

    @property
    def schema(self) -> StructType:
        return self._schema

    def initial_offset(self) -> Any:
        return self.reader.initialOffset()

    def default_read_limit(self) -> ReadLimit:
        if not self._admission_control:
            return ALL_AVAILABLE
        return from_pyspark_limit(self.reader.getDefaultReadLimit())

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        if not self._admission_control:
            return self.reader.latestOffset()
        if self._simple:          # PySpark's wrapper takes no limit but ReadAllAvailable
            limit = ALL_AVAILABLE
        return self.reader.latestOffset(start, to_pyspark_limit(limit))

    def report_latest_offset(self, latest: Any) -> Any:
        if not self._admission_control:
            return latest
        if self._simple:
            return None
        return self.reader.reportLatestOffset()

    def prepare_for_trigger_available_now(self) -> None:
        inner = self.reader.simple_reader if self._simple else self.reader
        inner.prepareForTriggerAvailableNow()

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        spark = self._spark
        if self._simple:
            from pyspark.sql.datasource_internal import SimpleInputPartition
            rows = self.reader.getCache(start, end)
            if rows is None:       # a batch replayed after a restart
                rows = self.reader.read(SimpleInputPartition(start, end))
            batches = list(_arrow_batches(rows, self._schema, self._data_source))
            if not batches:
                return spark_internals.empty_batch(spark, self._schema)
            return spark.createDataFrame(pa.Table.from_batches(batches), self._schema)
        partitions = list(self.reader.partitions(start, end))
        if not partitions:
            return spark_internals.empty_batch(spark, self._schema)
        task = _read_partitions_task(self.reader, partitions, self._schema, self._data_source)
        return spark.range(0, len(partitions), 1, len(partitions)).mapInArrow(task, self._schema)

    def commit(self, end: Any) -> None:
        self.reader.commit(end)

    def stop(self) -> None:
        if not self._simple:
            self.reader.stop()

    def __str__(self) -> str:
        return f"PythonMicroBatchStream[{self._name}]"


class PythonDataSourceProvider(SourceProvider):
    """Found when no built-in source has the name and a Python data source does."""

    runs_over_connect = True   # (its reader runs in the client, its partitions in mapInArrow)

    def __init__(self, name: str, data_source_class: type):
        self.short_name = name
        self.data_source_class = data_source_class

    def resolve_schema(self, spark, options, user_schema):
        return resolve_schema(spark, instantiate(self.data_source_class, options), user_schema)

    def create(self, context, options, schema):
        data_source = instantiate(self.data_source_class, options)
        return PythonDataSourceStream(context.spark, data_source, schema, self.short_name)
