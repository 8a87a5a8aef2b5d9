"""Test-only crash points: kill the whole query process exactly at a named step.

Off unless the environment names a step: ``MICROBATCH_CRASH_AT="<step>:<count>"`` makes
the ``count``-th arrival at ``step`` in one process SIGKILL the process group recorded by
``arm()`` (the driver, its JVM and the Python workers, which inherit the group). A
process that did not call ``arm()`` is never killed, so a stray variable cannot take a
test runner down. Steps so far:

- ``kafka-sink-record``: the Kafka sink delivered one more record of a task (the count
  is per task process), i.e. a kill in the middle of a sink write.
"""
from __future__ import annotations

import os
import signal

CRASH_AT = "MICROBATCH_CRASH_AT"
_GROUP = "MICROBATCH_CRASH_GROUP"
_arrivals: dict[str, int] = {}


def arm() -> None:
    """Make this process's group the one a crash point kills (called by a test's child
    process before it starts Spark, so the JVM and workers inherit the setting)."""
    os.environ[_GROUP] = str(os.getpgid(0))


def reached(step: str) -> None:
    spec = os.environ.get(CRASH_AT)
    if not spec:
        return
    name, _, count = spec.rpartition(":")
    if name != step or _GROUP not in os.environ:
        return
    _arrivals[step] = _arrivals.get(step, 0) + 1
    if _arrivals[step] == int(count):
        os.killpg(int(os.environ[_GROUP]), signal.SIGKILL)
