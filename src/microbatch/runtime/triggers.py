"""Triggers and the executors that run the batch runner for them.

- ``ProcessingTime(interval)``: a batch every interval (0: as fast as possible);
  Spark's ProcessingTimeExecutor, including its "falling behind" warning.
- ``Once``: one batch with everything available, then stop (SingleBatchExecutor).
- ``AvailableNow``: everything available at start, in as many batches as read
  limits need, then stop (MultiBatchExecutor).
- ``RealTime(duration)``: Spark 4.1's real-time mode: long-running batches back to back,
  each ``duration`` long, whose tasks process records as they arrive
  (``runtime.real_time``); the executor is ProcessingTime(0)'s, as Spark's.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from pyspark.errors import PySparkValueError

from microbatch import spark_internals
from microbatch.errors import IllegalArgumentException, UnsupportedOperationError, pyspark_error
from microbatch.runtime.clock import Clock
from microbatch.util import interval_to_ms

log = logging.getLogger(__name__)


class Trigger:
    #: the milliseconds between batches' starts a trigger asks for (0: as soon as the last ends)
    interval_ms: int = 0

    @staticmethod
    def ProcessingTime(interval: str | int) -> "ProcessingTime":
        return ProcessingTime.of(interval)

    @staticmethod
    def Once() -> "Once":
        return Once()

    @staticmethod
    def AvailableNow() -> "AvailableNow":
        return AvailableNow()

    @staticmethod
    def RealTime(batch_duration: str | int = "5 minutes") -> "RealTime":
        return RealTime.of(batch_duration)


@dataclass(frozen=True)
class ProcessingTime(Trigger):
    interval_ms: int = 0

    @classmethod
    def of(cls, interval: str | int) -> "ProcessingTime":
        """``interval``: milliseconds, or a string Spark parses (its errors when not)."""
        if isinstance(interval, int):
            if interval < 0:
                raise IllegalArgumentException(
                    "requirement failed: the interval of trigger should not be negative")
            return cls(interval)
        if not spark_internals.jvm_started():   # no Spark yet: the same grammar, parsed here
            return cls(interval_to_ms(str(interval), "processingTime trigger interval"))
        return cls(spark_internals.processing_time_ms(str(interval)))


@dataclass(frozen=True)
class Once(Trigger):
    pass


@dataclass(frozen=True)
class AvailableNow(Trigger):
    pass


@dataclass(frozen=True)
class RealTime(Trigger):
    """Spark's RealTimeTrigger: each batch runs ``batch_duration_ms`` (its checkpoint
    interval, not a latency). Its default, as Spark's ``Trigger.RealTime()``, is 5 minutes."""
    batch_duration_ms: int = 300_000

    @classmethod
    def of(cls, duration: str | int) -> "RealTime":
        ms = duration if isinstance(duration, int) else (
            spark_internals.processing_time_ms(str(duration)) if spark_internals.jvm_started()
            else interval_to_ms(str(duration), "realTime trigger batch duration"))
        if ms <= 0:
            raise IllegalArgumentException(
                f"requirement failed: the batch duration should be positive, but got {duration}")
        return cls(ms)


def trigger_from_writer_args(processingTime=None, once=None, availableNow=None,
                             continuous=None, realTime=None) -> Trigger:
    """PySpark's ``writeStream.trigger(...)`` keyword rules and errors."""
    params = [processingTime, once, continuous, availableNow, realTime]
    if params.count(None) != 4:
        raise pyspark_error(PySparkValueError, "ONLY_ALLOW_SINGLE_TRIGGER", {})
    for name, value in (("processingTime", processingTime), ("continuous", continuous),
                        ("realTime", realTime)):
        if value is not None and (not isinstance(value, str) or len(value.strip()) == 0):
            raise pyspark_error(PySparkValueError, "VALUE_NOT_NON_EMPTY_STR", {"arg_name": name, "arg_value": str(value)})
    if processingTime is not None:
        return ProcessingTime.of(processingTime.strip())
    if once is not None:
        if once is not True:
            raise pyspark_error(PySparkValueError, "VALUE_NOT_ALLOWED", {"arg_name": "once", "allowed_values": "[True]"})
        return Once()
    if realTime is not None:
        return RealTime.of(realTime.strip())
    if continuous is not None:
        raise UnsupportedOperationError(
            "The continuous trigger runs a query in Spark's continuous processing mode (deprecated "
            "since Spark 4.1 for real-time mode), which microbatch does not have. Use realTime=... "
            "for records through the query in milliseconds, or processingTime=..., once=True or "
            "availableNow=True.")
    if availableNow is not True:
        raise pyspark_error(PySparkValueError, "VALUE_NOT_ALLOWED", {"arg_name": "availableNow", "allowed_values": "[True]"})
    return AvailableNow()


class TriggerExecutor:
    def execute(self, batch_runner: Callable[[], bool]) -> None:
        raise NotImplementedError


class ProcessingTimeExecutor(TriggerExecutor):
    def __init__(self, trigger: ProcessingTime, clock: Clock, interrupt: threading.Event):
        self.interval_ms = trigger.interval_ms
        self.clock = clock
        self.interrupt = interrupt

    def next_batch_time(self, now: int) -> int:
        if self.interval_ms == 0:
            return now
        return now // self.interval_ms * self.interval_ms + self.interval_ms

    def execute(self, batch_runner: Callable[[], bool]) -> None:
        while True:
            trigger_time = self.clock.get_time_millis()
            next_trigger_time = self.next_batch_time(trigger_time)
            terminated = not batch_runner()
            if self.interval_ms > 0:
                elapsed = self.clock.get_time_millis() - trigger_time
                if elapsed > self.interval_ms:
                    log.warning("Current batch is falling behind. The trigger interval is %d "
                                "milliseconds, but spent %d milliseconds", self.interval_ms, elapsed)
                if terminated:
                    return
                if not self.clock.wait_till_time(next_trigger_time, self.interrupt):
                    return
            elif terminated:
                return


class SingleBatchExecutor(TriggerExecutor):
    def execute(self, batch_runner: Callable[[], bool]) -> None:
        batch_runner()


class MultiBatchExecutor(TriggerExecutor):
    def execute(self, batch_runner: Callable[[], bool]) -> None:
        while batch_runner():
            pass
