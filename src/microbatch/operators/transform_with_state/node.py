"""A transformWithState's plan node: the user's processor and its state variables, and its policy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.operators.pandas_groups import opaque_stand_in
from microbatch.operators.transform_with_state.step import TransformWithStateStep
from microbatch.plan.logical import PlanNode, StatefulNode, Watermark
from microbatch.state.store import SPARK_ROCKSDB_PROVIDER


@dataclass(eq=False)
class TransformWithState(StatefulNode):
    """``groupBy(keys).transformWithStateInPandas(processor, ...)`` and
    ``transformWithState`` (Spark's TransformWithStateInPandasExec): the user's
    ``StatefulProcessor`` per key, over the key's rows of the batch and its state variables,
    with timers in processing or event time (``operators.transform_with_state``)."""

    template_hides_input = True     # (its template is a relation of its output)
    child: PlanNode
    keys: tuple[str, ...]
    processor: Any                         # the user's StatefulProcessor
    output_schema: StructType
    output_mode: str                       # append or update
    time_mode: str                         # none, processingtime or eventtime
    variables: tuple                       # StateVariable, as the processor's init declares them
    rows_api: bool = False                 # transformWithState: Rows in and out
    initial_state: Any = None              # a DataFrame of initial state, read in the query's first batch
    initial_keys: tuple[str, ...] = ()     # the columns it is grouped by
    data_columns: int | None = None        # the input's leading columns the processor gets (None: all)
    event_time_column: str | None = None   # eventTimeColumnName: the output's watermarked column
    late_rows_column: str | None = None    # the input's event time, as Spark's exec finds it (api.frame)

    def event_time_delay_ms(self) -> int:
        """The delay of the watermark nearest below (Spark's UpdateEventTimeWatermarkColumn
        copies it onto ``event_time_column``)."""
        return next(n.delay_ms for n in self.child.nodes() if isinstance(n, Watermark))

    def output_watermarked(self) -> bool:
        """Whether operators above see a watermark out of this one: Spark passes its input
        watermark on, except in processing time."""
        return self.time_mode != "processingtime"

    # -- its policy (plan.logical.StatefulNode) ----------------------------------------------
    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> TransformWithStateStep:
        return TransformWithStateStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        return shuffle_partitions

    def output_watermark_ms(self, input_ms: int) -> int | None:
        return input_ms if self.output_watermarked() else None

    def output_marks_event_time(self) -> bool:
        return self.output_watermarked()

    def evicts_with(self, output_mode: str) -> bool:
        return True     # (timers in event time; in processing time every batch runs: below)

    def runs_every_batch(self) -> bool:
        return self.time_mode == "processingtime"   # (its timers may fire in any batch)

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        return {}

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        return None     # (its output mode is checked where it is defined: api.frame)

    def affected_by_late_rows(self) -> bool:
        return False

    def connect_refusal(self, output_mode: str) -> str | None:
        return None

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        if provider != SPARK_ROCKSDB_PROVIDER:   # (Spark runs it only on its RocksDB provider)
            return f"it has no state in {provider}'s files"
        return None

    def scan_filter_stand_in(self) -> PlanNode:
        return opaque_stand_in(self)

    def build(self, inputs):
        df = self.child.build(inputs)
        return spark_internals.empty_batch(df.sparkSession, self.output_schema)

    def describe(self) -> str:
        api = "TransformWithState" if self.rows_api else "TransformWithStateInPandas"
        return (f"{api} [{', '.join(self.keys)}], {self.time_mode}, {self.output_mode}, "
                f"{type(self.processor).__name__}")
