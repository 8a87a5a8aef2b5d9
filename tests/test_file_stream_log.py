"""The file source / file sink logs: Spark's layout, compaction, retention, clean-up."""
from __future__ import annotations

import os

import pytest

from microbatch.checkpoint.file_stream_log import (FileEntry, FileStreamSinkLog, FileStreamSourceLog,
                                                   SinkFileStatus, all_valid_batches,
                                                   derive_compact_interval, is_compaction_batch,
                                                   path_to_uri, uri_to_path)
from microbatch.errors import CheckpointError


def entry(i: int, batch: int) -> FileEntry:
    return FileEntry(f"file:///in/f{i}.json", 1000 + i, batch)


def test_path_to_uri_matches_spark_encoding():
    # Observed in Spark 4.3's logs: space escaped, '+' and '=' kept.
    assert path_to_uri("/tmp/in/k=1/a b+c.json") == "file:///tmp/in/k=1/a%20b+c.json"
    assert path_to_uri("/tmp/x%y#z?.json") == "file:///tmp/x%25y%23z%3F.json"
    assert path_to_uri("/tmp/é.json") == "file:///tmp/é.json"
    for p in ["/tmp/in/k=1/a b+c.json", "/tmp/x%y#z?.json", "/tmp/é.json"]:
        assert uri_to_path(path_to_uri(p)) == p
    assert uri_to_path("file:/tmp/a") == "/tmp/a"
    with pytest.raises(CheckpointError, match="s3"):
        uri_to_path("s3://bucket/a")


def test_compaction_arithmetic_is_sparks():
    assert [b for b in range(25) if is_compaction_batch(b, 10)] == [9, 19]
    assert list(all_valid_batches(12, 10)) == [9, 10, 11, 12]
    assert list(all_valid_batches(9, 10)) == [9]
    assert list(all_valid_batches(3, 10)) == [0, 1, 2, 3]
    # SPARK-18187 examples: an existing 11.compact with default 5 -> 6; with default 10 -> 12
    assert derive_compact_interval(5, 11) == 6
    assert derive_compact_interval(10, 11) == 12
    assert derive_compact_interval(3, 1) == 2


def test_source_log_files_and_compaction(tmp_path):
    path = str(tmp_path / "sources" / "0")
    log = FileStreamSourceLog(path, default_compact_interval=3)
    for b in range(7):
        assert log.add(b, [entry(2 * b, b), entry(2 * b + 1, b)])
    assert sorted(os.listdir(path)) == ["0", "1", "2.compact", "3", "4", "5.compact", "6"]
    with open(os.path.join(path, "0")) as f:
        assert f.read() == ('v1\n{"path":"file:///in/f0.json","timestamp":1000,"batchId":0}\n'
                            '{"path":"file:///in/f1.json","timestamp":1001,"batchId":0}')
    compact = log.get(5)
    assert [e.batchId for e in compact] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert [e.path for e in log.all_files()] == [f"file:///in/f{i}.json" for i in range(14)]
    assert log.get_latest_batch_id() == 6
    # A second writer of the same batch loses.
    assert not log.add(6, [entry(99, 6)])
    # A fresh reader (no cache) finds a batch's entries inside a compact file.
    reader = FileStreamSourceLog(path, default_compact_interval=10)
    assert reader.compact_interval == 3, "the interval of existing compact files wins"
    assert [e.path for e in reader.files_in_range(5, 6)] == [
        "file:///in/f10.json", "file:///in/f11.json", "file:///in/f12.json", "file:///in/f13.json"]


def test_expired_log_files_deleted_after_compaction(tmp_path):
    path = str(tmp_path / "log")
    log = FileStreamSourceLog(path, default_compact_interval=3, cleanup_delay_ms=0,
                              min_batches_to_retain=2)
    for b in range(9):
        log.add(b, [entry(b, b)])
    # Spark keeps the compact file that covers minBatchesToRetain and everything after it.
    assert sorted(os.listdir(path), key=lambda n: int(n.split(".")[0])) == ["5.compact", "6", "7", "8.compact"]
    assert [e.batchId for e in log.all_files()] == list(range(9))
    # The entries of removed batch files are still found through the compact file.
    assert [e.batchId for e in FileStreamSourceLog(path).files_in_range(3, 4)] == [3, 4]


def test_cleanup_delay_keeps_recent_files(tmp_path):
    path = str(tmp_path / "log")
    log = FileStreamSourceLog(path, default_compact_interval=3, cleanup_delay_ms=600_000,
                              min_batches_to_retain=2)
    for b in range(9):
        log.add(b, [entry(b, b)])
    assert len(os.listdir(path)) == 9


def test_sink_log_retention_drops_old_entries_at_compaction(tmp_path):
    now = [1_000_000.0]
    log = FileStreamSinkLog(str(tmp_path / "_spark_metadata"), default_compact_interval=2,
                            retention_ms=10_000, clock=lambda: now[0])

    def status(name: str, mtime_ms: int) -> SinkFileStatus:
        return SinkFileStatus(f"file:///out/{name}", 10, False, mtime_ms, 1, 33554432, "add")

    log.add(0, [status("old", 1_000_000_000 - 20_000)])
    log.add(1, [status("new", 1_000_000_000 - 1_000)])
    assert [e.path for e in log.get(1)] == ["file:///out/new"]
    with open(tmp_path / "_spark_metadata" / "1.compact") as f:
        assert f.read() == ('v1\n{"path":"file:///out/new","size":10,"isDir":false,'
                            '"modificationTime":999999000,"blockReplication":1,'
                            '"blockSize":33554432,"action":"add"}')


def test_damaged_entry_is_a_clear_error(tmp_path):
    path = tmp_path / "log"
    log = FileStreamSourceLog(str(path))
    log.add(0, [entry(0, 0)])
    (path / "1").write_text('v1\n{"path": broken')
    with pytest.raises(CheckpointError, match=r"damaged at line 2"):
        log.all_files()
    (path / "1").write_text('v7\n')
    with pytest.raises(CheckpointError, match="maximum supported log version is v1"):
        log.get(1)
