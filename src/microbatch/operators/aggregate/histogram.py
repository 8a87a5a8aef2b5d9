"""Spark's NumericHistogram, the buffer of ``histogram_numeric(x, nb)``
(``org.apache.spark.sql.util.NumericHistogram``, Ben-Haim and Tom-Tov's streaming
histogram as Hive wrote it), its merge ported step for step.

A histogram is a list of bins ``(x, y)`` sorted by ``x`` (a bin's centre and its height),
at most ``nb`` of them. Merging two concatenates their bins, sorts them (a stable sort in
Java's order of doubles) and merges the two closest neighbours until ``nb`` are left; a
tie between equally close pairs is broken by a ``java.util.Random`` seeded 31183 when the
buffer object was made. So the answer depends on which buffers merged in which order,
and with what random draws before, which is why microbatch merges exactly where Spark's
engine does:

- a batch's histogram per key is Spark's own (``histogram_numeric`` over the batch's rows
  in a Spark job: each input partition's partial histogram, then their merge after the
  shuffle, in the order and with the buffer objects Spark's engine uses for its first
  ``PartialMerge``);
- the state task merges the key's kept histogram with it as the second ``PartialMerge``
  of Spark's streaming aggregation does: a new buffer (a new random generator) takes the
  kept bins (a copy: the buffer is empty), then the batch's (the sort and the trims).
"""
from __future__ import annotations

import math

_MULTIPLIER = 0x5DEECE66D
_MASK = (1 << 48) - 1
#: the seed every NumericHistogram's generator starts from
SEED = 31183


class JavaRandom:
    """``java.util.Random``'s linear congruential generator, as far as ``nextDouble``."""

    def __init__(self, seed: int) -> None:
        self._seed = (seed ^ _MULTIPLIER) & _MASK

    def _next(self, bits: int) -> int:
        self._seed = (self._seed * _MULTIPLIER + 0xB) & _MASK
        return self._seed >> (48 - bits)

    def next_double(self) -> float:
        return ((self._next(26) << 27) + self._next(27)) * 2.0 ** -53


def _java_order(x: float) -> tuple:
    """``Double.compare``'s order: -0.0 before 0.0, NaN after everything."""
    if x != x:
        return (1, 0.0, 0)
    return (0, x, 0 if x == 0.0 and math.copysign(1.0, x) < 0 else 1)


def _trim(bins: list[list[float]], nb: int, prng: JavaRandom) -> None:
    """NumericHistogram.trim: merge the closest neighbours until ``nb`` bins are left."""
    while len(bins) > nb:
        smallest = bins[1][0] - bins[0][0]
        at, ties = 0, 1
        for i in range(1, len(bins) - 1):
            diff = bins[i + 1][0] - bins[i][0]
            if diff < smallest:
                smallest, at, ties = diff, i, 1
            elif diff == smallest:
                ties += 1
                if prng.next_double() <= 1.0 / ties:
                    at = i
        left, right = bins[at], bins[at + 1]
        d = left[1] + right[1]
        left[0] *= left[1] / d
        left[0] += right[0] / d * right[1]
        left[1] = d
        del bins[at + 1]


def merge(kept: list | None, batch: list | None, nb: int) -> list | None:
    """The state's histogram and a batch's (lists of ``{"x", "y"}`` or ``(x, y)``; None or
    empty: no value yet) merged as a fresh Spark buffer merges them, kept first."""
    ours = [_coord(b) for b in kept or ()]
    other = [_coord(b) for b in batch or ()]
    if not ours:
        bins = other
    else:
        bins = sorted(ours + other, key=lambda b: _java_order(b[0]))
        _trim(bins, nb, JavaRandom(SEED))
    return [{"x": x, "y": y} for x, y in bins] or None


def _coord(b) -> list[float]:
    if isinstance(b, dict):
        return [float(b["x"]), float(b["y"])]
    x, y = b
    return [float(x), float(y)]
