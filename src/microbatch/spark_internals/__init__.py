"""The calls into Spark's JVM that PySpark has no public API for, in one place.

microbatch gives users PySpark's own objects. Some of them only exist with a JVM
object behind them: PySpark's ``StreamingQueryException`` answers ``getCondition()``,
``getMessageParameters()`` and ``getSqlState()`` from the JVM exception it wraps, and
Spark's error messages are formatted by the JVM from its error-condition catalogue.
This module builds those JVM objects (py4j) and hands back what PySpark would hand
back, so a Spark upgrade that moves one of them breaks here and nowhere else. The
side-by-side tests exercise every call (``tests/test_pyspark_objects.py``,
``test_argument_checks.py``, ``test_tables.py``, ``test_named_sources.py``).
"""

# The seam: the engine calls these as ``spark_internals.<name>``; each lives in the
# module named for what it does (analysis, binding, catalog, engine_plan, errors, jvm,
# metrics, relations, session, versions).
from microbatch.spark_internals.analysis import (
    AggregateCall, AggregateOutput, TimeTerm, aggregation_parts, ambiguous_on_a_stream, analyzed_plan, attribute_positions,
    column_sql, conjunct_sides,
    bound_attribute_ids, conjuncts_without_column, event_time_barrier, event_time_marked, grouping_set_filters, is_global_aggregation,
    having_condition, having_aggregation, hidden_aggregates_added, is_aggregation, sources_removed, output_columns,
    output_attribute_ids, plan_json, positions_below_projection, rebound, filter_can_skip_column, filter_passes_filter,
    filter_passes_projection, grouped_dataframe, nullable_output, grouping_column_names, grouping_columns, hyperloglog_tables,
    join_condition, output_qualifiers, parse_schema_ddl, processing_time_ms, projections_keep_column, pruned_from_joins,
    pruned_below_repartitions,
    qualified_alias, reads_only_files, requalified, scan_filters, scan_skips_filter, schema_string, semi_join_below_aggregation, semi_join_branches,
    semi_join_pushed_into_join, pushed_semi_join_condition,
    window_function_error,
    schema_tree,
)
from microbatch.spark_internals.aggregate_filters import conjuncts_through_aggregation
from microbatch.spark_internals import listener_bus as _listener_bus
from microbatch.spark_internals import metrics_source as _metrics_source
from microbatch.spark_internals.binding import (
    CARRIED_METADATA, BatchInput, BindablePlan, ColumnsKeys, PythonFunctionRef, has_hidden_columns,
    hidden_columns_read, map_in_arrow_function,
    projected_function, runs_again_alike, uses_current_time, with_batch_timestamp,
)
from microbatch.spark_internals.catalog import (
    CatalogTableInfo, catalog_table, managed_table_location, python_data_source, schema_ddl, temp_view_exists,
)
from microbatch.spark_internals.engine_plan import (empty_stream_stand_in, engine_file_scans, engine_join_event_times,
                                                    streaming_file_stand_in)
from microbatch.spark_internals.errors import (
    captured, cause_string, error_condition, exception_message, exception_string,
    foreach_batch_user_error, is_foreach_user_error, jvm_throwable, python_proxy_error,
    query_exception, refusals_not_logged, spark_error, state_reader_error, streaming_query_exception,
    user_error_cause,
)
from microbatch.spark_internals.jvm import (
    jvm_class, jvm_started, scala_map,
)
from microbatch.spark_internals.metrics import (
    ScanRowCounter, executed_observation_row, observation_row, observed_rows, python_row, query_execution,
    reset_observations, row_json, run_to_end,
)
from microbatch.spark_internals.relations import (
    FileBatches, RangeBatches, empty_batch, empty_dataframe, metadata_column, with_plan_id, PLAN_IDS_FROM,
)
from microbatch.spark_internals.eliminated_joins import outer_joins_eliminated, outer_joins_narrowed
from microbatch.spark_internals.join_conditions import ConditionPart, join_condition_parts
from microbatch.spark_internals.inferred_filters import join_inferred_filters, optimized_plan, stream_without_data
from microbatch.spark_internals.session import (
    arrow_batches_by_rows, cloned_session, job_tags, session_settings, sparks_own_reader, with_read_formats,
)
from microbatch.spark_internals.versions import (
    CHECKPOINTED_CONF_SINCE, FEATURES, OLDEST_SUPPORTED, SparkVersion, arrow_schema, arrow_type, check_supported, dataframe_of_arrow, has_arrow_udf,
    max_offset_log_version, na_functions, observation_has_row, progress_operator_name, progress_shuffle_partitions, user_progress, with_observed_rows,
    query_started_event, records_conf, require, running_version,
)
from microbatch.spark_internals.sql import (
    SqlNode, behind_a_view, grouping_position, parse_sql, sql_column, sql_int, sql_parameters,
)

__all__ = [
    "CARRIED_METADATA", "behind_a_view", "has_hidden_columns", "hidden_columns_read",
    "CHECKPOINTED_CONF_SINCE", "FEATURES", "OLDEST_SUPPORTED", "arrow_schema", "arrow_type", "check_supported", "dataframe_of_arrow", "SparkVersion", "has_arrow_udf", "max_offset_log_version",
    "observation_has_row", "observed_rows", "progress_operator_name", "progress_shuffle_partitions", "user_progress", "with_observed_rows", "na_functions", "query_started_event",
    "records_conf", "require", "running_version",
    "SqlNode", "grouping_position", "parse_sql", "per_batch_sql_refusal", "sql_over", "sparks_own_reader", "with_read_formats", "sql_column", "sql_int", "sql_parameters",
    "AggregateCall", "AggregateOutput", "BatchInput", "BindablePlan", "CatalogTableInfo",
    "ColumnsKeys", "FileBatches", "PythonFunctionRef", "RangeBatches", "ScanRowCounter", "TimeTerm",
    "aggregation_parts", "analyzed_plan", "captured", "catalog_table", "cause_string",
    "arrow_batches_by_rows", "cloned_session", "jobs_see_session_confs", "column_sql", "conjuncts_without_column", "conjuncts_through_aggregation", "grouping_set_filters", "empty_batch", "empty_dataframe",
    "conjunct_sides", "pruned_from_joins", "pruned_below_repartitions", "event_time_marked", "is_global_aggregation", "having_condition", "having_aggregation", "hidden_aggregates_added", "is_aggregation", "output_columns", "bound_attribute_ids", "event_time_barrier",
    "output_attribute_ids", "plan_json", "positions_below_projection", "attribute_positions", "rebound", "metadata_column", "with_plan_id", "PLAN_IDS_FROM", "window_function_error", "output_qualifiers", "qualified_alias", "requalified",
    "error_condition", "exception_message", "exception_string", "executed_observation_row",
    "filter_can_skip_column", "filter_passes_filter", "filter_passes_projection", "grouped_dataframe",
    "foreach_batch_user_error", "grouping_column_names", "grouping_columns", "hyperloglog_tables",
    "is_foreach_user_error", "job_tags", "join_condition", "join_condition_parts", "ConditionPart", "jvm_class", "jvm_started",
    "jvm_throwable", "managed_table_location", "map_in_arrow_function", "observation_row", "parse_schema_ddl",
    "processing_time_ms", "projected_function", "projections_keep_column", "python_data_source",
    "python_proxy_error", "python_row", "query_exception", "query_execution", "refusals_not_logged", "row_json",
    "run_to_end", "scala_map", "schema_ddl", "session_settings", "schema_string", "schema_tree", "spark_error", "state_reader_error",
    "streaming_query_exception", "temp_view_exists", "user_error_cause", "uses_current_time",
    "with_batch_timestamp", "nullable_output", "runs_again_alike", "reset_observations",
    "reads_only_files", "scan_filters", "scan_skips_filter", "ambiguous_on_a_stream", "semi_join_branches",
    "semi_join_below_aggregation", "semi_join_pushed_into_join", "pushed_semi_join_condition", "sources_removed",
    "join_inferred_filters", "optimized_plan", "stream_without_data",
]

# -- Spark Connect: the same names, chosen by the kind of their first argument ---------------
# A Connect client's session, DataFrame, Column or Observation (``connect.is_connect``)
# goes to ``spark_internals.connect``; everything else to the classic modules above,
# unchanged. A name without a Connect side refuses there with the list of what runs.
import functools as _functools

from microbatch.spark_internals import session as _session
from microbatch.spark_internals.connect import analysis as _c_analysis
from microbatch.spark_internals.connect import batch_time as _c_batch_time
from microbatch.spark_internals.connect import errors as _c_errors
from microbatch.spark_internals.connect import is_connect
from microbatch.spark_internals.connect import metrics as _c_metrics
from microbatch.spark_internals.connect import relations as _c_relations
from microbatch.spark_internals.connect import session as _c_session
from microbatch.spark_internals.connect.support import WHAT_RUNS as CONNECT_RUNS
from microbatch.spark_internals.connect.support import refusal as connect_refusal


def _by_kind(classic, remote):
    """``classic`` or, for a Connect first argument, ``remote``."""
    @_functools.wraps(classic)
    def chosen(first=None, *args, **kwargs):
        return (remote if is_connect(first) else classic)(first, *args, **kwargs)
    return chosen


def _refused(feature: str):
    return _c_session.unsupported(feature)


check_supported_classic = check_supported
check_supported = _by_kind(check_supported_classic, _c_session.check_supported)
# sessions and threads
cloned_session = _by_kind(cloned_session, _c_session.cloned_session)
jobs_see_session_confs = _by_kind(_session.jobs_see_session_confs, _c_session.jobs_see_session_confs)
job_tags = _by_kind(job_tags, _c_session.job_tags)
post_to_spark_listeners = _by_kind(_listener_bus.post_to_spark_listeners, lambda spark, event: None)   # (Connect: no JVM here)
register_metrics_source = _by_kind(_metrics_source.register_metrics_source, _c_session.metrics_source_unavailable)
remove_metrics_source = _metrics_source.remove_metrics_source
session_settings = _by_kind(session_settings, _c_session.session_settings)
enter_query_thread = _by_kind(_session.enter_query_thread, _c_session.enter_query_thread)
cancel_run = _by_kind(_session.cancel_run, _c_session.cancel_run)
describe_batch = _by_kind(_session.describe_batch, _c_session.describe_batch)
static_conf = _by_kind(_session.static_conf, _c_session.static_conf)
app_name = _by_kind(_session.app_name, _c_session.app_name)
default_parallelism = _by_kind(_session.default_parallelism, _c_session.default_parallelism)
set_local_property = _by_kind(_session.set_local_property, _refused("A kept batch plan"))
# catalog: a Connect client asks the catalog API, and the session catalog's tables' location,
# provider and storage options of DESCRIBE TABLE EXTENDED .. AS JSON
temp_view_exists = _by_kind(temp_view_exists, _c_session.temp_view_exists)
python_data_source = _by_kind(python_data_source, _c_session.python_data_source)
data_source_registration = _by_kind(lambda spark: spark.dataSource, _c_session.data_source_registration)
catalog_table = _by_kind(catalog_table, _c_session.catalog_table)
managed_table_location = _by_kind(managed_table_location, _c_session.managed_table_location)
schema_ddl = _by_kind(schema_ddl, _c_session.schema_ddl)
row_accumulator = _by_kind(_session.row_accumulator, _refused("A kept batch plan"))
# relations
empty_batch = _by_kind(empty_batch, _c_relations.empty_batch)
empty_dataframe = _by_kind(empty_dataframe, _c_relations.empty_dataframe)
in_session = _by_kind(lambda df, spark: df, _c_relations.in_session)   # (classic: one SparkContext, any session)
FileBatches = _by_kind(FileBatches, _c_relations.FileBatches)
RangeBatches = _by_kind(RangeBatches, _refused("The rate-micro-batch source"))
# analysis
aggregation_parts = _by_kind(aggregation_parts, _c_analysis.aggregation_parts)
column_sql = _by_kind(column_sql, _c_analysis.column_sql)
uses_current_time = _by_kind(uses_current_time, _c_analysis.uses_current_time)
runs_again_alike = _by_kind(runs_again_alike, _c_analysis.never)
filter_can_skip_column = _by_kind(filter_can_skip_column, _c_analysis.never)
is_global_aggregation = _by_kind(is_global_aggregation, _c_analysis.never)
having_condition = _by_kind(having_condition, _c_analysis.no_conjuncts)   # (Connect: none)
is_aggregation = _by_kind(is_aggregation, _c_analysis.never)
hidden_aggregates_added = _by_kind(hidden_aggregates_added, _refused("A filter by an aggregate its aggregation does not output"))
output_columns = _by_kind(output_columns, _refused("A filter by an aggregate its aggregation does not output"))
having_aggregation = _by_kind(having_aggregation, _refused("A filter by an aggregate its aggregation does not output"))
filter_passes_projection = _by_kind(filter_passes_projection, _c_analysis.never)
filter_passes_filter = _by_kind(filter_passes_filter, _c_analysis.never)
projections_keep_column = _by_kind(projections_keep_column, _c_analysis.never)
reads_only_files = _by_kind(reads_only_files, _c_analysis.never)   # (over Connect: no scan filters added)
conjuncts_without_column = _by_kind(conjuncts_without_column, _c_analysis.no_conjuncts)
grouping_set_filters = _by_kind(grouping_set_filters, _c_analysis.no_conjuncts)
conjuncts_through_aggregation = _by_kind(conjuncts_through_aggregation, _c_analysis.no_conjuncts)   # (Connect: none)
schema_tree = _by_kind(schema_tree, _c_analysis.schema_tree)
behind_a_view = _by_kind(behind_a_view, lambda df: df)   # (Connect: its own views' rules)
join_condition = _by_kind(join_condition, _c_analysis.join_condition)   # (Connect: equalities of columns)
join_condition_parts = _by_kind(join_condition_parts, _refused("A join"))
conjunct_sides = _by_kind(conjunct_sides, _refused("A join"))
semi_join_branches = _by_kind(semi_join_branches, _refused("A join"))
semi_join_below_aggregation = _by_kind(semi_join_below_aggregation, _c_analysis.never)
semi_join_pushed_into_join = _by_kind(semi_join_pushed_into_join, lambda joined: None)   # (Connect runs no stream-stream join)
pushed_semi_join_condition = _by_kind(pushed_semi_join_condition, _refused("A join"))
sources_removed = _by_kind(sources_removed, _c_analysis.never)   # (Connect runs no stream-stream join)
pruned_from_joins = _by_kind(pruned_from_joins, _refused("A join"))
pruned_below_repartitions = _by_kind(pruned_below_repartitions, lambda df, columns: [False] * len(columns))
output_qualifiers = _by_kind(output_qualifiers, _refused("A join"))
requalified = _by_kind(requalified, _refused("A join"))


def _connect_event_time_marked(df, column, delay_ms):
    """Over Connect: ``column`` marked, every other column's mark removed (EventTimeWatermark)."""
    for field in df.schema.fields:
        if field.name.lower() != column.lower() and "spark.watermarkDelayMs" in field.metadata:
            df = df.withMetadata(field.name, {k: v for k, v in field.metadata.items()
                                              if k != "spark.watermarkDelayMs"})
    return df.withMetadata(column, {"spark.watermarkDelayMs": int(delay_ms)})


event_time_marked = _by_kind(event_time_marked, _connect_event_time_marked)
grouping_columns = _by_kind(grouping_columns, _c_analysis.grouping_columns)
grouping_column_names = _by_kind(grouping_column_names, _c_analysis.grouping_column_names)
ambiguous_on_a_stream = _by_kind(ambiguous_on_a_stream, lambda df, step: None)   # (Connect: none)
grouped_dataframe = _by_kind(grouped_dataframe, _c_analysis.grouped_dataframe)


def is_grouped_data(obj) -> bool:
    """Whether ``obj`` is PySpark's GroupedData, a classic session's or a Connect client's."""
    from pyspark.sql import GroupedData
    return isinstance(obj, GroupedData) or (is_connect(obj) and type(obj).__name__ == "GroupedData")


window_function_error = _by_kind(window_function_error, _refused("A window function (OVER)"))
with_batch_timestamp = _by_kind(with_batch_timestamp, _c_batch_time.with_batch_timestamp)
analyzed_plan = _by_kind(analyzed_plan, _refused("A prepared plan"))
parse_sql = _by_kind(parse_sql, _refused("SQL that reads a stream (a temporary view of a stream, or STREAM t)"))


def _no_sql_per_batch(*args, **kwargs):
    raise TypeError("a classic session translates SQL over streams (api/sql.py); it runs no SQL per batch")


per_batch_sql_refusal = _by_kind(_no_sql_per_batch, _c_analysis.per_batch_sql_refusal)
sql_over = _by_kind(_no_sql_per_batch, _c_relations.sql_over)
nullable_output = _by_kind(nullable_output, lambda df: df)   # (over Connect the task's output is nullable)
_classic_parse_schema_ddl = parse_schema_ddl


def parse_schema_ddl(ddl: str):  # the seam's choice by the process: a JVM or none
    """A DDL schema string (by the JVM of a classic session, else by the Connect client)."""
    return _classic_parse_schema_ddl(ddl) if jvm_started() else _c_analysis.parse_schema_ddl(ddl)


_classic_hyperloglog_tables = hyperloglog_tables


def hyperloglog_tables(p: int) -> tuple:  # the seam's choice by the process: a JVM or none
    """Spark's HyperLogLog++ bias tables at precision ``p`` (from the JVM of a classic
    session, else from the copy of Spark 4.3's a Connect client reads)."""
    return _classic_hyperloglog_tables(p) if jvm_started() else _c_analysis.hyperloglog_tables(p)


# errors
_classic_spark_error = spark_error


def spark_error(kind: str, error_class: str, **parameters):  # chosen by the process
    """Spark's exception for ``error_class``: built in the JVM of a classic session, else
    as a Connect client raises it."""
    if not jvm_started() and _c_session.is_remote_client():
        return _c_errors.spark_error(kind, error_class, **parameters)
    return _classic_spark_error(kind, error_class, **parameters)


_classic_state_reader_error = state_reader_error


def state_reader_error(kind: str, method: str, *args):  # chosen by the process
    """Spark's state data source's exception (``spark_internals.errors``' ``state_reader_error``): built by
    Spark's factory in the JVM of a classic session, else as a Connect client raises it."""
    if not jvm_started() and _c_session.is_remote_client():
        return _c_errors.state_reader_error(kind, method, *args)
    return _classic_state_reader_error(kind, method, *args)


foreach_batch_user_error = _by_kind(foreach_batch_user_error,
                                    lambda df, error: _c_errors.foreach_batch_user_error(error))
query_failure = _c_errors.query_failure
# (over Connect a foreachBatch function is pickled and read back as PySpark's Connect writer
# and Spark's server do, for their errors; classic: nothing to check)
foreach_batch_command = _by_kind(lambda spark, func: None, _c_errors.foreach_batch_command)
check_foreach_batch_command = _c_errors.check_foreach_batch_command

# Spark's engine's plan of a batch (classic only: over Connect no scan counts the input rows)
streaming_file_stand_in = _by_kind(streaming_file_stand_in, lambda df, aliased: None)
empty_stream_stand_in = _by_kind(empty_stream_stand_in, lambda df: None)
engine_file_scans = _by_kind(engine_file_scans, lambda query, stand_ins: None)
engine_join_event_times = _by_kind(engine_join_event_times, lambda df: None)
# the outer joins Spark's optimizer removes (over Connect: none known, each join stays)
outer_joins_eliminated = _by_kind(outer_joins_eliminated, lambda df, joins: [None] * len(joins))
# the outer joins Spark's optimizer makes of another type (over Connect: none known)
outer_joins_narrowed = _by_kind(outer_joins_narrowed, lambda df, joins: [None] * len(joins))
# metrics
observation_row = _by_kind(observation_row, _c_metrics.observation_row)
executed_observation_row = _by_kind(executed_observation_row, _c_metrics.executed_observation_row)
run_to_end = _by_kind(run_to_end, _c_metrics.run_to_end)
reset_observations = _by_kind(reset_observations, _c_metrics.reset_observations)
ScanRowCounter = _by_kind(ScanRowCounter, _c_metrics.ScanRowCounter)
operator_accumulator = _by_kind(_session.operator_accumulator, _c_metrics.operator_accumulator)
map_state_task = _by_kind(_session.map_state_task, _c_metrics.map_state_task)
map_in_arrow_function = _by_kind(map_in_arrow_function, lambda mapped, return_type: None)
binds_plans = _by_kind(_session.binds_plans, lambda df: False)
_classic_row_json, _classic_python_row = row_json, python_row


def row_json(row):
    """An observed row as Spark's ``Row.json`` writes it (parsed)."""
    return _c_metrics.row_json(row) if isinstance(row, _c_metrics.ObservedRow) else _classic_row_json(row)


def python_row(row):
    """An observed row as PySpark hands one to Python."""
    return _c_metrics.python_row(row) if isinstance(row, _c_metrics.ObservedRow) else _classic_python_row(row)


__all__ += [
    "CONNECT_RUNS", "app_name", "query_failure", "binds_plans", "cancel_run", "connect_refusal", "default_parallelism",
    "describe_batch", "enter_query_thread", "is_connect", "map_state_task", "operator_accumulator",
    "static_conf", "empty_stream_stand_in", "engine_file_scans", "engine_join_event_times", "streaming_file_stand_in",
    "outer_joins_eliminated", "outer_joins_narrowed", "in_session", "is_grouped_data", "data_source_registration",
]
