"""``rate``: rows at a fixed rate per second, as Spark's rate source.

Options: ``rowsPerSecond`` (default 1), ``rampUpTime`` (default 0s),
``numPartitions`` (default: Spark's default parallelism). Schema
``timestamp TIMESTAMP, value BIGINT``. The offset is the number of whole seconds
since the source was first created; that creation time is kept in the
checkpoint (``sources/<i>/0``, text ``v1`` + milliseconds, Spark's format), so
every range of seconds maps to the same values and timestamps on every replay.
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from microbatch import spark_internals
from microbatch.checkpoint.metadata_log import MetadataLog, parse_version
from microbatch.errors import AnalysisException
from microbatch.sources.base import ReadLimit, Source, SourceContext, SourceProvider
from microbatch.util import CaseInsensitiveOptions, time_string_as_seconds

RATE_SCHEMA = StructType([StructField("timestamp", TimestampType(), True),
                          StructField("value", LongType(), True)])
LONG_MAX = 2**63 - 1


def reject_user_schema(name: str, user_schema: StructType | None) -> None:
    if user_schema is not None:
        raise AnalysisException(
            f"The {name} source does not support a user-specified schema: its schema is "
            f"fixed ({RATE_SCHEMA.simpleString()}). Remove the .schema(...) call.")


def value_at_second(seconds: int, rows_per_second: int, ramp_up_seconds: int) -> int:
    """The first value not yet emitted at ``seconds`` (Spark's valueAtSecond)."""
    speed_delta = rows_per_second // (ramp_up_seconds + 1)
    if seconds <= ramp_up_seconds:
        return (seconds * (seconds + 1) // 2) * speed_delta
    ramp_up_part = value_at_second(ramp_up_seconds, rows_per_second, ramp_up_seconds)
    return ramp_up_part + (seconds - ramp_up_seconds) * rows_per_second


class _CreationTimeLog(MetadataLog[int]):
    def serialize(self, metadata: int) -> str:
        return f"v1\n{metadata}"

    def deserialize(self, text: str, path: str) -> int:
        head, _, body = text.partition("\n")
        parse_version(head, 1, path)
        return int(body.strip())


class RateSource(Source):
    def __init__(self, context: SourceContext, rows_per_second: int, ramp_up_seconds: int,
                 num_partitions: int):
        self._spark = context.spark
        self._clock = context.clock
        self.rows_per_second = rows_per_second
        self.ramp_up_seconds = ramp_up_seconds
        self.num_partitions = num_partitions
        self._max_seconds = LONG_MAX // rows_per_second
        log = _CreationTimeLog(context.metadata_path, context.fs)
        created = log.get(0)
        if created is None:
            created = self._clock.get_time_millis()
            log.add(0, created)
        self.creation_time_ms = created
        self._last_time_ms = created

    @property
    def schema(self) -> StructType:
        return RATE_SCHEMA

    def initial_offset(self) -> Any:
        return 0

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        now = self._clock.get_time_millis()
        self._last_time_ms = max(self._last_time_ms, now)
        return (self._last_time_ms - self.creation_time_ms) // 1000

    def _range(self, start: Any, end: Any) -> tuple[int, int, int, int]:
        start_s, end_s = int(start or 0), int(end)
        if start_s > end_s:
            raise ValueError(f"startSeconds({start_s}) > endSeconds({end_s})")
        if end_s > self._max_seconds:
            raise ArithmeticError(
                f"Integer overflow. Max offset with {self.rows_per_second} rowsPerSecond is "
                f"{self._max_seconds}, but it's {end_s} now.")
        self._last_time_ms = max(self._last_time_ms, end_s * 1000 + self.creation_time_ms)
        return (start_s, end_s,
                value_at_second(start_s, self.rows_per_second, self.ramp_up_seconds),
                value_at_second(end_s, self.rows_per_second, self.ramp_up_seconds))

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        start_s, end_s, range_start, range_end = self._range(start, end)
        if range_start == range_end:
            return spark_internals.empty_batch(self._spark, RATE_SCHEMA)
        local_start_ms = self.creation_time_ms + start_s * 1000
        ms_per_value = float((end_s - start_s) * 1000) / (range_end - range_start)
        # Java's Math.round is floor(x + 0.5); the double arithmetic matches Spark's reader.
        relative = F.floor((F.col("id") - F.lit(range_start)).cast("double")
                           * F.lit(ms_per_value) + F.lit(0.5))
        return (self._spark.range(range_start, range_end, 1, self.num_partitions)
                .select(F.timestamp_millis(relative + F.lit(local_start_ms)).alias("timestamp"),
                        F.col("id").alias("value")))

    def num_rows(self, start: Any, end: Any) -> int | None:
        _, _, range_start, range_end = self._range(start, end)
        return range_end - range_start

    def __str__(self) -> str:
        return (f"RateStreamV2[rowsPerSecond={self.rows_per_second}, "
                f"rampUpTimeSeconds={self.ramp_up_seconds}, numPartitions={self.num_partitions}]")


class RateSourceProvider(SourceProvider):
    short_name = "rate"

    def _parse(self, options: CaseInsensitiveOptions, default_parallelism: int):
        rows_per_second = options.get_int("rowsPerSecond", 1)
        if rows_per_second <= 0:
            raise ValueError(
                f"Invalid value '{rows_per_second}'. The option 'rowsPerSecond' must be positive")
        ramp_up = time_string_as_seconds(options["rampUpTime"]) if "rampUpTime" in options else 0
        if ramp_up < 0:
            raise ValueError(
                f"Invalid value '{ramp_up}'. The option 'rampUpTime' must not be negative")
        if ramp_up > LONG_MAX // rows_per_second:
            raise ArithmeticError(
                f"Integer overflow. Max offset with {rows_per_second} rowsPerSecond is "
                f"{LONG_MAX // rows_per_second}, but 'rampUpTimeSeconds' is {ramp_up}.")
        num_partitions = options.get_int("numPartitions", default_parallelism)
        if num_partitions <= 0:
            raise ValueError(
                f"Invalid value '{num_partitions}'. The option 'numPartitions' must be positive")
        return rows_per_second, ramp_up, num_partitions

    def resolve_schema(self, spark, options, user_schema):
        reject_user_schema("rate", user_schema)
        self._parse(options, 1)
        return RATE_SCHEMA

    def create(self, context, options, schema):
        parallelism = spark_internals.default_parallelism(context.spark)
        return RateSource(context, *self._parse(options, parallelism))
