"""Spark's QuantileSummaries, the buffer of ``percentile_approx`` / ``approx_percentile``
(``org.apache.spark.sql.catalyst.util.QuantileSummaries``, a Greenwald-Khanna variant, and
``ApproximatePercentile.PercentileDigest``), ported step for step: the head buffer of
50,000 values inserted sorted, compressed when the samples reach 10,000, the merge that
widens each interleaved sample's ``delta`` by the other side's error, and the query.

A summary is three lists, as the state keeps it (``list<double>``, ``list<bigint>``,
``list<bigint>``): the samples' values (sorted), their ``g`` (the rank gap to the sample
before; the summary's count is their sum) and ``delta`` (the rank's uncertainty). A
batch's values arrive with ``g`` null: not inserted yet (``summary``).

While a summary has seen fewer than ``1 / (2 * relativeError)`` values (5,000 at the default
accuracy 10,000), every ``delta`` Spark computes is ``floor(2 * relativeError * n) = 0`` and
nothing is compressed: the samples are every value, sorted, and the answer is exact (the
value at rank ``ceil(q * n)``), whatever order the values came in. The functions take a
shortcut there (one sort, no per-value Python); beyond it they run Spark's loops.
"""
from __future__ import annotations

import math

#: QuantileSummaries.defaultCompressThreshold and defaultHeadSize
COMPRESS_THRESHOLD = 10000
HEAD_SIZE = 50000

Summary = tuple  # (values: list[float], g: list[int], delta: list[int])
EMPTY: Summary = ([], [], [])


def _java_key(value: float) -> tuple:
    """java.lang.Double.compare's order (Scala's ``sorted`` of doubles): -0.0 before 0.0,
    NaN after everything."""
    if value != value:
        return (1, 0.0, 0)
    return (0, value, 0 if value == 0.0 and math.copysign(1.0, value) < 0 else 1)


def _plain(values: list) -> bool:
    """Whether Python's order of ``values`` is Java's: no NaN, no zero (whose sign Java
    orders)."""
    total = sum(values, 0.0)
    return total == total and 0.0 not in values


def _inserted(summary: Summary, head: list, eps: float) -> Summary:
    """QuantileSummaries.withHeadBufferInserted: ``head`` sorted and merged into the
    samples, each new sample with g = 1 and delta = floor(2 * eps * count so far), 0 for
    the first and the last."""
    values, gs, deltas = summary
    count = sum(gs)
    if 2 * eps * (count + len(head)) < 1 and _plain(head) and _plain(values):
        # every delta is 0: the samples are all the values, sorted (the held ones first
        # among equals, as Spark's loop takes a held sample <= the new one first)
        merged = sorted(values + head) if values else sorted(head)
        return merged, [1] * len(merged), [0] * len(merged)
    ordered = sorted(head, key=_java_key)
    new_values: list = []
    new_gs: list = []
    new_deltas: list = []
    i, n = 0, len(values)
    current = count
    last = len(ordered) - 1
    for j, x in enumerate(ordered):
        while i < n and values[i] <= x:
            new_values.append(values[i])
            new_gs.append(gs[i])
            new_deltas.append(deltas[i])
            i += 1
        current += 1
        delta = 0 if not new_values or (i == n and j == last) else math.floor(2 * eps * current)
        new_values.append(x)
        new_gs.append(1)
        new_deltas.append(delta)
    return new_values + values[i:], new_gs + gs[i:], new_deltas + deltas[i:]


def _compressed(summary: Summary, threshold: float) -> Summary:
    """QuantileSummaries.compressImmut: from the last sample down, a sample merges into the
    one after it while their g and the latter's delta stay under ``threshold``; the first
    sample is kept."""
    values, gs, deltas = summary
    size = len(values)
    if not size:
        return summary
    if threshold <= 2 and (size < 2 or values[0] <= values[1]):
        return summary   # g >= 1: no two samples merge, and the first is kept
    out_v, out_g, out_d = [], [], []
    head_v, head_g, head_d = values[-1], gs[-1], deltas[-1]
    for i in range(size - 2, 0, -1):
        if gs[i] + head_g + head_d < threshold:
            head_g += gs[i]
        else:
            out_v.append(head_v)
            out_g.append(head_g)
            out_d.append(head_d)
            head_v, head_g, head_d = values[i], gs[i], deltas[i]
    out_v.append(head_v)
    out_g.append(head_g)
    out_d.append(head_d)
    if values[0] <= head_v and size > 1:
        out_v.append(values[0])
        out_g.append(gs[0])
        out_d.append(deltas[0])
    return out_v[::-1], out_g[::-1], out_d[::-1]


def _compress(summary: Summary, eps: float) -> Summary:
    return _compressed(summary, 2 * eps * sum(summary[1]))


def summary(values: list, eps: float) -> Summary:
    """The summary Spark's PercentileDigest makes of ``values`` added one by one, then
    serialised (compressed): a batch's partial buffer."""
    result: Summary = EMPTY
    compressed = True
    for start in range(0, len(values), HEAD_SIZE):
        chunk = values[start:start + HEAD_SIZE]
        result = _inserted(result, chunk, eps)
        if len(chunk) == HEAD_SIZE and len(result[0]) < COMPRESS_THRESHOLD:
            compressed = False   # a full head inserted, not compressed (yet)
        else:
            result = _compress(result, eps)
            compressed = True
    return result if compressed else _compress(result, eps)


def merge(left: Summary, right: Summary, eps: float) -> Summary:
    """QuantileSummaries.merge(left, right): the samples merged in order (``right``'s first
    among equals), a sample that falls among the other side's widened by that side's
    ``floor(2 * eps * count)``, then compressed."""
    lv, lg, ld = left
    rv, rg, rd = right
    left_count, right_count = sum(lg), sum(rg)
    if right_count == 0:
        return left
    if left_count == 0:
        return right
    total = left_count + right_count
    if 2 * eps * total < 1 and _plain(lv) and _plain(rv):
        merged = sorted(rv + lv)   # all g 1 and delta 0; equal values: right's first
        return merged, [1] * len(merged), [0] * len(merged)
    add_left = math.floor(2 * eps * right_count)
    add_right = math.floor(2 * eps * left_count)
    out_v, out_g, out_d = [], [], []
    i = j = 0
    while i < len(lv) and j < len(rv):
        if lv[i] < rv[j]:
            out_v.append(lv[i])
            out_g.append(lg[i])
            out_d.append(ld[i] + (add_left if j > 0 else 0))
            i += 1
        else:
            out_v.append(rv[j])
            out_g.append(rg[j])
            out_d.append(rd[j] + (add_right if i > 0 else 0))
            j += 1
    out_v += lv[i:] + rv[j:]
    out_g += lg[i:] + rg[j:]
    out_d += ld[i:] + rd[j:]
    return _compressed((out_v, out_g, out_d), 2 * eps * total)


def query(summary: Summary, percentages, eps: float) -> list | None:
    """QuantileSummaries.query: each percentage's sample (None for an empty summary)."""
    values, gs, deltas = summary
    if not values:
        return None
    count = sum(gs)
    target = max(map(sum, zip(gs, deltas))) // 2
    exact = target == 0   # every g 1, every delta 0: rank r is sample r - 1
    last = len(values) - 1
    index, min_rank = 0, gs[0]
    result = [0.0] * len(percentages)
    for pos, p in sorted(enumerate(percentages), key=lambda x: x[1]):
        if p <= eps:
            result[pos] = values[0]
        elif p >= 1 - eps:
            result[pos] = values[-1]
        else:
            rank = math.ceil(p * count)
            if exact:
                i = rank - 1
                if index <= i < last:
                    index, min_rank = i, rank
                    result[pos] = values[i]
                else:
                    index, min_rank = last, 0
                    result[pos] = values[-1]
                continue
            i = index
            while i < last:
                if min_rank + deltas[i] - target <= rank <= min_rank + target:
                    break
                i += 1
                min_rank += gs[i]
            else:
                index, min_rank = last, 0
                result[pos] = values[-1]
                continue
            index = i
            result[pos] = values[i]
    return result
