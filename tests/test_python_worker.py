"""microbatch in PySpark's worker processes (``microbatch.python_worker``): a worker that
has imported microbatch freezes what survives a full collection after new imports, so the
collection PySpark's daemon runs after each task walks only what tasks made since. The
driver is left as it is."""
from __future__ import annotations

import gc
import sys

import pyarrow as pa
from pyspark import cloudpickle

from microbatch import python_worker

cloudpickle.register_pickle_by_value(sys.modules[__name__])   # (the probe, on Spark's workers)


def _probe(batches):
    import microbatch  # noqa: F401  (as unpickling a task function that refers to it does)
    for _ in batches:
        pass
    gc.collect()            # what PySpark's daemon runs after each task
    yield pa.RecordBatch.from_pydict({
        "worker": [python_worker.in_pyspark_worker()],
        "installed": [python_worker._freeze_survivors in gc.callbacks],
        "frozen": [gc.get_freeze_count()],
        "walked": [len(gc.get_objects())]})      # what a full collection walks now


def test_a_worker_that_imported_microbatch_freezes_its_long_lived_objects(spark):
    rows = spark.range(0, 2, 1, 2).mapInArrow(_probe, "worker boolean, installed boolean, frozen long, walked long") \
        .collect()
    assert len(rows) == 2
    for row in rows:
        assert row.worker and row.installed
        assert row.frozen > 20_000, row           # modules, classes, functions of pyspark, pyarrow, microbatch
        assert row.walked < row.frozen / 4, row   # a collection no longer walks them


def test_the_driver_is_left_as_it_is():
    assert not python_worker.in_pyspark_worker()
    assert python_worker.install() is False
    assert python_worker._freeze_survivors not in gc.callbacks
    frozen = gc.get_freeze_count()
    gc.collect()
    assert gc.get_freeze_count() == frozen
