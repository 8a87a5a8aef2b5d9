"""What a batch measured, read once its sink ran: the rows each source gave
(``numInputRows``) and the batch's observations (``Observation``).

A source's rows are counted, cheapest first: the source knows them up front
(``Source.num_rows``: a range's, a Kafka offset range's); or they are the file scans'
own ``numOutputRows`` in the sink's executions (``spark_internals.ScanRowCounter``), after
the filters Spark's engine pushes into those scans (``runtime.scan_filters``), as many times
as Spark's engine's plan scans the source (``runtime.engine_scans``); or
an ``Observation`` of the source's DataFrame counts them (a node that stops Spark's code
generation).

Spark fills an ``Observation`` when a SQL action that ran it ends (through a listener,
so it may lag the action a little). An RDD action (``foreach``, ``noop``'s run of the
batch, ``foreachPartition`` in ``foreachBatch``) never fills it: its metrics are then read
from the batch DataFrame's own executed plan, which that action ran. The sink says which
it does (``Sink.reads_batch_through``).
"""
from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from microbatch import spark_internals
from microbatch.runtime.engine_scans import EngineScans
from microbatch.sinks.base import READS_RDD, READS_SQL, Sink
from microbatch.sources.base import Source

log = logging.getLogger(__name__)


class BatchMetrics:
    """The counting of one run's batches: per batch, ``input`` for each source's DataFrame,
    ``sink_starts`` and ``sink_ended`` around the sink, then ``input_rows`` and
    ``observed``."""

    def __init__(self, session: SparkSession, sink: Sink):
        self.session = session
        self.sink = sink
        self.batch_df: DataFrame | None = None     # the batch's DataFrame, once made
        self._scan_counter: spark_internals.ScanRowCounter | None = None
        self._scan_counting_failed = False
        self._rows: dict[int, int] = {}
        self._observations: dict[int, Observation] = {}
        self._scanned: dict[int, dict] = {}        # sources counted from the sink's scans
        #: how many times Spark's engine's plan of a batch scans each source, where known
        #: (``runtime.engine_scans``, made once per run)
        self.engine_scans: EngineScans | None = None
        self._without_data: set[int] = set()       # the sources without data in the batch
        #: Spark before 4.1: the rows the sink's executions observed, by observation name
        #: (its ``Observation`` keeps a map, not the row)
        self._rows_in_executions = not spark_internals.observation_has_row()
        self._observed: dict[str, Any] = {}
        self._counted_by: dict[int, Any] = {}
        #: this batch runs a kept plan: its observations were filled by an earlier batch,
        #: so what it observed is read from the executions that ran it
        self.kept_plan = False
        self._collecting = False

    def start_batch(self) -> None:
        self._rows, self._observations, self._scanned, self._observed = {}, {}, {}, {}
        self._without_data = set()
        self._counted_by = {}
        self.kept_plan = False
        self.batch_df = None

    def no_input(self, i: int) -> None:
        """Source ``i`` gave no rows to this batch."""
        self._rows[i] = 0
        self._without_data.add(i)

    def input(self, i: int, source: Source, start: Any, end: Any, df: DataFrame) -> DataFrame:
        """Source ``i``'s DataFrame of this batch, set up to count its rows."""
        count = source.num_rows(start, end)
        if count is not None:
            self._rows[i] = count
        elif (keys := self._scan_keys(df)) is not None:
            self._scanned[i] = keys
        else:
            self._observations[i] = Observation(f"microbatch_input_{i}")
            df = df.observe(self._observations[i], F.count(F.lit(1)).alias("rows"))
        return df

    def input_counted_by(self, i: int, rows: Any) -> None:
        """Source ``i``'s rows are what ``rows()`` says once the sink ran (a kept batch
        frame counts its own: ``BoundBatch.rows``)."""
        self._counted_by[i] = rows

    def _scan_keys(self, df: DataFrame) -> dict | None:
        """How to find ``df``'s scans in the sink's executions, if its rows can be counted
        there; None: count them with an Observation."""
        if self._scan_counting_failed:
            return None
        try:
            if self._scan_counter is None:
                self._scan_counter = spark_internals.ScanRowCounter(self.session)
            return self._scan_counter.input_keys(df)
        except Exception:  # a Spark without these internals: count another way
            log.warning("Cannot count input rows from the scans' metrics; counting them "
                        "with an Observation instead", exc_info=True)
            self._scan_counting_failed = True
            return None

    def _observed_in_executions(self) -> bool:
        return self._rows_in_executions or self.kept_plan

    def sink_starts(self) -> None:
        self._collecting = (self._scanned or self._observed_in_executions()) \
            and self.sink.reads_batch_through != READS_RDD
        if self._collecting:
            if self._scan_counter is None:
                self._scan_counter = spark_internals.ScanRowCounter(self.session)
            self._scan_counter.start()

    def sink_ended(self) -> None:
        """Count what the sink's executions scanned (they ran the batch); before Spark 4.1,
        keep what they observed."""
        self._rows.update({i: rows() for i, rows in self._counted_by.items()})
        if not (self._scanned or self._observed_in_executions()):
            return
        reads_through = self.sink.reads_batch_through
        executions = self._scan_counter.finish() if self._collecting else []
        if self._observed_in_executions():
            self._observed = spark_internals.observed_rows(executions)
        if not self._scanned:
            return
        if reads_through != READS_SQL:
            executions.append(spark_internals.query_execution(self.batch_df))
        engine_scans = self.engine_scans.of(frozenset(self._without_data)) if self.engine_scans else None
        self._rows.update(self._scan_counter.count(self._scanned, executions, engine_scans))

    def input_rows(self, i: int) -> int:
        """The rows source ``i`` gave the batch (0 where the sink never ran it)."""
        if i in self._observations:
            metrics = self.observed(self._observations[i])
            return int(metrics.get("rows", 0)) if metrics else 0
        return self._rows.get(i, 0)

    def observed_row(self, observation: Observation) -> Any:
        """The JVM row of an ``Observation`` of the batch, or None if the sink never ran
        the batch's DataFrame."""
        reads_through = self.sink.reads_batch_through
        if self._observed_in_executions() and observation._name in self._observed:
            return self._observed[observation._name]
        # (over Spark Connect every sink runs the batch by a DataFrame action, the noop
        # sink's and foreach's too, which fills the batch's observations)
        by_action = reads_through != READS_RDD or spark_internals.is_connect(self.batch_df)
        if by_action and not self._observed_in_executions():
            row = spark_internals.observation_row(observation, wait_s=0.5)
            if row is not None:
                return row
        if reads_through == READS_SQL or self.batch_df is None:
            return None
        try:
            return spark_internals.executed_observation_row(self.batch_df, observation._name)
        except Exception:  # a plan the sink never ran may not even plan
            log.debug("No observed metrics in the batch's own plan", exc_info=True)
            return None

    def observed(self, observation: Observation | None) -> dict | None:
        """The observed metrics as a dict (Spark's JSON of the row), or None."""
        row = None if observation is None else self.observed_row(observation)
        return None if row is None else spark_internals.row_json(row)

    def user_metrics(self, observations: dict[str, Observation]) -> dict[str, tuple[dict, Any]]:
        """The batch's ``observe(name, ...)`` metrics: per name, the row as Spark's JSON
        and as a Python ``Row`` (for progress and listener events)."""
        found = {}
        for name, observation in observations.items():
            row = self.observed_row(observation)
            if row is not None:
                found[name] = (spark_internals.row_json(row), spark_internals.python_row(row))
        return found

    def close(self) -> None:
        if self._scan_counter is not None:
            self._scan_counter.close()
