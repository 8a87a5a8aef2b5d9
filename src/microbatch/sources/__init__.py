"""Streaming sources, one module each, found by their short name."""
from __future__ import annotations

from microbatch.errors import AnalysisException, UnsupportedOperationError
from microbatch.sources.base import SourceProvider
from microbatch.sources.file import PROVIDERS as FILE_SOURCE_PROVIDERS
from microbatch.sources.kafka import KafkaSourceProvider
from microbatch.sources.rate import RateSourceProvider
from microbatch.sources.rate_micro_batch import RateMicroBatchSourceProvider

_PROVIDERS: dict[str, SourceProvider] = {}
_PLANNED = {"socket", "delta"}


def register_source(provider: SourceProvider) -> None:
    """Make ``readStream.format(provider.short_name)`` find ``provider``."""
    _PROVIDERS[provider.short_name.lower()] = provider


def lookup_source(name: str, spark=None) -> SourceProvider:
    """A built-in source, else a Python data source registered with ``spark``."""
    provider = _PROVIDERS.get(name.lower())
    if provider is not None:
        return provider
    if spark is not None:
        from microbatch.spark_internals import python_data_source
        data_source_class = python_data_source(spark, name)
        if data_source_class is not None:
            from microbatch.sources.python_datasource import PythonDataSourceProvider
            return PythonDataSourceProvider(name, data_source_class)
    if name.lower() in _PLANNED:
        raise UnsupportedOperationError(
            f"The streaming source '{name}' is not supported by microbatch yet. Available "
            f"sources: {', '.join(sorted(_PROVIDERS))}, and MemoryStream for tests.")
    raise AnalysisException(
        f"Failed to find the data source: {name}. Make sure the "
        "provider name is correct and the package is properly registered and compatible "
        f"with your Spark version. microbatch knows: {', '.join(sorted(_PROVIDERS))}.",
        "DATA_SOURCE_NOT_FOUND", {"provider": name})


for _provider in (RateSourceProvider(), RateMicroBatchSourceProvider(), KafkaSourceProvider(),
                  *FILE_SOURCE_PROVIDERS):
    register_source(_provider)
