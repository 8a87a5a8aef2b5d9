"""``static_df.join(stream, on, how)``: a static DataFrame on the left of a stream, written
with PySpark's own ``DataFrame.join``, on microbatch next to Spark's engine, batch by batch
(rows and progress); the join types Spark's engine refuses for that side are refused with
its words, where the query is defined."""
from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from helpers import collect_batches, json_stream
from stream_events import comparable


def _static(spark):
    return spark.createDataFrame([(1, "one"), (2, "two"), (3, "three"), (9, "nine")], "id INT, name STRING")


CASES = {
    "inner, on a name": lambda static, stream: static.join(stream, "id"),
    "inner, on a column pair": lambda static, stream: static.join(stream, static["id"] == stream["id"]).drop(static["id"]),
    "right outer": lambda static, stream: static.join(stream, "id", "right_outer"),
    "inner, then a filter and a projection": lambda static, stream: static.join(stream, ["id"], "inner")
    .where(F.col("name") != "two").select("name", "ts"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_static_frame_joins_a_stream_on_its_right_as_in_sparks_engine(spark, ss, events, tmp_path, case):
    def run(session, ckpt):
        stream = json_stream(session, events, "id INT, ts TIMESTAMP")
        return collect_batches(CASES[case](_static(spark), stream), ckpt, "append")

    theirs, their_progress = run(spark, tmp_path / "spark")
    ours, our_progress = run(ss, tmp_path / "microbatch")
    assert ours == theirs
    assert sum(len(rows) for _, rows in ours) > 0
    assert comparable(our_progress) == comparable(their_progress)


@pytest.mark.parametrize("how", ["left_outer", "full_outer", "left_semi", "left_anti"])
def test_a_join_type_spark_refuses_for_a_static_left_side_is_refused_alike(spark, ss, events, tmp_path, how):
    def refusal(session, ckpt):
        stream = json_stream(session, events, "id INT, ts TIMESTAMP")
        with pytest.raises(AnalysisException) as raised:
            joined = _static(spark).join(stream, "id", how)
            collect_batches(joined, ckpt, "append")
        return str(raised.value)

    theirs = refusal(spark, tmp_path / "spark").split(";")[0]
    ours = refusal(ss, tmp_path / "microbatch")
    assert "streaming DataFrame" in theirs and "on the right" in theirs
    assert ours == theirs


def test_a_static_frame_still_joins_a_static_frame(spark, ss):
    """PySpark's join, wrapped for streams, is unchanged for two static DataFrames."""
    other = spark.createDataFrame([(1, 10), (3, 30)], "id INT, v INT")
    assert sorted(map(tuple, _static(spark).join(other, "id").collect())) == [(1, "one", 10), (3, "three", 30)]
