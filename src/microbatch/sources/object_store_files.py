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
from microbatch.checkpoint.stores import storage_from_spec


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


# -- text files: their lines, for Spark's own JSON and CSV parsers ------------------------
_LINE_BREAK = None   # compiled on first use in a task


def _split_lines(text: str, line_sep: str | None) -> list[str]:
    """Hadoop's LineRecordReader: lines end at ``\\n``, ``\\r\\n`` or ``\\r`` (or at
    ``lineSep``); a last line break ends the last line, it does not start an empty one."""
    global _LINE_BREAK
    if line_sep:
        lines = text.split(line_sep)
    else:
        if _LINE_BREAK is None:
            import re
            _LINE_BREAK = re.compile(r"\r\n|\r|\n")
        lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _decompressed(path: str, data: bytes) -> bytes:
    """The file's bytes, decompressed by its extension as Hadoop's codecs are picked."""
    lowered = path.lower()
    if lowered.endswith(".gz"):
        import gzip
        return gzip.decompress(data)
    if lowered.endswith(".bz2"):
        import bz2
        return bz2.decompress(data)
    if lowered.endswith((".deflate", ".lz4", ".snappy", ".zst", ".zstd", ".br")):
        raise ValueError(
            f"The file source cannot read '{path}' in a Python task: its compression "
            f"('{lowered.rsplit('.', 1)[-1]}') is read by Hadoop's codecs only; the tasks read "
            "gzip (.gz) and bzip2 (.bz2). Use one of those, or a Spark with the store's connector.")
    return data


@dataclass(frozen=True)
class ReadTextFilesTask:
    """The ``mapInArrow`` function reading files' lines (or each whole file, ``whole_text``)
    as one string column ``value``."""

    groups: tuple[tuple[str, ...], ...]
    line_sep: str | None
    whole_text: bool
    encoding: str
    ignore_missing: bool
    storage: tuple = field(repr=False, default=("file", ()))   # may hold credentials

    #: rows per Arrow batch handed to Spark
    ROWS_PER_BATCH = 8192

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = storage_from_spec(self.storage)
        schema = pa.schema([("value", pa.string())])
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for path in self.groups[index]:
                    try:
                        data = store.read_bytes(path)
                    except FileNotFoundError:
                        if self.ignore_missing:
                            continue
                        raise FileNotFoundError(
                            f"[FILE_SOURCE_MISSING_FILE] The file source listed {path}, but it no "
                            "longer exists. Restore the file, or set the option "
                            "ignoreMissingFiles=true to skip files removed after they were listed.") from None
                    # malformed bytes become U+FFFD, as Hadoop's Text decodes them
                    text = _decompressed(path, data).decode(self.encoding, errors="replace")
                    lines = [text] if self.whole_text else _split_lines(text, self.line_sep)
                    for at in range(0, len(lines), self.ROWS_PER_BATCH):
                        yield pa.RecordBatch.from_arrays(
                            [pa.array(lines[at:at + self.ROWS_PER_BATCH], pa.string())], schema=schema)


def read_text_lines(spark: SparkSession, paths: list[str], storage: tuple, *, line_sep: str | None = None,
                    whole_text: bool = False, encoding: str = "utf-8", ignore_missing: bool = False) -> DataFrame:
    """A DataFrame of one string column ``value``: the lines of ``paths`` (in Spark tasks,
    as ``read_parquet_files`` reads parquet); each file is read whole into its task's memory."""
    from pyspark.sql.types import StringType, StructField
    tasks = max(1, min(len(paths), spark.sparkContext.defaultParallelism))
    groups = tuple(tuple(paths[i::tasks]) for i in range(tasks))
    read = ReadTextFilesTask(groups, line_sep, whole_text, encoding, ignore_missing, storage)
    return spark.range(0, tasks, 1, tasks).mapInArrow(read, StructType([StructField("value", StringType())]))
