"""``rate-micro-batch``: a fixed number of rows per batch, as Spark's source of that name.

Options: ``rowsPerBatch`` (required, > 0), ``numPartitions`` (default: Spark's
default parallelism), ``startTimestamp`` (default 0), ``advanceMillisPerBatch``
(default 1000). Batch k holds values ``[k*rowsPerBatch, (k+1)*rowsPerBatch)``, all
with the timestamp of the batch's start offset, however the query is triggered.
Offset JSON ``{"offset":N,"timestamp":T}``, Spark's.
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.sources.base import ReadLimit, Source, SourceContext, SourceProvider
from microbatch.sources.rate import LONG_MAX, RATE_SCHEMA, reject_user_schema
from microbatch.util import CaseInsensitiveOptions


def _offset(value: Any) -> tuple[int, int]:
    try:
        return int(value["offset"]), int(value["timestamp"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(
            f"The offset {value!r} is not a rate-micro-batch offset "
            '({"offset":N,"timestamp":T}); was the checkpoint written by another query?') from None


class RateMicroBatchSource(Source):
    supports_available_now = True

    def __init__(self, context: SourceContext, rows_per_batch: int, num_partitions: int,
                 start_timestamp: int, advance_ms_per_batch: int):
        self._spark = context.spark
        self.rows_per_batch = rows_per_batch
        self.num_partitions = num_partitions
        self.start_timestamp = start_timestamp
        self.advance_ms_per_batch = advance_ms_per_batch
        self._available_now = False
        self._available_now_end: Any = None
        self._batches: spark_internals.RangeBatches | None = None   # made at the first batch

    @property
    def schema(self) -> StructType:
        return RATE_SCHEMA

    def initial_offset(self) -> Any:
        return {"offset": 0, "timestamp": self.start_timestamp}

    def report_latest_offset(self, latest: Any) -> Any:
        return None  # as Spark's (admission control, no reportLatestOffset)

    def prepare_for_trigger_available_now(self) -> None:
        self._available_now = True

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        # Like Spark: one batch's worth per call whatever the limit, and for
        # AvailableNow exactly one batch (the first answer is pinned).
        if self._available_now and self._available_now_end is not None:
            return self._available_now_end
        offset, timestamp = _offset(start)
        end = {"offset": min(offset + self.rows_per_batch, LONG_MAX),
               "timestamp": timestamp + self.advance_ms_per_batch}
        if self._available_now:
            self._available_now_end = end
        return end

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        start_offset, start_ts = _offset(start if start is not None else self.initial_offset())
        end_offset, end_ts = _offset(end)
        if start_offset > end_offset or start_ts > end_ts:
            raise ValueError(f"start offset {start} is after end offset {end}")
        if start_offset == end_offset:
            return spark_internals.empty_batch(self._spark, RATE_SCHEMA)
        if self._batches is None:
            self._batches = spark_internals.RangeBatches(self._spark, self.num_partitions)
        return self._batches.dataframe(start_offset, end_offset, start_ts)

    def num_rows(self, start: Any, end: Any) -> int | None:
        start_offset, _ = _offset(start if start is not None else self.initial_offset())
        return _offset(end)[0] - start_offset

    def __str__(self) -> str:
        return (f"RatePerMicroBatchStream[rowsPerBatch={self.rows_per_batch}, "
                f"numPartitions={self.num_partitions}, startTimestamp={self.start_timestamp}, "
                f"advanceMsPerBatch={self.advance_ms_per_batch}]")


class RateMicroBatchSourceProvider(SourceProvider):
    short_name = "rate-micro-batch"

    def _parse(self, options: CaseInsensitiveOptions, default_parallelism: int):
        rows_per_batch = options.get_int("rowsPerBatch", 0)
        if rows_per_batch <= 0:
            raise ValueError(
                f"Invalid value '{rows_per_batch}'. The option 'rowsPerBatch' must be positive")
        num_partitions = options.get_int("numPartitions", default_parallelism)
        if num_partitions <= 0:
            raise ValueError(
                f"Invalid value '{num_partitions}'. The option 'numPartitions' must be positive")
        start_timestamp = options.get_int("startTimestamp", 0)
        if start_timestamp < 0:
            raise ValueError(f"Invalid value '{start_timestamp}'. The option 'startTimestamp' "
                             "must be non-negative")
        advance = options.get_int("advanceMillisPerBatch", 1000)
        if advance < 0:
            raise ValueError(f"Invalid value '{advance}'. The option 'advanceMillisPerBatch' "
                             "must be non-negative")
        return rows_per_batch, num_partitions, start_timestamp, advance

    def resolve_schema(self, spark, options, user_schema):
        reject_user_schema("rate-micro-batch", user_schema)
        self._parse(options, 1)
        return RATE_SCHEMA

    def create(self, context, options, schema):
        parallelism = context.spark.sparkContext.defaultParallelism
        return RateMicroBatchSource(context, *self._parse(options, parallelism))
