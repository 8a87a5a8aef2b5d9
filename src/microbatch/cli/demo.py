"""``microbatch demo``: a small pipeline on an embedded local Spark.

rate-micro-batch -> filter/withColumn -> a foreachBatch sink that keeps a
running total, with a listener printing each batch's progress. It runs a fixed
number of batches, stops, restarts from its checkpoint for one more batch to
show that it resumes where it stopped, and exits.
"""
from __future__ import annotations

import shutil
import tempfile
import time

from pyspark.sql import functions as F

from microbatch import StreamingQueryListener, StreamingSession


class PrintProgress(StreamingQueryListener):
    def onQueryStarted(self, event):
        print(f"started   query {event.id} (run {event.runId})")

    def onQueryProgress(self, event):
        p = event.progress
        d = p["durationMs"]
        src = p["sources"][0]
        print(f"batch {p['batchId']:>3}: {p['numInputRows']:>8} rows in {p['batchDuration']:>5} ms "
              f"(addBatch {d.get('addBatch', 0)} ms, walCommit {d.get('walCommit', 0)} ms, "
              f"commitOffsets {d.get('commitOffsets', 0)} ms) offsets {src['startOffset']} -> "
              f"{src['endOffset']}")

    def onQueryTerminated(self, event):
        print(f"terminated query {event.id}" + (f" with {event.exception}" if event.exception else ""))


def run_demo(batches: int, rows_per_batch: int, checkpoint: str | None) -> int:
    print("Starting an embedded local Spark (takes a few seconds)...")
    ss = StreamingSession()
    listener = PrintProgress()
    ss.streams.addListener(listener)
    own_checkpoint = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="microbatch-demo-")
    totals = {"rows": 0, "even_sum": 0}

    def write(df, batch_id):
        row = df.agg(F.count("*").alias("n"), F.sum("value").alias("s")).first()
        totals["rows"] += row["n"]
        totals["even_sum"] += row["s"] or 0

    def start():
        events = (ss.readStream.format("rate-micro-batch")
                  .option("rowsPerBatch", rows_per_batch).option("numPartitions", 2).load())
        evens = (events.filter(F.col("value") % 2 == 0)
                 .withColumn("batch_time", F.current_timestamp()))
        return (evens.writeStream.foreachBatch(write).queryName("demo")
                .trigger(processingTime="1 second")
                .option("checkpointLocation", checkpoint).start())

    try:
        query = start()
        while query.isActive and (query.lastProgress or {}).get("batchId", -1) < batches - 1:
            time.sleep(0.05)
        query.stop()
        if query.exception() is not None:
            raise query.exception()
        print(f"stopped after {len(query.recentProgress)} batches; restarting from {checkpoint}")
        query = start()
        first_id = query.id
        while query.isActive and not query.recentProgress:
            time.sleep(0.05)
        query.stop()
        if query.exception() is not None:
            raise query.exception()
        resumed_at = query.recentProgress[0]["batchId"]
        ss.streams._wait_for_listeners()
        print(f"resumed at batch {resumed_at} with the same query id {first_id}")
        print(f"total even rows seen: {totals['rows']}, sum of values: {totals['even_sum']}")
        return 0
    finally:
        ss.stop()
        if own_checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)
