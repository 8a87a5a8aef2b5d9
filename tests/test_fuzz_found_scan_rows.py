"""Input rows the differential fuzzer found microbatch counted unlike Spark's engine when
Spark's optimizer gives a file scan a filter its scan does not take (issue 57, seed 712),
each as a small hand-written query on microbatch next to Spark's own engine, batch by
batch: rows, progress (input rows, state operators), watermarks.

Spark's engine counts a source's rows by its scans' ``numOutputRows``. Its planner
(FileSourceStrategy) hands a file scan only the filters it translates for the file format
(``PushedFilters``: ``v > 2``, ``isnotnull(v)``; a JSON reader returns only the rows that
pass them) and prunes partitions by the filters on partition columns; the scan's other
``DataFilters`` (``isnotnull((v % 4))``) run in a filter above it, after its count.
Seed 712 joins a stream's rows with the maximum of its ``v % 4`` per window, on
``v % 4``: Spark's optimizer infers ``isnotnull`` of the join's keys and pushes it down to
the scan as ``isnotnull((v % 4))``, after it inferred filters: no ``isnotnull(v)``, so its
scan counts the rows with a null ``v``. microbatch put the same filter right above its
scan as a plain filter, from which Spark's optimizer inferred ``isnotnull(v)``, which the
scan takes: one row fewer. The filters a scan does not take now go over microbatch's scan
in a form Spark's optimizer infers nothing from (``spark_internals.scan_skips_filter``).
"""
from __future__ import annotations

import json
import os
import time

import pytest
from pyspark.sql import functions as F

from helpers import ci_share, collect_batches, json_stream
from microbatch import spark_internals
from stream_events import comparable, watermarks

SCHEMA = "ts TIMESTAMP, k INT, v INT"

#: (second of the minute, key, value) per file: null values and keys, a late row
EVENTS = [
    [(0, 2, 4), (4, 1, 0), (1, 2, 0), (4, 0, 0)],
    [(12, 2, None), (13, 2, 4), (14, 2, 2), (7, 0, 5)],
    [(26, None, 5), (22, 2, 2), (21, 1, None)],
    [(26, 3, 7), (24, 1, 9), (38, 3, None)],
]


def _write(directory, events, partition: bool = False) -> str:
    """One JSON file per batch of ``events``, in order; with ``partition``, each in the
    directory ``p=<its index modulo 2>`` (a partition column ``p``)."""
    directory.mkdir()
    base = time.time() - 10_000
    for i, batch in enumerate(events):
        where = directory / f"p={i % 2}" if partition else directory
        where.mkdir(exist_ok=True)
        path = where / f"f{i}.json"
        path.write_text("".join(json.dumps({"ts": f"2026-01-01 00:00:{s:02d}", "k": k, "v": v}) + "\n"
                                for s, k, v in batch))
        os.utime(path, (base + i, base + i))
    return str(directory)


@pytest.fixture
def events(tmp_path):
    return _write(tmp_path / "events", EVENTS)


@pytest.fixture
def partitioned(tmp_path):
    return _write(tmp_path / "partitioned", EVENTS, partition=True)


def join_on_a_key_of_an_expression(session, path):
    """Seed 712: the join on ``v % 4`` gives the scan ``isnotnull((v % 4))``, which it does
    not take: the rows with a null ``v`` count."""
    df = json_stream(session, path, SCHEMA).withColumn("v", F.col("v") % 4).withWatermark("ts", "10 seconds")
    a = df.groupBy(F.window("ts", "10 seconds").alias("aw")).agg(F.max("v").alias("mv"))
    b = df.select(F.window("ts", "10 seconds").alias("bw"), "k", F.col("v").alias("bv"))
    return b.join(a, F.expr("bw = aw AND bv = mv"))


def filter_the_reader_cannot_apply(session, path):
    """``v % 4 IN (0, 1)`` and ``k + v > 2`` run above the scan, after its count; the
    ``isnotnull(k)`` and ``isnotnull(v)`` Spark's optimizer infers from the second are
    taken: the rows with a null ``v`` or ``k`` do not count."""
    df = json_stream(session, path, SCHEMA).where("(v % 4 = 0 OR v % 4 = 1) AND k + v > 2")
    return df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()


def filter_the_reader_applies(session, path):
    """``v > 2`` is taken: the JSON reader returns only the rows that pass it."""
    df = json_stream(session, path, SCHEMA).withWatermark("ts", "10 seconds").where("v > 2")
    return df.groupBy(F.window("ts", "10 seconds")).agg(F.sum("v").alias("s"))


def filters_on_a_partition_column(session, path):
    """``p >= 1`` prunes the partitions; ``p % 2 = 0 OR v % 4 = 1`` (both columns) runs
    above the scan, and ``k IS NOT NULL`` is taken, so nothing else counts."""
    df = json_stream(session, path, SCHEMA + ", p INT")
    df = df.where("p >= 1 AND k IS NOT NULL AND (p % 2 = 0 OR v % 4 = 1)")
    return df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()


def partition_filter_the_scan_cannot_translate(session, path):
    """``p % 2 = 1``, on the partition column only, prunes the partitions all the same."""
    df = json_stream(session, path, SCHEMA + ", p INT").where("p % 2 = 1")
    return df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()


#: name -> (query, output mode, whether it reads the partitioned files, Spark's
#: numInputRows per batch)
QUERIES = {
    "seed 712 join on v % 4": (join_on_a_key_of_an_expression, "append", False, [8, 8, 6, 6, 0]),
    "filter the JSON reader cannot apply": (filter_the_reader_cannot_apply, "append", False, [4, 3, 1, 2, 0]),
    "filter the JSON reader applies": (filter_the_reader_applies, "append", False, [1, 2, 1, 2]),
    "filters on a partition column": (filters_on_a_partition_column, "append", True, [0, 4, 0, 3, 0]),
    "partition filter the scan cannot translate": (partition_filter_the_scan_cannot_translate, "append", True,
                                                   [0, 4, 0, 3, 0]),
}


@pytest.mark.parametrize("name", ci_share(list(QUERIES)))   # half in CI's run (helpers.ci_share)
def test_input_rows_match_spark_batch_by_batch(spark, ss, events, partitioned, tmp_path, name):
    query, mode, on_partitions, counted = QUERIES[name]
    path = partitioned if on_partitions else events
    theirs, their_progress = collect_batches(query(spark, path), tmp_path / "spark", mode)
    ours, our_progress = collect_batches(query(ss, path), tmp_path / "microbatch", mode)
    assert ours == theirs
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    assert [p["numInputRows"] for p in their_progress] == counted


def test_a_filter_the_scan_does_not_take_gives_it_nothing(spark, events):
    """The form microbatch gives such a filter passes the same rows, and Spark's planner
    gives the scan no filter from it (nor the ``isnotnull(v)`` it infers from the plain one)."""
    df = spark.read.schema(SCHEMA).json(events)
    condition = "isnotnull(v % 4) AND k = v"
    plain, skipped = df.where(condition), df.where(spark_internals.scan_skips_filter(condition))
    assert sorted(skipped.collect()) == sorted(plain.collect())

    def pushed(frame) -> str:
        scans = frame._jdf.queryExecution().executedPlan().collectLeaves()
        return scans.apply(0).pushedDownFilters().toString()
    assert pushed(plain) == "List(IsNotNull(v), IsNotNull(k))"
    assert pushed(skipped) == "List()"
