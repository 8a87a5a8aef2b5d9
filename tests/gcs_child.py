"""``gcs_child.py SRC OUT CKPT ENDPOINT``: the window count of ``test_gcs.py`` from
``SRC`` into the parquet file sink at ``OUT``, checkpoint ``CKPT``, all on the GCS
emulator at ``ENDPOINT``, in a process a crash point may kill (``MICROBATCH_CRASH_AT``)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from microbatch import crash_points

crash_points.arm()

from microbatch import StreamingSession, embedded_spark  # noqa: E402
from microbatch.testing.gcs_server import settings  # noqa: E402
from test_gcs import windowed_to_parquet  # noqa: E402

if __name__ == "__main__":
    src, out, ckpt, endpoint = sys.argv[1:5]
    spark = embedded_spark(conf={**settings(endpoint), "spark.sql.shuffle.partitions": "2"})
    windowed_to_parquet(StreamingSession(spark), src, out, ckpt)
    print("DONE", flush=True)
    spark.stop()
