"""The offset and commit logs: Spark's text format, atomic create-if-absent, purge, bad files."""
from __future__ import annotations

import os
import threading

import pytest

from helpers import confs
from microbatch.checkpoint.commits import CommitLog, CommitMetadata
from microbatch.checkpoint.fs import CheckpointFileSystem, FailingFileSystem, InjectedFailure
from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqLog, OffsetSeqMetadata
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import CheckpointError


def test_offset_log_writes_spark_format_without_trailing_newline(tmp_path):
    log = OffsetSeqLog(str(tmp_path / "offsets"))
    seq = OffsetSeq([{"offset": 10, "timestamp": 1000}, None, 5],
                    OffsetSeqMetadata(0, 1700000000000, {"spark.sql.shuffle.partitions": "4"}))
    assert log.add(0, seq)
    text = (tmp_path / "offsets" / "0").read_text()
    assert text == ('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,'
                    '"conf":{"spark.sql.shuffle.partitions":"4"}}\n'
                    '{"offset":10,"timestamp":1000}\n-\n5')
    read = log.get(0)
    assert read.offsets == [{"offset": 10, "timestamp": 1000}, None, 5]
    assert read.metadata == seq.metadata


def test_commit_log_format(tmp_path):
    log = CommitLog(str(tmp_path / "commits"))
    assert log.add(3, CommitMetadata(42))
    assert (tmp_path / "commits" / "3").read_text() == 'v1\n{"nextBatchWatermarkMs":42}'
    assert log.get(3) == CommitMetadata(42)
    assert log.get_latest() == (3, CommitMetadata(42))


def test_add_is_create_if_absent(tmp_path):
    log = CommitLog(str(tmp_path / "commits"))
    assert log.add(0, CommitMetadata(1))
    assert not log.add(0, CommitMetadata(2))
    assert log.get(0) == CommitMetadata(1)


def test_concurrent_writers_of_one_batch_have_exactly_one_winner(tmp_path):
    log = CommitLog(str(tmp_path / "commits"))
    results, barrier = [], threading.Barrier(8)

    def writer(i):
        barrier.wait()
        results.append((i, log.add(7, CommitMetadata(i))))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results if won]
    assert len(winners) == 1
    assert log.get(7) == CommitMetadata(winners[0])
    assert os.listdir(tmp_path / "commits") == ["7"]  # no temporary files left behind


def test_latest_ignores_temp_and_foreign_files_and_purge_keeps_recent(tmp_path):
    log = CommitLog(str(tmp_path / "commits"))
    for i in range(5):
        log.add(i, CommitMetadata(i))
    (tmp_path / "commits" / ".5.abc.tmp").write_text("partial")
    (tmp_path / "commits" / "README").write_text("x")
    assert log.get_latest()[0] == 4
    log.purge(3)
    assert log.batch_ids() == [3, 4]


def test_failed_write_leaves_no_entry(tmp_path):
    fs = FailingFileSystem(lambda op, path: path.endswith("/0"))
    log = CommitLog(str(tmp_path / "commits"), fs)
    with pytest.raises(InjectedFailure):
        log.add(0, CommitMetadata(0))
    assert log.get_latest() is None


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("garbage", "failed to read correct log version"),
    ("v9\n{}", "maximum supported log version is v2, but encountered v9"),
    ('v1\n{"batchWatermarkMs":', "cannot parse"),
])
def test_bad_offset_files_give_clear_errors(tmp_path, content, message):
    log = OffsetSeqLog(str(tmp_path / "offsets"))
    (tmp_path / "offsets" / "0").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        log.get(0)
    assert (tmp_path / "offsets" / "0").read_text() == content  # nothing overwritten


def test_stream_metadata_is_created_once(tmp_path):
    fs = CheckpointFileSystem()
    first = StreamMetadata.read_or_create(fs, str(tmp_path))
    assert (tmp_path / "metadata").read_text() == '{"id":"%s"}' % first.id
    assert StreamMetadata.read_or_create(fs, str(tmp_path)).id == first.id
    (tmp_path / "metadata").write_text("{not json")
    with pytest.raises(CheckpointError, match="Cannot read the query metadata file"):
        StreamMetadata.read_or_create(fs, str(tmp_path))


def _checkpoint_files(root) -> dict:
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


def test_a_deleted_metadata_file_is_refused_as_spark_refuses_it(ss, spark, tmp_path):
    """Spark 4.2+: offsets or commits without ``metadata`` would restart under a new query
    id; both engines refuse with STREAMING_CHECKPOINT_MISSING_METADATA_FILE, change no
    file, and run again with the check turned off."""
    from pyspark.errors import SparkRuntimeException
    for engine, session in (("spark", spark), ("microbatch", ss)):
        ckpt = tmp_path / engine
        frame = session.readStream.format("rate-micro-batch").option("rowsPerBatch", 3).load()

        def start(frame=frame, ckpt=ckpt):
            return (frame.writeStream.format("noop").option("checkpointLocation", str(ckpt))
                    .trigger(availableNow=True).start())
        start().awaitTermination(60)
        os.remove(ckpt / "metadata")
        if (ckpt / ".metadata.crc").exists():   # Hadoop's checksum beside Spark's file
            os.remove(ckpt / ".metadata.crc")
        before = _checkpoint_files(ckpt)
        with pytest.raises(SparkRuntimeException) as error:
            start()
        assert error.value.getCondition() == "STREAMING_CHECKPOINT_MISSING_METADATA_FILE", engine
        assert "the metadata file is missing but offset and/or commit logs contain data" in str(error.value)
        assert _checkpoint_files(ckpt) == before, engine
        with confs(spark, {"spark.sql.streaming.checkpoint.verifyMetadataExists.enabled": "false"}):
            q = start()
            q.awaitTermination(60)
            assert q.exception() is None
