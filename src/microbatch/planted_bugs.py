"""Test-only planted bugs: the differential fuzzer (``microbatch.testing.fuzz``) must find
each of them, which shows it can find bugs of their kind.

Off unless the query's session sets ``spark.microbatch.testing.plant`` to a name below
(the fuzzer sets it on microbatch's runs only). The driver reads it from the session where
the query is defined or planned; a Spark task reads it from the job's local properties,
where the batch session's confs are (``spark_internals.jobs_see_session_confs``).

- ``join-no-evict``: a stream-stream join never evicts state (its state watermarks stay
  at 0), as a join whose watermark the engine cannot find.
- ``partition-shift``: a state task takes the next partition's store (partition p uses
  p + 1 modulo the partitions), as state written under shifted partition numbers.
- ``rename-drops-watermark``: a watermarked column renamed or aliased loses its watermark
  (only the column named in ``withWatermark`` carries it), as the engine once found it by
  its name.
"""
from __future__ import annotations

from typing import Any

CONF = "spark.microbatch.testing.plant"
PLANTS = ("join-no-evict", "partition-shift", "rename-drops-watermark")


def planted(spark: Any, name: str) -> bool:
    """Whether ``spark`` (a session, or None in a Spark task) plants ``name``."""
    if spark is None:
        from pyspark import TaskContext
        context = TaskContext.get()
        value = context.getLocalProperty(CONF) if context is not None else None
    else:
        try:
            value = spark.conf.get(CONF, None)
        except Exception:  # noqa: BLE001 - a session that cannot answer plants nothing
            value = None
    return value == name
