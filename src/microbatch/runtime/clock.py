"""Clocks injected into triggers, batch timestamps and time-based sources.

``wait_till_time`` takes an ``interrupt`` event so that ``stop()`` ends a wait at
once (Python threads cannot be interrupted like JVM threads).
"""
from __future__ import annotations

import threading
import time


class Clock:
    def get_time_millis(self) -> int:
        raise NotImplementedError

    def wait_till_time(self, target_ms: int, interrupt: threading.Event) -> bool:
        """Block until the clock reaches ``target_ms``; False if interrupted first."""
        raise NotImplementedError


class SystemClock(Clock):
    def get_time_millis(self) -> int:
        return int(time.time() * 1000)

    def wait_till_time(self, target_ms: int, interrupt: threading.Event) -> bool:
        while True:
            remaining = target_ms - self.get_time_millis()
            if remaining <= 0:
                return True
            if interrupt.wait(remaining / 1000.0):
                return False


class ManualClock(Clock):
    """A clock that moves only when a test advances it."""

    def __init__(self, time_ms: int = 0):
        self._time = time_ms
        self._cond = threading.Condition()
        self._waiting_for: int | None = None

    def get_time_millis(self) -> int:
        with self._cond:
            return self._time

    def advance(self, ms: int) -> None:
        self.set_time(self.get_time_millis() + ms)

    def set_time(self, time_ms: int) -> None:
        with self._cond:
            self._time = time_ms
            if self._waiting_for is not None and self._time >= self._waiting_for:
                self._waiting_for = None  # released: a waiter is no longer waiting from now on
            self._cond.notify_all()

    def is_waiting(self) -> bool:
        """Whether the stream thread is blocked waiting for the clock to move."""
        with self._cond:
            return self._waiting_for is not None

    def wait_till_time(self, target_ms: int, interrupt: threading.Event) -> bool:
        with self._cond:
            try:
                while self._time < target_ms:
                    if interrupt.is_set():
                        return False
                    self._waiting_for = target_ms
                    self._cond.wait(0.05)
                return True
            finally:
                self._waiting_for = None
                self._cond.notify_all()

    def wait_for_waiter(self, timeout: float) -> bool:
        """Block until a thread waits on this clock (StreamTest's isStreamWaitingAt)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._waiting_for is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
            return True
