"""Spark's own file readers where Spark cannot reach the files: whether this Spark has a
Hadoop ``FileSystem`` for a scheme, and Spark's JSON and CSV parsers over a
``Dataset[String]`` of lines read elsewhere (``DataFrameReader.json(Dataset[String])``,
``.csv(Dataset[String])``), so the options and semantics (schema, ``mode``,
``columnNameOfCorruptRecord``, ``header``, ``sep``, ...) stay Spark's."""
from __future__ import annotations

from typing import Any, Mapping

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch.spark_internals.jvm import jvm_class, scala_map

_CONNECTORS: dict[tuple[int, str], bool] = {}


def has_hadoop_file_system(spark: SparkSession, scheme: str) -> bool:
    """Whether Spark's Hadoop configuration maps ``scheme`` to a FileSystem class this JVM
    can load (``s3a`` needs hadoop-aws on the classpath; ``fs.<scheme>.impl`` may name one)."""
    key = (id(spark._jsparkSession), scheme.lower())
    if key not in _CONNECTORS:
        conf = spark._jsparkSession.sessionState().newHadoopConf()
        try:
            jvm_class("org.apache.hadoop.fs.FileSystem").getFileSystemClass(scheme.lower(), conf)
            _CONNECTORS[key] = True
        except Py4JJavaError:       # UnsupportedFileSystemException, ClassNotFoundException
            _CONNECTORS[key] = False
    return _CONNECTORS[key]


def parse_lines(spark: SparkSession, fmt: str, lines: DataFrame, schema: StructType | None,
                options: Mapping[str, str]) -> DataFrame:
    """``spark.read.schema(schema).options(options).<fmt>(lines)`` with ``lines`` (a
    DataFrame of one string column) as a ``Dataset[String]``: Spark's parser of ``json``
    or ``csv``; without ``schema``, Spark infers one from the lines."""
    if fmt not in ("json", "csv"):
        raise ValueError(f"Spark parses lines of json or csv, not {fmt}")
    reader: Any = spark._jsparkSession.read()
    if schema is not None:
        reader = reader.schema(spark._jsparkSession.parseDataType(schema.json()))
    reader = reader.options(scala_map(dict(options)))
    strings = getattr(lines._jdf, "as")(jvm_class("org.apache.spark.sql.Encoders").STRING())
    return DataFrame(getattr(reader, fmt)(strings), spark)
