"""``store_child.py SRC OUT CKPT SETTINGS``: the window count of
``object_store_queries.py`` from ``SRC`` into the parquet file sink at ``OUT``,
checkpoint ``CKPT``, all on an object store whose Spark settings are the JSON object
``SETTINGS``, in a process a crash point may kill (``MICROBATCH_CRASH_AT``)."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from microbatch import crash_points

crash_points.arm()

from microbatch import StreamingSession, embedded_spark  # noqa: E402
from object_store_queries import windowed_to_parquet  # noqa: E402

if __name__ == "__main__":
    src, out, ckpt, settings = sys.argv[1:5]
    spark = embedded_spark(conf={**json.loads(settings), "spark.sql.shuffle.partitions": "2"})
    windowed_to_parquet(StreamingSession(spark), src, out, ckpt)
    print("DONE", flush=True)
    spark.stop()
