"""HyperLogLog++ estimation, as Spark's ``approx_count_distinct`` computes it.

A batch's registers come from Spark SQL (``operators.aggregate.spec``: XxHash64 with seed
42, register index from the top ``p`` bits, rank from the leading zeros of the
rest); the state keeps the per-register maximum; this module turns registers into
Spark's estimate: raw HLL with the HLL++ bias correction (k-nearest-neighbour
interpolation, K = 6, over the bias tables of the running Spark, read once on the
driver), or linear counting below Spark's thresholds.
"""
from __future__ import annotations

import math
import struct

K = 6


def alpha_m2(p: int) -> float:
    m = 1 << p
    if p == 4:
        return 0.673 * m * m
    if p == 5:
        return 0.697 * m * m
    if p == 6:
        return 0.709 * m * m
    return (0.7213 / (1.0 + 1.079 / m)) * m * m


def _double_bits(x: float) -> int:
    return struct.unpack(">q", struct.pack(">d", x))[0]


def _java_binary_search(values: list[float], key: float) -> int:
    """``java.util.Arrays.binarySearch(double[], double)``, step for step (the tables
    are not strictly sorted, so the path matters)."""
    low, high = 0, len(values) - 1
    while low <= high:
        mid = (low + high) >> 1
        mid_value = values[mid]
        if mid_value < key:
            low = mid + 1
        elif mid_value > key:
            high = mid - 1
        else:
            mid_bits, key_bits = _double_bits(mid_value), _double_bits(key)
            if mid_bits == key_bits:
                return mid
            if mid_bits < key_bits:
                low = mid + 1
            else:
                high = mid - 1
    return -(low + 1)


def estimate_bias(e: float, raw_estimates: list[float], biases: list[float]) -> float:
    n = len(raw_estimates)
    ix = _java_binary_search(raw_estimates, e)
    nearest = -(ix + 1) if ix < 0 else ix

    def distance(i: int) -> float:
        diff = e - raw_estimates[i]
        return diff * diff

    low = max(nearest - K + 1, 0)
    high = min(low + K, n)
    while high < n and distance(high) < distance(low):
        low += 1
        high += 1
    total = 0.0
    for i in range(low, high):
        total += biases[i]
    return total / (high - low)


def estimate(registers: dict[int, int], p: int, threshold: float,
             raw_estimates: list[float], biases: list[float]) -> int:
    """Spark's ``HyperLogLogPlusPlusHelper.query`` over registers ``{index: rank}``."""
    m = 1 << p
    z_inverse = 0.0
    zeros = 0.0
    for j in range(m):
        rank = registers.get(j, 0)
        z_inverse += 1.0 / (1 << rank)
        if rank == 0:
            zeros += 1.0
    e = alpha_m2(p) / z_inverse

    def bias_corrected() -> float:
        if p < 19 and e < 5.0 * m:
            return e - estimate_bias(e, raw_estimates, biases)
        return e

    if zeros > 0:
        h = m * math.log(m / zeros)
        value = h if (p < 19 and h <= threshold) or e <= 2.5 * m else bias_corrected()
    else:
        value = bias_corrected()
    return int(math.floor(value + 0.5))  # Java's Math.round
