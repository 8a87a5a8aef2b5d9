"""Argument checks of DataStreamReader, DataStreamWriter, StreamingQuery and
StreamingQueryManager, method by method, side by side with PySpark 4.3 on Spark's own
engine: the same exception class and the same error class for the same call."""
from __future__ import annotations

import warnings

import pytest
from pyspark.errors import (AnalysisException, IllegalArgumentException, ParseException,
                            PySparkAttributeError, PySparkException, PySparkTypeError,
                            PySparkValueError, StreamingQueryException)


class NoProcess:
    pass


class ProcessNotCallable:
    process = 5


class OpenNotCallable:
    def process(self, row):
        pass

    open = 5


def reader(session):
    return session.readStream


def stream(session):
    return session.readStream.format("rate").load()


def writer(session):
    return stream(session).writeStream


def noop_query(session):
    return writer(session).format("noop").start()


CASES = {
    # DataStreamReader
    "schema of another type": lambda s, d: reader(s).schema(5),
    "schema DDL that does not parse": lambda s, d: reader(s).schema("a INT,,"),
    "name of another type": lambda s, d: reader(s).name(3),
    "name with a hyphen": lambda s, d: reader(s).name("a-b"),
    "load an empty path": lambda s, d: reader(s).format("json").load(""),
    "load a path of another type": lambda s, d: reader(s).format("json").load(5),
    "json path of another type": lambda s, d: reader(s).json(5),
    "csv path of another type": lambda s, d: reader(s).csv(5),
    "parquet path of another type": lambda s, d: reader(s).parquet(5),
    "text path of another type": lambda s, d: reader(s).text(5),
    "table name of another type": lambda s, d: reader(s).table(5),
    "json without a schema": lambda s, d: reader(s).json(d("empty")),
    "json of a missing directory": lambda s, d: reader(s).schema("a INT").json(d("missing") + "/x"),
    "a None option is ignored": lambda s, d: reader(s).format("rate").option("rowsPerSecond", None).load(),
    # DataStreamWriter
    "outputMode empty": lambda s, d: writer(s).outputMode(""),
    "outputMode None": lambda s, d: writer(s).outputMode(None),
    "outputMode unknown": lambda s, d: writer(s).outputMode("bogus"),
    "queryName empty": lambda s, d: writer(s).queryName(""),
    "queryName of another type": lambda s, d: writer(s).queryName(5),
    "trigger without a kind": lambda s, d: writer(s).trigger(),
    "trigger of two kinds": lambda s, d: writer(s).trigger(processingTime="1 second", once=True),
    "processingTime empty": lambda s, d: writer(s).trigger(processingTime=""),
    "processingTime of another type": lambda s, d: writer(s).trigger(processingTime=5),
    "processingTime that does not parse": lambda s, d: writer(s).trigger(processingTime="abc"),
    "processingTime negative": lambda s, d: writer(s).trigger(processingTime="-1 seconds"),
    "processingTime in months": lambda s, d: writer(s).trigger(processingTime="1 month"),
    "once=False": lambda s, d: writer(s).trigger(once=False),
    "availableNow=False": lambda s, d: writer(s).trigger(availableNow=False),
    "foreach without process": lambda s, d: writer(s).foreach(NoProcess()),
    "foreach process not callable": lambda s, d: writer(s).foreach(ProcessNotCallable()),
    "foreach open not callable": lambda s, d: writer(s).foreach(OpenNotCallable()),
    "foreachBatch takes anything": lambda s, d: writer(s).foreachBatch(5),
    "memory sink without queryName": lambda s, d: writer(s).format("memory").start(),
    "file sink without path": lambda s, d: writer(s).format("parquet").option(
        "checkpointLocation", d("ckpt1")).start(),
    "file sink without checkpoint": lambda s, d: writer(s).format("parquet").start(d("out2")),
    "complete mode without aggregation": lambda s, d: writer(s).format("console").outputMode("complete").start(),
    "update mode into files": lambda s, d: writer(s).format("parquet").outputMode("update").option(
        "checkpointLocation", d("ckpt3")).start(d("out3")),
    "partition column that is not there": lambda s, d: writer(s).format("parquet").partitionBy("nope").option(
        "checkpointLocation", d("ckpt4")).start(d("out4")),
    "two active queries of one name": lambda s, d: [writer(s).format("noop").queryName("dup").start()
                                                     for _ in range(2)],
    "observe without metrics": lambda s, d: stream(s).observe("x"),
    "observe a column that is not aggregated": lambda s, d: stream(s).observe("x", stream(s).value),
    # StreamingQuery and StreamingQueryManager
    "awaitTermination negative": lambda s, d: noop_query(s).awaitTermination(-1),
    "awaitTermination zero": lambda s, d: noop_query(s).awaitTermination(0),
    "awaitTermination of another type": lambda s, d: noop_query(s).awaitTermination("x"),
    "awaitAnyTermination negative": lambda s, d: s.streams.awaitAnyTermination(-1),
}

#: The PySpark classes an error is told apart by, most specific first.
KINDS = (ParseException, AnalysisException, StreamingQueryException, IllegalArgumentException,
         PySparkTypeError, PySparkValueError, PySparkAttributeError, PySparkException)


def outcome(session, case, tmp_path, prefix):
    def directory(name):
        path = tmp_path / f"{prefix}_{name}"
        if name != "missing":
            path.mkdir(exist_ok=True)
        return str(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = case(session, directory)
    except Exception as e:  # noqa: BLE001 - what was raised is the result
        kind = next((k.__name__ for k in KINDS if isinstance(e, k)), type(e).__name__)
        return kind, e.getCondition() if isinstance(e, PySparkException) else None, str(e)
    finally:
        for query in session.streams.active:
            query.stop()
    return "ok", type(result).__name__ if not isinstance(result, list) else "list", ""


@pytest.mark.parametrize("case", list(CASES))
def test_argument_check_as_pyspark(spark, ss, tmp_path, case):
    theirs = outcome(spark, CASES[case], tmp_path, "spark")
    ours = outcome(ss, CASES[case], tmp_path, "microbatch")
    assert ours[:2] == (theirs[:2] if theirs[0] != "ok" else ("ok", ours[1])), (case, theirs, ours)
    if theirs[0] != "ok" and theirs[1] is not None:
        # Spark's own message for its error classes (paths differ between the two runs)
        assert ours[2].split(".")[0].replace("microbatch_", "") == theirs[2].split(".")[0].replace("spark_", ""), \
            (case, theirs[2][:200], ours[2][:200])


def test_foreach_batch_that_cannot_be_called_fails_the_first_batch(ss, tmp_path):
    query = (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
             .writeStream.foreachBatch(5).option("checkpointLocation", str(tmp_path)).start())
    with pytest.raises(StreamingQueryException, match=r"(?s)FOREACH_BATCH_USER_FUNCTION_ERROR.*"
                                                      r"'int' object is not callable"):
        query.awaitTermination(60)


def test_continuous_trigger_is_refused_clearly(ss):
    from microbatch.errors import UnsupportedOperationError
    with pytest.raises(UnsupportedOperationError, match="continuous.*processingTime"):
        writer(ss).trigger(continuous="1 second")
