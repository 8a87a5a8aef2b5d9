"""What a stream supports, checked when a query is defined or started.

Messages follow Spark's wording where Spark has one.
"""
from __future__ import annotations

import logging

from microbatch import spark_internals
from microbatch.errors import AnalysisException, UnsupportedOperationError
from microbatch.plan.logical import PlanNode

log = logging.getLogger(__name__)

OUTPUT_MODES = ("append", "complete", "update")
_JOIN_NAMES = {"left": "LeftOuter", "right": "RightOuter", "full": "FullOuter", "semi": "LeftSemi"}


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


def _mode_error(mode: str, what: str) -> Exception:
    return spark_internals.spark_error("AnalysisException",
                                       "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
                                       outputMode=mode, operation=what)


def check_output_mode(plan: PlanNode, mode: str, check_correctness: bool = True) -> None:
    """Spark's rules (UnsupportedOperationChecker) of what each output mode may run.

    Without aggregation (stateless, deduplication) append and update mean the same and
    complete is refused. Append needs a watermark on an aggregation's grouping key
    (the event-time column or a window over it), or no row could ever be final.
    Sorting needs an aggregation in complete mode.
    """
    from microbatch.plan.logical import (Aggregate, Deduplicate, FlatMapGroupsWithState, StaticJoin,
                                         StreamingLimit, StreamJoin, Transform)
    aggregates = [n for n in plan.nodes() if isinstance(n, Aggregate)]
    if mode == "complete" and not aggregates:
        raise _mode_error("complete", "no streaming aggregations")
    if mode == "update" and aggregates and aggregates[0].session_index is not None:   # (Spark looks at the top one)
        raise _mode_error("update", "session window streaming aggregations")
    if mode == "append" and any(a.event_time_key is None for a in aggregates):
        raise _mode_error("append", "streaming aggregations without watermark")
    for join in (n for n in plan.nodes() if isinstance(n, StreamJoin)):
        if (join.how in ("left", "right", "full") and mode != "append") or mode == "complete":
            named = f"{_JOIN_NAMES.get(join.how, 'Inner')} join" \
                if spark_internals.running_version().at_least(4, 2) else "Join"
            allowed = "Append and Update output modes" if join.how in ("inner", "semi") \
                and spark_internals.running_version().at_least(4, 2) else "Append output mode"
            raise unsupported_operation(
                f"{named} between two streaming DataFrames/Datasets is not "
                f"supported in {mode.capitalize()} output mode, only in {allowed};")
        nullable = {"left": (1,), "semi": (1,), "right": (0,), "full": (0, 1)}.get(join.how, ())
        ranged = all(join.value_watermark_ms(1 - side, 0) is not None for side in nullable)
        if join.how != "inner" and join.watermark_key() is None and not ranged:
            raise AnalysisException(
                f"Stream-stream {_JOIN_NAMES[join.how]} join between two streaming DataFrame/Datasets "
                "is not supported without a watermark in the join keys, or a watermark on the "
                "nullable side and an appropriate range condition;")
    for node in plan.nodes():
        if isinstance(node, StaticJoin) and node.stream_side == "left" \
                and node.how.lower().replace("_", "") in ("right", "rightouter", "full", "fullouter", "outer"):
            full = node.how.lower().replace("_", "") in ("full", "fullouter", "outer")
            raise unsupported_operation(
                "FullOuter joins with streaming DataFrames/Datasets on the left and a static DataFrame/Dataset "
                "on the right is not supported;" if full else
                "RightOuter join with a streaming DataFrame/Dataset on the left and a static DataFrame/DataSet "
                "on the right not supported;")
        if isinstance(node, FlatMapGroupsWithState):   # (the modes first, as Spark's checker)
            if not aggregates and node.func_mode != mode:
                raise unsupported_operation(
                    f"applyInPandasWithState in {node.func_mode} mode is not supported with "
                    f"{mode.capitalize()} output mode on a streaming DataFrame/Dataset;")
            if node.timeout == "EventTimeTimeout" and node.watermarked_input() is None:
                raise unsupported_operation(
                    "Watermark must be specified in the query using '[Dataset/DataFrame].withWatermark()' "
                    "for using event-time timeout in a applyInPandasWithState. Event-time timeout not "
                    "supported without watermark.;")
        if isinstance(node, Deduplicate) and node.within_watermark and node.event_time() is None:
            raise unsupported_operation(
                "dropDuplicatesWithinWatermark is not supported on streaming DataFrames/DataSets without watermark;")
    _check_global_watermark_limit(plan, mode, check_correctness)
    limits = [n for n in plan.nodes() if isinstance(n, StreamingLimit)
              or (isinstance(n, Transform) and n.method == "limit")]
    if limits and mode == "update":
        raise AnalysisException(
            "Limits are not supported on streaming DataFrames/Datasets in Update output mode;")
    sorts = [n for n in plan.nodes() if isinstance(n, Transform) and n.method in ("orderBy", "sort")]
    if sorts and (mode != "complete" or not aggregates):
        raise AnalysisException(
            "Sorting is not supported on streaming DataFrames/Datasets, unless it is on "
            "aggregated DataFrame/Dataset in Complete output mode;")


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
    from microbatch.plan.logical import Aggregate, Deduplicate, FlatMapGroupsWithState, StreamJoin
    if mode == "append":
        return
    for node in plan.nodes():
        counts = isinstance(node, (Aggregate, StreamJoin, FlatMapGroupsWithState)) or (
            isinstance(node, Deduplicate) and node.watermark_column() is not None)
        if counts and any(isinstance(below, Aggregate) for below in node.nodes() if below is not node):
            if enabled:
                raise AnalysisException(_CORRECTNESS_MESSAGE)
            log.warning(_CORRECTNESS_MESSAGE)
            return


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
                            custom_sink: bool = False) -> None:
    """Over a Spark Connect session, at ``start()``: refuse a query with a part that does
    not run over Connect yet, naming it (the message lists what runs)."""
    from microbatch.plan.logical import Aggregate, Observe, StreamingRelation, Transform, Watermark
    from microbatch.spark_internals.connect.support import SINKS as _CONNECT_SINKS
    from microbatch.spark_internals.connect.support import SOURCES as _CONNECT_SOURCES
    from microbatch.spark_internals.connect.support import STEPS as _CONNECT_STEPS
    support = spark_internals.connect_refusal
    for node in plan.nodes():
        if isinstance(node, StreamingRelation):
            if node.source_name.lower() not in _CONNECT_SOURCES:
                raise support(f"The source {node.source_name!r}")
        elif isinstance(node, Transform):
            if type(node) is not Transform or node.method not in _CONNECT_STEPS:
                raise support(f"The step {node.method}")
        elif isinstance(node, Aggregate):
            if node.grouping is not None or node.session_index is not None:
                raise support("An aggregation by grouping sets or session windows")
            if output_mode not in ("append", "update"):
                raise support(f"An aggregation in {output_mode} mode")
        elif not isinstance(node, (Watermark, Observe)):
            raise support(_CONNECT_NODE_NAMES.get(type(node).__name__, f"The step {type(node).__name__}"))
    if custom_sink or (sink_format or "").lower() not in _CONNECT_SINKS:
        raise support(f"The sink {sink_format or 'given by .sink(...)'!r}")


_CONNECT_NODE_NAMES = {
    "Deduplicate": "dropDuplicates / dropDuplicatesWithinWatermark", "StreamJoin": "A stream-stream join",
    "StaticJoin": "A stream-static join", "StreamingLimit": "limit", "Union": "union",
    "FlatMapGroupsWithState": "applyInPandasWithState", "TransformWithState": "transformWithState",
    "Apply": "mapInPandas / mapInArrow",
}
