"""What a receiver admits: the refusal its senders hear when it cannot take records now
(``Backpressure``: HTTP 429 over the rate, 503 over the bound on unconsumed blocks or when
the log cannot be written, with how long to wait), and the token bucket that holds it to
a rate of records a second (``RateLimiter``: ``maxRate``, or the rate backpressure's
estimator publishes)."""
from __future__ import annotations

import threading
import time
from typing import Callable


class Backpressure(Exception):
    """A receiver cannot take records now. ``status``: the HTTP answer (429 over the rate,
    503 over the unconsumed bound or when the log cannot be written); ``retry_after``:
    seconds to wait."""

    def __init__(self, status: int, retry_after: float, reason: str):
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after
        self.reason = reason


class RateLimiter:
    """A token bucket of ``rate`` records a second (Spark Streaming's receiver RateLimiter,
    ``spark.streaming.receiver.maxRate``), holding at most one second's worth."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self._clock = clock
        self._tokens = float(rate)
        self._at = clock()
        self._lock = threading.Lock()

    def set_rate(self, rate: int) -> None:
        """A new rate (Spark's RateLimiter.updateRate, what backpressure publishes); the
        bucket keeps what it holds, up to one second of the new rate."""
        with self._lock:
            self.rate = rate
            self._tokens = min(self._tokens, float(rate))

    def wait_time(self, n: int) -> float:
        """Take ``n`` records if the bucket holds them (0.0); else take nothing and return
        the seconds until it will (a request larger than a second's worth waits for a
        full bucket and then takes it)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
            self._at = now
            need = min(float(n), float(self.rate))
            if self._tokens >= need:
                self._tokens -= n
                return 0.0
            return (need - self._tokens) / self.rate
