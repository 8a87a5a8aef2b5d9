"""applyInPandasWithState sessionization against Spark's own engine, in one process.

``python -m benchmarks.group_state [--batches 10] [--rows 1000000] [--users 10000]``

A ``rate-micro-batch`` stream of ``rows`` rows a batch (one second of event time per
batch, a 5-second watermark), each row an event of user ``value % users``. Per user,
``applyInPandasWithState`` keeps the session's event count and last event time, and
closes the session (one output row) when no event came for 3 seconds of event time
(an event-time timeout). The same query runs on Spark's engine and on microbatch, one
run each after a warm-up run of each. It prints the median ``triggerExecution`` of
batches 1.. per engine and their ratio (microbatch / Spark), and writes
``benchmarks/results/group_state.json``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from benchmarks.progress import batch_times, both_engines, engines_cell, first_batches, write_results


def sessions(key, frames, state):
    """A user's session: events and the last event time; closed 3 s after its last event."""
    import pandas as pd
    if state.hasTimedOut:
        events, last = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "events": [events], "last": [last]})
        return
    events, last = state.get if state.exists else (0, 0)
    for frame in frames:
        events += len(frame)
        last = max(last, int(frame["timestamp"].max().timestamp() * 1000))
    state.update((events, last))
    state.setTimeoutTimestamp(max(last + 3000, state.getCurrentWatermarkMs() + 1))
    yield from ()


def run(session, rows: int, users: int, batches: int) -> list[dict]:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout
    frame = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
             .option("numPartitions", 2).option("advanceMillisPerBatch", 1000).load()
             .withWatermark("timestamp", "5 seconds").withColumn("user", F.col("value") % users))
    query = (frame.groupBy("user").applyInPandasWithState(
                 sessions, "user LONG, events LONG, last LONG", "events LONG, last LONG", "append",
                 GroupStateTimeout.EventTimeTimeout)
             .writeStream.format("noop").outputMode("append")
             .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-group-state-"))
             .trigger(processingTime="0 seconds").start())
    progress = first_batches(query, batches)
    return [{**batch_times(p), "inputRows": p.numInputRows, "stateRows": p.stateOperators[0].numRowsTotal}
            for p in progress]


def measure(rows: int = 1_000_000, users: int = 10_000, batches: int = 10) -> tuple[dict, dict, dict]:
    """Both engines' batches, their medians, and the cell of the full run
    (``python -m benchmarks``)."""
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers need `sessions`
    results, medians = both_engines(run, (rows // 10, users, 3), (rows, users, batches))
    return results, medians, engines_cell(results, medians)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    args = parser.parse_args(argv)

    results, medians, _ = measure(args.rows, args.users, args.batches)
    print(f"applyInPandasWithState sessionization, {args.rows} rows a batch, {args.users} users, "
          f"{args.batches} batches")
    for name, batches in results.items():
        print(f"  {name:10} median triggerExecution {medians[name]:6.0f} ms; state rows "
              f"{[b['stateRows'] for b in batches]}")
    print(f"  microbatch / Spark: {medians['microbatch'] / medians['spark']:.2f}")
    write_results("group_state", args, medians, results)


if __name__ == "__main__":
    main()
