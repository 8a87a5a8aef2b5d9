"""Input rows the differential fuzzer found microbatch counted unlike Spark's engine in
Nexmark q5's shape (issue 57, seeds 1359, 1763, 1872, 2037, 2169): a stream branched into
two aggregations that join again, ``counts.join(counts.groupBy("window").agg(max("count")))``,
each as a small hand-written query on microbatch next to Spark's own engine, batch by batch:
rows, progress (input rows, state operators), watermarks.

Spark's engine (4.3, ``ProgressContext.extractSourceToNumInputRows``) sums a source's
``numOutputRows`` over the scans of the source in its executed plan of the batch (its
``StreamSourceAwareSparkPlan`` nodes; a ``ReusedExchange`` is a leaf, the scan under the
exchange it reuses is not counted again). Straight over a file source its plan scans the
source twice: MicroBatchExecution puts the batch's relation under a projection aliasing
each column to the stream's, the same in both branches, and Spark's optimizer
(RemoveRedundantAliases) drops the aliases of the join's left branch but keeps, on the right
branch, the alias of a column the left branch outputs (``k#73 AS k#3``): the branches differ
and the first one's exchange is not reused in the second. Every batch with rows counts
them twice. Behind a projection that renames the grouped column (seed 420) the branches
are alike, Spark reuses the exchange and counts the rows once. microbatch's own batch plan
reuses the exchange in both shapes (it reads a batch as a batch: no such projection), so it
counted once; it now asks Spark's planner once per run how many times Spark's engine scans
each source (``runtime.engine_scans``) and counts the rows that many times. Over a union
with a second source Spark reuses the exchange while both sources have data and not in a
batch where the second has none (an empty relation in Spark's plan): microbatch asks for
each such set of sources without data. A batch without data (for the watermark) reports
none, in both engines; after a restart the new run asks again.
"""
from __future__ import annotations

import json
import os
import time

import pytest
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream
from microbatch.runtime.engine_scans import EngineScans
from microbatch.spark_internals.metrics import engine_rows
from stream_events import comparable, watermarks

SCHEMA = "k INT, ts TIMESTAMP, v INT"

#: (key, second of the minute, value) per file: out of order, a late row, a null key
EVENTS = [
    [(3, 0, 3)],
    [(None, 12, 7), (1, 8, 0), (0, 8, 2), (0, 11, 8)],
    [(0, 20, 8), (3, 12, 4), (None, 19, 5), (3, 19, 4)],
    [(1, 5, 4), (3, 23, 7)],
    [(0, 35, 3), (2, 36, 7)],
    [(1, 49, 9), (2, 32, 8), (1, 47, 1)],
]

#: a second stream's files (the union's): fewer, so that its last batches have no data
OTHER_EVENTS = [
    [(2, 3, 1), (1, 9, 2)],
    [(2, 14, 1)],
]


def _write(directory, events, first: int = 0, last: int | None = None) -> str:
    """Files ``first`` to ``last`` of ``events`` in ``directory``, one a batch, in order."""
    directory.mkdir(exist_ok=True)
    base = time.time() - 10_000
    for i, batch in enumerate(events[first:last], start=first):
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps({"k": k, "ts": f"2026-01-01 00:00:{s:02d}", "v": v}) + "\n"
                                for k, s, v in batch))
        os.utime(path, (base + i, base + i))
    return str(directory)


def _hot_keys(df, delay: str = "5 seconds", slide: str = "2 seconds"):
    """Nexmark q5's shape (seed 1359): counts per key in a sliding window, joined with the
    largest count of each window."""
    df = df.withWatermark("ts", delay)
    counts = df.groupBy(F.window("ts", "10 seconds", slide), "k").count()
    m = counts.groupBy("window").agg(F.max("count").alias("mx")).withColumnRenamed("window", "mwindow")
    return counts.join(m, F.expr("window = mwindow AND count = mx"))


def straight_over_the_source(stream):
    """Seeds 1359, 2169: the shape straight over the source."""
    return _hot_keys(stream)


def renamed_value_filtered_after(stream):
    """Seeds 1763, 1872: a column not grouped renamed first, a filter after the join."""
    return _hot_keys(stream.withColumnRenamed("v", "v_1"), "0 seconds", "5 seconds").where("count IS NOT NULL")


SHAPES = {
    "straight over the source (seeds 1359, 2169)": straight_over_the_source,
    "a column renamed, a filter after the join (seeds 1763, 1872)": renamed_value_filtered_after,
}


def _rows_in(events) -> list[int]:
    return [len(batch) for batch in events]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_stream_read_in_two_branches_counts_its_rows_as_sparks_engine(spark, ss, tmp_path, shape):
    query = SHAPES[shape]
    path = _write(tmp_path / "events", EVENTS)

    def run(session, ckpt):
        return collect_batches(query(json_stream(session, path, SCHEMA)), ckpt, "append")
    theirs, their_progress = run(spark, tmp_path / "spark")
    ours, our_progress = run(ss, tmp_path / "microbatch")
    assert ours == theirs and sum(len(rows) for _, rows in ours) > 0
    # (Spark's engine counts each batch's rows twice: the test reads what it is about)
    read = [p["numInputRows"] for p in their_progress]
    assert read[:len(EVENTS)] == [2 * n for n in _rows_in(EVENTS)]
    assert read[len(EVENTS):] == [0] * (len(read) - len(EVENTS))   # (the batches for the watermark)
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


def test_over_a_union_the_count_follows_sparks_plan_of_each_batch(spark, ss, tmp_path):
    """The shape over a union of two file sources. While both have data Spark's optimizer
    drops the per-batch aliases in both branches, reuses the first one's exchange and counts
    each source's rows once (and the second branch's aggregations, above the reused exchange,
    get no watermark: the rows differ, ``test_fuzz_known_differences``); in a batch where the
    second source has no data (Spark reads it as an empty relation) the branches differ again
    and the first source's rows count twice. microbatch asks Spark's planner for each such
    set of sources without data."""
    paths = _write(tmp_path / "events", EVENTS), _write(tmp_path / "other", OTHER_EVENTS)

    def counted(session, ckpt) -> list:
        frame = _hot_keys(json_stream(session, paths[0], SCHEMA).unionByName(json_stream(session, paths[1], SCHEMA)))
        _, progress = collect_batches(frame, ckpt, "append")
        return [(p["batchId"], [source["numInputRows"] for source in p["sources"]]) for p in progress]
    theirs = counted(spark, tmp_path / "spark")
    both = len(OTHER_EVENTS)
    assert theirs[:len(EVENTS)] == list(enumerate(
        [[a, b] for a, b in zip(_rows_in(EVENTS), _rows_in(OTHER_EVENTS))]
        + [[2 * a, 0] for a in _rows_in(EVENTS)[both:]]))
    assert counted(ss, tmp_path / "microbatch") == theirs


def test_the_count_after_a_restart_is_sparks_engines(spark, ss, tmp_path):
    """Seed 2037: stopped after four files, restarted on the same checkpoint with the rest;
    the new run counts as Spark's engine does in every batch, the watermark's too."""
    path = tmp_path / "events"
    runs: dict[str, list] = {"spark": [], "microbatch": []}
    for first, last in ((0, 4), (4, None)):
        _write(path, EVENTS, first, last)
        for label, session in (("spark", spark), ("microbatch", ss)):
            frame = _hot_keys(json_stream(session, path, SCHEMA), "0 seconds")
            runs[label].append(collect_batches(frame, tmp_path / label, "append"))
    (their_first, their_second), (our_first, our_second) = runs["spark"], runs["microbatch"]
    assert our_first[0] == their_first[0] and our_second[0] == their_second[0]
    assert sum(len(rows) for _, rows in our_second[0]) > 0
    for ours, theirs in ((our_first, their_first), (our_second, their_second)):
        assert comparable(ours[1]) == comparable(theirs[1])
    assert [p["numInputRows"] for p in their_second[1]][:2] == [2 * n for n in _rows_in(EVENTS)[4:]]
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")


def behind_a_renaming_projection(stream):
    """Seed 420's shape: the event time selected under another name, the grouped column
    renamed."""
    df = stream.select(stream["ts"].alias("t_1"), "k", "v").withWatermark("t_1", "3 seconds")
    counts = df.withColumnRenamed("k", "k_2").groupBy(F.window("t_1", "10 seconds", "2 seconds"), "k_2").count()
    m = counts.groupBy("window").agg(F.max("count").alias("mx")).withColumnRenamed("window", "mwindow")
    return counts.join(m, F.expr("window = mwindow AND count = mx"))


def test_behind_a_renaming_projection_spark_reuses_the_exchange_and_counts_once(spark, ss, tmp_path):
    """Seed 420's shape: Spark's engine reuses the first branch's exchange in the second (its
    rows differ from microbatch's for that reason: ``test_fuzz_known_differences``), and
    counts each batch's rows once, as microbatch does."""
    path = _write(tmp_path / "events", EVENTS)
    _, their_progress = collect_batches(behind_a_renaming_projection(json_stream(spark, path, SCHEMA)),
                                        tmp_path / "spark", "append")
    _, our_progress = collect_batches(behind_a_renaming_projection(json_stream(ss, path, SCHEMA)),
                                      tmp_path / "microbatch", "append")
    theirs = [(p["batchId"], p["numInputRows"]) for p in their_progress]
    assert theirs[:len(EVENTS)] == list(enumerate(_rows_in(EVENTS)))
    assert [(p["batchId"], p["numInputRows"]) for p in our_progress] == theirs


def test_sparks_planner_tells_how_many_times_its_engine_scans_a_source(spark, ss, tmp_path):
    """What ``runtime.engine_scans`` reads from Spark's planner: two scans straight over the
    source, one behind a renaming projection; nothing asked of a query that reads its source
    once, or of a batch without data."""
    path = _write(tmp_path / "events", EVENTS)

    def scans(frame, without_data=frozenset()) -> dict:
        plan = frame._plan
        empty = {r: r.empty_batch(spark) for r in plan.relations()}
        return EngineScans(plan, plan.relations(), empty).of(without_data)
    stream = json_stream(ss, path, SCHEMA)
    assert scans(_hot_keys(stream)) == {0: 2}
    assert scans(behind_a_renaming_projection(stream)) == {0: 1}
    assert scans(stream.groupBy("k").count()) == {}
    assert scans(_hot_keys(stream), frozenset({0})) == {}


def test_a_sources_rows_are_counted_as_often_as_sparks_engine_scans_it():
    assert engine_rows([4], None) == 4                 # (nothing known: microbatch's scans)
    assert engine_rows([4], 2) == 8                    # (q5: Spark scans twice, microbatch once)
    assert engine_rows([4, 4], 1) == 4                 # (Spark reuses what microbatch reads twice)
    assert engine_rows([4, 1], 1) == 5                 # (different reads: each counted)
    assert engine_rows([3, 3], 2) == 6
