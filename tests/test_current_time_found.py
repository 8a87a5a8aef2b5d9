"""``current_timestamp()`` is the batch's timestamp wherever the query calls it (Spark's
engine replaces it by ``CurrentBatchTimestamp`` in the whole plan of a batch). microbatch
finds the calls in Spark's analysed plan; two places it did not look:

- a projection of more than 25 columns, where the call is past the 25th: the plan's text
  (``toString``) shortens a node's lists past ``spark.sql.debug.maxToStringFields``, so
  the call was not in it and ran as the wall clock's time;
- below applyInPandasWithState, whose place in the query's template is an empty relation
  of its output: the steps below it were not looked at.
"""
from __future__ import annotations

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from microbatch import ManualClock, MemoryStream
from microbatch.sinks.memory import MemorySink

BATCH_MS = 1_234_567


def _run(ss, frame, mode="append"):
    sink = MemorySink(ss.spark, frame.schema, mode)
    query = frame.writeStream.outputMode(mode).sink(sink).clock(ManualClock(BATCH_MS)).start()
    return query, sink


def test_current_timestamp_past_the_25th_column_is_the_batch_timestamp(ss):
    ms = MemoryStream(ss, "value INT")
    columns = [F.col("value").alias(f"c{i}") for i in range(30)]
    frame = ms.toDF().select(*columns, F.expr("unix_millis(current_timestamp())").alias("ms"))
    query, sink = _run(ss, frame)
    ms.add_data([1, 2])
    query.processAllAvailable()
    query.stop()
    assert {r.ms for r in sink.all_data()} == {BATCH_MS}


def test_current_timestamp_below_apply_in_pandas_with_state_is_the_batch_timestamp(ss):
    def _first_time_seen(key, rows, state):   # (nested: the workers cannot import the tests)
        times = [int(t) for frame in rows for t in frame["ms"]]
        yield pd.DataFrame({"value": [key[0]], "ms": [min(times)]})

    ms = MemoryStream(ss, "value INT")
    frame = (ms.toDF().withColumn("ms", F.expr("unix_millis(current_timestamp())"))
             .groupBy("value").applyInPandasWithState(_first_time_seen, "value INT, ms LONG", "n LONG", "update",
                                                      GroupStateTimeout.NoTimeout))
    query, sink = _run(ss, frame, "update")
    ms.add_data([1, 2])
    query.processAllAvailable()
    query.stop()
    assert {r.ms for r in sink.all_data()} == {BATCH_MS}


def test_every_current_time_function_is_the_batch_time_past_the_25th_column(ss):
    """``now()``, ``current_date()`` and ``localtimestamp()`` too (Spark's engine replaces
    each), each past a projection's 25th column."""
    ms = MemoryStream(ss, "value INT")
    columns = [F.col("value").alias(f"c{i}") for i in range(30)]
    frame = ms.toDF().select(*columns, F.expr("unix_millis(now())").alias("now"),
                             F.expr("current_date() = to_date(timestamp_millis(1234567))").alias("date"),
                             F.expr("cast(localtimestamp() AS STRING) = cast(timestamp_millis(1234567) AS STRING)")
                             .alias("local"))
    query, sink = _run(ss, frame)
    ms.add_data([1])
    query.processAllAvailable()
    query.stop()
    assert {(r.now, r.date, r.local) for r in sink.all_data()} == {(BATCH_MS, True, True)}
