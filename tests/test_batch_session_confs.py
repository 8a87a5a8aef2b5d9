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


def test_the_batch_session_reads_the_querys_state_with_microbatchs_reader(ss, tmp_path):
    """Inside foreachBatch, ``batch_df.sparkSession.read.format("statestore")`` (and
    ``"state-metadata"``) read the running query's checkpoint as ``ss.read`` does, as
    PySpark's own tests read it on Spark's engine; the session and its reader stay PySpark's
    classes, and every other format is Spark's. (A file source's batch is the batch
    session's: a source that makes its batches in the user's session gives that one.)"""
    from pyspark.sql import DataFrameReader, SparkSession
    source, checkpoint = tmp_path / "in", str(tmp_path / "checkpoint")
    source.mkdir()
    for i, values in enumerate(([1, 1, 2], [2, 3])):
        (source / f"{i}.json").write_text("".join(json.dumps({"value": v}) + "\n" for v in values))
        os.utime(source / f"{i}.json", (1_700_000_000 + i, 1_700_000_000 + i))
    seen = {}

    def inspect(batch_df, batch_id):
        batch_df.collect()
        session = batch_df.sparkSession
        seen["classes"] = (isinstance(session, SparkSession), isinstance(session.read, DataFrameReader),
                           isinstance(session.read.format("json"), DataFrameReader), session is not ss.spark)
        if batch_id == 1:
            seen["state"] = sorted((r.key.value, r.value["count"]) for r in
                                   session.read.format("statestore").load(checkpoint).collect())
            seen["operators"] = [r.operatorName for r in session.read.format("state-metadata").load(checkpoint).collect()]
    query = (ss.readStream.schema("value INT").option("maxFilesPerTrigger", 1).json(str(source))
             .groupBy("value").count().writeStream.outputMode("update").foreachBatch(inspect)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(120) is not False and query.exception() is None, query.exception()
    assert seen["classes"] == (True, True, True, True)
    assert seen["state"] == [(1, 2), (2, 1)]    # (after batch 0: the last committed when batch 1 runs)
    assert seen["operators"] == ["stateStoreSave"]
    assert sorted((r.key.value, r.value["count"]) for r in ss.read.format("statestore").load(checkpoint).collect()) \
        == [(1, 2), (2, 2), (3, 1)]
