"""Bad input: a clear error naming the problem and the fix, and nothing lost."""
from __future__ import annotations

import os

import pytest
from pyspark.errors import AnalysisException as PySparkAnalysisException

from pyspark.errors import (AnalysisException, IllegalArgumentException, PySparkValueError,
                            StreamingQueryException)

from microbatch import MemoryStream, UnsupportedOperationError
from microbatch.checkpoint.fs import LOCAL


def rate(ss, **options):
    reader = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 5)
    return reader.options(**options).load()


def test_unknown_format(ss):
    with pytest.raises(AnalysisException, match="DATA_SOURCE_NOT_FOUND.*nosuch"):
        ss.readStream.format("nosuch").load()
    with pytest.raises(AnalysisException, match="DATA_SOURCE_NOT_FOUND.*nosink"):
        rate(ss).writeStream.format("nosink").start()


@pytest.mark.parametrize("options, message", [
    ({"rowsPerBatch": "0"}, "'rowsPerBatch' must be positive"),
    ({"rowsPerBatch": "ten"}, "expected an integer"),
    ({"numPartitions": "-1"}, "'numPartitions' must be positive"),
    ({"advanceMillisPerBatch": "-5"}, "'advanceMillisPerBatch' must be non-negative"),
])
def test_invalid_source_options(ss, options, message):
    with pytest.raises(IllegalArgumentException, match=message):
        rate(ss, **options)
    with pytest.raises(ValueError):  # also a ValueError, for plain Python callers
        rate(ss, **options)


def test_rate_rejects_a_schema(ss):
    with pytest.raises(AnalysisException, match="does not support a user-specified schema"):
        ss.readStream.format("rate").schema("a INT").load()


def test_definition_errors_come_where_the_step_is_written(ss):
    frame = rate(ss)
    with pytest.raises(PySparkAnalysisException):  # Spark's own analysis error
        frame.select("no_such_column")
    with pytest.raises(PySparkAnalysisException):  # an unknown grouping column too
        frame.groupBy("no_such_column")
    with pytest.raises(PySparkAnalysisException):  # an unknown dedup key fails where it is written
        frame.dropDuplicates(["no_such_column"])
    with pytest.raises(AnalysisException, match="dropDuplicatesWithinWatermark is not supported .* without watermark"):
        frame.dropDuplicatesWithinWatermark(["value"]).writeStream.format("noop").start()   # at start, as Spark
    with pytest.raises(AnalysisException, match="LeftAnti joins with a streaming DataFrame/Dataset on the right"):
        frame.join(rate(ss), "value", "left_anti").writeStream.format("noop").start()   # at start, as Spark
    with pytest.raises(AnalysisException, match="must be executed with writeStream.start"):
        frame.count()
    with pytest.raises(AnalysisException, match="Union between streaming and batch"):
        frame.union(ss.spark.range(3))
    with pytest.raises(AnalysisException, match="RightOuter join with a streaming DataFrame"):   # at start, as Spark
        frame.join(ss.spark.range(3).withColumnRenamed("id", "value"), "value", "right").writeStream.format("noop").start()
    with pytest.raises(IllegalArgumentException, match="delay threshold"):
        frame.withWatermark("timestamp", "ten minutes")
    with pytest.raises(AnalysisException, match="Sorting is not supported"):
        frame.orderBy("value")


def test_output_mode_and_trigger_errors(ss):
    with pytest.raises(IllegalArgumentException, match=r"STREAMING_OUTPUT_MODE.INVALID\] Invalid streaming "
                                                       "output mode: bogus"):
        rate(ss).writeStream.outputMode("bogus")
    with pytest.raises(AnalysisException, match=r"STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION.*complete.*"
                                                "no streaming aggregations"):
        rate(ss).writeStream.format("console").outputMode("complete").start()
    with pytest.raises(PySparkValueError, match="ONLY_ALLOW_SINGLE_TRIGGER"):
        rate(ss).writeStream.trigger(once=True, availableNow=True)
    with pytest.raises(UnsupportedOperationError, match="continuous"):
        rate(ss).writeStream.trigger(continuous="1 second")
    with pytest.raises(IllegalArgumentException, match="INVALID_INTERVAL_FORMAT.*'often'"):
        rate(ss).writeStream.trigger(processingTime="often")


def test_checkpoint_location_rules(ss, tmp_path):
    with pytest.raises(AnalysisException, match="checkpointLocation must be specified"):
        _start_without_checkpoint(rate(ss))
    # console, memory, foreachBatch may run without one, on a temporary checkpoint deleted on stop
    ms = MemoryStream(ss, "v INT")
    query = ms.toDF().writeStream.foreachBatch(lambda df, i: None).start()
    location = query.checkpointLocation
    ms.add_data([1])
    query.processAllAvailable()
    assert os.path.exists(os.path.join(location, "commits", "0"))
    query.stop()
    assert not os.path.exists(location)
    with pytest.raises(AnalysisException, match="queryName must be specified for memory sink"):
        rate(ss).writeStream.format("memory").start()


def _start_without_checkpoint(frame):
    from microbatch.connectors import register_sink
    from microbatch.sinks.noop import NoopSinkProvider

    class StrictNoop(NoopSinkProvider):
        short_name = "strict-noop"
        allows_temporary_checkpoint = False

    register_sink(StrictNoop())
    return frame.writeStream.format("strict-noop").start()


def test_two_active_queries_cannot_share_a_name_and_a_restart_stops_the_active_run(ss, tmp_path):
    first = rate(ss).writeStream.format("noop").queryName("dup").trigger(processingTime="1 hour") \
        .option("checkpointLocation", str(tmp_path / "a")).start()
    with pytest.raises(IllegalArgumentException, match="name dup as a query with that name is already active"):
        rate(ss).writeStream.format("noop").queryName("dup") \
            .option("checkpointLocation", str(tmp_path / "b")).start()
    assert first.isActive
    # the same query (its checkpoint) again: Spark's engine stops the active run and starts
    # the new one (spark.sql.streaming.stopActiveRunOnRestart, true by default; false refuses:
    # tests/test_confs_honoured.py)
    second = rate(ss).writeStream.format("noop").option("checkpointLocation", str(tmp_path / "a")).start()
    assert not first.isActive and second.isActive and second.id == first.id
    second.stop()


def test_checkpoint_of_another_query_is_refused_and_kept(ss, tmp_path):
    checkpoint = str(tmp_path)
    rate(ss).writeStream.format("noop").option("checkpointLocation", checkpoint) \
        .trigger(once=True).start().awaitTermination()
    before = {name: open(os.path.join(checkpoint, "offsets", name)).read()
              for name in os.listdir(os.path.join(checkpoint, "offsets"))}
    two_sources = rate(ss).union(rate(ss))
    query = two_sources.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    with pytest.raises(StreamingQueryException,
                       match=r"There are \[1\] sources in the checkpoint offsets and now there are \[2\]"):
        query.awaitTermination(60)
    after = {name: open(os.path.join(checkpoint, "offsets", name)).read()
             for name in os.listdir(os.path.join(checkpoint, "offsets"))}
    assert after == before


def test_unreadable_offsets_file_fails_with_its_name(ss, tmp_path):
    checkpoint = str(tmp_path)
    rate(ss).writeStream.format("noop").option("checkpointLocation", checkpoint) \
        .trigger(once=True).start().awaitTermination()
    with open(os.path.join(checkpoint, "offsets", "0"), "w") as f:
        f.write("v1\n{broken")
    query = rate(ss).writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    with pytest.raises(StreamingQueryException, match="offsets/0"):
        query.awaitTermination(60)
    assert open(os.path.join(checkpoint, "offsets", "0")).read() == "v1\n{broken"


def test_another_writer_of_the_same_batch_fails_loudly(ss, tmp_path):
    """A second run that plans the batch another run already logged: Spark's message."""
    ms = MemoryStream(ss, "v INT")
    checkpoint = str(tmp_path)
    ms.add_data([1])
    query = ms.toDF().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    query.processAllAvailable()
    # another process planned batch 1 behind this run's back
    LOCAL.create(os.path.join(checkpoint, "offsets", "1"), "v1\n{}\n0")
    ms.add_data([2])
    with pytest.raises(StreamingQueryException,
                       match="Concurrent update to the log. Multiple streaming jobs detected for 1"):
        query.awaitTermination(60)
    assert open(os.path.join(checkpoint, "offsets", "1")).read() == "v1\n{}\n0"
