"""Receivers with a write-ahead log (docs/receivers.md): the http and socket sources with
real HTTP clients and real sockets, replay after a restart, bad input, limits, clean-up.
The SIGKILL tests are in test_receivers_crash.py (the ``faults`` marker)."""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time

import pyarrow as pa
import pytest
import requests
from pyspark.errors import AnalysisException

from helpers import wait_for
from test_disk_full import fill, small_disk  # noqa: F401 - a fixture: a 2 MB tmpfs
from microbatch.checkpoint.fs import LOCAL, CheckpointFileSystem
from microbatch.errors import CheckpointError
from microbatch.sources.http import BadInput, parse_json_lines
from microbatch.sources.receiver import (Backpressure, BlockLog, BlockWriter, RateLimiter, ReceiverOptions,
                                         encode_block)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float = 60) -> None:
    """The query's source starts its server on the query's thread, after start() returns."""
    def accepts() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(accepts, timeout, f"the http source listening on port {port}")


def post(url: str, lines: list[dict], key: str | None = None, **kwargs) -> requests.Response:
    headers = {"Content-Type": "application/x-ndjson"}
    if key is not None:
        headers["Idempotency-Key"] = key
    body = "".join(json.dumps(line) + "\n" for line in lines)
    return requests.post(url, data=body.encode(), headers=headers, timeout=30, **kwargs)


def blocks(ckpt, source_id: str = "0") -> list[str]:
    return sorted(n for n in os.listdir(ckpt / "sources" / source_id / "blocks") if n.endswith(".arrow"))


def logged(ckpt, source_id: str = "0") -> int:
    """Records in the source's write-ahead log."""
    return sum(b.count for b in BlockLog(LOCAL, str(ckpt / "sources" / source_id)).recover())


def wait_logged(query, ckpt, records: int) -> None:
    def done() -> bool:
        assert query.isActive or query.exception() is None, query.exception()
        return logged(ckpt) == records
    wait_for(done, 60, f"{records} records in the write-ahead log")


def http_query(ss, ckpt, out, port: int, **options):
    frame = (ss.readStream.format("http").schema("id INT, name STRING")
             .option("port", port).options(**options).load())
    query = (frame.writeStream.format("parquet").option("checkpointLocation", str(ckpt))
             .option("path", str(out)).start())
    wait_listening(port)
    return query


def sink_ids(spark, out) -> list[int]:
    return sorted(r.id for r in spark.read.parquet(str(out)).collect())


def test_http_records_acknowledged_are_read_exactly_once_across_a_restart(ss, spark, tmp_path):
    ckpt, out, port = tmp_path / "ckpt", tmp_path / "out", free_port()
    url = f"http://127.0.0.1:{port}/"
    query = http_query(ss, ckpt, out, port)
    first = post(url, [{"id": i, "name": f"n{i}"} for i in range(5)], key="a")
    assert first.status_code == 200 and first.json() == {"accepted": 5, "first": 0}
    assert blocks(ckpt) == ["00000000000000000000.arrow"]    # durable before the answer
    assert post(url, [{"id": 5, "name": "x"}, {"id": 6}], key="b").json() == {"accepted": 2, "first": 5}
    query.processAllAvailable()
    assert sink_ids(spark, out) == list(range(7))
    source = json.loads(query.lastProgress.json)["sources"][0]
    assert source["endOffset"] == 6     # the last record's index
    assert source["metrics"] == {"unconsumedRecords": "0", "unconsumedBlocks": "0", "unconsumedBytes": "0"}
    # a retry of an acknowledged request is answered again, and not logged twice
    again = post(url, [{"id": 5, "name": "x"}, {"id": 6}], key="b")
    assert again.status_code == 200 and again.json()["duplicate"] is True
    query.stop()

    # a restart: the same port, the log continues after its last block; keys are remembered
    query = http_query(ss, ckpt, out, port)
    assert post(url, [{"id": 0, "name": "n0"}], key="a").json()["duplicate"] is True
    assert post(url, [{"id": 7}, {"id": 8}]).json() == {"accepted": 2, "first": 7}
    query.processAllAvailable()
    query.stop()
    assert sink_ids(spark, out) == list(range(9))
    offsets = sorted(int(n) for n in os.listdir(ckpt / "offsets") if n.isdigit())
    last = (ckpt / "offsets" / str(offsets[-1])).read_text().splitlines()
    assert last[-1] == "8"     # the offset is the last record's index, as Spark's socket source's


def test_http_bad_input_is_refused_naming_the_line_and_never_logged(ss, spark, tmp_path, caplog):
    ckpt, out, port = tmp_path / "ckpt", tmp_path / "out", free_port()
    url = f"http://127.0.0.1:{port}/ingest"
    query = http_query(ss, ckpt, out, port, path="/ingest", maxRequestBytes="1k")
    secret = "SECRET-VALUE-42"
    with caplog.at_level(logging.DEBUG):
        body = f'{{"id": 1}}\n{{"id": "{secret}"}}\n'
        bad = requests.post(url, data=body, headers={"Content-Type": "application/x-ndjson"}, timeout=30)
        assert bad.status_code == 400 and bad.json()["line"] == 2
        assert "line 2" in bad.json()["error"] and secret not in bad.text
        torn = requests.post(url, data=b'{"id": 1}\n{"id": 2', timeout=30)
        assert torn.status_code == 400 and torn.json()["line"] == 2
        assert requests.post(url, data=b"x", headers={"Content-Type": "text/csv"}, timeout=30).status_code == 400
        assert requests.post(url, data=b'{"id": 1}\n' * 200, timeout=30).status_code == 413
    assert secret not in caplog.text
    assert not (ckpt / "sources" / "0" / "blocks").exists() or blocks(ckpt) == []
    # Arrow IPC: columns by name, cast to the schema
    sink = pa.BufferOutputStream()
    table = pa.table({"name": ["a", "b"], "id": pa.array([10, 11], pa.int64())})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    ok = requests.post(url, data=sink.getvalue().to_pybytes(),
                       headers={"Content-Type": "application/vnd.apache.arrow.stream"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["accepted"] == 2
    query.processAllAvailable()
    query.stop()
    assert sink_ids(spark, out) == [10, 11]


def test_http_options_are_checked_when_the_stream_is_defined(ss):
    with pytest.raises(AnalysisException, match=r"needs the schema.*\.schema\("):
        ss.readStream.format("http").option("port", 1).load()
    with pytest.raises(AnalysisException, match="Set a port"):
        ss.readStream.format("http").schema("id INT").load()
    with pytest.raises(AnalysisException, match="'ackMode'.*record, block, interval"):
        ss.readStream.format("http").schema("id INT").option("port", 1).option("ackMode", "never").load()
    with pytest.raises(AnalysisException, match="_LEGACY_ERROR_TEMP_1295|Set a host"):
        ss.readStream.format("socket").option("port", 1).load()
    with pytest.raises(AnalysisException, match="_LEGACY_ERROR_TEMP_1296|Set a port"):
        ss.readStream.format("socket").option("host", "localhost").load()
    with pytest.raises(AnalysisException, match="user-specified schema"):
        ss.readStream.format("socket").schema("x INT").option("host", "h").option("port", 1).load()


def test_http_backpressure_answers_503_and_429_with_retry_after(ss, spark, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    frame = (ss.readStream.format("http").schema("id INT").option("port", port)
             .option("maxUnconsumedBlocks", 2).load())
    query = (frame.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c1"))
             .trigger(processingTime="1 hour").start())
    wait_listening(port)
    # (the first trigger may read the first block before the hour's wait: a third is taken then)
    answers = [post(url, [{"id": i}]) for i in range(4)]
    codes = [a.status_code for a in answers]
    assert codes[:2] == [200, 200] and 503 in codes and codes.count(200) <= 3, codes
    assert int(answers[codes.index(503)].headers["Retry-After"]) >= 1
    query.stop()

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    frame = (ss.readStream.format("http").schema("id INT").option("port", port)
             .option("maxRate", 5).load())
    query = (frame.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c2"))
             .trigger(processingTime="1 hour").start())
    wait_listening(port)
    # 20 records at 5 a second: taken at once (a full bucket), then 3 s owed
    assert post(url, [{"id": i} for i in range(20)]).status_code == 200
    over = post(url, [{"id": 20}])
    assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1
    query.stop()


class LineServer:
    """A TCP server that sends each connection the lines queued for it (as `nc -lk`)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.batches: list[list[str]] = []
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            batch = self.batches[self.connections] if self.connections < len(self.batches) else []
            self.connections += 1
            with conn:
                conn.sendall("".join(line + "\n" for line in batch).encode())
                time.sleep(0.5)

    def close(self):
        self.sock.close()


def test_socket_lines_are_logged_and_replayed_after_a_restart(ss, spark, tmp_path):
    server = LineServer()
    server.batches = [[f"a{i}" for i in range(20)], [f"b{i}" for i in range(5)]]
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"

    def start():
        frame = (ss.readStream.format("socket").option("host", "127.0.0.1").option("port", server.port)
                 .option("includeTimestamp", True).option("blockInterval", "50ms")
                 .option("maxRecordsPerTrigger", 8).load())
        return (frame.writeStream.format("parquet").option("checkpointLocation", str(ckpt))
                .option("path", str(out)).start())

    query = start()
    wait_logged(query, ckpt, 20)
    query.processAllAvailable()
    query.stop()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value for r in rows) == sorted(f"a{i}" for i in range(20))
    assert all(r.timestamp is not None for r in rows)
    assert max(p["numInputRows"] for p in query.recentProgress) <= 8     # maxRecordsPerTrigger

    query = start()   # connects again; the log continues at record 20
    wait_logged(query, ckpt, 25)
    query.processAllAvailable()
    query.stop()
    server.close()
    values = sorted(r.value for r in spark.read.parquet(str(out)).collect())
    assert values == sorted([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(5)])


def test_blocks_of_old_batches_are_deleted_after_min_batches_to_retain(ss, spark, tmp_path):
    ckpt, port = tmp_path / "ckpt", free_port()
    url = f"http://127.0.0.1:{port}/"
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "2")
    try:
        frame = ss.readStream.format("http").schema("id INT").option("port", port).load()
        query = (frame.writeStream.format("noop").option("checkpointLocation", str(ckpt)).start())
        wait_listening(port)
        for i in range(6):
            assert post(url, [{"id": i}]).status_code == 200
            query.processAllAvailable()
        query.stop()
    finally:
        spark.conf.unset("spark.sql.streaming.minBatchesToRetain")
    # batches 0..5 read a block each; committed: 0..4 (batch 5's commit is told at batch 6)
    names = blocks(ckpt)
    assert len(names) < 6 and names[-1] == f"{5:020d}.arrow"


# -- pure Python: no Spark --------------------------------------------------------------------
def test_rate_limiter_holds_a_second_of_records():
    now = [0.0]
    limiter = RateLimiter(10, clock=lambda: now[0])
    assert limiter.wait_time(10) == 0.0
    assert limiter.wait_time(1) == pytest.approx(0.1)
    now[0] = 0.5
    assert limiter.wait_time(5) == 0.0
    assert limiter.wait_time(100) == pytest.approx(1.0)   # more than a second's worth: a full bucket


def test_block_log_recovery_refuses_a_gap(tmp_path):
    log_ = BlockLog(LOCAL, str(tmp_path))
    schema = pa.schema([("v", pa.string())])
    for first, n in ((0, 3), (3, 2), (5, 4)):
        log_.write(first, encode_block(pa.table({"v": ["x"] * n}, schema=schema), first, [f"k{first}"], 0))
    recovered = log_.recover()
    assert [(b.first, b.count, b.keys) for b in recovered] == [(0, 3, ("k0",)), (3, 2, ("k3",)), (5, 4, ("k5",))]
    log_.delete(3)
    with pytest.raises(CheckpointError, match="has a gap before '00000000000000000005.arrow'"):
        log_.recover()


def test_json_lines_are_refused_by_line_without_their_content():
    schema = pa.schema([("id", pa.int32()), ("ts", pa.timestamp("us", tz="UTC"))])
    table = parse_json_lines(b'{"id": 1, "ts": "2024-01-01T00:00:00Z"}\n\n{"id": 2, "extra": 1}\n', schema)
    assert table.to_pylist()[1] == {"id": 2, "ts": None}
    assert parse_json_lines(b"", schema).num_rows == 0 and parse_json_lines(b"\n \n", schema).num_rows == 0
    with pytest.raises(BadInput) as bad:
        parse_json_lines(b'{"id": 1}\n[1, 2]\n', schema)
    assert bad.value.line == 2
    with pytest.raises(BadInput) as bad:
        parse_json_lines(b'{"id": 1}\n{"id": 2, "ts": "not-a-time-XYZ"}\n', schema)
    assert bad.value.line == 2 and "not-a-time-XYZ" not in bad.value.reason


def test_http_source_with_its_checkpoint_on_s3(ss, spark, tmp_path):
    """The blocks go through the storage layer: one PUT each on S3, read by the tasks."""
    from helpers import s3_lake
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    got: list[int] = []
    with s3_lake(spark, "receivers"):
        frame = ss.readStream.format("http").schema("id INT").option("port", port).load()
        query = (frame.writeStream.foreachBatch(lambda df, _: got.extend(r.id for r in df.collect()))
                 .option("checkpointLocation", "s3://receivers/ckpt").start())
        wait_listening(port)
        assert post(url, [{"id": 1}, {"id": 2}]).json() == {"accepted": 2, "first": 0}
        query.processAllAvailable()
        query.stop()
        query = (frame.writeStream.foreachBatch(lambda df, _: got.extend(r.id for r in df.collect()))
                 .option("checkpointLocation", "s3://receivers/ckpt").start())
        wait_listening(port)
        assert post(url, [{"id": 3}]).json() == {"accepted": 1, "first": 2}
        query.processAllAvailable()
        query.stop()
    assert sorted(got) == [1, 2, 3]


class FullDisk(CheckpointFileSystem):
    """Local disk whose block writes fail while ``full`` (ENOSPC), as a full disk's do."""

    full = False

    def write_bytes(self, path, data):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        super().write_bytes(path, data)


def test_a_failed_block_write_acknowledges_nothing_and_the_log_recovers(tmp_path):
    fs = FullDisk()
    log_ = BlockLog(fs, str(tmp_path))
    schema = pa.schema([("v", pa.string())])
    durable: list = []
    options = ReceiverOptions("block", 200, None, None, 10, 1 << 30)
    writer = BlockWriter(log_, schema, [], options, lambda: 0, durable.append)
    try:
        fs.full = True
        failed = writer.submit(pa.table({"v": ["a", "b"]}, schema=schema))
        with pytest.raises(Backpressure) as e:
            failed.future.result(10)
        assert e.value.status == 503 and "nothing was accepted" in e.value.reason
        assert durable == [] and fs.list(log_.directory) == []
        fs.full = False      # space returns: the next block takes the same index, no gap
        assert writer.submit(pa.table({"v": ["c"]}, schema=schema)).future.result(10) == 0
        assert [(b.first, b.count) for b in log_.recover()] == [(0, 1)]
    finally:
        writer.stop()


def test_http_answers_503_while_the_disk_is_full_and_recovers_when_space_returns(ss, spark, small_disk):
    """A real full disk (a 2 MB tmpfs, test_disk_full.py): the block cannot be written, the
    sender hears 503 and nothing of it is logged; once space returns the next block takes
    the same index, and the batches read exactly what was acknowledged."""
    ckpt, port = os.path.join(small_disk, "ckpt"), free_port()
    url = f"http://127.0.0.1:{port}/"
    got: list[int] = []
    frame = ss.readStream.format("http").schema("id INT").option("port", port).load()

    def start(**trigger):
        writer = (frame.writeStream.foreachBatch(lambda df, _: got.extend(r.id for r in df.collect()))
                  .option("checkpointLocation", ckpt))
        query = (writer.trigger(**trigger) if trigger else writer).start()
        wait_listening(port)
        return query

    query = start(processingTime="1 hour")    # no batch writes while the disk is full
    assert post(url, [{"id": 1}]).status_code == 200
    filler = fill(small_disk)
    full = post(url, [{"id": 2}])
    assert full.status_code == 503 and int(full.headers["Retry-After"]) >= 1
    assert "cannot be written" in full.json()["error"]
    os.remove(filler)
    assert post(url, [{"id": 3}]).json() == {"accepted": 1, "first": 1}
    query.stop()
    query = start()
    query.processAllAvailable()
    query.stop()
    assert sorted(got) == [1, 3]
