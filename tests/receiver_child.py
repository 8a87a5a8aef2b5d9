"""The query the receiver crash tests kill: ``python receiver_child.py PORT OUT CKPT ACKMODE``.

An http source on PORT (``id INT, client INT``) into parquet OUT, a processing-time
trigger. Prints ``STARTED`` and ``PROGRESS <batchId>`` (child_process.PrintProgress).
"""
from __future__ import annotations

import sys

from microbatch import StreamingSession, crash_points

from child_process import PrintProgress


def main() -> None:
    port, out, ckpt, ack_mode = sys.argv[1:5]
    crash_points.arm()
    ss = StreamingSession(conf={"spark.sql.shuffle.partitions": "2",
                                "spark.sql.streaming.minBatchesToRetain": "3"})
    ss.streams.addListener(PrintProgress())
    frame = (ss.readStream.format("http").schema("id INT, client INT").option("port", port)
             .option("ackMode", ack_mode).option("blockInterval", "50ms")
             .option("maxRecordsPerTrigger", 50).load())
    query = (frame.writeStream.format("parquet").option("checkpointLocation", ckpt).option("path", out)
             .trigger(processingTime="100 milliseconds").start())
    print("STARTED", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
