"""Options Spark's engine takes that microbatch must not drop silently (issue 59):
``asyncProgressTrackingEnabled`` and ``asyncProgressTrackingCheckpointIntervalMs``.
microbatch does not track progress asynchronously: where Spark's engine refuses the option
(its sink, its trigger, a stateful query, a value that is not a number) microbatch refuses it
with Spark's exception and words, and where Spark would run it, with its own error naming the
option. Each refusal is Spark's engine's, reproduced."""
from __future__ import annotations

import json

import pytest
from pyspark.errors import IllegalArgumentException

from microbatch.errors import UnsupportedOperationError

ASYNC = "asyncProgressTrackingEnabled"


@pytest.fixture
def files(tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / "0.json").write_text(json.dumps({"k": "a", "v": 1}) + "\n")
    return directory


def stream(session, files, stateful=False):
    frame = session.readStream.schema("k STRING, v INT").json(str(files))
    return frame.groupBy("k").count() if stateful else frame


def writer(session, files, tmp_path, sink, options, stateful=False, trigger=None):
    w = stream(session, files, stateful).writeStream.option("checkpointLocation", str(tmp_path / f"ck-{id(session)}"))
    if stateful:
        w = w.outputMode("update")
    if sink == "foreachBatch":
        w = w.foreachBatch(lambda df, batch_id: None)
    else:
        w = w.format(sink)
        if sink == "memory":
            w = w.queryName(f"async_{abs(hash((id(session), str(tmp_path))))}")
        if sink == "parquet":
            w = w.option("path", str(tmp_path / "out"))
    for key, value in options.items():
        w = w.option(key, value)
    return w.trigger(**(trigger or {"processingTime": "1 second"}))


#: (sink, options, trigger): what Spark's engine refuses when the query starts
REFUSED_AT_START = {
    "foreachBatch is not a sink it allows": ("foreachBatch", {ASYNC: "true"}, None),
    "a file sink is not one it allows": ("parquet", {ASYNC: "true"}, None),
    "not with availableNow": ("memory", {ASYNC: "true"}, {"availableNow": True}),
    "not with once": ("console", {ASYNC: "TRUE"}, {"once": True}),
    "an interval that is not a number": ("memory", {ASYNC: "true", "asyncProgressTrackingCheckpointIntervalMs": "1s"},
                                         None),
    "an enabling that is not a boolean": ("memory", {ASYNC: "yes"}, None),
}


@pytest.mark.parametrize("case", list(REFUSED_AT_START))
def test_what_spark_refuses_at_start_microbatch_refuses_with_sparks_error(spark, ss, files, tmp_path, case):
    sink, options, trigger = REFUSED_AT_START[case]
    with pytest.raises(IllegalArgumentException) as theirs:
        writer(spark, files, tmp_path, sink, options, trigger=trigger).start().stop()
    with pytest.raises(IllegalArgumentException) as ours:
        writer(ss, files, tmp_path, sink, options, trigger=trigger).start().stop()
    expected = str(theirs.value)
    if sink == "parquet":   # Spark names the file sink by its qualified path
        expected = expected.replace("file:", "")
    assert str(ours.value).split("\n")[0] == expected.split("\n")[0], (str(ours.value), expected)


def test_a_stateful_query_is_refused_as_spark_refuses_it(spark, ss, files, tmp_path):
    query = writer(spark, files, tmp_path, "memory", {ASYNC: "true"}, stateful=True).start()
    try:
        query.awaitTermination(60)
    except Exception as e:   # noqa: BLE001 - Spark's engine fails the query in its first batch
        theirs = str(e)
    else:
        pytest.fail("Spark's engine ran a stateful query with async progress tracking")
    finally:
        query.stop()
    assert "Stateful streaming queries does not support async progress tracking at this moment." in theirs
    with pytest.raises(IllegalArgumentException, match="Stateful streaming queries does not support async progress "
                                                       "tracking at this moment."):
        writer(ss, files, tmp_path, "memory", {ASYNC: "true"}, stateful=True).start()


def test_what_spark_would_run_is_refused_by_name_not_ignored(spark, ss, files, tmp_path):
    query = writer(spark, files, tmp_path, "noop", {ASYNC: "true"}).start()   # Spark's engine runs it
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    with pytest.raises(UnsupportedOperationError, match="'asyncProgressTrackingEnabled'"):
        writer(ss, files, tmp_path, "noop", {ASYNC: "true"}).start()


def test_the_options_in_another_case_are_not_sparks_and_not_read(spark, ss, files, tmp_path):
    """Spark's engine reads these two options by their exact names."""
    options = {"asyncprogresstrackingenabled": "true"}
    for session in (spark, ss):
        query = writer(session, files, tmp_path, "console", options, trigger={"once": True}).start()
        try:
            query.awaitTermination(60)
            assert query.exception() is None
        finally:
            query.stop()


def test_the_option_off_runs_as_without_it(ss, files, tmp_path):
    query = writer(ss, files, tmp_path, "noop", {ASYNC: "false",
                                                 "asyncProgressTrackingCheckpointIntervalMs": "not read"}).start()
    try:
        query.processAllAvailable()
        assert query.exception() is None and query.lastProgress["numInputRows"] == 1
    finally:
        query.stop()

