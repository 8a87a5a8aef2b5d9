"""Streaming sinks, one module each, found by their short name."""
from __future__ import annotations

from microbatch.errors import AnalysisException, UnsupportedOperationError
from microbatch.sinks.base import SinkProvider
from microbatch.sinks.console import ConsoleSinkProvider
from microbatch.sinks.file import PROVIDERS as FILE_SINK_PROVIDERS
from microbatch.sinks.foreach import ForeachSinkProvider
from microbatch.sinks.foreach_batch import ForeachBatchSinkProvider
from microbatch.sinks.kafka import KafkaSinkProvider
from microbatch.sinks.memory import MemorySinkProvider
from microbatch.sinks.noop import NoopSinkProvider

_PROVIDERS: dict[str, SinkProvider] = {}
_PLANNED = {"delta"}


def register_sink(provider: SinkProvider) -> None:
    """Make ``writeStream.format(provider.short_name)`` find ``provider``."""
    _PROVIDERS[provider.short_name.lower()] = provider


def lookup_sink(name: str, spark=None) -> SinkProvider:
    """A built-in sink, else a Python data source registered with ``spark``."""
    provider = _PROVIDERS.get(name.lower())
    if provider is not None:
        return provider
    if spark is not None:
        from microbatch.spark_internals import python_data_source
        data_source_class = python_data_source(spark, name)
        if data_source_class is not None:
            from microbatch.sinks.python_datasource import PythonDataSourceSinkProvider
            return PythonDataSourceSinkProvider(name, data_source_class)
    if name.lower() in _PLANNED:
        raise UnsupportedOperationError(
            f"The streaming sink '{name}' is not supported by microbatch yet. Available "
            f"sinks: {', '.join(sorted(_PROVIDERS))}.")
    raise AnalysisException(
        f"Failed to find the data source: {name}. Make sure the "
        "provider name is correct and the package is properly registered and compatible "
        f"with your Spark version. microbatch's sinks: {', '.join(sorted(_PROVIDERS))}.",
        "DATA_SOURCE_NOT_FOUND", {"provider": name})


for _provider in (ConsoleSinkProvider(), MemorySinkProvider(), ForeachBatchSinkProvider(),
                  ForeachSinkProvider(), NoopSinkProvider(), KafkaSinkProvider(), *FILE_SINK_PROVIDERS):
    register_sink(_provider)
