"""``applyInPandasWithState``, its home: its plan node and policy (``node``), its step and
task (``step``: one Spark task per state partition), its state and that state's layout in
Spark's engine (``spark_layout``).

Spark's ``FlatMapGroupsInPandasWithStateExec``. The batch's rows, hash-partitioned by
the grouping keys into the state partitions, reach the task as Arrow; the task opens
the store of its partition at version N (the batch id) and then, as Spark does:

1. With an event-time timeout, drops rows at or before the previous batch's watermark
   (late; counted as ``numRowsDroppedByWatermark``).
2. Calls the user's function once per key that has rows, in ascending key order (nulls
   first), with the key as a tuple, an iterator of pandas DataFrames (the key's rows, in
   chunks of ``spark.sql.execution.arrow.maxRecordsPerBatch``) and PySpark's own
   ``GroupState`` over the key's stored state. A call starts with no timeout set, as in
   Spark: a function that wants one sets it again each time.
3. With a timeout, calls the function for every stored key whose timeout timestamp is
   set and before the threshold (the batch's processing time, or this batch's watermark
   for an event-time timeout), with ``hasTimedOut`` true and, as PySpark calls it, one
   empty DataFrame of the input's columns.
4. After each call, Spark's rule: a removed state without a timeout is removed from the
   store; else it is written when updated, removed or its timeout changed.

The store keeps per key Spark's value: ``groupState`` (a struct of the state's fields, null
when only a timeout is kept) and ``timeoutTimestamp`` (ms, -1 for none), so the state
reader shows what Spark's shows; timestamps as µs, given to the function as datetimes.
The function's DataFrames become Arrow batches of the declared output schema, columns
matched by name (by position when the labels are not strings), as PySpark matches them.
"""
from microbatch.operators.group_state.node import FlatMapGroupsWithState
from microbatch.operators.group_state.step import GroupStateStep

__all__ = ["FlatMapGroupsWithState", "GroupStateStep"]
