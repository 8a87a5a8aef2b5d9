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
# module named for what it does (analysis, binding, catalog, errors, jvm, metrics,
# relations, session, versions).
from microbatch.spark_internals.analysis import (
    AggregateCall, AggregateOutput, TimeTerm, aggregation_parts, analyzed_plan, column_sql, conjunct_sides,
    conjuncts_without_column, filter_can_skip_column, filter_passes_filter,
    filter_passes_projection, grouped_dataframe, grouping_column_names, grouping_columns, hyperloglog_tables,
    join_condition, output_qualifiers, parse_schema_ddl, processing_time_ms, projections_keep_column,
    qualified_alias, requalified, schema_string, window_function_error,
    schema_tree, uses_current_time,
)
from microbatch.spark_internals.binding import (
    BatchInput, BindablePlan, ColumnsKeys, PythonFunctionRef, map_in_arrow_function,
    projected_function, with_batch_timestamp,
)
from microbatch.spark_internals.catalog import (
    CatalogTableInfo, catalog_table, managed_table_location, python_data_source, schema_ddl, temp_view_exists,
)
from microbatch.spark_internals.errors import (
    captured, cause_string, error_condition, exception_message, exception_string,
    foreach_batch_user_error, is_foreach_user_error, jvm_throwable, python_proxy_error,
    query_exception, spark_error, streaming_query_exception, user_error_cause,
)
from microbatch.spark_internals.jvm import (
    jvm_class, jvm_started, scala_map,
)
from microbatch.spark_internals.metrics import (
    ScanRowCounter, executed_observation_row, observation_row, observed_rows, python_row, query_execution,
    row_json, run_to_end,
)
from microbatch.spark_internals.relations import (
    FileBatches, RangeBatches, empty_batch, empty_dataframe, metadata_column,
)
from microbatch.spark_internals.session import (
    cloned_session, job_tags, session_settings,
)
from microbatch.spark_internals.versions import (
    CHECKPOINTED_CONF_SINCE, FEATURES, OLDEST_SUPPORTED, SparkVersion, arrow_schema, arrow_type, check_supported, dataframe_of_arrow, has_arrow_udf,
    max_offset_log_version, na_functions, observation_has_row, progress_operator_name, progress_shuffle_partitions, user_progress, with_observed_rows,
    query_started_event, records_conf, require, running_version,
)
from microbatch.spark_internals.sql import (
    SqlNode, grouping_position, parse_sql, sql_column, sql_int, sql_parameters,
)

__all__ = [
    "CHECKPOINTED_CONF_SINCE", "FEATURES", "OLDEST_SUPPORTED", "arrow_schema", "arrow_type", "check_supported", "dataframe_of_arrow", "SparkVersion", "has_arrow_udf", "max_offset_log_version",
    "observation_has_row", "observed_rows", "progress_operator_name", "progress_shuffle_partitions", "user_progress", "with_observed_rows", "na_functions", "query_started_event",
    "records_conf", "require", "running_version",
    "SqlNode", "grouping_position", "parse_sql", "sql_column", "sql_int", "sql_parameters",
    "AggregateCall", "AggregateOutput", "BatchInput", "BindablePlan", "CatalogTableInfo",
    "ColumnsKeys", "FileBatches", "PythonFunctionRef", "RangeBatches", "ScanRowCounter", "TimeTerm",
    "aggregation_parts", "analyzed_plan", "captured", "catalog_table", "cause_string",
    "cloned_session", "column_sql", "conjuncts_without_column", "empty_batch", "empty_dataframe",
    "conjunct_sides", "metadata_column", "window_function_error", "output_qualifiers", "qualified_alias", "requalified",
    "error_condition", "exception_message", "exception_string", "executed_observation_row",
    "filter_can_skip_column", "filter_passes_filter", "filter_passes_projection", "grouped_dataframe",
    "foreach_batch_user_error", "grouping_column_names", "grouping_columns", "hyperloglog_tables",
    "is_foreach_user_error", "job_tags", "join_condition", "jvm_class", "jvm_started",
    "jvm_throwable", "managed_table_location", "map_in_arrow_function", "observation_row", "parse_schema_ddl",
    "processing_time_ms", "projected_function", "projections_keep_column", "python_data_source",
    "python_proxy_error", "python_row", "query_exception", "query_execution", "row_json",
    "run_to_end", "scala_map", "schema_ddl", "session_settings", "schema_string", "schema_tree", "spark_error",
    "streaming_query_exception", "temp_view_exists", "user_error_cause", "uses_current_time",
    "with_batch_timestamp",
]
