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
from pyspark.sql.types import DataType, StructField, StructType

from microbatch import spark_internals
from microbatch.checkpoint.stores import storage_from_spec


@dataclass(frozen=True)
class ParquetFile:
    """One file of a batch: its full path as the storage names it, and its partition
    values (column → the value's text, or None), for columns the file does not hold."""

    path: str
    partition_values: tuple[tuple[str, str | None], ...] = ()
    #: its listed modification time (ms), for ``_metadata.file_modification_time``
    modified_ms: int | None = None


@dataclass(frozen=True)
class ReadParquetFilesTask:
    """The ``mapInArrow`` function: each input row is the index of the task's files."""

    groups: tuple[tuple[ParquetFile, ...], ...]
    schema_json: str                                  # the stream's StructType, as JSON
    storage: tuple = field(repr=False, default=("file", ()))   # storage_from_spec's; may hold credentials
    #: the ``_metadata`` struct type (JSON) to give each row in a last column, or None
    metadata_json: str | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import json

        import pyarrow.parquet as pq
        target = spark_internals.arrow_schema(StructType.fromJson(json.loads(self.schema_json)))
        metadata = None
        if self.metadata_json is not None:
            metadata = spark_internals.arrow_schema(StructType.fromJson(json.loads(self.metadata_json)))
        store = storage_from_spec(self.storage)
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for one in self.groups[index]:
                    values = dict(one.partition_values)
                    with store.open_input(one.path) as handle:
                        size = handle.seek(0, 2)    # (the file's size: its end)
                        handle.seek(0)
                        reader = pq.ParquetFile(handle)
                        present = set(reader.schema_arrow.names)
                        wanted = [name for name in target.names if name in present and name not in values]
                        row_index = 0
                        for rows in reader.iter_batches(columns=wanted):
                            conformed = _conform(rows, target, values)
                            if metadata is not None:
                                conformed = _with_file_metadata(conformed, metadata, one, size, row_index)
                                row_index += rows.num_rows
                            yield conformed


def _with_file_metadata(rows: pa.RecordBatch, metadata: pa.Schema, file: ParquetFile, size: int,
                        first_row: int) -> pa.RecordBatch:
    """``rows`` and their ``_metadata`` (``metadata``: one field, the struct Spark's parquet
    relation gives) in a last column ``CARRIED_METADATA``: the file's path, name, size, one
    block of the whole file (Spark's for a file it does not split), its listed modification
    time, and each row's index in the file; a field Spark adds that is not one of these, null."""
    kind = metadata.field(0).type
    n = rows.num_rows
    name = file.path.rstrip("/").rsplit("/", 1)[-1]
    known = {
        "file_path": pa.repeat(pa.scalar(file.path, pa.string()), n),
        "file_name": pa.repeat(pa.scalar(name, pa.string()), n),
        "file_size": pa.repeat(pa.scalar(size, pa.int64()), n),
        "file_block_start": pa.repeat(pa.scalar(0, pa.int64()), n),
        "file_block_length": pa.repeat(pa.scalar(size, pa.int64()), n),
        "file_modification_time": pa.repeat(pa.scalar(
            None if file.modified_ms is None else file.modified_ms * 1000, pa.int64()), n),
        "row_index": pa.array(range(first_row, first_row + n), pa.int64()),
    }
    children = [known[f.name].cast(f.type) if f.name in known else pa.nulls(n, f.type) for f in kind]
    column = pa.StructArray.from_arrays(children, fields=list(kind))
    return pa.RecordBatch.from_arrays(list(rows.columns) + [column],
                                      names=list(rows.schema.names) + [spark_internals.CARRIED_METADATA])


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
                       storage: tuple, metadata: DataType | None = None) -> DataFrame:
    """The batch DataFrame of ``files`` (see the module docstring): at most the cluster's
    default parallelism of tasks, the files dealt round-robin among them; with ``metadata``
    (the ``_metadata`` struct type), each row's in a last column ``CARRIED_METADATA``."""
    tasks = max(1, min(len(files), spark.sparkContext.defaultParallelism))
    groups = tuple(tuple(files[i::tasks]) for i in range(tasks))
    out = schema
    carried = None
    if metadata is not None:
        carried = StructType([StructField("_metadata", metadata)]).json()
        out = StructType(schema.fields + [StructField(spark_internals.CARRIED_METADATA, metadata)])
    read = ReadParquetFilesTask(groups, schema.json(), storage, carried)
    return spark.range(0, tasks, 1, tasks).mapInArrow(read, out)


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
