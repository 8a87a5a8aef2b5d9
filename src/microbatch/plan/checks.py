"""What a stream supports, checked when a query is defined or started.

Messages follow Spark's wording where Spark has one.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from microbatch import spark_internals
from microbatch.errors import AnalysisException, UnsupportedOperationError
from microbatch.plan.logical import PlanNode

log = logging.getLogger(__name__)

OUTPUT_MODES = ("append", "complete", "update")


def normalize_output_mode(mode: str) -> str:
    m = str(mode).strip().lower()
    if m not in OUTPUT_MODES:
        raise spark_internals.spark_error("SparkIllegalArgumentException",
                                          "STREAMING_OUTPUT_MODE.INVALID", outputMode=mode)
    return m


def unsupported_operation(message: str) -> Exception:
    """Spark's refusal of a streaming query's shape, as its UnsupportedOperationChecker (and
    its planner) raise it: an AnalysisException of class ``_LEGACY_ERROR_TEMP_3102`` with the
    message (on 3.5, the message alone)."""
    if not spark_internals.running_version().at_least_4:
        return AnalysisException(message)
    return spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_3102", msg=message)


def output_mode_error(mode: str, what: str) -> Exception:
    """Spark's error for an operation output mode ``mode`` does not support."""
    return spark_internals.spark_error("AnalysisException",
                                       "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
                                       outputMode=mode, operation=what)


def check_output_mode(plan: PlanNode, mode: str, check_correctness: bool = True) -> None:
    """Spark's rules (UnsupportedOperationChecker) of what each output mode may run.

    Without aggregation (stateless, deduplication) append and update mean the same and
    complete is refused. Each stateful operator answers for its own rules
    (``output_mode_refusal``): the aggregations first, as Spark's checker, then the others in
    plan order. Sorting needs an aggregation in complete mode.
    """
    from microbatch.plan.logical import StaticJoin, Transform
    nodes = list(plan.nodes())
    aggregations = [n for n in nodes if n.stateful and n.aggregation]
    if mode == "complete" and not aggregations:
        raise output_mode_error("complete", "no streaming aggregations")
    for node in aggregations + [n for n in nodes if n.stateful and not n.aggregation]:
        refusal = node.output_mode_refusal(mode, aggregations)
        if refusal is not None:
            raise refusal
    for node in nodes:
        if isinstance(node, StaticJoin) and node.stream_side == "left" \
                and node.how.lower().replace("_", "") in ("right", "rightouter", "full", "fullouter", "outer"):
            full = node.how.lower().replace("_", "") in ("full", "fullouter", "outer")
            raise unsupported_operation(
                "FullOuter joins with streaming DataFrames/Datasets on the left and a static DataFrame/Dataset "
                "on the right is not supported;" if full else
                "RightOuter join with a streaming DataFrame/Dataset on the left and a static DataFrame/DataSet "
                "on the right not supported;")
    _check_global_watermark_limit(plan, mode, check_correctness)
    if mode == "update" and any(isinstance(n, Transform) and n.method == "limit" for n in nodes):
        raise AnalysisException(
            "Limits are not supported on streaming DataFrames/Datasets in Update output mode;")
    sorts = [n for n in nodes if isinstance(n, Transform) and n.method in ("orderBy", "sort")]
    if sorts and (mode != "complete" or not aggregations):
        raise AnalysisException(
            "Sorting is not supported on streaming DataFrames/Datasets, unless it is on "
            "aggregated DataFrame/Dataset in Complete output mode;")
    for node in nodes:     # (what microbatch does not plan yet: after Spark's own rules)
        if node.stateful and node.deferred_refusal is not None:
            raise node.deferred_refusal


#: Spark's conf that turns the check below into a warning.
CHECK_CORRECTNESS_CONF = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"

_CORRECTNESS_MESSAGE = (
    "Detected pattern of possible 'correctness' issue due to global watermark. The query "
    "contains stateful operation which can emit rows older than the current watermark plus "
    "allowed late record delay, which are \"late rows\" in downstream stateful operations and "
    "these rows can be discarded. Please refer the programming guide doc for more details. If "
    "you understand the possible risk of correctness issue and still need to run the query, you "
    f"can disable this check by setting the config `{CHECK_CORRECTNESS_CONF}` to false.;")


def _check_global_watermark_limit(plan: PlanNode, mode: str, enabled: bool) -> None:
    """Spark's checkStreamingQueryGlobalWatermarkLimit: a stateful operator (an aggregation,
    a stream-stream join, applyInPandasWithState, a deduplication on an event-time key) above an aggregation that
    emits updated rows (update or complete mode) would see those rows as late. Spark refuses
    the query, or only warns when ``CHECK_CORRECTNESS_CONF`` is false, and runs it."""
    if mode == "append":
        return
    for node in plan.nodes():
        counts = node.stateful and node.affected_by_late_rows()
        if counts and any(below.stateful and below.aggregation for below in node.nodes() if below is not node):
            if enabled:   # (Spark's checker's throwError: its condition, _LEGACY_ERROR_TEMP_3102)
                raise unsupported_operation(_CORRECTNESS_MESSAGE)
            log.warning(_CORRECTNESS_MESSAGE)
            return


def check_joins_kept(plan: PlanNode, template: Any) -> None:
    """Refuse a query whose stream-stream join (a stateful operator of two inputs) Spark's
    optimizer removes with the only reads of a source (``spark_internals.sources_removed``):
    Spark's engine then runs neither the join nor its other side and reads nothing of that
    source, which stays one of its sources; microbatch does not plan a source read by
    nothing (fuzzer seed 6673). A join removed while its other side's sources are read
    elsewhere runs as Spark's does (``operators.join.outer_joins_eliminated``)."""
    if any(n.stateful and len(n.children) == 2 for n in plan.nodes()) and spark_internals.sources_removed(template):
        raise not_yet("A stream-stream join that Spark's optimizer removes from the query with every read of a "
                      "source (EliminateOuterJoin: an outer join whose other side is unique on the join keys, "
                      "none of whose columns is read above it; read a column of that side, or leave the join out)",
                      "a join Spark's optimizer removes")


def not_yet(operation: str, issue: str = "stateful streaming") -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"{operation} on a streaming DataFrame needs state across batches, which microbatch "
        f"does not support yet ({issue} is planned). Stateless steps (select, filter, "
        "withColumn, union, join with a static DataFrame) work today.")


def streaming_action(name: str) -> AnalysisException:
    return AnalysisException(
        f"Queries with streaming sources must be executed with writeStream.start(); "
        f"'{name}' cannot run on a streaming DataFrame.")


def check_source_names(plan: PlanNode) -> None:
    """Named sources must have distinct names (they key the checkpoint's offsets)."""
    names = [r.user_name for r in plan.relations() if r.user_name is not None]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise spark_internals.spark_error(
            "AnalysisException", "STREAMING_QUERY_EVOLUTION_ERROR.DUPLICATE_SOURCE_NAMES",
            names=", ".join(f"'{n}'" for n in duplicates))


def check_runs_over_connect(plan: PlanNode, sink_format: str | None, output_mode: str,
                            custom_sink: bool = False, sink_runs: Callable[[], bool] = lambda: False) -> None:
    """Over a Spark Connect session, at ``start()``: refuse a query with a part that does
    not run over Connect yet, naming it (the message lists what runs); ``sink_runs``: whether
    the sink's provider runs over Connect whatever its format's name (a Python data source)."""
    from microbatch.plan.logical import Apply, Observe, StaticJoin, StreamingRelation, Transform, Union, Watermark
    from microbatch.spark_internals.connect.support import SINKS as _CONNECT_SINKS
    from microbatch.spark_internals.connect.support import SOURCES as _CONNECT_SOURCES
    from microbatch.spark_internals.connect.support import STEPS as _CONNECT_STEPS
    support = spark_internals.connect_refusal
    for node in plan.nodes():
        if isinstance(node, StreamingRelation):
            if node.source_name.lower() not in _CONNECT_SOURCES and not (
                    node.provider is not None and node.provider.runs_over_connect):
                raise support(f"The source {node.source_name!r}")
        elif isinstance(node, Transform):
            if type(node) is not Transform or node.method not in _CONNECT_STEPS:
                raise support(f"The step {node.method}")
        elif node.stateful:
            refusal = node.connect_refusal(output_mode)
            if refusal is not None:
                raise support(refusal)
        elif not isinstance(node, (Watermark, Observe, Union, StaticJoin, Apply)):
            raise support(f"The step {type(node).__name__}")
    if custom_sink or ((sink_format or "").lower() not in _CONNECT_SINKS and not sink_runs()):
        raise support(f"The sink {sink_format or 'given by .sink(...)'!r}")

