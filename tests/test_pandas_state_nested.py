"""Group aggregate pandas UDFs in a streaming aggregation, refused as Spark's engine
refuses them (issue 59)."""
from __future__ import annotations

import sys

import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf, pandas_udf
from pyspark.sql.types import DoubleType

from helpers import collect_batches, json_stream

# the functions below run in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- group aggregate pandas UDFs ----------------------------------------------------------
@pandas_udf(DoubleType())
def mean_udf(v: pd.Series) -> float:
    return v.mean()


@arrow_udf(DoubleType())
def mean_arrow(v: pa.Array) -> pa.Scalar:
    import pyarrow.compute as pc
    return pc.mean(v)


UDAFS = {
    "a pandas UDAF": ("update", lambda f: f.groupBy("id").agg(mean_udf(F.col("id").cast("double")).alias("m"))),
    "an Arrow UDAF": ("update", lambda f: f.groupBy("id").agg(mean_arrow(F.col("id").cast("double")).alias("m"))),
    "a pandas UDAF beside count over a window": (
        "append", lambda f: f.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*"), mean_udf(F.col("id").cast("double")).alias("m"))),
}


@pytest.mark.parametrize("case", list(UDAFS))
def test_a_group_aggregate_pandas_udf_in_a_streaming_aggregation_is_refused_as_spark_refuses_it(
        spark, ss, events, tmp_path, case):
    """Spark's engine fails the query as it plans its first batch (StatefulAggregationStrategy:
    AnalysisException "Streaming aggregation doesn't support group aggregate pandas UDF");
    microbatch refuses it at start with the same exception and words, before any batch."""
    mode, transform = UDAFS[case]
    with pytest.raises(Exception) as theirs:
        collect_batches(transform(json_stream(spark, events, "id INT, ts TIMESTAMP")), tmp_path / "spark", mode)
    message = "Streaming aggregation doesn't support group aggregate pandas UDF"
    assert message in str(theirs.value)
    frame = transform(json_stream(ss, events, "id INT, ts TIMESTAMP"))   # (defined as on Spark)
    with pytest.raises(AnalysisException) as ours:
        collect_batches(frame, tmp_path / "microbatch", mode)
    assert str(ours.value).startswith(message)
    assert not (tmp_path / "microbatch" / "commits").exists() or \
        not list((tmp_path / "microbatch" / "commits").iterdir())
