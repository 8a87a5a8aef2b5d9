"""Processes the Kafka crash tests kill. ``python kafka_child.py SRC OUT CKPT MODE BOOTSTRAP``.

- ``source``: Kafka topic SRC -> parquet OUT (a processing-time trigger,
  ``maxOffsetsPerTrigger`` so that a run has many batches to be killed in).
- ``sink``: json files in SRC -> Kafka topic OUT with the exactly-once option;
  ``sink-at-least-once`` without it.
- ``real-time``: Kafka topic SRC -> Kafka topic OUT in real-time mode (2-second batches);
  ``real-time-exactly-once`` with the sink's exactly-once option.

Prints ``STARTED`` and ``PROGRESS <batchId>`` (child_process.PrintProgress).
"""
from __future__ import annotations

import sys

from microbatch import StreamingSession, crash_points

from child_process import PrintProgress


def source_writer(ss, topic: str, out: str, ckpt: str, bootstrap: str):
    frame = (ss.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 40).load())
    return (frame.selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet").option("checkpointLocation", ckpt).option("path", out))


def sink_writer(ss, src: str, topic: str, ckpt: str, bootstrap: str, exactly_once: bool = True):
    frame = (ss.readStream.format("json").schema("id INT, name STRING")
             .option("maxFilesPerTrigger", 2).load(src))
    return (frame.selectExpr("CAST(id AS STRING) AS key", "concat(name, '-', id) AS value")
            .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("kafka.batch.num.messages", 1)     # Tansu's latest-offset quirk
            .option("topic", topic).option("microbatch.exactlyOnce", str(exactly_once).lower())
            .option("checkpointLocation", ckpt))


def real_time_writer(ss, src: str, topic: str, ckpt: str, bootstrap: str, exactly_once: bool):
    frame = (ss.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", src).option("startingOffsets", "earliest").load())
    return (frame.selectExpr("key", "CAST(value AS STRING) AS value")
            .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("kafka.batch.num.messages", 1)     # Tansu's latest-offset quirk
            .option("topic", topic).option("microbatch.exactlyOnce", str(exactly_once).lower())
            .option("checkpointLocation", ckpt).outputMode("update").trigger(realTime="2 seconds"))


def main() -> None:
    src, out, ckpt, mode, bootstrap = sys.argv[1:6]
    crash_points.arm()
    ss = StreamingSession(conf={"spark.sql.shuffle.partitions": "2",
                                "spark.sql.streaming.realTimeMode.minBatchDuration": "1000"})
    ss.streams.addListener(PrintProgress())
    if mode.startswith("real-time"):
        query = real_time_writer(ss, src, out, ckpt, bootstrap, mode.endswith("exactly-once")).start()
        print("STARTED", flush=True)
        query.awaitTermination()
        return
    if mode == "source":
        writer = source_writer(ss, src, out, ckpt, bootstrap)
    else:
        writer = sink_writer(ss, src, out, ckpt, bootstrap, exactly_once=mode == "sink")
    query = writer.trigger(processingTime="100 milliseconds").start()
    print("STARTED", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
