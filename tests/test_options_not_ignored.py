"""Options Spark's engine takes that microbatch must not drop silently (issue 59):
``asyncProgressTrackingEnabled`` and ``asyncProgressTrackingCheckpointIntervalMs``.
microbatch does not track progress asynchronously: where Spark's engine refuses the option
(its sink, its trigger, a stateful query, a value that is not a number) microbatch refuses it
with Spark's exception and words, and where Spark would run it, with its own error naming the
option. Each refusal is Spark's engine's, reproduced. Then a walk of the options and confs
Spark documents for streaming: each must be honoured or refused by name."""
from __future__ import annotations

import functools
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


# -- Spark's documented streaming options and confs: each honoured or refused -------------------------
# A static guard: an option or conf microbatch neither reads nor refuses appears nowhere in its code.
# Each name below is found in microbatch's source (read where it applies, or refused by name), or is
# listed in OPEN: documented by Spark, silently without effect in microbatch today; each fails
# (strict xfail) until it is honoured or refused, and then must leave the list.

#: sources' and sinks' options from Spark 4.3's docs: structured-streaming-programming-guide.md
#: ("Input Sources", "Output Sinks"), structured-streaming-kafka-integration.md, DataStreamWriter
DOCUMENTED_OPTIONS = {
    "file source": ["path", "maxFilesPerTrigger", "maxBytesPerTrigger", "latestFirst", "fileNameOnly",
                    "maxFileAge", "maxCachedFiles", "discardCachedInputRatio", "cleanSource", "sourceArchiveDir"],
    "socket source": ["host", "port", "includeTimestamp"],
    "rate source": ["rowsPerSecond", "rampUpTime", "numPartitions"],
    "rate-micro-batch source": ["rowsPerBatch", "numPartitions", "startTimestamp", "advanceMillisPerBatch"],
    "kafka source": ["assign", "subscribe", "subscribePattern", "kafka.bootstrap.servers", "startingTimestamp",
                     "startingOffsetsByTimestamp", "startingOffsets", "endingTimestamp", "endingOffsetsByTimestamp",
                     "endingOffsets", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
                     "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
                     "minPartitions", "maxRecordsPerPartition", "groupIdPrefix", "kafka.group.id", "includeHeaders",
                     "startingOffsetsByTimestampStrategy"],
    "kafka sink": ["topic", "includeHeaders"],
    "file sink": ["path", "retention"],
    "console sink": ["numRows", "truncate"],
    "writeStream": ["checkpointLocation", "asyncProgressTrackingEnabled", "asyncProgressTrackingCheckpointIntervalMs"],
}

#: the state store's confs the programming guide documents ("RocksDB State Store Implementation")
#: beside SQLConf's (which ``SET -v`` lists, as Spark's configuration page does)
ROCKSDB = "spark.sql.streaming.stateStore.rocksdb."
DOCUMENTED_ROCKSDB_CONFS = [ROCKSDB + name for name in (
    "compactOnCommit", "changelogCheckpointing.enabled", "blockSizeKB", "blockCacheSizeMB", "lockAcquireTimeoutMs",
    "maxOpenFiles", "resetStatsOnLoad", "trackTotalNumberOfRows", "writeBufferSizeMB", "maxWriteBufferNumber",
    "boundedMemoryUsage", "maxMemoryUsageMB", "writeBufferCacheRatio", "highPriorityPoolRatio", "allowFAllocate",
    "compression")]

#: documented, and neither honoured nor refused by microbatch yet (issue 59)
OPEN: set[str] = set()


def _code_only(source: str) -> str:
    """``source`` without its comments and its docstrings (any statement that is a string
    alone): a name only mentioned there is neither read nor refused."""
    import ast
    import io
    import tokenize
    prose = {(node.value.lineno, node.value.col_offset) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    kept = [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type != tokenize.COMMENT and not (t.type == tokenize.STRING and t.start in prose)]
    return tokenize.untokenize(kept)


@functools.lru_cache(maxsize=1)
def _source_text() -> str:
    import pathlib

    import microbatch
    root = pathlib.Path(microbatch.__file__).parent
    return "\n".join(_code_only(p.read_text()) for p in sorted(root.rglob("*.py")))


def test_a_name_in_a_comment_or_a_docstring_is_not_honoured():
    source = '''"""Reads "maxFilesPerTrigger"."""
def f(options):
    """And "latestFirst"."""
    return options.get("fileNameOnly")  # and "maxFileAge"
'''
    text = _code_only(source)
    assert _read_or_refused("fileNameOnly", text)
    assert not any(_read_or_refused(name, text) for name in ("maxFilesPerTrigger", "latestFirst", "maxFileAge"))


def _read_or_refused(name: str, text: str) -> bool:
    """Whether microbatch's code names ``name``: an option quoted (in any case, as options
    compare), a conf in full or, for a family of confs read by a prefix kept in a constant,
    as an f-string's ``{PREFIX}.last`` in a module that has the prefix."""
    import re
    if "." not in name or not name.startswith("spark."):
        return re.search(rf"[\"'`]{re.escape(name)}[\"'`]", text, re.IGNORECASE) is not None
    if name in text:
        return True
    prefix, _, last = name.rpartition(".")
    while prefix.count(".") > 3 and prefix not in text:   # (a name built from a shorter prefix)
        prefix, _, more = prefix.rpartition(".")
        last = f"{more}.{last}"
    return prefix in text and re.search(rf"\}}\.{re.escape(last)}[\"']", text) is not None


def _documented_params():
    params = []
    for where, names in DOCUMENTED_OPTIONS.items():
        for name in names:
            params.append(pytest.param(name, id=f"{where}: {name}", marks=[pytest.mark.xfail(
                strict=True, reason="documented by Spark, neither honoured nor refused yet")] if name in OPEN else []))
    for name in DOCUMENTED_ROCKSDB_CONFS:
        params.append(pytest.param(name, id=name, marks=[pytest.mark.xfail(
            strict=True, reason="documented by Spark, neither honoured nor refused yet")] if name in OPEN else []))
    return params


@pytest.mark.parametrize("name", _documented_params())
def test_a_documented_option_is_honoured_or_refused(name):
    assert _read_or_refused(name, _source_text()), f"{name}: documented by Spark, unknown to microbatch"


#: SQLConf's documented streaming confs (``SET -v``: what Spark's configuration page lists)
#: of a mode microbatch refuses as a whole, so they have nothing to configure
REFUSED_WITH_THEIR_MODE = {
    "spark.sql.streaming.continuous.epochBacklogQueueSize": "trigger(continuous=...) is refused",
}
#: SQLConf's documented streaming confs microbatch honours by running through Spark's own
#: machinery, not by reading them: the test (file, function) that shows each honoured, which
#: must name it
HONOURED_BY_SPARK = {
    "spark.sql.streaming.validateEventTimeWatermarkColumn":
        ("test_confs_honoured.py", "test_a_nested_event_time_is_checked_as_sparks_analysis_checks_it"),
    # (microbatch's events are on Spark's listener bus: Spark makes these listeners and the UI tab)
    "spark.sql.streaming.streamingQueryListeners": ("spark_ui_child.py", "main"),
    "spark.sql.streaming.ui.enabled": ("spark_ui_child.py", "main"),
}
#: documented, and neither honoured nor refused by microbatch yet (issue 59)
OPEN_CONFS = {
    "spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition",
    "spark.sql.streaming.stateStore.commitValidation.enabled",
    "spark.sql.streaming.stateStore.stateSchemaCheck",
}


def _function_source(module: str, function: str) -> str:
    """The code of ``function`` in the tests' ``module`` (comments and docstrings left out)."""
    import ast
    import pathlib
    source = (pathlib.Path(__file__).parent / module).read_text()
    found = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == function]
    assert found, f"{module} has no function {function}"
    return _code_only(ast.get_source_segment(source, found[0]))


def test_every_documented_streaming_conf_is_honoured_or_refused(spark):
    documented = {r.key for r in spark.sql("SET -v").collect()
                  if r.key.startswith(("spark.sql.streaming.", "spark.sql.adaptive.streaming."))}
    text = _source_text()
    for name, (module, function) in HONOURED_BY_SPARK.items():
        assert name in _function_source(module, function), f"{module}::{function} does not set {name}"
    unknown = {name for name in documented if not _read_or_refused(name, text)} - set(REFUSED_WITH_THEIR_MODE) \
        - set(HONOURED_BY_SPARK)
    assert unknown - OPEN_CONFS == set(), f"documented by Spark, unknown to microbatch: {sorted(unknown - OPEN_CONFS)}"
    assert OPEN_CONFS - unknown == set(), "honoured or refused now: take them off OPEN_CONFS"
