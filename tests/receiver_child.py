"""The query the receiver crash tests kill:
``python receiver_child.py PORT OUT CKPT ACKMODE [SOURCE]``.

SOURCE ``http`` (default): an http source listening on PORT (``id INT, client INT``);
``socket``: a socket source reading the line server on PORT (``value STRING``). Into
parquet OUT, a processing-time trigger. Prints ``STARTED`` and ``PROGRESS <batchId>``
(child_process.PrintProgress).
"""
from __future__ import annotations

import sys

from microbatch import StreamingSession, crash_points

from child_process import PrintProgress


def main() -> None:
    port, out, ckpt, ack_mode = sys.argv[1:5]
    source = sys.argv[5] if len(sys.argv) > 5 else "http"
    crash_points.arm()
    # the socket test reads the whole log back at the end: keep every block
    retain = "3" if source == "http" else "1000"
    ss = StreamingSession(conf={"spark.sql.shuffle.partitions": "2",
                                "spark.sql.streaming.minBatchesToRetain": retain})
    ss.streams.addListener(PrintProgress())
    if source == "http":
        reader = ss.readStream.format("http").schema("id INT, client INT").option("port", port)
    else:
        reader = ss.readStream.format("socket").option("host", "127.0.0.1").option("port", port)
    # the socket's lines come faster than 50 a trigger drains on a loaded machine: the
    # backlog logged by the end would take longer than the test waits (CI, 2026-12-03)
    max_records = 50 if source == "http" else 1000
    frame = (reader.option("ackMode", ack_mode).option("blockInterval", "50ms")
             .option("maxRecordsPerTrigger", max_records).load())
    query = (frame.writeStream.format("parquet").option("checkpointLocation", ckpt).option("path", out)
             .trigger(processingTime="100 milliseconds").start())
    print("STARTED", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
