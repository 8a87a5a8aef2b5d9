"""Named sources (``DataStreamReader.name``, Spark 4.2+) and source evolution, side by side
with Spark's own engine: the same checkpoint layout (offsets v2 keyed by name,
``sources/<name>``), the same offsets when a source is added and one removed across
restarts, and the same errors."""
from __future__ import annotations

import json
import os

import pytest
from pyspark.errors import AnalysisException, PySparkTypeError, PySparkValueError, StreamingQueryException

from file_inputs import write_json_files
from helpers import confs

EVOLUTION = "spark.sql.streaming.queryEvolution.enableSourceEvolution"


@pytest.fixture
def evolution(spark):
    with confs(spark, {EVOLUTION: "true"}):
        yield


def named(session, name, src):
    return (session.readStream.format("json").schema("id INT, name STRING")
            .option("maxFilesPerTrigger", 1).name(name).load(src))


def run(frame, ckpt):
    query = (frame.writeStream.format("noop").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def offsets(ckpt) -> list[tuple[str, list[str]]]:
    """Per batch: the version line, the metadata's fields and the source lines of
    ``offsets/N`` (Spark writes version 2's lines in the order of a hash map: sorted)."""
    found = []
    for batch in sorted((b for b in os.listdir(ckpt / "offsets") if b.isdigit()), key=int):
        lines = (ckpt / "offsets" / batch).read_text().split("\n")
        metadata = json.loads(lines[1])
        found.append((lines[0], sorted(metadata), sorted(lines[2:])))
    return found


def layout(ckpt) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), ckpt / "sources")
                  for d, _, files in os.walk(ckpt / "sources") for f in files if not f.endswith(".crc")
                  and not f.startswith("."))


def test_sources_evolve_by_name_across_restarts(spark, ss, tmp_path, evolution):
    progress = {}
    for engine, session in (("spark", spark), ("microbatch", ss)):
        inputs = {}
        for name, count in (("alpha", 3), ("beta", 2), ("gamma", 2)):
            inputs[name] = str(tmp_path / engine / "in" / name)
            write_json_files(inputs[name], 0, count)
        ckpt = tmp_path / engine / "ckpt"
        first = run(named(session, "alpha", inputs["alpha"]).union(named(session, "beta", inputs["beta"])), ckpt)
        write_json_files(inputs["alpha"], 3, 1)
        # restart: gamma added (read from its beginning), beta removed, alpha keeps its offsets
        second = run(named(session, "gamma", inputs["gamma"]).union(named(session, "alpha", inputs["alpha"])), ckpt)
        progress[engine] = [[(s.description.split("[")[0], s.startOffset, s.endOffset, s.numInputRows)
                             for s in p.sources] for p in first.recentProgress + second.recentProgress]
    theirs, ours = tmp_path / "spark" / "ckpt", tmp_path / "microbatch" / "ckpt"
    assert offsets(ours) == offsets(theirs)
    assert offsets(ours)[0][0] == "v2" and offsets(ours)[0][2] == ['alpha:{"logOffset":0}', 'beta:{"logOffset":0}']
    assert offsets(ours)[-1][2] == ['alpha:{"logOffset":3}', 'gamma:{"logOffset":1}']
    assert "sourceMetadataInfo" in offsets(ours)[0][1]
    assert layout(ours) == layout(theirs) and "gamma/0" in layout(ours) and "alpha/3" in layout(ours)
    assert progress["microbatch"] == progress["spark"]


def test_naming_errors_as_spark(spark, ss, tmp_path):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 1)
    for session in (spark, ss):
        with pytest.raises(PySparkTypeError) as raised:
            session.readStream.name(3)
        assert raised.value.getCondition() == "NOT_EXPECTED_TYPE"
        with pytest.raises(PySparkValueError) as raised:
            session.readStream.name("my-source")
        assert raised.value.getCondition() == "INVALID_STREAMING_SOURCE_NAME"
        with pytest.raises(AnalysisException) as raised:   # naming needs source evolution
            named(session, "alpha", src)
        assert raised.value.getCondition() == "STREAMING_QUERY_EVOLUTION_ERROR.SOURCE_NAMING_NOT_SUPPORTED"
    with confs(spark, {EVOLUTION: "true"}):
        for session in (spark, ss):
            with pytest.raises(AnalysisException) as raised:   # ... and then every source named
                session.readStream.format("json").schema("id INT").load(src)
            assert (raised.value.getCondition()
                    == "STREAMING_QUERY_EVOLUTION_ERROR.UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT")
            with pytest.raises(AnalysisException) as raised:
                named(session, "twin", src).union(named(session, "twin", src)).writeStream.format("noop").start()
            assert raised.value.getCondition() == "STREAMING_QUERY_EVOLUTION_ERROR.DUPLICATE_SOURCE_NAMES"
            assert "'twin'" in str(raised.value)


def test_evolution_cannot_start_on_a_positional_checkpoint(spark, ss, tmp_path):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 1)
    for engine, session in (("spark", spark), ("microbatch", ss)):
        ckpt = tmp_path / engine
        run(session.readStream.format("json").schema("id INT, name STRING").load(src), ckpt)
        assert offsets(ckpt)[0][0] == "v1"
        with confs(spark, {EVOLUTION: "true"}):
            query = (named(session, "files", src).writeStream.format("noop")
                     .option("checkpointLocation", str(ckpt)).start())
            with pytest.raises(StreamingQueryException) as raised:
                query.awaitTermination(60)
        assert ("[STREAMING_QUERY_EVOLUTION_ERROR.CANNOT_ENABLE_ON_EXISTING_CHECKPOINT]"
                in raised.value.getMessageParameters()["message"]), engine


def test_unnamed_sources_keep_the_positional_layout(ss, tmp_path):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 2)
    ckpt = tmp_path / "ckpt"
    run(ss.readStream.format("json").schema("id INT, name STRING").load(src), ckpt)
    assert offsets(ckpt) == [("v1", ["batchTimestampMs", "batchWatermarkMs", "conf"], ['{"logOffset":0}'])]
    assert layout(ckpt) == ["0/0"]
