"""Batches of parquet files on an object store, read in Spark tasks through the storage
layer: the Delta and Iceberg sources' reader for tables on S3.

Spark's own parquet reader reaches ``s3a://`` through hadoop-aws, which this Spark has not
(and a cluster may have not either); the storage layer (fsspec's s3fs, with the endpoint
and keys of ``spark.hadoop.fs.s3a.*``, as the checkpoint takes them) reaches it from any
Python process. A batch is ``spark.range(0, tasks).mapInArrow(read)``: each task reads its
share of the files, streaming each file's row groups (never the whole file in memory at
once), and gives the batch's columns in the stream's schema: a column the file lacks is
null (a column added to the table after the file was written), partition columns take the
file's partition values (Delta keeps them in its log, not in the file). The rows never
pass through the driver.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.checkpoint.fs import storage_from_spec


@dataclass(frozen=True)
class ParquetFile:
    """One file of a batch: its full path as the storage names it, and its partition
    values (column → the value's text, or None), for columns the file does not hold."""

    path: str
    partition_values: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class ReadParquetFilesTask:
    """The ``mapInArrow`` function: each input row is the index of the task's files."""

    groups: tuple[tuple[ParquetFile, ...], ...]
    schema_json: str                                  # the stream's StructType, as JSON
    storage: tuple = field(repr=False, default=("file", ()))   # storage_from_spec's; may hold credentials

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import json

        import pyarrow.parquet as pq
        target = spark_internals.arrow_schema(StructType.fromJson(json.loads(self.schema_json)))
        store = storage_from_spec(self.storage)
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for one in self.groups[index]:
                    values = dict(one.partition_values)
                    with store.open_input(one.path) as handle:
                        reader = pq.ParquetFile(handle)
                        present = set(reader.schema_arrow.names)
                        wanted = [name for name in target.names if name in present and name not in values]
                        for rows in reader.iter_batches(columns=wanted):
                            yield _conform(rows, target, values)


def _conform(rows: pa.RecordBatch, target: pa.Schema, partition_values: dict[str, str | None]) -> pa.RecordBatch:
    """``rows`` as the stream's columns: cast to its types, partition columns from their
    values, missing columns null."""
    arrays = []
    for column in target:
        if column.name in partition_values:
            text = partition_values[column.name]
            array = pa.nulls(rows.num_rows, pa.string()) if text is None else \
                pa.repeat(pa.scalar(text, pa.string()), rows.num_rows)
            arrays.append(array.cast(column.type))
        elif column.name in rows.schema.names:
            array = rows.column(column.name)
            arrays.append(array if array.type == column.type else array.cast(column.type))
        else:
            arrays.append(pa.nulls(rows.num_rows, column.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def read_parquet_files(spark: SparkSession, files: list[ParquetFile], schema: StructType,
                       storage: tuple) -> DataFrame:
    """The batch DataFrame of ``files`` (see the module docstring): at most the cluster's
    default parallelism of tasks, the files dealt round-robin among them."""
    tasks = max(1, min(len(files), spark.sparkContext.defaultParallelism))
    groups = tuple(tuple(files[i::tasks]) for i in range(tasks))
    read = ReadParquetFilesTask(groups, schema.json(), storage)
    return spark.range(0, tasks, 1, tasks).mapInArrow(read, schema)
