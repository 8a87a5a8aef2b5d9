"""A stream-stream join Spark's optimizer removes from the query (issue 57, seed 6673).

A full outer join of a windowed projection and a windowed aggregation on the window and
the key, then ``groupBy(window(window_time(lw)))``: the window over the left side's column
filters out the rows without one, so Spark's optimizer makes the join a left outer join,
and since the right side (an aggregation) is unique on the join keys and nothing above
reads its columns, removes the join and the right side altogether (EliminateOuterJoin).
Spark's engine then reads one source, runs one stateful operator and emits the left rows
without waiting for a match; microbatch ran the join, the right aggregation and the
upper one (``numInputRows`` 9 against Spark's 4 in the first batch). microbatch does not
plan that shape: it refuses it when the query starts, naming the rule and what to write.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from microbatch import StreamingSession
from microbatch.errors import UnsupportedOperationError
from microbatch.testing import fuzz


@pytest.mark.timeout(600)
def test_seed_6673_a_join_spark_removes_is_refused_not_run(spark):
    result = fuzz.run_case(spark, fuzz.generate(6673))
    assert result.status == "microbatch-refuses", result.report()
    assert "EliminateOuterJoin" in result.detail


def test_the_join_is_planned_when_a_column_of_its_other_side_is_read(spark, tmp_path):
    ss = StreamingSession(spark)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    left = ss.readStream.schema(fuzz.SCHEMA1).json(str(tmp_path / "a")).withWatermark("ts", "5 seconds")
    left = left.select(F.window("ts", "10 seconds").alias("lw"), "k", "v")
    right = ss.readStream.schema(fuzz.SCHEMA2).json(str(tmp_path / "b")).withWatermark("ts2", "10 seconds")
    right = right.groupBy(F.window("ts2", "10 seconds").alias("rw"), "k2").agg(F.sum("v2").alias("sv2"))
    joined = left.join(right, [left.lw == right.rw, left.k == right.k2], "left_outer")

    def start(df, name):
        return (df.writeStream.foreachBatch(lambda batch, batch_id: None)
                .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())

    with pytest.raises(UnsupportedOperationError, match="EliminateOuterJoin"):
        start(joined.select("lw", "k", "v"), "removed")
    assert not (tmp_path / "removed" / "offsets").exists()
    query = start(joined.select("lw", "k", "sv2"), "kept")
    query.awaitTermination(120)
    assert query.exception() is None


def test_a_join_of_nested_fields_spark_narrows_is_planned(spark, tmp_path):
    """Nexmark's q3, q5 and q8 shape: both sides read fields of a struct column of parquet
    files. Spark's optimizer narrows each read to the fields it uses (nested schema
    pruning), a copy of the file relation, which is not a relation removed: the join runs,
    batch by batch as on Spark's engine (it was refused as a removed join)."""
    import os
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers import collect_batches, sorted_rows

    events = tmp_path / "events"
    events.mkdir()
    base = time.time() - 10_000
    batches = [[(1, 7, "a", 10), (2, 7, "b", 11), (2, 8, "c", 12)],
               [(1, 8, "d", 13), (2, 8, "e", 14), (2, 7, "f", 40)],
               [(1, 9, "g", 70), (2, 9, "h", 71)]]
    event_type = pa.struct([("key", pa.int64()), ("text", pa.string()), ("extra", pa.string())])
    for i, rows in enumerate(batches):
        table = pa.table({"kind": pa.array([r[0] for r in rows], pa.int32()),
                          "event": pa.array([{"key": r[1], "text": r[2], "extra": "x" * 5} for r in rows],
                                            event_type),
                          "ts": pa.array([r[3] * 1_000_000 for r in rows], pa.timestamp("us"))})
        path = events / f"f{i}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + i, base + i))
    schema = "kind INT, event STRUCT<key: BIGINT, text: STRING, extra: STRING>, ts TIMESTAMP"

    def query(session):
        def side(kind, *fields):
            return (session.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(events))
                    .where(F.col("kind") == kind)
                    .select(*[F.col(f"event.{f}").alias(f"{f}{kind}") for f in fields], F.col("ts").alias(f"ts{kind}"))
                    .withWatermark(f"ts{kind}", "5 seconds"))
        left, right = side(1, "key"), side(2, "key", "text")
        return left.join(right, (F.col("key1") == F.col("key2"))
                         & F.col("ts2").between(F.col("ts1"), F.col("ts1") + F.expr("INTERVAL 30 SECONDS")))

    ours, ours_progress = collect_batches(query(StreamingSession(spark)), tmp_path / "mb", rows=sorted_rows)
    theirs, theirs_progress = collect_batches(query(spark), tmp_path / "spark", rows=sorted_rows)
    assert ours == theirs
    assert [r for _, rows in ours for r in rows], "the join matched nothing: the test checks nothing"
    assert ([p.stateOperators[0].numRowsTotal for p in ours_progress]
            == [p.stateOperators[0].numRowsTotal for p in theirs_progress])
