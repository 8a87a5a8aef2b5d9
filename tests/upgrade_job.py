"""The stateful queries of the checkpoint-upgrade test (``test_checkpoint_upgrade.py``),
run by both engines: a windowed count with a watermark and a deduplication.

Run as a script by an older PySpark (``python tests/upgrade_job.py <dir>``), it writes the
first event files and runs both engines over them into ``<dir>/spark`` and
``<dir>/microbatch`` (checkpoints ``ckpt-<query>``), printing their batches as JSON.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import functions as F

SCHEMA = "id INT, ts TIMESTAMP"
#: event files: (id, seconds) rows; the first two are written before the upgrade
FILES = [
    [(1, 1), (2, 4), (3, 12), (1, 1)],
    [(4, 25), (5, 33), (2, 4), (6, 9)],          # moves the watermark past the first window
    [(7, 41), (8, 44), (5, 33), (9, 58)],
    [(10, 75), (11, 77), (3, 12), (12, 90)],
]


def write_events(events: Path, indexes: range) -> None:
    events.mkdir(parents=True, exist_ok=True)
    for i in indexes:
        lines = [json.dumps({"id": id_, "ts": f"2026-01-01T00:00:{s:02d}Z" if s < 60 else
                             f"2026-01-01T00:01:{s - 60:02d}Z"}) for id_, s in FILES[i]]
        path = events / f"part-{i}.json"
        path.write_text("\n".join(lines) + "\n")
        # distinct modification times, a second apart: Spark 3.5 orders files written in
        # the same millisecond as it lists them, later lines by path too
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


QUERIES = {
    "window-count": lambda frame: frame.withWatermark("ts", "10 seconds").groupBy(
        F.window("ts", "10 seconds")).count(),
    "dedup": lambda frame: frame.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"]),
}


def run_all(session, events: Path, out: Path) -> dict[str, list]:
    """Every query of ``session`` (Spark's SparkSession, or a StreamingSession) over
    ``events`` to the end, resuming from ``out/ckpt-<query>``: its batches as text."""
    batches = {}
    for name, build in QUERIES.items():
        frame = session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(events))
        found: list = []

        def sink(df, batch_id, found=found):
            found.append([batch_id, sorted(str(tuple(r)) for r in df.collect())])

        query = (build(frame).writeStream.outputMode("append").foreachBatch(sink)
                 .option("checkpointLocation", str(out / f"ckpt-{name}")).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        batches[name] = found
    return batches


def main(work: Path) -> None:
    from pyspark.sql import SparkSession

    from microbatch import StreamingSession
    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false").getOrCreate())
    write_events(work / "events", range(2))
    result = {"version": spark.version,
              "spark": run_all(spark, work / "events", work / "spark"),
              "microbatch": run_all(StreamingSession(spark), work / "events", work / "microbatch")}
    spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
