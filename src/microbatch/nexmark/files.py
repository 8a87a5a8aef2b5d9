"""Nexmark's events as parquet files, so that any engine (Spark's own, microbatch's file
source, another system) reads exactly the events the ``nexmark`` source generates.

Each file holds ``events_per_file`` consecutive events of the ``events`` view, generated
in Spark tasks as the source generates them; file ``i`` is named ``events-<i>.parquet``
and gets a modification time one second after file ``i - 1`` (a file source taking one
file a trigger takes them in order: Spark's orders by modification time).
"""
from __future__ import annotations

import glob
import os
import shutil
import time
from pathlib import Path

from pyspark.sql import SparkSession

from microbatch import spark_internals
from microbatch.sources.nexmark.generator import NexmarkConfig
from microbatch.sources.nexmark.source import generated


def write_event_files(spark: SparkSession, directory: str | Path, config: NexmarkConfig, num_events: int,
                      events_per_file: int, view: str = "events") -> list[Path]:
    """Write events ``0 .. num_events - 1`` of ``config`` under ``directory``; the files, in order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / "_staging"
    files = []
    mtime = int(time.time()) - (num_events // events_per_file) - 10
    for index, first in enumerate(range(0, num_events, events_per_file)):
        end = min(first + events_per_file, num_events)
        (generated(spark, config, first, end, view, spark_internals.default_parallelism(spark)).coalesce(1)
         .write.mode("overwrite").parquet(str(staging)))
        [part] = glob.glob(str(staging / "part-*.parquet"))
        target = directory / f"{view}-{index:06d}.parquet"
        os.replace(part, target)
        mtime += 1
        os.utime(target, (mtime, mtime))
        files.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    return files
