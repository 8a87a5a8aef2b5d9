"""``nexmark``: Nexmark's auction events as a replayable source (``generator.py`` says
which events, and how they match Nexmark's reference generator).

Options:

- ``eventsPerSecond`` (default 10000): the event-time rate, Nexmark's ``firstEventRate``:
  event ``k`` has the event time ``baseTime + floor(k' * 1e6 / eventsPerSecond) / 1000`` ms
  (``k'`` its Nexmark event number);
- ``baseTime`` (epoch milliseconds; default the wall clock when the query first starts),
  kept in the checkpoint (``sources/<i>/0``) so a restart or a re-run batch regenerates the
  same events;
- ``numEvents`` (default 0, no end): the stream ends after that many events;
- ``maxEventsPerTrigger``: at most that many events a batch;
- ``pacing``: ``none`` (default: as fast as the batches go) or ``wallClock`` (an event is
  available once the wall clock has passed its event time: the stream runs at
  ``eventsPerSecond`` in real time, for latency measurements);
- ``view``: ``events`` (default; Flink's ``datagen`` row: ``event_type`` 0/1/2 for
  person/auction/bid, one struct per type of which only the event's is set, and
  ``dateTime``), or ``person``, ``auction``, ``bid`` (the rows of one type, the columns of
  Flink's views of those names);
- ``numPartitions`` (default: Spark's default parallelism).

The offset is ``{"events": N}``: the number of events before it. A batch's events are
generated in Spark tasks (``mapInArrow`` over chunks of event numbers), each a function
of its number only.
"""
from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.checkpoint.metadata_log import MetadataLog, parse_version
from microbatch.errors import AnalysisException
from microbatch.sources.base import (BoundBatch, ReadAllAvailable, ReadLimit, ReadMaxRows, RowsRead, Source, SourceContext,
                                     SourceProvider)
from microbatch.sources.nexmark.generator import VIEW_SCHEMAS, NexmarkConfig, generate
from microbatch.util import CaseInsensitiveOptions

#: events a task generates at a time (one Arrow batch)
CHUNK_EVENTS = 65_536
VIEWS = ("events", "person", "auction", "bid")
PACINGS = ("none", "wallclock")


@functools.lru_cache(maxsize=None)
def spark_schema(view: str) -> StructType:
    """The Spark schema of ``view`` (Arrow's, with timestamps as ``TIMESTAMP``)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    return from_arrow_schema(VIEW_SCHEMAS[view])


def _events(offset: Any) -> int:
    try:
        return int(offset["events"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"The offset {offset!r} is not a nexmark offset ({{\"events\":N}}); "
                         "was the checkpoint written by another query?") from None


class _BaseTimeLog(MetadataLog[int]):
    def serialize(self, metadata: int) -> str:
        return f"v1\n{metadata}"

    def deserialize(self, text: str, path: str) -> int:
        head, _, body = text.partition("\n")
        parse_version(head, 1, path)
        return int(body.strip())


@dataclass(frozen=True)
class GenerateTask:
    """A task's part of a batch: each input row is a chunk number; yields the chunk's events."""
    config: NexmarkConfig
    first: int
    end: int
    view: str
    chunk_events: int = CHUNK_EVENTS

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for chunk in batch.column(0).to_pylist():
                start = self.first + chunk * self.chunk_events
                yield generate(self.config, start, min(start + self.chunk_events, self.end), self.view)


@dataclass(frozen=True)
class BoundGenerateTask:
    """A kept batch plan's task: like ``GenerateTask``, with the batch's first and end
    event and chunk size read from the local property ``key`` (JSON ``[first, end,
    size]``), and the rows it made added to the accumulator ``rows``."""
    config: NexmarkConfig
    view: str
    key: str
    rows: Any

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import json

        from pyspark import TaskContext
        first, end, size = json.loads(TaskContext.get().getLocalProperty(self.key))
        made = 0
        try:
            for batch in batches:
                for chunk in batch.column(0).to_pylist():
                    start = first + chunk * size
                    events = generate(self.config, start, min(start + size, end), self.view)
                    made += events.num_rows
                    yield events
        finally:        # (also when the plan above stops reading early, as a limit does)
            self.rows.add(made)


def _chunks(first: int, end: int, partitions: int) -> tuple[int, int]:
    """(chunks, events a chunk) of events ``first`` .. ``end - 1``: chunks of at most
    ``CHUNK_EVENTS``, at least one a task of ``partitions``."""
    chunks = max(min(partitions, end - first), -(-(end - first) // CHUNK_EVENTS))
    size = -(-(end - first) // chunks)
    return -(-(end - first) // size), size


def generated(spark, config: NexmarkConfig, first: int, end: int, view: str, partitions: int) -> DataFrame:
    """Events ``first`` .. ``end - 1`` of ``view``, generated in up to ``partitions`` Spark
    tasks (chunks of at most ``CHUNK_EVENTS``, at least one a task)."""
    chunks, size = _chunks(first, end, partitions)
    task = GenerateTask(config, first, end, view, size)
    return spark.range(0, chunks, 1, min(partitions, chunks)).mapInArrow(task, spark_schema(view))


class NexmarkSource(Source):
    supports_available_now = True

    def __init__(self, context: SourceContext, config: NexmarkConfig, view: str, num_events: int,
                 max_per_trigger: int | None, pacing: str, num_partitions: int):
        self._spark = context.spark
        self._clock = context.clock
        self.view, self.num_events, self.pacing = view, num_events, pacing
        self.max_per_trigger, self.num_partitions = max_per_trigger, num_partitions
        log = _BaseTimeLog(context.metadata_path, context.fs)
        recorded = log.get(0)
        if recorded is None:
            recorded = config.base_time_ms if config.base_time_ms >= 0 else self._clock.get_time_millis()
            log.add(0, recorded)
        self.config = NexmarkConfig(**{**config.__dict__, "base_time_ms": recorded})
        self._available_now_target: int | None = None   # Trigger.AvailableNow: what existed at start
        self._bound_key = f"microbatch.nexmark.{uuid.uuid4().hex}"   # (a kept plan's local property)
        self._bound_rows = RowsRead()

    @property
    def schema(self) -> StructType:
        return spark_schema(self.view)

    def initial_offset(self) -> Any:
        return {"events": 0}

    def default_read_limit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepare_for_trigger_available_now(self) -> None:
        if self.num_events <= 0 and self.pacing != "wallclock":
            raise ValueError("The nexmark source has no end: Trigger.AvailableNow needs 'numEvents' "
                             "or 'pacing'='wallClock'.")
        self._available_now_target = self._available()

    def _available(self) -> int:
        """How many events exist now: all (up to ``numEvents``), or those whose event time
        the wall clock has passed."""
        end = self.num_events if self.num_events > 0 else 2**62
        if self.pacing == "wallclock":
            elapsed_us = (self._clock.get_time_millis() - self.config.base_time_ms) * 1000
            end = min(end, max(0, int(elapsed_us // self.config.inter_event_delay_us)))
        return end

    def latest_offset(self, start: Any, limit: ReadLimit) -> Any:
        first = _events(start) if start is not None else 0
        end = self._available() if self._available_now_target is None else self._available_now_target
        if isinstance(limit, ReadMaxRows):
            end = min(end, first + limit.rows)
        elif self.num_events <= 0 and self.pacing != "wallclock":
            raise ValueError("The nexmark source has no end and no pace: set 'maxEventsPerTrigger', "
                             "'numEvents' or 'pacing'='wallClock'.")
        return {"events": max(end, first)}

    def get_batch(self, start: Any, end: Any) -> DataFrame:
        first = _events(start) if start is not None else 0
        last = _events(end)
        if first > last:
            raise ValueError(f"start offset {start} is after end offset {end}")
        if first == last:
            return spark_internals.empty_batch(self._spark, self.schema)
        return generated(self._spark, self.config, first, last, self.view, self.num_partitions)

    def bound_batch(self, start: Any, end: Any) -> BoundBatch | None:
        """The batch as a kept frame: as ``generated``, with the batch's events from the
        local property (the frame of a number of chunks is the same for every batch of
        that many)."""
        first, last = (_events(start) if start is not None else 0), _events(end)
        if first >= last or spark_internals.is_connect(self._spark):
            return None
        chunks, size = _chunks(first, last, self.num_partitions)
        spark = self._spark

        def frame() -> DataFrame:
            task = BoundGenerateTask(self.config, self.view, self._bound_key, self._bound_rows.for_tasks(spark))
            return spark.range(0, chunks, 1, min(self.num_partitions, chunks)).mapInArrow(task, self.schema)
        return BoundBatch(("nexmark", chunks, min(self.num_partitions, chunks)), self._bound_key,
                          json.dumps([first, last, size]), frame, self._bound_rows.take)


    def num_rows(self, start: Any, end: Any) -> int | None:
        if self.view != "events":
            return None
        return _events(end) - (_events(start) if start is not None else 0)

    def __str__(self) -> str:
        return (f"NexmarkSource[view={self.view}, eventsPerSecond={self.config.events_per_second:g}, "
                f"numEvents={self.num_events}, pacing={self.pacing}]")


class NexmarkSourceProvider(SourceProvider):
    short_name = "nexmark"

    def _parse(self, options: CaseInsensitiveOptions, default_parallelism: int):
        rate = float(options["eventsPerSecond"]) if "eventsPerSecond" in options else 10_000.0
        if not rate > 0:
            raise ValueError(f"Invalid value '{options['eventsPerSecond']}'. The option 'eventsPerSecond' "
                             "must be positive")
        base_time = options.get_int("baseTime", -1)
        num_events = options.get_int("numEvents", 0)
        max_per_trigger = options.get_int("maxEventsPerTrigger", 0)
        if num_events < 0 or max_per_trigger < 0:
            raise ValueError("The options 'numEvents' and 'maxEventsPerTrigger' must not be negative")
        pacing = str(options["pacing"]).lower() if "pacing" in options else "none"
        if pacing not in PACINGS:
            raise ValueError(f"Invalid value '{options['pacing']}' for option 'pacing': use 'none' or 'wallClock'")
        view = str(options["view"]).lower() if "view" in options else "events"
        if view not in VIEWS:
            raise ValueError(f"Invalid value '{options['view']}' for option 'view': use one of {', '.join(VIEWS)}")
        num_partitions = options.get_int("numPartitions", default_parallelism)
        if num_partitions <= 0:
            raise ValueError(f"Invalid value '{num_partitions}'. The option 'numPartitions' must be positive")
        config = NexmarkConfig(base_time_ms=base_time, events_per_second=rate)
        return config, view, num_events, max_per_trigger or None, pacing, num_partitions

    def resolve_schema(self, spark, options, user_schema):
        if user_schema is not None:
            raise AnalysisException("The nexmark source does not support a user-specified schema: its schema "
                                    "is fixed by its 'view'. Remove the .schema(...) call.")
        return spark_schema(self._parse(options, 1)[1])

    def create(self, context, options, schema):
        return NexmarkSource(context, *self._parse(options, spark_internals.default_parallelism(context.spark)))
