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
