"""Backpressure's rate estimator (Spark Streaming's PIDRateEstimator): after each batch,
the rate a receiver should take records in at, from the batch's records and delays."""
from __future__ import annotations

import threading


class PIDRateEstimator:
    """Spark Streaming's PIDRateEstimator (``spark.streaming.backpressure.*``), the same
    formula: after each batch, the rate (records a second) the stream should take in,
    from the batch's records, processing delay and scheduling delay.

    ``error`` is the last published rate minus the batch's processing rate; the integral
    term is the backlog (``schedulingDelay * processingRate`` records) spread over one
    batch interval; the derivative, the change of the error a second. The first batch
    only sets the rate to its processing rate (``None``: nothing published), as Spark's.
    ``batch_interval_ms`` is Spark's batch duration; the receiver source sets it to the
    observed time between batches before each ``compute`` (docs/receivers.md)."""

    def __init__(self, batch_interval_ms: float, proportional: float = 1.0, integral: float = 0.2,
                 derivative: float = 0.0, min_rate: float = 100.0):
        for name, value in (("proportional", proportional), ("integral", integral),
                            ("derivative", derivative)):
            if value < 0:
                raise ValueError(f"{name.capitalize()} term {value} in PIDRateEstimator should be >= 0.")
        if min_rate <= 0:
            raise ValueError("Minimum rate in PIDRateEstimator should be > 0")
        if batch_interval_ms <= 0:
            raise ValueError(f"Specified batch interval {batch_interval_ms} in PIDRateEstimator is invalid.")
        self.batch_interval_ms = batch_interval_ms
        self.proportional = proportional
        self.integral = integral
        self.derivative = derivative
        self.min_rate = min_rate
        self._first_run = True
        self.latest_time = -1
        self.latest_rate = -1.0
        self.latest_error = -1.0
        self._lock = threading.Lock()

    def compute(self, time_ms: int, elements: int, processing_delay_ms: int,
                scheduling_delay_ms: int) -> float | None:
        """The new rate, or None when the batch says nothing (no records, no time, the
        first batch)."""
        with self._lock:
            if not (time_ms > self.latest_time and elements > 0 and processing_delay_ms > 0):
                return None
            delay_since_update = (time_ms - self.latest_time) / 1000.0          # seconds
            processing_rate = elements / processing_delay_ms * 1000.0            # records/s
            error = self.latest_rate - processing_rate
            historical_error = scheduling_delay_ms * processing_rate / self.batch_interval_ms
            d_error = (error - self.latest_error) / delay_since_update
            new_rate = max(self.latest_rate - self.proportional * error
                           - self.integral * historical_error
                           - self.derivative * d_error, self.min_rate)
            self.latest_time = time_ms
            if self._first_run:
                self.latest_rate = processing_rate
                self.latest_error = 0.0
                self._first_run = False
                return None
            self.latest_rate = new_rate
            self.latest_error = error
            return new_rate
