"""PySpark 4.3's own tests of transformWithState's state variables (value, list and map
state, TTL, timers, initial state, and Spark's state readers over the query's checkpoint,
called on the batch's session inside ``foreachBatch``), unmodified, on a session wrapped by
``StreamingSession`` (``engine.py``). About two minutes on two workers: ``make
test-extended`` runs them (``make test-pyspark-extended``), CI does not (README, What runs
where)."""
from __future__ import annotations

import pytest
from pyspark.sql.tests.pandas.streaming import test_pandas_transform_with_state_state_variable as _pandas
from pyspark.sql.tests.pandas.streaming import test_transform_with_state_state_variable as _rows

from engine import OnMicrobatch

pytestmark = pytest.mark.extended


class TransformWithStateInPandasStateVariables(OnMicrobatch, _pandas.TransformWithStateInPandasStateVariableTests):
    pass


class TransformWithStateStateVariables(OnMicrobatch, _rows.TransformWithStateInPySparkStateVariableTests):
    pass
