"""Fuzzer seed 3219 (issue 57): an aggregation over a stream-stream full outer join whose
aggregate reads only the left side's columns and does not care for duplicates
(``groupBy(window(ts), k).agg(min(v))``). Spark's optimizer removes the join
(EliminateOuterJoin: the tumbling window's ``isnotnull(ts)`` makes the full outer join a
left one, and an aggregation of the left side's columns by duplicate-agnostic functions
over a left outer join is the aggregation of the left side alone), in every batch: Spark's
engine's only stateful operator is the aggregation (operator 0, ``state/0``), which reads
the left side's rows as they come. microbatch ran the join (operator 1), whose outer rows
reached the aggregation later, after the watermark, so windows closed without them.

The query as the seed has it: the left side a union of both streams, the right side the
second stream again; run on a checkpoint for three files of each stream, then restarted on
it for the rest. Rows, progress (state operators and their rows), watermarks, the state's
layout and rows per partition, next to Spark's engine."""
from __future__ import annotations

import json
import os
import time

from pyspark.sql import functions as F

from helpers import collect_batches, json_stream, state_rows_per_partition
from stream_events import comparable, watermarks

#: the seed's files, (ts second, k, v, s) per row; the first stream's, then the second's
FILES1 = [
    [(0, 0, 3, "b"), (6, None, 1, "c"), (7, 1, 6, "c"), (10, None, 1, "b"), (9, 0, 6, "a")],
    [],
    [(13, 2, None, "c"), (0, 0, 2, "a"), (10, 1, 5, "b"), (0, 1, 6, "c"), (5, 0, 3, "b"), (5, 2, 4, "b")],
    [(21, None, 6, "b"), (14, 0, 9, "c"), (22, 2, 3, "c"), (0, 2, 0, "c")],
    [(19, 1, 3, "c")],
    [(32, 0, 0, "c"), (25, 2, 8, "a"), (33, 3, 6, "c"), (28, 2, 7, "a")],
]
FILES2 = [
    [(4, 1, 2), (1, 0, 5)],
    [(8, 2, 1), (3, 1, 7)],
    [(12, 0, 4)],
    [(16, 1, 1), (11, 2, 9)],
    [(24, 0, 3)],
    [(30, 2, 2), (27, 1, 5)],
]
RESTART_AFTER = 3


def _write(directory, files, start, end, record) -> None:
    directory.mkdir(exist_ok=True)
    base = time.time() - 10_000
    for i in range(start, end):
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps(record(*row)) + "\n" for row in files[i]))
        os.utime(path, (base + i, base + i))


def _at(second: int) -> str:
    return f"2026-01-01 00:00:{second:02d}"


def union_full_outer_join_min(session, src_dir, src2_dir):
    src = json_stream(session, src_dir, "ts TIMESTAMP, k INT, v INT, s STRING")
    src2 = json_stream(session, src2_dir, "ts2 TIMESTAMP, k2 INT, v2 INT")
    left = src.withWatermark("ts", "0 seconds").unionByName(
        src2.withWatermark("ts2", "3 seconds").select(F.col("ts2").alias("ts"), F.col("k2").alias("k"),
                                                      F.col("v2").alias("v"), F.lit("u").alias("s")))
    right = src2.withColumnRenamed("ts2", "rt")
    joined = left.join(right, F.expr("k = k2 AND rt BETWEEN ts - INTERVAL 5 SECONDS AND ts + INTERVAL 5 SECONDS"),
                       "full_outer").drop(left.s)
    return (joined.groupBy(F.window(F.col("ts"), "5 seconds"), "k").agg(F.min(F.col("v")).alias("mi_1"))
            .filter(F.col("mi_1") >= 1))


def test_aggregation_over_an_outer_join_spark_removes_matches_spark_across_a_restart(spark, ss, tmp_path):
    src, src2 = tmp_path / "src", tmp_path / "src2"
    results = {}
    for start, end in ((0, RESTART_AFTER), (RESTART_AFTER, len(FILES1))):
        _write(src, FILES1, start, end, lambda t, k, v, s: {"ts": _at(t), "k": k, "v": v, "s": s})
        _write(src2, FILES2, start, end, lambda t, k, v: {"ts2": _at(t), "k2": k, "v2": v})
        for name, session in (("spark", spark), ("microbatch", ss)):
            batches, progress = collect_batches(union_full_outer_join_min(session, src, src2),
                                                tmp_path / name, "append")
            found = results.setdefault(name, ([], []))
            found[0].extend(batches)
            found[1].extend(comparable(progress))
    (ours, our_progress), (theirs, their_progress) = results["microbatch"], results["spark"]
    assert [ops for _, _, ops, _, _ in their_progress if ops] and all(
        [op["operatorName"] for op in ops] == ["stateStoreSave"] for _, _, ops, _, _ in their_progress)
    assert ours == theirs
    assert sum(len(rows) for _, rows in ours) > 0
    assert our_progress == their_progress
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
    assert sorted(os.listdir(tmp_path / "microbatch" / "state")) == sorted(os.listdir(tmp_path / "spark" / "state")) \
        == ["0"]
    assert state_rows_per_partition(ss.read, tmp_path / "microbatch", {0: (None,)}) == \
        state_rows_per_partition(spark.read, tmp_path / "spark", {0: (None,)})
