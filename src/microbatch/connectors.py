"""The one registry of sources and sinks: what ``readStream.format(name)`` and
``writeStream.format(name)`` find. A name no built-in connector has is looked up among the
Python data sources registered with the session (``spark.dataSource.register``)."""
from __future__ import annotations

from typing import Any

from microbatch import spark_internals
from microbatch.errors import AnalysisException, UnsupportedOperationError
from microbatch.kafka.sink import KafkaSinkProvider
from microbatch.kafka.source import KafkaSourceProvider
from microbatch.sinks.base import SinkProvider
from microbatch.sinks.console import ConsoleSinkProvider
from microbatch.sinks.delta import DeltaSinkProvider
from microbatch.sinks.file import PROVIDERS as FILE_SINK_PROVIDERS
from microbatch.sinks.foreach import ForeachSinkProvider
from microbatch.sinks.iceberg import IcebergSinkProvider
from microbatch.sinks.foreach_batch import ForeachBatchSinkProvider
from microbatch.sinks.memory import MemorySinkProvider
from microbatch.sinks.noop import NoopSinkProvider
from microbatch.sources.base import SourceProvider
from microbatch.sources.delta import DeltaSourceProvider
from microbatch.sources.iceberg import IcebergSourceProvider
from microbatch.sources.file import PROVIDERS as FILE_SOURCE_PROVIDERS
from microbatch.sources.http import HttpIngestSourceProvider
from microbatch.sources.rate import RateSourceProvider
from microbatch.sources.nexmark.source import NexmarkSourceProvider
from microbatch.sources.rate_micro_batch import RateMicroBatchSourceProvider
from microbatch.sources.socket import TextSocketSourceProvider


class _Registry:
    """Providers of one kind (sources or sinks) by lower-case short name."""

    def __init__(self, kind: str, planned: set[str], python_provider, listed_as: str):
        self.kind = kind
        self.listed_as = listed_as   # the words before the list of names in an error
        self.providers: dict[str, Any] = {}
        self.planned = planned
        self.python_provider = python_provider   # (name, data source class) -> provider

    def register(self, provider) -> None:
        self.providers[provider.short_name.lower()] = provider

    def lookup(self, name: str, spark=None):
        provider = self.providers.get(name.lower())
        if provider is not None:
            return provider
        if spark is not None:
            data_source_class = spark_internals.python_data_source(spark, name)
            if data_source_class is not None:
                return self.python_provider(name, data_source_class)
        known = ", ".join(sorted(self.providers))
        if name.lower() in self.planned:
            raise UnsupportedOperationError(
                f"The streaming {self.kind} '{name}' is not supported by microbatch yet. Available "
                f"{self.kind}s: {known}" + (", and MemoryStream for tests." if self.kind == "source" else "."))
        raise AnalysisException(
            f"Failed to find the data source: {name}. Make sure the "
            "provider name is correct and the package is properly registered and compatible "
            f"with your Spark version. {self.listed_as}: {known}.",
            "DATA_SOURCE_NOT_FOUND", {"provider": name})


def _python_source(name: str, data_source_class: type) -> SourceProvider:
    from microbatch.python_datasource.source import PythonDataSourceProvider
    return PythonDataSourceProvider(name, data_source_class)


def _python_sink(name: str, data_source_class: type) -> SinkProvider:
    from microbatch.python_datasource.sink import PythonDataSourceSinkProvider
    return PythonDataSourceSinkProvider(name, data_source_class)


_SOURCES = _Registry("source", set(), _python_source, "microbatch knows")
_SINKS = _Registry("sink", set(), _python_sink, "microbatch's sinks")


def register_source(provider: SourceProvider) -> None:
    """Make ``readStream.format(provider.short_name)`` find ``provider``."""
    _SOURCES.register(provider)


def register_sink(provider: SinkProvider) -> None:
    """Make ``writeStream.format(provider.short_name)`` find ``provider``."""
    _SINKS.register(provider)


def lookup_source(name: str, spark=None) -> SourceProvider:
    """A built-in source, else a Python data source registered with ``spark``."""
    return _SOURCES.lookup(name, spark)


def lookup_sink(name: str, spark=None) -> SinkProvider:
    """A built-in sink, else a Python data source registered with ``spark``."""
    return _SINKS.lookup(name, spark)


for _source in (RateSourceProvider(), RateMicroBatchSourceProvider(), NexmarkSourceProvider(), KafkaSourceProvider(),
                DeltaSourceProvider(), IcebergSourceProvider(), TextSocketSourceProvider(),
                HttpIngestSourceProvider(), *FILE_SOURCE_PROVIDERS):
    register_source(_source)
for _sink in (ConsoleSinkProvider(), MemorySinkProvider(), ForeachBatchSinkProvider(),
              ForeachSinkProvider(), NoopSinkProvider(), KafkaSinkProvider(), DeltaSinkProvider(),
              IcebergSinkProvider(), *FILE_SINK_PROVIDERS):
    register_sink(_sink)
