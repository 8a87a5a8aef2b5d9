"""A batch's tasks read the query's session confs, whichever way the sink runs the batch
(the ``noop`` sink runs its plan as an RDD action, which does not carry them by itself:
the byte bound below is read in the task), and Arrow batches to Python workers are
bounded by rows unless the session bounds bytes."""
from __future__ import annotations

import json
import os
import sys

from pyspark import cloudpickle

from helpers import confs
from microbatch import MemoryStream

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"


def _recording(directory: str):
    """A mapInArrow function that notes, per Arrow batch it gets, its rows and the byte
    bound its task was given, in a file of ``directory``."""
    def record(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        seen = []
        for batch in batches:
            seen.append({"rows": batch.num_rows, "bytes": context.getLocalProperty(MAX_BYTES)})
            yield batch
        with open(os.path.join(directory, f"{context.taskAttemptId()}.json"), "w") as f:
            json.dump(seen, f)
    return record


def _run_noop(ss, directory, checkpoint, rows: int) -> list[dict]:
    os.makedirs(directory, exist_ok=True)
    ms = MemoryStream(ss, "value INT")
    frame = ms.toDF().mapInArrow(_recording(str(directory)), "value INT")
    query = frame.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
    try:
        ms.addData(list(range(rows)))
        query.processAllAvailable()
    finally:
        query.stop()
    seen = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            seen += json.load(f)
    return seen


def test_arrow_batches_to_python_are_not_measured_in_bytes_unless_the_session_says(ss, tmp_path):
    seen = _run_noop(ss, tmp_path / "seen", tmp_path / "checkpoint", 5)
    assert seen and {b["bytes"] for b in seen} == {str(2**31 - 1)}   # Spark's Int.MaxValue: no measure
    assert ss.spark.conf.get(MAX_BYTES, None) is None                  # (the user's session unchanged)


def test_a_session_s_own_arrow_byte_bound_is_kept(ss, tmp_path):
    with confs(ss.spark, {MAX_BYTES: "30"}):
        seen = _run_noop(ss, tmp_path / "seen", tmp_path / "checkpoint", 10)
    assert sum(b["rows"] for b in seen) == 10
    assert {b["bytes"] for b in seen} == {"30"}
    assert max(b["rows"] for b in seen) < 10      # 30 bytes hold a few INT rows, not ten
