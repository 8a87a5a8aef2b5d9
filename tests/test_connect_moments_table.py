"""Over Spark Connect the client has no JVM, so the final expressions of the moment
functions (corr, covariances, skewness, kurtosis, regr_*) come from a table of Spark
4.3's (``spark_internals.connect.analysis._MOMENTS``); a classic session reads them from
Spark's classes. Here the table is checked against those, with
``spark.sql.legacy.statisticalAggregate`` off and on: a Spark whose expressions change
fails here, not in a Connect query's answers. So are the HyperLogLog++ bias tables, and
the state reader's errors, which a Connect client builds from a table of Spark's factories."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import confs
from microbatch.spark_internals import running_version
from microbatch.spark_internals.analysis import aggregation_parts
from microbatch.spark_internals.connect.analysis import _MOMENTS


@pytest.mark.skipif(not running_version().at_least(4, 3), reason="the table is Spark 4.3's (Connect runs on 4.3 only)")
@pytest.mark.parametrize("legacy", ["false", "true"])
def test_the_connect_table_of_final_expressions_is_sparks(spark, legacy):
    df = spark.createDataFrame([], "k STRING, v INT, d DOUBLE")
    with confs(spark, {"spark.sql.legacy.statisticalAggregate": legacy}):
        for name, (function, replaced, plain, with_legacy) in _MOMENTS.items():
            _, _, outputs = aggregation_parts(df.groupBy("k").agg(getattr(F, name)("d", "v") if name not in (
                "skewness", "kurtosis") else getattr(F, name)("v")))
            call = outputs[1].calls[0]
            assert (call.function, call.replaced, call.final) == \
                (function, replaced, with_legacy if legacy == "true" else plain), name


@pytest.mark.skipif(not running_version().at_least(4, 3), reason="the tables are Spark 4.3's (Connect runs on 4.3 only)")
def test_the_connect_copy_of_the_hyperloglog_tables_is_sparks(spark):
    """approx_count_distinct's estimate over Connect reads Spark's HyperLogLog++ bias tables
    from a copy (``spark_internals.connect.analysis.hyperloglog_tables``): equal to the JVM's
    at every precision."""
    from microbatch.spark_internals.analysis import hyperloglog_tables as from_the_jvm
    from microbatch.spark_internals.connect.analysis import hyperloglog_tables as from_the_copy
    for p in range(4, 20):
        assert from_the_copy(p) == from_the_jvm(p), p


#: each of Spark's state data source error factories microbatch's state reader raises
#: through, with arguments of the kinds it passes
_STATE_ERRORS = [("source", "requiredOptionUnspecified", "path"),
                 ("source", "invalidOptionValue", "joinSide", "Valid values are left,right,none"),
                 ("source", "invalidOptionValueIsNegative", "operatorId"),
                 ("source", "invalidOptionValueIsEmpty", "storeName"),
                 ("source", "conflictOptions", ["joinSide", "storeName"]),
                 ("source", "committedBatchUnavailable", "file:/tmp/checkpoint"),
                 ("source", "offsetLogUnavailable", 3, "file:/tmp/checkpoint"),
                 ("store", "stateStoreSnapshotPartitionNotFound", 4, 0, "file:/tmp/checkpoint/state"),
                 ("store", "stateStoreSnapshotFileNotFound", "file:/tmp/checkpoint/state/0/1/1.snapshot",
                  "HDFSStateStoreProvider[id = (op=0,part=1),dir = file:/tmp/checkpoint/state/0/1]")]


@pytest.mark.skipif(not running_version().at_least(4, 3), reason="the table is Spark 4.3's (Connect runs on 4.3 only)")
@pytest.mark.parametrize("case", _STATE_ERRORS, ids=[c[1] for c in _STATE_ERRORS])
def test_the_connect_state_reader_errors_are_sparks(spark, case):
    """Over Connect the state reader's errors are built in the client (``connect.errors
    ._STATE_ERRORS``); on a classic session by Spark's own factories: the same condition,
    parameters, SQL state and message."""
    from microbatch.spark_internals.connect.errors import state_reader_error as built_by_the_client
    from microbatch.spark_internals.errors import state_reader_error as built_by_the_jvm
    ours, sparks = built_by_the_client(*case), built_by_the_jvm(*case)
    assert type(ours).__name__ == type(sparks).__name__ == "SparkRuntimeException"
    assert (ours.getCondition(), ours.getMessageParameters(), ours.getSqlState()) == \
        (sparks.getCondition(), sparks.getMessageParameters(), sparks.getSqlState())
    assert ours.getMessage() == sparks.getMessage()
