"""The source contract every streaming source implements.

Modelled on Spark's MicroBatchStream / PySpark's DataSourceStreamReader:

- ``initial_offset()``: where a new query starts.
- ``latest_offset(start, limit)``: the end of the next batch, reading from
  ``start`` and respecting ``limit`` (a ReadLimit); ``None`` when nothing exists.
- ``get_batch(start, end)``: a Spark DataFrame of the half-open range
  ``(start, end]``. It must return the same rows for the same range every time
  (replayable); a source that cannot says so in its docstring.
- ``commit(end)``: everything up to ``end`` is processed and may be forgotten.
- ``stop()``: release resources.
- ``bound_batch(start, end)``, optional: the batch as a DataFrame that does not change
  from batch to batch, whose tasks read the batch's range at run time from a Spark local
  property (``BoundBatch``). A stateless query whose every source offers one keeps its
  batch's DataFrame, planned once, and runs it again for each batch
  (``runtime.kept_plans``): Spark's analysis, optimisation
  and physical planning of the batch are not paid again.

Offsets are JSON values (numbers or objects) because they go to the offset log
as JSON text; a source never pickles anything into a checkpoint.

A ``SourceProvider`` is what ``readStream.format(name)`` finds: it validates the
options and works out the schema when ``load()`` is called, and creates the
Source when a query starts (the checkpoint's ``sources/<i>`` directory is only
known then).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.util import CaseInsensitiveOptions


class ReadLimit:
    """How much one batch may read (Spark's ReadLimit)."""


@dataclass(frozen=True)
class ReadAllAvailable(ReadLimit):
    pass


@dataclass(frozen=True)
class ReadMaxRows(ReadLimit):
    rows: int


@dataclass(frozen=True)
class ReadMinRows(ReadLimit):
    """At least ``rows`` new rows, unless ``max_trigger_delay_ms`` passed since the last batch."""
    rows: int
    max_trigger_delay_ms: int


@dataclass(frozen=True)
class CompositeReadLimit(ReadLimit):
    limits: tuple


@dataclass(frozen=True)
class ReadMaxFiles(ReadLimit):
    files: int


@dataclass(frozen=True)
class ReadMaxBytes(ReadLimit):
    bytes: int


ALL_AVAILABLE = ReadAllAvailable()


@dataclass(frozen=True)
class BoundBatch:
    """A batch of a source as a DataFrame kept across batches: ``frame()`` makes it (once
    for each ``shape``: batches of the same shape share it), and its tasks read this
    batch's range from the Spark local property ``key``, which the engine sets to
    ``value`` before the batch's jobs run. ``value`` is text (JSON): local properties go
    to every task of a job. ``rows()`` gives the rows the frame's tasks read since it was
    last asked (a kept frame cannot carry a new ``Observation`` each batch)."""
    shape: Any
    key: str
    value: str
    frame: Any                  # () -> DataFrame
    rows: Any                   # () -> int


class RowsRead:
    """What a source's kept frames read: an accumulator their tasks add to, made with the
    first frame (``for_tasks``); ``take()`` gives the rows since the last call (a
    ``BoundBatch.rows``)."""

    def __init__(self):
        self.accumulator: Any = None

    def for_tasks(self, spark: SparkSession) -> Any:
        if self.accumulator is None:
            self.accumulator = spark_internals.row_accumulator(spark)
        return self.accumulator

    def take(self) -> int:
        rows, self.accumulator.value = self.accumulator.value, 0
        return rows


class Source(ABC):
    """A replayable streaming source (see the module docstring for the contract)."""

    #: True when the source implements ``prepare_for_trigger_available_now`` itself;
    #: otherwise the engine pins the first latest offset it sees (as Spark's wrapper does).
    supports_available_now: bool = False

    @property
    @abstractmethod
    def schema(self) -> StructType: ...

    @abstractmethod
    def initial_offset(self) -> Any: ...

    @abstractmethod
    def latest_offset(self, start: Any, limit: ReadLimit) -> Any: ...

    @abstractmethod
    def get_batch(self, start: Any, end: Any) -> DataFrame: ...

    def default_read_limit(self) -> ReadLimit:
        return ALL_AVAILABLE

    def bound_batch(self, start: Any, end: Any) -> BoundBatch | None:
        """``(start, end]`` as a ``BoundBatch`` (see the module's docstring), or None: the
        engine then asks ``get_batch`` for a DataFrame of its own."""
        return None

    def num_rows(self, start: Any, end: Any) -> int | None:
        """Rows in ``(start, end]`` if the offsets tell it; None makes the engine count."""
        return None

    def report_latest_offset(self, latest: Any) -> Any:
        """What progress shows as ``latestOffset``. Spark shows the answer of sources
        without admission control and null for those with it (file, rate-micro-batch),
        unless they report one."""
        return latest

    def metrics(self, consumed: Any) -> dict[str, str]:
        """The progress ``metrics`` map of this source, given the batch's end offset
        (Spark's ReportsSourceMetrics); empty for most sources (Spark omits it then)."""
        return {}

    def prepare_for_trigger_available_now(self) -> None:  # noqa: B027 - a hook: most sources need nothing
        """Fix the end of the data an AvailableNow run will read."""

    def batch_committed(self, end: Any) -> None:  # noqa: B027 - a hook: most sources tell no one
        """The batch that read up to ``end`` is in the commit log (called too when a run
        resumes, with the last committed batch's end): a source may tell its system how far
        the query got (the Kafka source's ``commitOffsetsToGroup``), never to be read back
        as where the query stands."""

    def commit(self, end: Any) -> None:  # noqa: B027 - a hook: most sources keep nothing to drop
        pass

    def batches_expose_hidden_columns(self) -> bool:
        """Whether each batch is a relation whose hidden columns (a file source's
        ``_metadata``) a segment's binding exposes, as Spark's file relations have them. A
        source whose batches are not carries them in a last column of their own once asked
        (``carry_hidden_columns``)."""
        return True

    def carry_hidden_columns(self) -> None:
        """From now on give each batch with data the source's hidden columns in a last
        column, ``spark_internals.CARRIED_METADATA`` (the planner asks where the query's
        steps read them); refuse, naming why, where the source cannot."""
        raise NotImplementedError(f"{type(self).__name__} exposes its batches' hidden columns itself")

    def real_time_read(self, start: Any, max_tasks: int | None = None) -> Any:
        """Real-time mode (``runtime.real_time``): a ``RealTimeRead`` from ``start`` whose
        tasks (at most ``max_tasks``; None: the cluster's cores) read records as they arrive
        until the batch's deadline and report where they got. None: the source has no
        real-time reader (Spark's INPUT_STREAM_NOT_SUPPORTED)."""
        return None

    def stop(self) -> None:  # noqa: B027 - a hook: most sources hold nothing to release
        pass

    def __str__(self) -> str:
        return type(self).__name__


@dataclass
class SourceContext:
    """What a source gets when a query starts."""

    spark: SparkSession
    metadata_path: str          # <checkpoint>/sources/<i>
    fs: CheckpointFileSystem
    clock: Any                  # execution.clock.Clock


class SourceProvider(ABC):
    """Found by ``readStream.format(short_name)``."""

    short_name: str = ""
    #: Spark's engine reads the source as a (v1) ``Source``: MicroBatchExecution puts each of
    #: its batches under a projection that aliases the batch relation's columns to the
    #: stream's (a v2 stream's relation has the stream's columns itself), on which depends
    #: whether Spark's optimizer reuses the exchange of a stream read in two places, and so
    #: its ``numInputRows`` (``runtime.engine_scans``)
    spark_v1_source: bool = False
    #: runs over Spark Connect whatever its name (``plan.checks.check_runs_over_connect``)
    runs_over_connect: bool = False

    @abstractmethod
    def resolve_schema(self, spark: SparkSession, options: CaseInsensitiveOptions,
                       user_schema: StructType | None) -> StructType:
        """Validate options and return the stream's schema (called by ``load()``)."""

    @abstractmethod
    def create(self, context: SourceContext, options: CaseInsensitiveOptions,
               schema: StructType) -> Source:
        """Create the source for one run of a query."""

    def empty_batch(self, spark: SparkSession, options: CaseInsensitiveOptions,
                    schema: StructType) -> DataFrame:
        """A batch of no rows of this source: the stream's template, a batch in which the
        source has nothing new, and the placeholder a prepared segment is analysed over.
        A source whose relation has hidden columns (the file source's ``_metadata``) gives
        a relation that has them, so they resolve wherever its batches are read."""
        return spark_internals.empty_batch(spark, schema)
