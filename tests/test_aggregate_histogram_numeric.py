"""histogram_numeric in a streaming aggregation, bin for bin as Spark's engine answers (issue 59).

Its bins depend on which partial histograms merged in which order and on a seeded random
tie-break (``operators.aggregate.histogram``), so the comparison is exact (no rounding) and
the inputs are made to tie: small integers, several files a batch (several partial
histograms a batch, merged after the shuffle), fewer bins than values.
"""
from __future__ import annotations

import json
import os
import random
import time

import pytest
from py4j.java_gateway import get_field
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream, sorted_rows
from microbatch.operators.aggregate import histogram
from stream_events import comparable, watermarks

SCHEMA = "k STRING, ts TIMESTAMP, v INT, d DOUBLE, big BIGINT, e INT"


@pytest.fixture
def events(tmp_path):
    """12 files of 40 rows (two a trigger): four keys, values 0-30 (many equally close
    bins), times going forward with late rows; ``e``: one even number a batch, two more each
    batch, so that a key's kept bins are evenly spaced and the fourth batch's merge into
    them meets equally close pairs (the random tie-break of the state's merge)."""
    rng = random.Random(59)
    directory = tmp_path / "events"
    directory.mkdir()
    base = time.time() - 10_000
    for i in range(12):
        rows = []
        for _ in range(40):
            second = max(0, i * 5 + rng.randint(-8, 4))
            rows.append({"k": rng.choice("abcd"), "ts": f"2026-01-01 00:{second // 60:02d}:{second % 60:02d}",
                         "v": rng.choice([None] + list(range(31))), "d": rng.randint(0, 400) / 8,
                         "big": rng.randint(-5, 5) * 1_000_000_007, "e": 2 * (i // 2)})
        path = directory / f"f{i:02d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (base + i, base + i))
    return str(directory)


def compare(spark, ss, events, tmp_path, transform, mode):
    def run(session, name):
        return collect_batches(transform(json_stream(session, events, SCHEMA, files_per_trigger=2)),
                               tmp_path / name, mode, rows=sorted_rows)
    theirs, their_progress = run(spark, "spark")
    ours, our_progress = run(ss, "microbatch")
    assert [b for b, _ in ours] == [b for b, _ in theirs]
    for (batch, our_rows), (_, their_rows) in zip(ours, theirs):
        assert our_rows == their_rows, f"batch {batch}"
    assert without_average(comparable(our_progress)) == without_average(comparable(their_progress))
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    return ours


def without_average(progress: list) -> list:
    """The progress without eventTime's ``avg``: Spark's engine merges its tasks' running means
    in the order the tasks end, so with two files a batch its last millisecond varies from run
    to run of Spark's engine itself."""
    return [(batch, {k: v for k, v in (times or {}).items() if k != "avg"}, *rest)
            for batch, times, *rest in progress]


def test_the_merge_is_sparks_numeric_histogram_merge(spark):
    """The state task's merge against Spark's own NumericHistogram (through the JVM), on
    histograms with equally close bins, so the random tie-break is exercised."""
    jvm = spark.sparkContext._jvm
    rng = random.Random(7)
    ties = 0
    for _ in range(200):
        nb = rng.randint(2, 8)
        kept = sorted({rng.randint(0, 20) for _ in range(rng.randint(1, nb))})
        batch = sorted({rng.randint(0, 20) for _ in range(rng.randint(1, nb))})
        kept_bins = [(float(x), float(rng.randint(1, 3))) for x in kept]
        batch_bins = [(float(x), float(rng.randint(1, 3))) for x in batch]

        def java(bins, nb=nb):
            found = jvm.org.apache.spark.sql.util.NumericHistogram()
            found.allocate(nb)
            for i, (x, y) in enumerate(bins):
                found.addBin(x, y, i)
            found.setUsedBins(len(bins))
            return found
        buffer = jvm.org.apache.spark.sql.util.NumericHistogram()
        buffer.allocate(nb)
        buffer.merge(java(kept_bins))
        buffer.merge(java(batch_bins))
        expected = [(get_field(buffer.getBin(i), "x"), get_field(buffer.getBin(i), "y"))
                    for i in range(buffer.getUsedBins())]
        merged = histogram.merge(kept_bins, batch_bins, nb)
        assert [(b["x"], b["y"]) for b in merged] == expected, (nb, kept_bins, batch_bins)
        ties += len(set(kept) | set(batch)) > nb
    assert ties > 50    # most cases trimmed, among integers most trims see ties


def test_the_random_tie_break_is_javas(spark):
    ours, theirs = histogram.JavaRandom(31183), spark.sparkContext._jvm.java.util.Random(31183)
    assert [ours.next_double() for _ in range(50)] == [theirs.nextDouble() for _ in range(50)]


def test_histograms_of_a_running_aggregation_in_update_mode(spark, ss, events, tmp_path):
    ours = compare(spark, ss, events, tmp_path, lambda frame: frame.groupBy("k").agg(
        F.expr("histogram_numeric(v, 4)").alias("hv"), F.expr("histogram_numeric(d, 3)").alias("hd"),
        F.expr("histogram_numeric(big, 2)").alias("hb"), F.expr("histogram_numeric(e, 3)").alias("he"),
        F.count("v").alias("n")), "update")
    assert len(ours) == 6 and all(rows for _, rows in ours)


def test_histograms_per_window_in_append_mode_and_of_timestamps_in_complete_mode(spark, ss, events, tmp_path):
    compare(spark, ss, events, tmp_path / "append", lambda frame: (
        frame.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "20 seconds"))
        .agg(F.expr("histogram_numeric(v, 3)").alias("h"))), "append")
    compare(spark, ss, events, tmp_path / "complete", lambda frame: frame.groupBy("k").agg(
        F.expr("histogram_numeric(ts, 3)").alias("h"),
        F.expr("histogram_numeric(v, 5) FILTER (WHERE v > 10)").alias("f"))
        .withColumn("first_x", F.col("h")[0]["x"]), "complete")
