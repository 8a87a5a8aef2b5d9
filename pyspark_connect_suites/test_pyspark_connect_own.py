"""PySpark 4.3's own Spark Connect streaming tests, unmodified, on a Connect client's
session wrapped by ``StreamingSession`` (``pyspark_suites/engine.py``), against a Connect
server in a process of its own (``conftest.py``)."""
from __future__ import annotations

from pyspark.sql.tests.connect import test_parity_python_streaming_datasource as _datasource
from pyspark.sql.tests.connect.pandas.streaming import test_parity_pandas_grouped_map_with_state as _grouped
from pyspark.sql.tests.connect.pandas.streaming import test_parity_pandas_transform_with_state as _tws_pandas
from pyspark.sql.tests.connect.pandas.streaming import (
    test_parity_pandas_transform_with_state_state_variable as _tws_pandas_variables)
from pyspark.sql.tests.connect.pandas.streaming import test_parity_transform_with_state as _tws_rows
from pyspark.sql.tests.connect.pandas.streaming import (
    test_parity_transform_with_state_state_variable as _tws_rows_variables)
from pyspark.sql.tests.connect.streaming import test_parity_foreach as _foreach
from pyspark.sql.tests.connect.streaming import test_parity_foreach_batch as _foreach_batch
from pyspark.sql.tests.connect.streaming import test_parity_listener as _listener
from pyspark.sql.tests.connect.streaming import test_parity_streaming as _streaming

from engine import OnMicrobatch


class StreamingParity(OnMicrobatch, _streaming.StreamingParityTests):
    pass


class ForeachParity(OnMicrobatch, _foreach.StreamingForeachParityTests):
    pass


class ForeachBatchParity(OnMicrobatch, _foreach_batch.StreamingForeachBatchParityTests):
    pass


class ListenerParity(OnMicrobatch, _listener.StreamingListenerParityTests):
    pass


class ApplyInPandasWithStateParity(OnMicrobatch, _grouped.GroupedApplyInPandasWithStateTests):
    pass


class TransformWithStateInPandasParity(OnMicrobatch, _tws_pandas.TransformWithStateInPandasParityTests):
    pass


class TransformWithStateParity(OnMicrobatch, _tws_rows.TransformWithStateInPySparkParityTests):
    pass


class TransformWithStateInPandasStateVariableParity(
        OnMicrobatch, _tws_pandas_variables.TransformWithStateInPandasStateVariableParityTests):
    pass


class TransformWithStateStateVariableParity(
        OnMicrobatch, _tws_rows_variables.TransformWithStateInPySparkStateVariableParityTests):
    pass


class PythonStreamingDataSourceParity(OnMicrobatch, _datasource.PythonStreamingDataSourceParityTests):
    pass
