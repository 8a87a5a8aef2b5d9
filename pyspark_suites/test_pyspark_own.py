"""PySpark 4.3's own tests of arbitrary stateful processing, Python streaming data sources
and SQL over a stream's temporary view, unmodified, on a session wrapped by
``StreamingSession`` (``engine.py``).

The test classes are PySpark's; only their session is wrapped. Every one of them passes
on Spark's own engine here (``MICROBATCH_PYSPARK_ENGINE=spark`` runs them there: 69 tests,
about 8 minutes), and every one must pass on microbatch; one waits on the wall clock with
a deadline that either engine misses now and then on two busy cores, and gets a second
try (``conftest.py``, ``WALL_CLOCK_BOUND``).
"""
from __future__ import annotations

from pyspark.sql.tests import test_python_streaming_datasource as _datasource
from pyspark.sql.tests.pandas import test_pandas_grouped_map_with_state as _grouped
from pyspark.sql.tests.pandas.streaming import test_pandas_transform_with_state as _tws_pandas
from pyspark.sql.tests.pandas.streaming import test_transform_with_state as _tws_rows
from pyspark.sql.tests.streaming import test_streaming as _streaming
from pyspark.testing.sqlutils import ReusedSQLTestCase

from engine import OnMicrobatch


class ApplyInPandasWithState(OnMicrobatch, _grouped.GroupedApplyInPandasWithStateTests):
    pass


class TransformWithStateInPandas(OnMicrobatch, _tws_pandas.TransformWithStateInPandasTests):
    pass


class TransformWithState(OnMicrobatch, _tws_rows.TransformWithStateInPySparkTests):
    pass


class PythonStreamingDataSource(OnMicrobatch, _datasource.PythonStreamingDataSourceTests):
    pass


class StreamingWithTemporaryView(OnMicrobatch, ReusedSQLTestCase):
    """PySpark's test of SQL over a stream's temporary view (``spark.sql`` is
    ``StreamingSession.sql`` on the wrapped session). The rest of PySpark's
    ``StreamingTests`` read ``python/test_support/``, which the wheel does not ship."""

    test_streaming_with_temporary_view = _streaming.StreamingTestsMixin.test_streaming_with_temporary_view
