"""DataStreamReader: ``ss.readStream.format(...).option(...).load()``.

Method by method PySpark 4.3's: the same arguments, the same checks and errors
(``NOT_EXPECTED_TYPE``, ``VALUE_NOT_NON_EMPTY_STR``, ``INVALID_STREAMING_SOURCE_NAME``, a
``ParseException`` for a bad DDL schema), ``None`` options ignored.
"""
from __future__ import annotations

import re
from typing import Any

from pyspark.errors import PySparkTypeError, PySparkValueError
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.api.frame import StreamFrame
from microbatch.api.tables import stream_of_table
from microbatch.checkpoint.offsets import SOURCE_EVOLUTION_CONF
from microbatch.errors import IllegalArgumentException, UnsupportedOperationError, pyspark_error
from microbatch.plan.logical import StreamingRelation
from microbatch.connectors import lookup_source
from microbatch.util import CaseInsensitiveOptions, conf_bool, option_value



def _not_expected_type(arg_name: str, expected: str, value: Any) -> PySparkTypeError:
    return pyspark_error(PySparkTypeError, "NOT_EXPECTED_TYPE", {"arg_name": arg_name, "expected_type": expected,
                           "arg_type": type(value).__name__})


class DataStreamReader:
    def __init__(self, session: Any):   # the StreamingSession
        self._session = session
        self._format: str | None = None
        self._schema: StructType | None = None
        self._options: dict[str, str] = {}
        self._name: str | None = None

    def format(self, source: str) -> "DataStreamReader":
        self._format = source
        return self

    def option(self, key: str, value: Any) -> "DataStreamReader":
        if value is not None:
            self._options[key] = option_value(value)
        return self

    def options(self, **options: Any) -> "DataStreamReader":
        for k, v in options.items():
            self.option(k, v)
        return self

    def schema(self, schema: StructType | str) -> "DataStreamReader":
        if isinstance(schema, str):
            schema = spark_internals.parse_schema_ddl(schema)
        elif not isinstance(schema, StructType):
            raise _not_expected_type("schema", "str or struct type", schema)
        self._schema = schema
        return self

    def name(self, source_name: str) -> "DataStreamReader":
        """Name this source (Spark 4.2+): its offsets and metadata are kept under the name
        in the checkpoint, so a query can add, remove or reorder named sources across
        restarts. Needs ``spark.sql.streaming.queryEvolution.enableSourceEvolution``."""
        spark_internals.require("named sources (readStream.name)")
        if not isinstance(source_name, str):
            raise _not_expected_type("source_name", "str", source_name)
        if not re.match(r"^[a-zA-Z0-9_]+$", source_name):
            raise pyspark_error(PySparkValueError, "INVALID_STREAMING_SOURCE_NAME", {"source_name": source_name})
        self._name = source_name
        return self

    def load(self, path: str | None = None, format: str | None = None,
             schema: StructType | str | None = None, **options: Any) -> "StreamFrame":
        if format is not None:
            self.format(format)
        if schema is not None:
            self.schema(schema)
        self.options(**options)
        if path is not None:
            if not isinstance(path, str) or len(path.strip()) == 0:
                raise pyspark_error(PySparkValueError, "VALUE_NOT_NON_EMPTY_STR", {"arg_name": "path", "arg_value": str(path)})
            self._options["path"] = path
        name = self._format or self._session.spark.conf.get("spark.sql.sources.default", "parquet")
        return self._relation_frame(name, self._options, self._schema)

    def _relation_frame(self, name: str, options: dict[str, str],
                        user_schema: StructType | None) -> "StreamFrame":
        from microbatch.api.frame import StreamFrame
        self._check_source_name(name)
        provider = lookup_source(name, self._session.spark)
        opts = CaseInsensitiveOptions(options)
        try:
            resolved = provider.resolve_schema(self._session.spark, opts, user_schema)
        except (ValueError, ArithmeticError) as e:
            if isinstance(e, IllegalArgumentException):
                raise
            raise IllegalArgumentException(f"{e} (source '{name}')") from e
        relation = StreamingRelation(name, opts, resolved, user_schema, provider,
                                     user_name=self._name)
        return StreamFrame.from_relation(self._session, relation)

    def _check_source_name(self, format_name: str) -> None:
        """Spark's rules: names only with source evolution on, and then on every source."""
        evolution = conf_bool(self._session.spark, SOURCE_EVOLUTION_CONF, False)
        if self._name is not None and not evolution:
            raise spark_internals.spark_error(
                "AnalysisException", "STREAMING_QUERY_EVOLUTION_ERROR.SOURCE_NAMING_NOT_SUPPORTED",
                name=self._name)
        if self._name is None and evolution:
            raise spark_internals.spark_error(
                "AnalysisException",
                "STREAMING_QUERY_EVOLUTION_ERROR.UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT",
                sourceInfo=f"Leaf position 0 - {format_name}")

    # -- PySpark's shortcuts: a str path, every reader option as a keyword ----------------
    def _file(self, fmt: str, path: Any, schema: Any = None, **options: Any) -> "StreamFrame":
        if schema is not None:
            self.schema(schema)
        self.options(**options)
        if not isinstance(path, str):
            raise _not_expected_type("path", "str", path)
        return self.format(fmt).load(path)

    def text(self, path: str, wholetext: bool = False, lineSep: str | None = None,
             **options: Any) -> "StreamFrame":
        return self._file("text", path, wholetext=wholetext, lineSep=lineSep, **options)

    def csv(self, path: str, schema: StructType | str | None = None, **options: Any) -> "StreamFrame":
        return self._file("csv", path, schema, **options)

    def json(self, path: str, schema: StructType | str | None = None, **options: Any) -> "StreamFrame":
        return self._file("json", path, schema, **options)

    def xml(self, path: str, rowTag: str | None = None, schema: StructType | str | None = None,
            **options: Any) -> "StreamFrame":
        return self._file("xml", path, schema, rowTag=rowTag, **options)

    def parquet(self, path: str, **options: Any) -> "StreamFrame":
        return self._file("parquet", path, **options)

    def orc(self, path: str, **options: Any) -> "StreamFrame":
        return self._file("orc", path, **options)

    # -- tables ---------------------------------------------------------------------------
    def table(self, tableName: str) -> "StreamFrame":
        """A stream of a catalog table's new files (Spark reads a file-based table as a
        file source on its location, with the table's schema, partition columns and
        options), or the stream behind a temporary view made with
        ``createOrReplaceTempView`` on a stream."""
        if not isinstance(tableName, str):
            raise _not_expected_type("tableName", "str", tableName)
        view = self._session._stream_view(tableName)
        if view is not None:
            return view
        return stream_of_table(self._session.spark, tableName, self._options, self._relation_frame)

    def changes(self, tableName: str) -> "StreamFrame":
        if not isinstance(tableName, str):
            raise _not_expected_type("tableName", "str", tableName)
        raise UnsupportedOperationError(
            f"Reading the change feed of table '{tableName}' needs a table format with a "
            "change log (Spark's DSv2 changelog tables), which microbatch does not read. Read "
            "the table's new files with readStream.table(...) instead.")
