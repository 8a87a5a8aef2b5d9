"""The process of the two-runs test: ``python lease_child.py - OUT CKPT``.

rate-micro-batch -> parquet at OUT, checkpoint CKPT (local or ``s3://``; Spark confs for
the endpoint come as JSON in ``LEASE_CHILD_CONF``). Prints ``STARTED``, ``PROGRESS
<batchId>``, or ``REFUSED <message>`` and exits 3 when the start is refused.
"""
from __future__ import annotations

import json
import os
import sys

from microbatch import StreamingSession
from microbatch.errors import ConcurrentUpdateError

from child_process import PrintProgress


def main() -> None:
    _, out, ckpt = sys.argv[1:4]
    ss = StreamingSession(conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                                "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                                **json.loads(os.environ.get("LEASE_CHILD_CONF", "{}"))})
    ss.streams.addListener(PrintProgress())
    try:
        query = (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
                 .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
                 .trigger(processingTime="100 milliseconds").start())
    except ConcurrentUpdateError as e:
        print("REFUSED " + str(e).splitlines()[0], flush=True)
        sys.exit(3)
    print("STARTED", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
