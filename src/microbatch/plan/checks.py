"""What a stream supports, checked when a query is defined or started.

Messages follow Spark's wording where Spark has one.
"""
from __future__ import annotations

from microbatch.errors import AnalysisException, UnsupportedOperationError
from microbatch.plan.logical import PlanNode

OUTPUT_MODES = ("append", "complete", "update")


def normalize_output_mode(mode: str) -> str:
    m = str(mode).strip().lower()
    if m not in OUTPUT_MODES:
        raise AnalysisException(
            f"Unknown output mode {mode}. Accepted output modes are 'append', 'complete', 'update'")
    return m


def check_output_mode(plan: PlanNode, mode: str) -> None:
    """Plans without aggregations (stateless, deduplication) run in append or update
    mode (they mean the same), not complete."""
    if mode == "complete":
        raise AnalysisException(
            "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: "
            "complete. This output mode is not supported for no streaming aggregations on "
            "streaming DataFrames/DataSets. Use outputMode('append') (or 'update') for this query.")


def not_yet(operation: str, issue: str = "stateful streaming") -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"{operation} on a streaming DataFrame needs state across batches, which microbatch "
        f"does not support yet ({issue} is planned). Stateless steps (select, filter, "
        "withColumn, union, join with a static DataFrame) work today.")


def streaming_action(name: str) -> AnalysisException:
    return AnalysisException(
        f"Queries with streaming sources must be executed with writeStream.start(); "
        f"'{name}' cannot run on a streaming DataFrame.")
