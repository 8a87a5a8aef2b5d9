"""Small helpers shared by every layer: Spark's duration strings, case-insensitive options."""
from __future__ import annotations

import os
import re
from typing import Any, Iterator, Mapping

_INTERVAL_UNITS_MS = {
    "week": 7 * 86_400_000, "day": 86_400_000, "hour": 3_600_000, "minute": 60_000,
    "second": 1000, "millisecond": 1, "microsecond": 0.001,
}
_INTERVAL_ALIASES = {
    "w": "week", "d": "day", "h": "hour", "hr": "hour", "hrs": "hour", "m": "minute",
    "min": "minute", "mins": "minute", "s": "second", "sec": "second", "secs": "second",
    "ms": "millisecond", "msec": "millisecond", "msecs": "millisecond", "us": "microsecond",
    "usec": "microsecond",
}
_INTERVAL_TOKEN = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


def interval_to_ms(text: str, what: str = "interval") -> int:
    """Parse a Spark interval string such as ``"10 seconds"`` or ``"1 minute 30 seconds"``.

    Months and years are refused, as Spark refuses them for triggers and
    watermarks: their length in milliseconds is not fixed.
    """
    original = text
    s = text.strip().lower()
    if s.startswith("interval"):
        s = s[len("interval"):]
    if not s.strip():
        raise ValueError(f"Invalid {what} '{original}': it is empty. Use e.g. '10 seconds'.")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _INTERVAL_TOKEN.match(s, pos)
        if not m:
            raise ValueError(
                f"Invalid {what} '{original}'. Use a number followed by a unit, e.g. "
                "'500 milliseconds', '10 seconds', '1 minute 30 seconds'.")
        number, unit = float(m.group(1)), m.group(2)
        unit = _INTERVAL_ALIASES.get(unit, unit)
        if unit.endswith("s") and unit[:-1] in _INTERVAL_UNITS_MS:
            unit = unit[:-1]
        if unit in ("month", "year"):
            raise ValueError(
                f"Invalid {what} '{original}': months and years are not supported because "
                "their length varies; use days, hours, minutes, seconds or milliseconds.")
        if unit not in _INTERVAL_UNITS_MS:
            raise ValueError(f"Invalid {what} '{original}': unknown unit '{m.group(2)}'.")
        total += number * _INTERVAL_UNITS_MS[unit]
        pos = m.end()
    if total < 0:
        raise ValueError(f"Invalid {what} '{original}': it must not be negative.")
    return int(total)


_TIME_STRING = re.compile(r"^\s*(-?\d+)\s*([a-z]+)?\s*$")
_TIME_SUFFIX_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000,
                   "h": 3_600_000, "d": 86_400_000}


def _time_string_ms(text: str, bare_unit_ms: int) -> float:
    m = _TIME_STRING.match(str(text).lower())
    if not m or (m.group(2) and m.group(2) not in _TIME_SUFFIX_MS):
        raise ValueError(
            f"Invalid time string '{text}'. Use a number with an optional suffix "
            "(us, ms, s, m, min, h, d), e.g. '5s'.")
    return int(m.group(1)) * (_TIME_SUFFIX_MS[m.group(2)] if m.group(2) else bare_unit_ms)


def time_string_as_seconds(text: str) -> int:
    """Spark's ``JavaUtils.timeStringAsSec``: ``"5s"``, ``"2m"``, or a bare number of seconds."""
    return int(_time_string_ms(text, 1000) // 1000)


def time_string_as_ms(text: str) -> int:
    """Spark's ``JavaUtils.timeStringAsMs``: ``"7d"``, ``"10s"``, or a bare number of ms."""
    return int(_time_string_ms(text, 1))


_BYTE_SUFFIX = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30,
                "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "p": 1 << 50, "pb": 1 << 50}
_BYTE_STRING = re.compile(r"^\s*(\d+)\s*([a-z]+)?\s*$")


def byte_size(text: Any) -> int:
    """Spark's ``JavaUtils.byteStringAsBytes``: ``"64m"``, ``"64MB"``, or a bare number of bytes."""
    m = _BYTE_STRING.match(str(text).lower())
    if not m or (m.group(2) and m.group(2) not in _BYTE_SUFFIX):
        raise ValueError(f"Invalid size '{text}'. Use a number of bytes with an optional suffix "
                         "(k, m, g, t, p, with or without b), e.g. '64m'.")
    return int(m.group(1)) * (_BYTE_SUFFIX[m.group(2)] if m.group(2) else 1)


class CaseInsensitiveOptions(Mapping[str, str]):
    """Source and sink options: keys compare case-insensitively, values are strings,
    as in Spark's CaseInsensitiveStringMap."""

    def __init__(self, options: Mapping[str, Any] | None = None):
        self._original: dict[str, str] = {}
        self._lower: dict[str, str] = {}
        for k, v in (options or {}).items():
            self._original[k] = v
            self._lower[k.lower()] = v

    def __getitem__(self, key: str) -> str:
        return self._lower[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._lower

    def __iter__(self) -> Iterator[str]:
        return iter(self._original)

    def __len__(self) -> int:
        return len(self._original)

    def get_int(self, key: str, default: int) -> int:
        if key not in self:
            return default
        value = self[key]
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError(
                f"Invalid value '{value}' for option '{key}': expected an integer.") from None

    def get_bool(self, key: str, default: bool) -> bool:
        if key not in self:
            return default
        value = str(self[key]).strip().lower()
        if value not in ("true", "false"):
            raise ValueError(
                f"Invalid value '{self[key]}' for option '{key}', must be 'true' or 'false'")
        return value == "true"

    def as_dict(self) -> dict[str, str]:
        return dict(self._original)


def option_value(value: Any) -> str:
    """Turn an option value into the string Spark would store (``True`` -> ``"true"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def conf_bool(spark: Any, key: str, default: bool) -> bool:
    """A boolean Spark SQL conf of ``spark`` (a SparkSession)."""
    return str(spark.conf.get(key, str(default).lower())).strip().lower() == "true"


#: What an ``hdfs://`` location would need (said where one is refused).
HDFS_NEEDS = (": its client would be pyarrow's HadoopFileSystem, which needs Hadoop's native libhdfs "
              "(ARROW_LIBHDFS_DIR or HADOOP_HOME), a Hadoop installation's class path (CLASSPATH from "
              "`hadoop classpath --glob`) and JAVA_HOME on the driver and every executor; until then, "
              "keep the checkpoint on a path every node mounts or on an object store")


def local_path(path: str, what: str) -> str:
    """An absolute local path from a path or ``file:`` URI; other schemes get a clear error."""
    if path.startswith("file:"):
        path = path[len("file:"):]
        if path.startswith("//"):
            path = path[2:]
    elif "://" in path:
        from microbatch.errors import UnsupportedOperationError
        raise UnsupportedOperationError(
            f"The {what} path '{path}' is on a file system microbatch cannot reach here. Its "
            "file source, file sink and checkpoint take local paths, file: URIs and the object "
            "stores s3://, s3a:// (spark.hadoop.fs.s3a.*), gs:// (spark.hadoop.fs.gs.*) and "
            "abfss:// (spark.hadoop.fs.azure.*); Delta tables local paths and S3. HDFS is not "
            f"supported yet{HDFS_NEEDS if path.lower().startswith(('hdfs:', 'viewfs:')) else ''}.")
    return os.path.abspath(os.path.expanduser(path))
