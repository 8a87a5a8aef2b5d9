"""A stream-stream join, its home: its plan node and policy (``node``), its step and task
(``step``), its state, and the rewrites Spark's optimizer makes of it.

Spark's ``StreamingSymmetricHashJoinExec`` (inner and left/right/full outer joins on
equal keys, optionally with time comparisons between the sides; state format 2). Both
sides' new rows of the batch arrive in the task of their key's partition (tagged with
their side). Per side the state is two stores, as Spark keeps them:

- ``<side>-keyToNumValues``: join key -> how many rows the side holds for it;
- ``<side>-keyWithIndexToValue``: (join key, index) -> the row and its ``matched`` flag.

The task drops late rows (a side's watermarked event time at or before the previous
batch's watermark); then, left side first, joins each new row with the other side's rows
of its key that pass the time comparisons, and adds it to its own side's state. The
right side's rows so meet the left side's new rows too, and each pair is produced once.
A left row is always added (this batch's right rows have not met it yet); a right row
only if it is not already behind this batch's state watermark (Spark 4's rule) or, in a
right or full outer join, it matched nothing. Then each side's rows behind its state
watermark are evicted — by the key, when a join key is a watermarked event time, or by
the side's state value watermark from the time comparisons — an outer side's rows that
never matched coming out with nulls; and the four stores commit version N+1.

The task does this in one of two ways with the same answers: where the stores keep their
memory as Arrow tables (the default provider), a side's batch at a time with Arrow's hash
joins and filters (``JoinTask._join_tables``); otherwise (the RocksDB provider) a row at
a time (``JoinTask._store_and_join``).
"""
from microbatch.operators.join.node import (StreamJoin, condition_sides_pushed, engine_event_times, filters_pushed_into_joins, join_filters_inferred,
                                            joins_null_filtered, joins_times_pruned, outer_joins_eliminated,
                                            outer_joins_narrowed,
                                            semi_joins_through_unions,
                                            with_null_filters)
from microbatch.operators.join.step import JOIN_SIDE_TAGS, JoinStep, JoinTask, join_statistics_column

__all__ = ["JOIN_SIDE_TAGS", "JoinStep", "JoinTask", "StreamJoin", "condition_sides_pushed", "engine_event_times", "filters_pushed_into_joins", "join_filters_inferred",
           "join_statistics_column", "joins_null_filtered", "joins_times_pruned", "outer_joins_eliminated", "outer_joins_narrowed",
           "semi_joins_through_unions",
           "with_null_filters"]
