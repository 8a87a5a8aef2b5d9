"""The stateful queries of the checkpoint-upgrade test (``test_checkpoint_upgrade.py``),
run by both engines: a windowed count with a watermark and a deduplication.

Run as a script by an older PySpark (``python tests/upgrade_job.py <dir> first|back``), it
writes event files and runs both engines over them into ``<dir>/spark`` and
``<dir>/microbatch`` (checkpoints ``ckpt-<query>``), printing their batches (and the
queries that failed) as JSON.
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
    [(13, 101), (14, 104), (11, 77), (15, 119)],   # back on the older line
]


def write_events(events: Path, indexes: range) -> None:
    events.mkdir(parents=True, exist_ok=True)
    for i in indexes:
        lines = [json.dumps({"id": id_, "ts": f"2026-01-01T00:{s // 60:02d}:{s % 60:02d}Z"}) for id_, s in FILES[i]]
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


def run_all(session, events: Path, out: Path, failures: dict | None = None) -> dict[str, list]:
    """Every query of ``session`` (Spark's SparkSession, or a StreamingSession) over
    ``events`` to the end, resuming from ``out/ckpt-<query>``: its batches as text. With
    ``failures``, a query that fails is recorded there (its error's class and message)."""
    batches = {}
    for name, build in QUERIES.items():
        frame = session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(events))
        found: list = []

        def sink(df, batch_id, found=found):
            found.append([batch_id, sorted(str(tuple(r)) for r in df.collect())])

        try:
            query = (build(frame).writeStream.outputMode("append").foreachBatch(sink)
                     .option("checkpointLocation", str(out / f"ckpt-{name}")).trigger(availableNow=True).start())
            query.awaitTermination(300)
            error = query.exception()
        except Exception as e:  # noqa: BLE001 - refused at start: recorded when asked to
            error = e
        if error is not None:
            if failures is None:
                raise AssertionError(f"{name}: {error}")
            failures[name] = [type(error).__name__, str(error)]
        batches[name] = found
    return batches


def main(work: Path, stage: str) -> None:
    """``first``: the first two event files, both engines from new checkpoints; ``back``:
    the last file, both engines resuming the checkpoints a newer line went on with."""
    from pyspark.sql import SparkSession

    from microbatch import StreamingSession
    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false").getOrCreate())
    write_events(work / "events", range(2) if stage == "first" else range(4, 5))
    failures: dict = {"spark": {}, "microbatch": {}}
    result = {"version": spark.version,
              "spark": run_all(spark, work / "events", work / "spark", failures["spark"]),
              "microbatch": run_all(StreamingSession(spark), work / "events", work / "microbatch",
                                    failures["microbatch"]),
              "failures": failures}
    spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "first")
