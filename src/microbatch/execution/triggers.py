"""Triggers and the executors that run the batch runner for them.

- ``ProcessingTime(interval)``: a batch every interval (0: as fast as possible);
  Spark's ProcessingTimeExecutor, including its "falling behind" warning.
- ``Once``: one batch with everything available, then stop (SingleBatchExecutor).
- ``AvailableNow``: everything available at start, in as many batches as read
  limits need, then stop (MultiBatchExecutor).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from microbatch.execution.clock import Clock
from microbatch.util import interval_to_ms

log = logging.getLogger(__name__)


class Trigger:
    @staticmethod
    def ProcessingTime(interval: str | int) -> "ProcessingTime":
        return ProcessingTime.of(interval)

    @staticmethod
    def Once() -> "Once":
        return Once()

    @staticmethod
    def AvailableNow() -> "AvailableNow":
        return AvailableNow()


@dataclass(frozen=True)
class ProcessingTime(Trigger):
    interval_ms: int = 0

    @classmethod
    def of(cls, interval: str | int) -> "ProcessingTime":
        if isinstance(interval, int):
            ms = interval
        else:
            if not str(interval).strip():
                raise ValueError("Value for processingTime must be a non empty string, "
                                 "e.g. '5 seconds'.")
            ms = interval_to_ms(str(interval), "processingTime trigger interval")
        if ms < 0:
            raise ValueError("Interval cannot be negative")
        return cls(ms)


@dataclass(frozen=True)
class Once(Trigger):
    pass


@dataclass(frozen=True)
class AvailableNow(Trigger):
    pass


def trigger_from_writer_args(processingTime=None, once=None, availableNow=None,
                             continuous=None, realTime=None) -> Trigger:
    """PySpark's ``writeStream.trigger(...)`` keyword rules."""
    given = [k for k, v in (("processingTime", processingTime), ("once", once),
                            ("availableNow", availableNow), ("continuous", continuous),
                            ("realTime", realTime)) if v is not None]
    if len(given) != 1:
        raise ValueError("Only one trigger can be set: give exactly one of processingTime=, "
                         "once=True or availableNow=True.")
    if continuous is not None or realTime is not None:
        raise ValueError("Continuous and real-time triggers are not supported by microbatch, "
                         "a micro-batch engine; use processingTime=, once=True or availableNow=True.")
    if processingTime is not None:
        if not isinstance(processingTime, str):
            raise TypeError(f"Value for processingTime must be a string, got {type(processingTime).__name__}")
        return ProcessingTime.of(processingTime)
    if once is not None:
        if once is not True:
            raise ValueError(f"Value for once must be True. Got: {once}")
        return Once()
    if availableNow is not True:
        raise ValueError(f"Value for availableNow must be True. Got: {availableNow}")
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
