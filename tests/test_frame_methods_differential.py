"""The stateless DataFrame methods a stream allows, on microbatch next to Spark's own
engine: every batch's rows equal (``na``, ``fillna``, ``dropna``, ``replace``, ``sample``,
``unpivot``/``melt``, ``to``, ``colRegex``, ``hint``, the file source's hidden ``_metadata``
and ``metadataColumn``); ``sample`` refused as Spark refuses it."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from helpers import ci_share, collect_batches, json_stream, sorted_rows
from stream_events import write_event_files

SCHEMA = "id INT, name STRING, v DOUBLE, w DOUBLE"
EVENTS = [
    [(1, "a", 1.0, None), (2, None, None, 2.0), (None, "c", 3.0, 4.0)],
    [(4, "d", None, None), (5, "e", 5.5, 6.5), (6, None, 7.0, None)],
    [(7, "a", 8.0, 9.0), (None, None, None, None)],
]

CASES = {
    "na.fill": lambda f: f.na.fill({"name": "?", "v": 0.0}),
    "fillna": lambda f: f.fillna(-1.0, subset=["v", "w"]),
    "na.drop": lambda f: f.na.drop(how="any", subset=["name"]),
    "dropna with a threshold": lambda f: f.dropna(thresh=3),
    "na.replace": lambda f: f.na.replace(["a", "e"], ["A", "E"], "name"),
    "replace": lambda f: f.replace(1.0, 10.0, subset=["v"]),
    "unpivot": lambda f: f.unpivot("id", ["v", "w"], "column", "value"),
    "melt": lambda f: f.melt(["id", "name"], ["v"], "column", "value"),
    "to a schema": lambda f: f.to(StructType([StructField("w", DoubleType()), StructField("id", LongType()),
                                              StructField("name", StringType())])),
    "colRegex": lambda f: f.select(f.colRegex("`(id|v)`")),
    "hint": lambda f: f.hint("broadcast").select("id", F.upper("name").alias("n")),
    "_metadata": lambda f: f.select("id", "_metadata"),
    "_metadata's fields": lambda f: f.where("id > 1").select("_metadata.file_path", "_metadata.file_name", "id"),
    "metadataColumn": lambda f: f.select(f.metadataColumn("_metadata").getField("file_name"), "name"),
    "_metadata after withColumn": lambda f: f.withColumn("t", F.timestamp_seconds("id")).select(
        "t", F.col("_metadata.file_modification_time").alias("m")),
}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, lambda i, n, v, w: {"id": i, "name": n, "v": v, "w": w})


@pytest.mark.parametrize("case", ci_share(list(CASES)))   # half in CI's run (helpers.ci_share)
def test_a_stateless_method_matches_spark(spark, ss, events, tmp_path, case):
    transform = CASES[case]
    rows = lambda df: (df.columns, sorted_rows(df))  # noqa: E731
    theirs, _ = collect_batches(transform(json_stream(spark, events, SCHEMA)), tmp_path / "spark", rows=rows)
    ours, _ = collect_batches(transform(json_stream(ss, events, SCHEMA)), tmp_path / "microbatch", rows=rows)
    assert ours == theirs and any(r for _, (_, r) in ours)


def test_sampling_a_stream_is_refused_as_spark_refuses_it(spark, ss, events, tmp_path):
    from pyspark.errors import AnalysisException
    with pytest.raises(AnalysisException, match="Sampling is not supported on streaming DataFrames/Datasets"):
        collect_batches(json_stream(spark, events, SCHEMA).sample(fraction=0.5, seed=7), tmp_path / "spark")
    with pytest.raises(AnalysisException, match="Sampling is not supported on streaming DataFrames/Datasets"):
        json_stream(ss, events, SCHEMA).sample(fraction=0.5, seed=7)


def test_a_hidden_column_a_source_does_not_have_gets_sparks_error(spark, ss):
    from pyspark.errors import AnalysisException
    errors = []
    for session in (spark, ss):
        with pytest.raises(AnalysisException) as caught:
            session.readStream.format("rate").load().metadataColumn("_metadata")
        errors.append(caught.value.getCondition())
    assert errors[0] == errors[1] and errors[0]


def test_a_window_function_on_a_stream_is_refused_as_spark_refuses_it(spark, ss, events, tmp_path):
    from pyspark.sql import Window
    said = []
    for session, ckpt in ((spark, tmp_path / "spark"), (ss, tmp_path / "microbatch")):
        try:
            frame = json_stream(session, events, SCHEMA).withColumn(
                "r", F.row_number().over(Window.partitionBy("name").orderBy("id")))
            collect_batches(frame, ckpt)
        except Exception as e:  # noqa: BLE001 - the refusal is what is compared
            said.append(str(e))
    assert len(said) == 2 and all("[NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING] Window function is not supported "
                                  "in ROW_NUMBER() (as column `r`)" in s for s in said), said
