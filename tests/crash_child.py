"""The process the SIGKILL crash test kills: json files -> parquet, processing-time trigger.

Run as ``python crash_child.py SRC OUT CHECKPOINT``. Prints ``STARTED`` once the
query runs and ``PROGRESS <batchId>`` after every batch, so the test can pick its
moments. ``writer`` is also used by the test to finish the job in its own process.
"""
from __future__ import annotations

import sys

from pyspark.sql import functions as F

from microbatch import StreamingSession, StreamingQueryListener


def writer(ss, src: str, out: str, checkpoint: str):
    frame = (ss.readStream.format("json").schema("id INT, name STRING")
             .option("maxFilesPerTrigger", 1).load(src))
    return (frame.where("id % 3 != 0")
            .withColumn("label", F.concat_ws("-", "name", F.col("id").cast("string")))
            .writeStream.format("parquet").option("checkpointLocation", checkpoint)
            .option("path", out))


class PrintProgress(StreamingQueryListener):
    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        print(f"PROGRESS {event.progress['batchId']}", flush=True)

    def onQueryTerminated(self, event) -> None:
        pass


def main() -> None:
    src, out, checkpoint = sys.argv[1:4]
    ss = StreamingSession(conf={"spark.sql.shuffle.partitions": "2"})
    ss.streams.addListener(PrintProgress())
    query = writer(ss, src, out, checkpoint).trigger(processingTime="100 milliseconds").start()
    print("STARTED", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
