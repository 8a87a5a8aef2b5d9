"""applyInPandasWithState's plan node: the user's function and schemas, and its policy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.operators.group_state.step import GroupStateStep
from microbatch.operators.pandas_groups import opaque_stand_in
from microbatch.plan.checks import unsupported_operation
from microbatch.plan.logical import PlanNode, StatefulNode


@dataclass(eq=False)
class FlatMapGroupsWithState(StatefulNode):
    """``groupBy(keys).applyInPandasWithState(func, ...)`` (Spark's
    FlatMapGroupsInPandasWithStateExec): per key, the user's function over the key's rows
    of the batch and its ``GroupState``; keys whose timeout passed are called with no rows
    (``operators.group_state``)."""

    template_hides_input = True     # (its template is a relation of its output)
    child: PlanNode
    keys: tuple[str, ...]
    func: Callable
    output_schema: StructType
    state_schema: StructType
    func_mode: str                         # the function's output mode: append or update
    timeout: str                           # a GroupStateTimeout value
    data_columns: int | None = None        # the input's leading columns the function gets (None: all)
    late_rows_column: str | None = None    # the input's event time, as Spark's exec finds it (api.frame)
    input_marked: bool = False             # a column of the input carries a mark in Spark's analysis

    # -- its policy (plan.logical.StatefulNode) ----------------------------------------------
    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> GroupStateStep:
        return GroupStateStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        return shuffle_partitions

    def output_watermark_ms(self, input_ms: int) -> int | None:
        return input_ms

    def output_marks_event_time(self) -> bool:
        return False    # (its output is the function's, with no event-time mark, in Spark)

    def evicts_with(self, output_mode: str) -> bool:
        return self.timeout == "EventTimeTimeout"

    def runs_every_batch(self) -> bool:
        return self.timeout == "ProcessingTimeTimeout"   # (Spark's rule: such timeouts may fire in any batch)

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        below = watermark_below(self.child)
        return {} if below is None else {0: below}

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        if not aggregations and self.func_mode != mode:   # (the modes first, as Spark's checker)
            return unsupported_operation(
                f"applyInPandasWithState in {self.func_mode} mode is not supported with "
                f"{mode.capitalize()} output mode on a streaming DataFrame/Dataset;")
        if self.timeout == "EventTimeTimeout" and not self.input_marked:
            # (Spark's checker asks the input's columns in its analysed plan for a watermark's
            # mark, not the plan for a withWatermark: a column that replaced the watermarked
            # one has none, seed 5998; nor one read through the frame before a second
            # withWatermark, though Spark's engine marks it in a batch with data, seed 6234)
            return unsupported_operation(
                "Watermark must be specified in the query using '[Dataset/DataFrame].withWatermark()' "
                "for using event-time timeout in a applyInPandasWithState. Event-time timeout not "
                "supported without watermark.;")
        return None

    def affected_by_late_rows(self) -> bool:
        return True

    def connect_refusal(self, output_mode: str) -> str | None:
        return None

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        return None

    def scan_filter_stand_in(self) -> PlanNode:
        return opaque_stand_in(self)

    def build(self, inputs):
        df = self.child.build(inputs)
        return spark_internals.empty_batch(df.sparkSession, self.output_schema)

    def describe(self) -> str:
        return (f"FlatMapGroupsInPandasWithState [{', '.join(self.keys)}], {self.func_mode}, "
                f"{self.timeout}, {getattr(self.func, '__name__', 'function')}")
