"""A receiver source's options: ``ackMode``, ``blockInterval``, ``maxRecordsPerTrigger``,
``maxRate``, the bounds on unconsumed blocks, and backpressure's (``backpressure.*``,
each also read from the Spark conf ``spark.streaming.<name>``), validated with their
messages."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from microbatch.errors import AnalysisException
from microbatch.util import CaseInsensitiveOptions, byte_size, time_string_as_ms

ACK_MODES = ("record", "block", "interval")

# the backpressure options; each also read from the Spark conf spark.streaming.<name>
BACKPRESSURE_OPTIONS = ("backpressure.enabled", "backpressure.initialRate", "backpressure.rateEstimator",
                        "backpressure.pid.proportional", "backpressure.pid.integral",
                        "backpressure.pid.derived", "backpressure.pid.minRate")


def backpressure_confs(spark: Any) -> dict[str, str]:
    """The session's ``spark.streaming.backpressure.*`` settings, by option name: the
    defaults of the backpressure options (an option set on the source wins)."""
    confs = {}
    for name in BACKPRESSURE_OPTIONS:
        value = spark.conf.get(f"spark.streaming.{name}", None)
        if value is not None:
            confs[name] = str(value)
    return confs


@dataclass
class BackpressureOptions:
    """``backpressure.*``: Spark Streaming's adaptive rate (docs/receivers.md)."""
    initial_rate: int | None = None
    proportional: float = 1.0
    integral: float = 0.2
    derived: float = 0.0
    min_rate: float = 100.0


@dataclass
class ReceiverOptions:
    ack_mode: str
    block_interval_ms: int
    max_records_per_trigger: int | None
    max_rate: int | None
    max_unconsumed_blocks: int
    max_unconsumed_bytes: int
    backpressure: BackpressureOptions | None = None     # None: backpressure.enabled false

    @staticmethod
    def parse(options: CaseInsensitiveOptions, default_ack_mode: str,
              confs: dict[str, str] | None = None) -> "ReceiverOptions":
        """``confs``: the ``spark.streaming.backpressure.*`` settings (``backpressure_confs``),
        the defaults of the backpressure options."""
        ack_mode = options.get("ackMode", default_ack_mode).strip().lower()
        if ack_mode not in ACK_MODES:
            raise AnalysisException(
                f"Invalid value '{options['ackMode']}' for option 'ackMode': use one of "
                f"{', '.join(ACK_MODES)} (docs/receivers.md: when a sender is acknowledged).")
        interval = time_string_as_ms(options.get("blockInterval", "200ms"))
        if interval <= 0:
            raise AnalysisException(
                f"Invalid value '{options['blockInterval']}' for option 'blockInterval': it must "
                "be positive, e.g. '200ms'.")

        def positive(name: str, default: int | None) -> int | None:
            value = options.get_int(name, default) if name in options else default
            if value is not None and value <= 0:
                raise AnalysisException(
                    f"Invalid value '{options[name]}' for option '{name}': it must be a positive "
                    "integer.")
            return value

        max_bytes = byte_size(options.get("maxUnconsumedBytes", "1g"))
        if max_bytes <= 0:
            raise AnalysisException("Invalid value for option 'maxUnconsumedBytes': it must be "
                                    "positive, e.g. '1g'.")
        return ReceiverOptions(ack_mode, interval, positive("maxRecordsPerTrigger", None),
                               positive("maxRate", None), positive("maxUnconsumedBlocks", 10000),
                               max_bytes, _parse_backpressure(options, confs or {}))


def _parse_backpressure(options: CaseInsensitiveOptions, confs: dict[str, str]) -> BackpressureOptions | None:
    def setting(name: str) -> tuple[str, str] | None:
        """(where it was set, its value): the source's option, else the Spark conf."""
        if name in options:
            return f"option '{name}'", str(options[name]).strip()
        if name in confs:
            return f"the Spark conf 'spark.streaming.{name}'", confs[name].strip()
        return None

    def number(name: str, default: float, minimum: float, strict: bool) -> float:
        found = setting(name)
        if found is None:
            return default
        where, raw = found
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value == value or (value <= minimum if strict else value < minimum) or value == float("inf"):
            bound = f"greater than {minimum:g}" if strict else f"at least {minimum:g}"
            raise AnalysisException(f"Invalid value '{raw}' for {where}: it must be a number "
                                    f"{bound} (docs/receivers.md: backpressure).")
        return value

    enabled = setting("backpressure.enabled")
    if enabled is None or enabled[1].lower() == "false":
        return None
    if enabled[1].lower() != "true":
        raise AnalysisException(f"Invalid value '{enabled[1]}' for {enabled[0]}: must be 'true' or 'false'.")
    estimator = setting("backpressure.rateEstimator")
    if estimator is not None and estimator[1] != "pid":
        raise AnalysisException(f"Unknown rate estimator: {estimator[1]} ({estimator[0]}): the only "
                                "estimator is 'pid' (Spark Streaming's PIDRateEstimator).")
    initial = number("backpressure.initialRate", 0, 0, strict=True) if setting("backpressure.initialRate") else None
    return BackpressureOptions(
        initial_rate=max(1, int(initial)) if initial is not None else None,
        proportional=number("backpressure.pid.proportional", 1.0, 0, strict=False),
        integral=number("backpressure.pid.integral", 0.2, 0, strict=False),
        derived=number("backpressure.pid.derived", 0.0, 0, strict=False),
        min_rate=number("backpressure.pid.minRate", 100.0, 0, strict=True))
