"""The file source on an object store (``s3://``, ``s3a://``, ``gs://``, ``abfss://``) where
this Spark has no Hadoop connector for the scheme (no hadoop-aws, GCS connector or
hadoop-azure): each batch's files read in Spark tasks through the storage layer
(fsspec's s3fs, gcsfs or adlfs, with the endpoint and credentials of
``spark.hadoop.fs.s3a.*``, ``fs.gs.*`` or ``fs.azure.*``), then given Spark's own semantics:

- ``parquet``: pyarrow in the tasks (``object_store_files.read_parquet_files``), the
  columns cast to the stream's schema, partition columns from the ``k=v`` directories;
- ``json`` and ``csv``: the tasks read the files' lines, and Spark's own parser reads
  them as a ``Dataset[String]`` (``DataFrameReader.json/csv(Dataset[String])``), with
  the stream's schema and every reader option (``mode``, ``columnNameOfCorruptRecord``,
  ``header``, ``sep``, ...);
- ``text``: the lines (or each whole file with ``wholetext``) as ``value``.

What cannot be read this way is refused at start, naming the format or option: ``orc``,
``xml``, ``multiLine`` json/csv (a record may span lines; Spark reads each file whole).
Where Spark has the connector (a cluster with hadoop-aws or the GCS connector), the source hands the listed
URIs to Spark's own reader instead (``file.py``)."""
from __future__ import annotations

import re
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (DataType, DateType, DoubleType, IntegerType, LongType, StringType,
                               StructField, StructType)

from microbatch.checkpoint.fs import OBJECT_STORE_SCHEMES
from microbatch.errors import UnsupportedOperationError
from microbatch.sources.file_listing import ListedFile, partition_values
from microbatch.sources.object_store_files import ParquetFile, read_parquet_files, read_text_lines
from microbatch.spark_internals.file_text import parse_lines

#: What the progress metric ``readPath`` says of a source on an object store.
READ_BY_SPARK = "sparkReader"
READ_IN_TASKS = "pythonTasks"


def store_scheme(path: str) -> str | None:
    """The object-store scheme of ``path`` (``s3a``, ``gs``: the storage layer's
    ``OBJECT_STORE_SCHEMES``), or None for a local path."""
    scheme, sep, _ = path.partition("://")
    return scheme.lower() if sep and scheme.lower() in OBJECT_STORE_SCHEMES else None


def check_readable(fmt: str, path: str, options: Mapping[str, str]) -> None:
    """Refuse what the tasks cannot read as Spark would, naming the format or option."""
    lowered = {k.lower(): str(v).strip().lower() for k, v in options.items()}
    fix = ("Run on a cluster whose Spark has the Hadoop connector for the scheme (hadoop-aws "
           "for s3a://, the GCS connector for gs://, hadoop-azure for abfss://), where Spark's own reader "
           "reads the files")
    if fmt not in ("parquet", "json", "csv", "text"):
        raise UnsupportedOperationError(
            f"The file source cannot read the format '{fmt}' from '{path}': this Spark has no "
            "Hadoop connector for the store, and microbatch reads only parquet, json, csv and "
            f"text there in its own tasks. {fix}, or use one of those formats.")
    if fmt in ("json", "csv") and lowered.get("multiline") == "true":
        raise UnsupportedOperationError(
            f"The file source cannot read {fmt} with the option multiLine=true from '{path}': "
            "this Spark has no Hadoop connector for the store, and microbatch hands Spark's "
            f"{fmt} parser the files' lines, one record a line. {fix}, or write one record a "
            "line and drop multiLine.")


# -- partition columns ------------------------------------------------------------
_INT = re.compile(r"^[+-]?\d+$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _value_type(text: str | None) -> DataType | None:
    if text is None:
        return None
    if _INT.match(text):
        return IntegerType() if -2**31 <= int(text) < 2**31 else LongType()
    try:
        float(text)
        return DoubleType()
    except ValueError:
        pass
    return DateType() if _DATE.match(text) else StringType()


def _merged(a: DataType | None, b: DataType | None) -> DataType | None:
    if a is None or a == b:
        return b if a is None else a
    if b is None:
        return a
    numeric = [IntegerType(), LongType(), DoubleType()]
    if a in numeric and b in numeric:
        return numeric[max(numeric.index(a), numeric.index(b))]
    return StringType()


def partition_schema(listed: list[ListedFile], infer_types: bool) -> StructType:
    """The partition columns of the listed files' ``k=v`` directories, their types
    inferred as Spark's partition discovery does for integers, longs, doubles and dates
    (``spark.sql.sources.partitionColumnTypeInference.enabled``); the rest strings."""
    names: list[str] = []
    types: dict[str, DataType | None] = {}
    for f in listed:
        for name, value in partition_values(f.path):
            if name not in types:
                names.append(name)
                types[name] = None
            types[name] = _merged(types[name], _value_type(value) if infer_types else StringType())
    return StructType([StructField(n, types[n] or StringType(), True) for n in names])


def infer_schema(spark: SparkSession, fmt: str, listed: list[ListedFile], user_schema: StructType | None,
                 options: Mapping[str, str], storage: tuple, infer_partition_types: bool,
                 glob: bool = False) -> StructType:
    """The stream's schema as Spark's reader would resolve it over the listed files: the
    data columns (given, or inferred: the first parquet file's footer, Spark's inference
    over the json/csv lines), then the partition columns (typed by the given schema where
    it names them)."""
    # as Spark's: a glob's matches are their own base paths, so no partition columns
    partitions = StructType() if glob else partition_schema(listed, infer_partition_types)
    if user_schema is not None:
        data = StructType([f for f in user_schema.fields if f.name not in partitions.fieldNames()])
        given = {f.name: f for f in user_schema.fields}
        parts = [given.get(f.name, f) for f in partitions.fields]
        return StructType(data.fields + parts)
    paths = [f.path for f in listed]
    if fmt == "text":
        data = StructType([StructField("value", StringType(), True)])
    elif fmt == "parquet":
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import from_arrow_schema

        from microbatch.checkpoint.stores import storage_from_spec
        with storage_from_spec(storage).open_input(paths[0]) as handle:
            data = from_arrow_schema(pq.ParquetFile(handle).schema_arrow)
    else:
        data = parse_lines(spark, fmt, read_text_lines(spark, paths, storage), None, options).schema
    names = set(data.fieldNames())
    return StructType(data.fields + [f for f in partitions.fields if f.name not in names])


class StoreBatches:
    """Batch DataFrames of files on an object store, read in Spark tasks (module docstring)."""

    def __init__(self, spark: SparkSession, fmt: str, schema: StructType, options: Mapping[str, str],
                 storage: tuple, ignore_missing: bool):
        self._spark = spark
        self._format = fmt
        self._schema = schema
        self._storage = storage
        self._ignore_missing = ignore_missing
        lowered = {k.lower(): v for k, v in options.items()}
        self._line_sep = lowered.get("linesep") or None
        self._whole_text = fmt == "text" and str(lowered.get("wholetext", "false")).lower() == "true"
        self._encoding = lowered.get("encoding") or lowered.get("charset") or "utf-8"
        self._options = {k: v for k, v in options.items()
                         if k.lower() not in ("basepath", "__globpaths__", "pathglobfilter", "recursivefilelookup")}

    def dataframe(self, paths: list[str], metadata: DataType | None = None,
                  modified_ms: Mapping[str, int] | None = None) -> DataFrame:
        """The batch of ``paths``; with ``metadata`` (parquet only: the file source's
        ``carry_hidden_columns``), each row's ``_metadata`` of that type in a last column
        ``CARRIED_METADATA``, the files' modification times from ``modified_ms``."""
        groups: dict[tuple, list[str]] = {}
        columns = set(self._schema.fieldNames())
        for path in paths:
            values = tuple((k, v) for k, v in partition_values(path) if k in columns)
            groups.setdefault(values, []).append(path)
        if self._format == "parquet":
            files = [ParquetFile(p, values, (modified_ms or {}).get(p)) for values, group in groups.items()
                     for p in group]
            return read_parquet_files(self._spark, files, self._schema, self._storage, metadata)
        frames = [self._text_frame(dict(values), group) for values, group in groups.items()]
        result = frames[0]
        for frame in frames[1:]:
            result = result.unionByName(frame)
        return result

    def _text_frame(self, values: dict[str, str | None], paths: list[str]) -> DataFrame:
        lines = read_text_lines(self._spark, paths, self._storage, line_sep=self._line_sep,
                                whole_text=self._whole_text, encoding=self._encoding,
                                ignore_missing=self._ignore_missing)
        data = StructType([f for f in self._schema.fields if f.name not in values])
        frame = lines if self._format == "text" else parse_lines(self._spark, self._format, lines, data, self._options)
        return frame.select(*[F.lit(values[f.name]).cast(f.dataType).alias(f.name) if f.name in values
                              else F.col(f"`{f.name}`") for f in self._schema.fields])


def describe_read_path(read_path: str, scheme: str) -> str:
    if read_path == READ_BY_SPARK:
        return f"Spark's own reader (this Spark has a Hadoop FileSystem for {scheme}://)"
    library = {"gs": "gcsfs", "abfs": "adlfs", "abfss": "adlfs"}.get(scheme, "s3fs")
    return (f"Spark tasks through {library} (this Spark has no Hadoop FileSystem for {scheme}://): "
            "parquet with pyarrow, json and csv by Spark's parser over the files' lines, text as lines")

