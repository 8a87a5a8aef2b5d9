"""Java's text of numbers, as Spark's JVM writes them (``Double.toString``): for what
microbatch prints where Spark's JVM would (``to_json`` in Arrow steps, an aggregate call's
text over Spark Connect)."""
from __future__ import annotations

import math


def java_double_text(value: float) -> str:
    """``Double.toString``: shortest digits; plain between 10^-3 and 10^7, else ``d.dddE±n``;
    NaN and infinities as Jackson writes them (quoted, as Spark's generator does)."""
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if value == 0:
        return "-0.0" if math.copysign(1, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    digits, exponent = _shortest_digits(abs(value))
    if 1e-3 <= abs(value) < 1e7:
        point = exponent + 1            # digits before the point
        if point <= 0:
            text = "0." + "0" * (-point) + digits
        elif point >= len(digits):
            text = digits + "0" * (point - len(digits)) + ".0"
        else:
            text = digits[:point] + "." + digits[point:]
        return sign + text
    mantissa = digits[0] + "." + (digits[1:] or "0")
    return f"{sign}{mantissa}E{exponent}"


def _shortest_digits(value: float) -> tuple[str, int]:
    """(the shortest digits that read back as ``value``, the exponent of the first)."""
    text = repr(value)
    mantissa, _, exp = text.partition("e")
    exponent = int(exp) if exp else 0
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    leading = len(whole) - 1 if whole != "0" else -(len(fraction) - len(fraction.lstrip("0")) + 1)
    return digits.rstrip("0") or "0", exponent + leading
