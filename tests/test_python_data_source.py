"""PySpark's Python Data Source API under microbatch: a user's DataSourceStreamReader,
SimpleDataSourceStreamReader and DataSourceStreamWriter, registered with
``spark.dataSource.register``, end to end with restarts; the reader side by side with
Spark's own engine running the same registered source."""
from __future__ import annotations

import json
import os
import sys
import uuid

from pyspark import cloudpickle
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.datasource import (DataSource, DataSourceStreamArrowWriter, DataSourceStreamReader,
                                    DataSourceStreamWriter, InputPartition,
                                    SimpleDataSourceStreamReader, WriterCommitMessage)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from microbatch.sinks.memory import MemorySink

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def available(path) -> int:
    with open(os.path.join(path, "count")) as f:
        return int(f.read())


def feed(path, count: int) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "count"), "w") as f:
        f.write(str(count))


def note(path, what: str) -> None:
    with open(os.path.join(path, "calls"), "a") as f:
        f.write(what + "\n")


def calls(path) -> list[str]:
    try:
        with open(os.path.join(path, "calls")) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


class RangePartition(InputPartition):
    def __init__(self, start, end):
        self.start, self.end = start, end


class CounterReader(DataSourceStreamReader):
    def __init__(self, options):
        self.path = options["path"]
        self.max_rows = int(options.get("maxRows", 0))

    def initialOffset(self):
        return {"offset": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start, limit):
        end = available(self.path)
        if isinstance(limit, ReadMaxRows):
            end = min(end, start["offset"] + limit.max_rows)
        return {"offset": end}

    def partitions(self, start, end):
        a, b = start["offset"], end["offset"]
        middle = (a + b) // 2
        return [p for p in (RangePartition(a, middle), RangePartition(middle, b)) if p.end > p.start]

    def read(self, partition):
        for i in range(partition.start, partition.end):
            yield (i, f"row-{i}")

    def commit(self, end):
        note(self.path, f"commit {end['offset']}")


class SimpleCounterReader(SimpleDataSourceStreamReader):
    def __init__(self, options):
        self.path = options["path"]

    def initialOffset(self):
        return {"offset": 0}

    def read(self, start):
        end = available(self.path)
        return iter([(i, f"row-{i}") for i in range(start["offset"], end)]), {"offset": end}

    def readBetweenOffsets(self, start, end):
        note(self.path, f"readBetweenOffsets {start['offset']} {end['offset']}")
        return iter([(i, f"row-{i}") for i in range(start["offset"], end["offset"])])

    def commit(self, end):
        note(self.path, f"commit {end['offset']}")


class FileMessage(WriterCommitMessage):
    def __init__(self, files):
        self.files = files


class DirectoryWriter(DataSourceStreamWriter):
    """Each task writes a staging file; commit moves a batch's files into ``batch-<id>``
    once (a batch committed before is not written again); abort deletes them."""

    def __init__(self, options):
        self.path = options["path"]
        self.fail_batch = options.get("failTaskWithValue")

    def write(self, iterator):
        rows = [r.asDict() for r in iterator]
        if self.fail_batch is not None and any(r["id"] == int(self.fail_batch) for r in rows):
            raise ValueError(f"planted failure at id {self.fail_batch}")
        staging = os.path.join(self.path, "staging")
        os.makedirs(staging, exist_ok=True)
        name = os.path.join(staging, f"{uuid.uuid4()}.json")
        with open(name, "w") as f:
            json.dump(rows, f)
        return FileMessage([name])

    def commit(self, messages, batchId):
        target = os.path.join(self.path, f"batch-{batchId}")
        files = [f for m in messages for f in m.files]
        if os.path.exists(target):
            for f in files:
                os.remove(f)
            return
        os.makedirs(target + ".tmp")
        for f in files:
            os.rename(f, os.path.join(target + ".tmp", os.path.basename(f)))
        os.rename(target + ".tmp", target)

    def abort(self, messages, batchId):
        note(self.path, f"abort {batchId}")


class ArrowDirectoryWriter(DataSourceStreamArrowWriter):
    """Gets each task's rows as Arrow record batches; commit writes one file per batch."""

    def __init__(self, options):
        self.path = options["path"]

    def write(self, iterator):
        import pyarrow as pa
        batches = list(iterator)
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        return FileMessage([r for b in batches for r in b.to_pylist()])

    def commit(self, messages, batchId):
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, f"arrow-{batchId}.json"), "w") as f:
            json.dump([r for m in messages for r in m.files], f)


class ArrowSink(DataSource):
    @classmethod
    def name(cls):
        return "mb_arrow_sink"

    def streamWriter(self, schema, overwrite):
        return ArrowDirectoryWriter(self.options)


class CounterSource(DataSource):
    @classmethod
    def name(cls):
        return "mb_counter"

    def schema(self):
        return "id INT, label STRING"

    def streamReader(self, schema):
        return CounterReader(self.options)

    def streamWriter(self, schema, overwrite):
        return DirectoryWriter(self.options)


class SimpleCounterSource(CounterSource):
    @classmethod
    def name(cls):
        return "mb_simple_counter"

    def streamReader(self, schema):
        from pyspark.errors import PySparkNotImplementedError
        raise PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED",
                                         messageParameters={"feature": "streamReader"})

    def simpleStreamReader(self, schema):
        return SimpleCounterReader(self.options)


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(CounterSource)
    spark.dataSource.register(SimpleCounterSource)
    spark.dataSource.register(ArrowSink)


def written(path) -> list[tuple[int, dict]]:
    out = []
    for name in sorted(os.listdir(path)):
        if name.startswith("batch-") and not name.endswith(".tmp"):
            for f in os.listdir(os.path.join(path, name)):
                with open(os.path.join(path, name, f)) as fh:
                    out += [(int(name[6:]), r) for r in json.load(fh)]
    return out


def test_a_stream_reader_runs_as_on_sparks_own_engine(ss, spark, tmp_path):
    feed(tmp_path / "src", 10)
    ours = MemorySink(spark, ss.readStream.format("mb_counter").load().schema, "append")
    q = (ss.readStream.format("mb_counter").option("path", str(tmp_path / "src"))
         .option("maxRows", 4).load().writeStream.sink(ours)
         .option("checkpointLocation", str(tmp_path / "ours")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    theirs = (spark.readStream.format("mb_counter").option("path", str(tmp_path / "src"))
              .option("maxRows", 4).load().writeStream.format("memory").queryName("spark_counter")
              .option("checkpointLocation", str(tmp_path / "theirs")).trigger(availableNow=True).start())
    theirs.awaitTermination(120)
    assert sorted(tuple(r) for r in ours.all_data()) == \
        sorted(tuple(r) for r in spark.table("spark_counter").collect()) == [(i, f"row-{i}") for i in range(10)]
    mine = [(p.numInputRows, p.sources[0].startOffset, p.sources[0].endOffset) for p in q.recentProgress]
    spark_side = [(p.numInputRows, p.sources[0].startOffset, p.sources[0].endOffset)
                  for p in theirs.recentProgress if p.numInputRows]
    # AvailableNow without the reader's own support: one batch up to the latest offset
    # at start (Spark's AvailableNowDataStreamWrapper), whatever the read limit
    assert mine == spark_side
    assert [n for n, *_ in mine] == [10]
    assert (tmp_path / "ours" / "offsets" / "0").read_text().splitlines()[-1] == '{"offset":10}'
    # Spark describes the source by its JVM object (class@hash); ours names the class and the source
    assert "PythonMicroBatchStream" in theirs.recentProgress[0].sources[0].description
    assert q.recentProgress[0].sources[0].description == "PythonMicroBatchStream[mb_counter]"


def test_a_stream_reader_and_writer_end_to_end_with_a_restart(ss, tmp_path):
    src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ckpt"
    feed(src, 7)

    def start():
        frame = ss.readStream.format("mb_counter").option("path", str(src)).option("maxRows", 3).load()
        q = (frame.writeStream.format("mb_counter").option("path", str(out))
             .option("checkpointLocation", str(ckpt)).trigger(processingTime="10 milliseconds")
             .start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        assert q.exception() is None
        return q
    start()
    assert sorted(r["id"] for _, r in written(out)) == list(range(7))
    feed(src, 12)
    q = start()
    rows = written(out)
    assert sorted(r["id"] for _, r in rows) == list(range(12))
    # the read limit (maxRows 3): batches of 3, 3, 1, then 3, 2 after the restart
    assert [sum(1 for b, _ in rows if b == n) for n in range(5)] == [3, 3, 1, 3, 2]
    assert q.lastProgress.sink.description == "PythonStreamingWrite[mb_counter]"
    # the reader is told each committed end when the next batch's offsets are written
    assert calls(src) == ["commit 3", "commit 6", "commit 7", "commit 10"]


def test_a_simple_reader_replays_a_failed_batch_and_the_writer_aborts_it(ss, tmp_path):
    src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ckpt"
    feed(src, 3)

    def start(**options):
        frame = ss.readStream.format("mb_simple_counter").option("path", str(src)).load()
        writer = (frame.writeStream.format("mb_counter").option("path", str(out))
                  .option("checkpointLocation", str(ckpt)).trigger(availableNow=True))
        for k, v in options.items():
            writer = writer.option(k, v)
        q = writer.start()
        try:
            q.awaitTermination(120)
        except StreamingQueryException:
            pass
        return q
    start()
    feed(src, 6)
    q = start(failTaskWithValue=4, path=str(out))
    assert q.exception() is not None and "planted failure at id 4" in str(q.exception())
    note_lines = calls(out)
    assert note_lines == ["abort 1"]
    assert sorted(r["id"] for _, r in written(out)) == [0, 1, 2]      # batch 1 left nothing
    q = start()
    assert q.exception() is None
    assert sorted(r["id"] for _, r in written(out)) == list(range(6))
    assert "readBetweenOffsets 3 6" in calls(src)   # the replay read its offsets again


def test_an_arrow_stream_writer_gets_record_batches(ss, tmp_path):
    feed(tmp_path / "src", 5)
    q = (ss.readStream.format("mb_counter").option("path", str(tmp_path / "src")).load()
         .writeStream.format("mb_arrow_sink").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    with open(tmp_path / "out" / "arrow-0.json") as f:
        rows = json.load(f)
    assert sorted((r["id"], r["label"]) for r in rows) == [(i, f"row-{i}") for i in range(5)]
