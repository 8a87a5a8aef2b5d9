"""percentile_approx / approx_percentile in a streaming aggregation (issue 59), on microbatch
next to Spark's own engine, batch by batch: one event file per batch (``maxFilesPerTrigger=1``,
AvailableNow). The state keeps Spark's QuantileSummaries per key; while a key has seen
fewer than 1 / (2 * relativeError) values (5,000 at the default accuracy) Spark's answer is
exact and microbatch's must equal it. Above that Spark's own answer depends on the order it
merges partitions' sketches, so a large group is checked against the sketch's guarantee:
the answer's rank within relativeError * n of the true quantile's.
"""
from __future__ import annotations

import bisect
import math
import random

import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream, plain_rows
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "k STRING, ts TIMESTAMP, v INT, d DOUBLE, dec DECIMAL(10,2), big BIGINT, nt TIMESTAMP_NTZ, b BOOLEAN"


def _events(seed: int, files: int, rows: int, keys: str = "abcd"):
    rng = random.Random(seed)
    out = []
    for f in range(files):
        batch = []
        for _ in range(rows):
            second = f * 10 + rng.randrange(15)
            v = rng.choice([None, *range(-20, 40)])
            d = rng.choice([None, -0.5, 2.25, 1e9, float(rng.randrange(100)) / 8])
            batch.append((rng.choice(keys), f"00:{second // 60:02d}:{second % 60:02d}", v, d,
                          f"{rng.randrange(-5000, 5000) / 100:.2f}", rng.randrange(-2 ** 60, 2 ** 60),
                          rng.random() < 0.5))
        out.append(batch)
    return out


def event_record(k, t, v, d, dec, big, b):
    return {"k": k, "ts": f"2026-01-01 {t}", "v": v, "d": d, "dec": dec, "big": big,
            "nt": f"2026-01-01T{t}", "b": b}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", _events(7, 5, 40), event_record)


def run(session, events, ckpt, transform, mode):
    return collect_batches(transform(json_stream(session, events, SCHEMA)), ckpt, mode,
                           rows=lambda df: plain_rows(df, lists_ordered=True))


def _progress(progress) -> list:
    """``comparable`` without the event time's average: Spark's is a running mean, row by
    row, whose last bits (a millisecond, once truncated) microbatch's exact mean of the
    batch can miss."""
    return [(b, {k: v for k, v in (t or {}).items() if k != "avg"}, *rest) for b, t, *rest in comparable(progress)]


def compare(spark, ss, events, tmp_path, transform, mode):
    theirs, their_progress = run(spark, events, tmp_path / "spark", transform, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", transform, mode)
    assert [b for b, _ in ours] == [b for b, _ in theirs]
    for (batch, our_rows), (_, their_rows) in zip(ours, theirs):
        assert our_rows == their_rows, f"batch {batch}"
    assert _progress(our_progress) == _progress(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    return ours


FUNCTIONS = [
    "percentile_approx(v, 0.5)", "approx_percentile(d, array(0.1, 0.5, 0.9, 0))", "percentile_approx(dec, 0.3)",
    "percentile_approx(big, 0.75, 100)", "percentile_approx(v, array(1, 0.99, 0.01), 50)",
    "percentile_approx(CAST(v AS TINYINT), 0.4)", "percentile_approx(CAST(d AS FLOAT), 0.6)",
    "percentile_approx(v, 0.5) FILTER (WHERE b)", "percentile_approx(v, 0.25) + count(v)",
    "percentile_approx(ts, 0.5)", "percentile_approx(CAST(ts AS DATE), array(0.2, 0.8))",
    "percentile_approx(nt, 0.5)", "percentile_approx(ts - TIMESTAMP'2026-01-01 00:00:00', 0.7)",
    "string(percentile_approx(make_ym_interval(0, v), array(0.5)))",
]


def keyed(functions):
    return lambda frame: frame.groupBy("k").agg(*[F.expr(f).alias(f"f{i}") for i, f in enumerate(functions)])


def test_equal_to_sparks_in_update_mode(spark, ss, events, tmp_path):
    ours = compare(spark, ss, events, tmp_path, keyed(FUNCTIONS), "update")
    assert len(ours) == 5 and all(len(rows) == 4 for _, rows in ours)


def test_equal_to_sparks_in_complete_mode_without_keys(spark, ss, events, tmp_path):
    compare(spark, ss, events, tmp_path, lambda frame: frame.agg(
        F.percentile_approx("v", [0.5, 0.9]).alias("p"), F.expr("approx_percentile(d, 0.5, 10)").alias("q")),
        "complete")


def test_windowed_append_mode_with_watermark(spark, ss, events, tmp_path):
    compare(spark, ss, events, tmp_path, lambda frame: (
        frame.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "k")
        .agg(F.percentile_approx("v", 0.5).alias("p"), F.expr("approx_percentile(dec, array(0.5, 0.1))"),
             F.percentile_approx("ts", 0.9, 1000).alias("t"))), "append")


def test_session_windows_merge_their_summaries(spark, ss, events, tmp_path):
    """Sessions that meet merge their summaries (both already summaries, not a batch's values);
    beside the other buffers a batch brings in another form than the state's (HLL++
    registers, percentile's counts)."""
    compare(spark, ss, events, tmp_path, lambda frame: (
        frame.withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "2 seconds"), "k")
        .agg(F.percentile_approx("v", [0.5, 0.2]).alias("p"), F.expr("approx_percentile(d, 0.5, 20)"),
             F.approx_count_distinct("v").alias("n"), F.expr("percentile(v, 0.5)").alias("m"))), "append")


def test_a_restart_carries_the_summaries_on(spark, ss, tmp_path):
    """Two files, the query stopped; three more files, the query restarted on its
    checkpoint: the summaries come back from the state files."""
    batches = _events(11, 5, 40)
    directory = tmp_path / "events"
    write_event_files(directory, batches[:2], event_record)
    transform = keyed(["percentile_approx(v, array(0.5, 0.75))", "percentile_approx(d, 0.5)", "count(v)"])
    found = {}
    for name, session in (("spark", spark), ("microbatch", ss)):
        first, _ = run(session, str(directory), tmp_path / name, transform, "update")
        found[name] = first
    more = tmp_path / "more"
    write_event_files(more, batches[2:], event_record)
    for i, path in enumerate(sorted(more.iterdir())):
        path.rename(directory / f"g{i}.json")
    for name, session in (("spark", spark), ("microbatch", ss)):
        later, _ = run(session, str(directory), tmp_path / name, transform, "update")
        found[name] = found[name] + later
    assert [b for b, _ in found["microbatch"]] == [0, 1, 2, 3, 4]
    assert found["microbatch"] == found["spark"]


def _rank_error(sorted_values: list, answer: float, q: float) -> float:
    """How far (in ranks) ``answer`` is from rank ceil(q * n): 0 if some occurrence of it
    is at that rank."""
    n = len(sorted_values)
    target = max(1, math.ceil(q * n))
    low, high = bisect.bisect_left(sorted_values, answer) + 1, bisect.bisect_right(sorted_values, answer)
    assert low <= high, f"{answer} is not one of the values"
    return 0 if low <= target <= high else min(abs(low - target), abs(high - target))


@pytest.mark.parametrize("accuracy", [10000, 100])
def test_a_large_group_stays_within_the_rank_guarantee(ss, tmp_path, accuracy):
    """20,000 values of one key over four batches (past the exact range at both
    accuracies, compressed at 100): each batch's answers are within relativeError * n
    ranks of the true quantiles of the values so far."""
    rng = random.Random(5)
    batches = [[rng.gauss(0, 1000) for _ in range(5000)] for _ in range(4)]
    directory = tmp_path / "events"
    write_event_files(directory, [[("a", v)] for v in batches], lambda k, vs: {"k": k, "vs": vs})
    percentages = [0.001, 0.1, 0.25, 0.5, 0.9, 0.999]
    frame = (json_stream(ss, directory, "k STRING, vs ARRAY<DOUBLE>").select("k", F.explode("vs").alias("x"))
             .groupBy("k").agg(F.percentile_approx("x", percentages, accuracy).alias("p")))
    found, _ = collect_batches(frame, tmp_path / "ckpt", "update")
    assert [b for b, _ in found] == [0, 1, 2, 3]
    seen: list = []
    for (_, rows), batch in zip(found, batches):
        seen = sorted(seen + batch)
        (_, answers), = rows
        errors = [_rank_error(seen, answer, q) for answer, q in zip(answers, percentages)]
        assert max(errors) <= len(seen) / accuracy, errors


@pytest.mark.parametrize("accuracy", [10000, 1000, 100])
def test_the_port_makes_sparks_sketch_of_one_partition(spark, accuracy):
    """70,000 values in one partition (past Spark's head buffer of 50,000 and its
    compression at 10,000 samples), in Spark's batch percentile_approx and in the port
    (``quantiles.summary``, then ``query``): the same answers, value for value."""
    from microbatch.operators.aggregate import quantiles
    frame = spark.range(0, 70_000, numPartitions=1).selectExpr("CAST((id * 7919) % 10007 AS DOUBLE) + id / 64 AS x")
    percentages = [0.0, 0.00005, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999, 1.0]
    theirs = frame.agg(F.percentile_approx("x", percentages, accuracy)).first()[0]
    values = [r.x for r in frame.collect()]
    eps = 1.0 / accuracy
    assert quantiles.query(quantiles.summary(values, eps), percentages, eps) == theirs
