"""The sink contract.

``add_batch(batch_id, df)`` writes one batch. The engine may call it again with
a batch id it already gave (a batch re-run after a crash before ``commits/N``
was written); each sink's docstring states what it guarantees then.

A ``SinkProvider`` is what ``writeStream.format(name)`` finds; it validates the
options at ``start()`` and creates the sink.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from microbatch.checkpoint.fs import LOCAL, CheckpointFileSystem
from microbatch.util import CaseInsensitiveOptions


READS_SQL, READS_RDD, READS_ANY = "sql", "rdd", "any"


class Sink(ABC):
    @abstractmethod
    def add_batch(self, batch_id: int, df: DataFrame) -> None: ...

    #: rows written by the last batch, or -1 when the sink does not know (Spark's numOutputRows)
    last_num_output_rows: int = -1

    #: How the sink reads the batch's DataFrame, which tells the engine where to find the
    #: executions whose scans count the batch's input rows (spark_internals/metrics.py):
    #: ``READS_SQL``: only through Spark SQL actions (``df.write``, ``collect``, ``show``),
    #: whose executed plans reach a query execution listener; ``READS_RDD``: only through
    #: its RDD (``foreachPartition``), which runs the DataFrame's own executed plan;
    #: ``READS_ANY`` (the default, e.g. user code): either, so the engine looks at both.
    reads_batch_through: str = READS_ANY

    #: Whether the sink may be given the same DataFrame object for several batches (a plan
    #: kept across batches, ``runtime.kept_plans``), each run binding that batch's inputs:
    #: it runs it through that object's own plan each time (or through a DataFrame it
    #: derived from it once and keeps), so Spark plans it once. Off by default: user code
    #: (``foreachBatch``) or a sink that caches a batch must get a DataFrame of its own.
    runs_kept_plans: bool = False

    def progress_metrics(self) -> dict[str, str]:
        """Extra figures for the progress ``sink.metrics`` map (Spark omits it when empty)."""
        return {}

    def report_progress(self, progress: Any) -> None:  # noqa: B027 - a hook: most sinks show nothing
        """The engine gives the sink each batch's progress (PySpark's
        ``StreamingQueryProgress``) once the batch is committed: the console sink shows it."""

    def real_time_writer(self, df: DataFrame, batch_id: int, query_id: str) -> Any:
        """Real-time mode (``runtime.real_time``): ``(columns, write)``, the DataFrame of the
        columns the sink takes from the query's output ``df`` and a picklable ``write``
        that a task calls with an iterator of Arrow batches of them, which it writes as they
        come, answering ``(rows written, rows skipped)`` once the iterator ends. Before it
        reads, a task asks ``write.written_before()``: the records a crashed run of the batch
        wrote (skipped) and, per input partition, the offset to read past before the batch
        may end; with ``write.wants_positions`` each batch carries its rows' input positions
        in a last column (``kafka.sink.SOURCE_POSITION``). None: the sink does not write row
        by row (Spark's allowlist refuses it). A sink that shows a batch's rows at its end
        (the console) answers a third item, the rows as Arrow IPC bytes, which the driver
        hands to ``real_time_batch_ended``."""
        return None

    def real_time_batch_ended(self, batch_id: int, answered: list) -> None:  # noqa: B027 - a hook
        """Real-time mode: the batch's tasks ended; ``answered``: each task's rows (Arrow IPC
        bytes, or None), for a sink whose writer answers them (``real_time_writer``)."""

    def stop(self) -> None:  # noqa: B027 - a hook: most sinks hold nothing to release
        pass

    def __str__(self) -> str:
        return type(self).__name__


@dataclass
class SinkContext:
    spark: SparkSession             # the user's session (temp views go there)
    options: CaseInsensitiveOptions
    output_mode: str
    schema: StructType
    query_name: str | None
    partition_by: list[str]
    extra: dict[str, Any]           # foreach / foreachBatch functions
    fs: CheckpointFileSystem = LOCAL  # for logs a sink keeps (the file sink's _spark_metadata)
    checkpoint_root: str | None = None  # the query's checkpoint, for a sink's own records there


class SinkProvider(ABC):
    short_name: str = ""
    #: a query without a checkpoint location may use a temporary one (console, memory, ...)
    allows_temporary_checkpoint: bool = False
    #: runs over Spark Connect whatever its name (``plan.checks.check_runs_over_connect``)
    runs_over_connect: bool = False

    @abstractmethod
    def create(self, context: SinkContext) -> Sink: ...
