"""The event-time statistics a stateful task computes for the watermark right below its
operator, instead of an ``Observation`` at the watermark (a node that stops Spark's code
generation): their metric keys, written by the tasks here and read by the runtime's
``WatermarkTracker`` through ``reported_statistics``.

A task adds max, min, sum and count of the event times in ms, as Spark's
``EventTimeWatermarkExec`` would, to its operator's accumulator under ``set:`` keys of its
partition (a re-run of the partition replaces them rather than adds to them):
``set:eventTime<tag>_<partition>_<stat>``, where ``tag`` tells a join's two sides apart.
"""
from __future__ import annotations

import pyarrow as pa

#: The statistics, in the order an aggregation computes them as partial aggregates.
EVENT_TIME_STATS = ("max", "min", "sum", "count")
_PREFIX = "set:eventTime"


class EventTimeStats:
    """Event-time statistics of one task (max, min, sum and count in ms)."""

    def __init__(self) -> None:
        self.high: int | None = None
        self.low: int | None = None
        self.total = 0.0
        self.count = 0

    def add_ms(self, high, low, total: float, count: int) -> None:
        if not count:
            return
        self.high = high if self.high is None else max(self.high, high)
        self.low = low if self.low is None else min(self.low, low)
        self.total += total
        self.count += count

    def add_micros(self, times: pa.Array) -> None:
        """Rows' event times in µs (int64); ms truncate toward zero, as in Spark."""
        import pyarrow.compute as pc
        ms = pc.divide(times, 1000)
        count = len(ms) - ms.null_count
        if count:
            self.add_ms(pc.max(ms).as_py(), pc.min(ms).as_py(), pc.sum(ms.cast(pa.float64())).as_py(), count)

    def report(self, metrics, partition: int, tag: str = "") -> None:
        """Add the statistics to the operator's accumulator (``tag``: which of its
        watermarks they are for, when it has more than one, as a join's sides)."""
        if self.count:
            prefix = f"{_PREFIX}{tag}_{partition}"
            metrics.add({f"{prefix}_max": self.high, f"{prefix}_min": self.low,
                         f"{prefix}_sum": self.total, f"{prefix}_count": self.count})


def reported_statistics(metrics: dict, tag: str = "") -> dict | None:
    """The statistics an operator's tasks reported for one watermark, as an
    ``Observation`` of the watermark would give them (max, min, avg, count), or None."""
    stats: dict[str, list] = {name: [] for name in EVENT_TIME_STATS}
    prefix = f"{_PREFIX}{tag}_"
    for key, value in metrics.items():
        if key.startswith(prefix):
            stats[key.rsplit("_", 1)[1]].append(value)
    count = sum(stats["count"])
    if not count:
        return None
    return {"max": max(stats["max"]), "min": min(stats["min"]), "avg": sum(stats["sum"]) / count,
            "count": count}
