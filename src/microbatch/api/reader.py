"""DataStreamReader: ``ss.readStream.format(...).option(...).load()``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from microbatch.errors import IllegalArgumentException, UnsupportedOperationError
from microbatch.plan.logical import StreamingRelation
from microbatch.sources import lookup_source
from microbatch.util import CaseInsensitiveOptions, option_value

if TYPE_CHECKING:
    from microbatch.api.frame import StreamFrame
    from microbatch.api.session import StreamingSession


class DataStreamReader:
    def __init__(self, session: "StreamingSession"):
        self._session = session
        self._format: str | None = None
        self._schema: StructType | None = None
        self._options: dict[str, str] = {}

    def format(self, source: str) -> "DataStreamReader":
        self._format = source
        return self

    def option(self, key: str, value: Any) -> "DataStreamReader":
        self._options[key] = option_value(value)
        return self

    def options(self, **options: Any) -> "DataStreamReader":
        for k, v in options.items():
            self.option(k, v)
        return self

    def schema(self, schema: StructType | str) -> "DataStreamReader":
        if isinstance(schema, str):
            try:
                schema = StructType.fromDDL(schema)
            except Exception as e:
                raise IllegalArgumentException(
                    f"Cannot parse the schema '{schema}': {e}. Give a DDL string such as "
                    "'id INT, name STRING' or a StructType.") from e
        if not isinstance(schema, StructType):
            raise TypeError(f"schema should be a StructType or a DDL string, got {type(schema).__name__}")
        self._schema = schema
        return self

    def load(self, path: str | None = None, format: str | None = None,
             schema: StructType | str | None = None, **options: Any) -> "StreamFrame":
        from microbatch.api.frame import StreamFrame

        if format is not None:
            self.format(format)
        if schema is not None:
            self.schema(schema)
        self.options(**options)
        if path is not None:
            self._options["path"] = path
        name = self._format or self._session.spark.conf.get("spark.sql.sources.default", "parquet")
        provider = lookup_source(name)
        opts = CaseInsensitiveOptions(self._options)
        try:
            resolved = provider.resolve_schema(self._session.spark, opts, self._schema)
        except (ValueError, ArithmeticError) as e:
            if isinstance(e, IllegalArgumentException):
                raise
            raise IllegalArgumentException(f"{e} (source '{name}')") from e
        relation = StreamingRelation(name, opts, resolved, self._schema, provider)
        return StreamFrame.from_relation(self._session, relation)

    def _file(self, fmt: str, path: str, **options: Any) -> "StreamFrame":
        # PySpark's shortcuts take every reader option as a keyword defaulting to None
        return self.format(fmt).load(path, **{k: v for k, v in options.items() if v is not None})

    def text(self, path: str, **options: Any) -> "StreamFrame":
        return self._file("text", path, **options)

    def csv(self, path: str, schema: StructType | str | None = None, **options: Any) -> "StreamFrame":
        if schema is not None:
            self.schema(schema)
        return self._file("csv", path, **options)

    def json(self, path: str, schema: StructType | str | None = None, **options: Any) -> "StreamFrame":
        if schema is not None:
            self.schema(schema)
        return self._file("json", path, **options)

    def parquet(self, path: str, **options: Any) -> "StreamFrame":
        return self._file("parquet", path, **options)

    def orc(self, path: str, **options: Any) -> "StreamFrame":
        return self._file("orc", path, **options)

    def table(self, tableName: str) -> "StreamFrame":
        raise UnsupportedOperationError(
            f"Reading table '{tableName}' as a stream is not supported by microbatch yet; "
            "use a source format such as 'rate' or 'rate-micro-batch'.")
