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

from helpers import confs, wait_for
from test_disk_full import fill, small_disk  # noqa: F401 - a fixture: a 2 MB tmpfs
from microbatch.checkpoint.fs import LOCAL, CheckpointFileSystem
from microbatch.errors import CheckpointError
from microbatch.sources.http import BadInput, parse_json_lines
from microbatch.sources.backpressure import Backpressure, RateLimiter
from microbatch.sources.rate_estimator import PIDRateEstimator
from microbatch.sources.receiver_blocks import BlockLog, encode_block
from microbatch.sources.receiver_options import ReceiverOptions
from microbatch.sources.receiver_writer import BlockWriter
from microbatch.util import CaseInsensitiveOptions


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
                time.sleep(0.5)     # (deliberate: the connection stays open a while after its lines)

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
    with confs(spark, {"spark.sql.streaming.minBatchesToRetain": "2"}):
        frame = ss.readStream.format("http").schema("id INT").option("port", port).load()
        query = (frame.writeStream.format("noop").option("checkpointLocation", str(ckpt)).start())
        wait_listening(port)
        for i in range(6):
            assert post(url, [{"id": i}]).status_code == 200
            query.processAllAvailable()
        query.stop()
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


class FailingWrite(CheckpointFileSystem):
    """Local disk whose ``fail_at``-th block write fails (EIO), as a store error does."""

    fail_at: int | None = None
    writes = 0

    def write_bytes(self, path, data):
        self.writes += 1
        if self.writes == self.fail_at:
            raise OSError(errno.EIO, "Input/output error", path)
        super().write_bytes(path, data)


def test_ack_mode_record_writes_a_block_a_record_and_the_key_on_the_last(tmp_path):
    """ackMode=record: each record is its own block, all durable before the answer; the
    request's Idempotency-Key goes on its last block, so a key in the log means the whole
    request is. A failure between a request's blocks answers 503 and leaves its first
    records logged without the key: its retry logs them again (at least once)."""
    fs = FailingWrite()
    log_ = BlockLog(fs, str(tmp_path))
    schema = pa.schema([("v", pa.string())])
    durable: list = []
    options = ReceiverOptions("record", 200, None, None, 100, 1 << 30)
    writer = BlockWriter(log_, schema, [], options, lambda: 0, durable.append)
    try:
        assert writer.submit(pa.table({"v": ["a", "b", "c"]}, schema=schema), "k1").future.result(10) == 0
        assert [(b.first, b.count, b.keys) for b in durable] == [(0, 1, ()), (1, 1, ()), (2, 1, ("k1",))]
        assert [(b.first, b.count, b.keys) for b in log_.recover()] == [(0, 1, ()), (1, 1, ()), (2, 1, ("k1",))]
        fs.fail_at = fs.writes + 2          # the second record's block of the next request fails
        failed = writer.submit(pa.table({"v": ["d", "e"]}, schema=schema), "k2")
        with pytest.raises(Backpressure) as e:
            failed.future.result(10)
        assert e.value.status == 503
        assert [(b.first, b.keys) for b in log_.recover()][3:] == [(3, ())]     # "d", without its key
        assert writer.submit(pa.table({"v": ["d", "e"]}, schema=schema), "k2").future.result(10) == 4
        recovered = log_.recover()
        assert [(b.first, b.count, b.keys) for b in recovered][3:] == [(3, 1, ()), (4, 1, ()), (5, 1, ("k2",))]
        values = [pa.ipc.open_file(fs.open_input(log_.path(b.first))).read_all()["v"][0].as_py() for b in recovered]
        assert values == ["a", "b", "c", "d", "d", "e"]      # the retried request's first record twice
    finally:
        writer.stop()


def test_http_ack_mode_record_answers_once_every_record_is_a_durable_block(ss, spark, tmp_path):
    ckpt, out, port = tmp_path / "ckpt", tmp_path / "out", free_port()
    url = f"http://127.0.0.1:{port}/"
    query = http_query(ss, ckpt, out, port, ackMode="record")
    assert post(url, [{"id": i} for i in range(3)], key="r").json() == {"accepted": 3, "first": 0}
    # durable before the answer: a block a record, the key on the request's last block
    assert blocks(ckpt) == [f"{i:020d}.arrow" for i in range(3)]
    recovered = BlockLog(LOCAL, str(ckpt / "sources" / "0")).recover()
    assert [(b.first, b.count, b.keys) for b in recovered] == [(0, 1, ()), (1, 1, ()), (2, 1, ("r",))]
    again = post(url, [{"id": i} for i in range(3)], key="r")
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert post(url, [{"id": 3}, {"id": 4}]).json() == {"accepted": 2, "first": 3}
    assert len(blocks(ckpt)) == 5
    query.processAllAvailable()
    query.stop()
    assert sink_ids(spark, out) == list(range(5))


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


# -- backpressure: Spark Streaming's PID rate estimator ------------------------------------
def test_pid_rate_estimator_computes_sparks_formula():
    """Hand-computed with PIDRateEstimator.scala's formula: newRate = latestRate
    - kp * error - ki * schedulingDelay * processingRate / batchInterval - kd * dError."""
    est = PIDRateEstimator(1000, proportional=1.0, integral=0.2, derivative=0.0, min_rate=100)
    # the first batch only sets the rate to its processing rate (2000 records/s): nothing published
    assert est.compute(1000, 2000, 1000, 0) is None
    assert (est.latest_rate, est.latest_error) == (2000.0, 0.0)
    # 1000 records in 1 s, 500 ms scheduling delay: error 2000 - 1000, integral 500 * 1000 / 1000
    assert est.compute(2000, 1000, 1000, 500) == pytest.approx(2000 - 1000 - 0.2 * 500)      # 900
    # faster than the rate: error 900 - 1500 = -600, the rate goes up by it
    assert est.compute(3000, 1500, 1000, 0) == pytest.approx(1500)
    # a batch far slower, a long delay: 1500 - 1490 - 0.2 * 10000 * 10 / 1000 < minRate
    assert est.compute(4000, 10, 1000, 10000) == 100
    # nothing to learn: no records, no processing time, a time not after the last
    assert est.compute(5000, 0, 1000, 0) is None
    assert est.compute(5000, 10, 0, 0) is None
    assert est.compute(4000, 10, 1000, 0) is None

    # the derivative term, over 2 s between updates
    est = PIDRateEstimator(500, proportional=0.5, integral=0.1, derivative=0.5, min_rate=1)
    assert est.compute(1000, 300, 1000, 0) is None                                # rate 300
    # processing rate 200/s; error 100; integral 250 * 200 / 500 = 100; dError (100 - 0) / 2 s
    assert est.compute(3000, 400, 2000, 250) == pytest.approx(300 - 0.5 * 100 - 0.1 * 100 - 0.5 * 50)
    # latestRate 215; processing rate 400; error -185; dError (-185 - 100) / 1 s
    assert est.compute(4000, 400, 1000, 0) == pytest.approx(215 + 0.5 * 185 + 0.5 * 285)

    for args, problem in (((0,), "batch interval 0"), ((1000, -1.0), "Proportional term -1.0"),
                          ((1000, 1.0, -0.2), "Integral term"), ((1000, 1.0, 0.2, -1.0), "Derivative term"),
                          ((1000, 1.0, 0.2, 0.0, 0), "Minimum rate")):
        with pytest.raises(ValueError, match=problem):
            PIDRateEstimator(*args)


def test_rate_limiter_takes_a_new_rate():
    now = [0.0]
    limiter = RateLimiter(100, clock=lambda: now[0])
    limiter.set_rate(10)            # what the bucket holds shrinks to a second of the new rate
    assert limiter.wait_time(10) == 0.0 and limiter.wait_time(1) == pytest.approx(0.1)


def test_backpressure_options_and_their_spark_conf_defaults():
    def parse(options, confs=None):
        return ReceiverOptions.parse(CaseInsensitiveOptions(options), "block", confs)

    assert parse({}).backpressure is None
    assert parse({}, {"backpressure.enabled": "false"}).backpressure is None
    bp = parse({"backpressure.enabled": "true"}).backpressure     # Spark's defaults
    assert (bp.initial_rate, bp.proportional, bp.integral, bp.derived, bp.min_rate) == (None, 1.0, 0.2, 0.0, 100.0)
    # spark.streaming.backpressure.* are the defaults; an option on the source wins
    bp = parse({"backpressure.pid.integral": "0.5"},
               {"backpressure.enabled": "true", "backpressure.pid.integral": "0.1",
                "backpressure.initialRate": "300", "backpressure.pid.minRate": "5"}).backpressure
    assert (bp.initial_rate, bp.integral, bp.min_rate) == (300, 0.5, 5.0)
    assert parse({"backpressure.enabled": "false"}, {"backpressure.enabled": "true"}).backpressure is None
    for options, session_confs, message in (
            ({"backpressure.enabled": "yes"}, {}, "'yes' for option 'backpressure.enabled': must be 'true' or 'false'"),
            ({"backpressure.enabled": "true", "backpressure.pid.minRate": "0"}, {},
             "'0' for option 'backpressure.pid.minRate': it must be a number greater than 0"),
            ({"backpressure.enabled": "true", "backpressure.pid.proportional": "-1"}, {},
             "'-1' for option 'backpressure.pid.proportional': it must be a number at least 0"),
            ({"backpressure.enabled": "true"}, {"backpressure.initialRate": "fast"},
             "'fast' for the Spark conf 'spark.streaming.backpressure.initialRate'"),
            ({"backpressure.enabled": "true", "backpressure.rateEstimator": "magic"}, {},
             "Unknown rate estimator: magic")):
        with pytest.raises(AnalysisException, match=message):
            parse(options, session_confs)


def test_http_backpressure_admits_what_the_batches_keep_up_with(ss, spark, tmp_path):
    """A sink slower per record than the clients send (5 ms a record: under 200 records a
    second): the estimated rate falls below it, requests over it are answered 429 naming
    the estimate, and every acknowledged record is read once."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    got: list[int] = []

    def slow_sink(df, _):
        ids = [r.id for r in df.collect()]
        time.sleep(0.005 * len(ids))
        got.extend(ids)

    frame = (ss.readStream.format("http").schema("id INT").option("port", port)
             .option("backpressure.enabled", True).option("backpressure.initialRate", 50)
             .option("backpressure.pid.minRate", 10).option("maxRate", 100000).load())
    query = frame.writeStream.foreachBatch(slow_sink).option("checkpointLocation", str(tmp_path / "c")).start()
    wait_listening(port)
    stop = threading.Event()
    lock = threading.Lock()
    next_id = [0]
    acknowledged: list[int] = []
    offered = [0]
    refusals: list[str] = []
    failures: list[str] = []

    def client(name: str) -> None:
        deadline = time.monotonic() + 90
        n = 0
        while not stop.is_set():
            with lock:
                ids = list(range(next_id[0], next_id[0] + 10))
                next_id[0] += 10
            n += 1
            while time.monotonic() < deadline:      # sent fast: the answer's Retry-After is ignored
                answer = post(url, [{"id": i} for i in ids], key=f"{name}-{n}")
                with lock:
                    offered[0] += len(ids)
                if answer.status_code == 200:
                    with lock:
                        acknowledged.extend(ids)
                    break
                if answer.status_code != 429 or "Retry-After" not in answer.headers:
                    failures.append(f"{answer.status_code} {answer.text}")
                    return
                with lock:
                    refusals.append(answer.json()["error"])
                time.sleep(0.02)
            else:
                failures.append(f"{name}: request {n} not answered 200 in time")
                return

    clients = [threading.Thread(target=client, args=(f"c{k}",), daemon=True) for k in range(3)]
    for c in clients:
        c.start()
    try:
        wait_for(lambda: failures or any("estimated by backpressure" in r for r in list(refusals)), 90,
                 "a request refused over the estimated rate")
    finally:
        stop.set()
        for c in clients:
            c.join(100)
    assert not failures, failures
    query.processAllAvailable()
    rates = [int(p["sources"][0]["metrics"]["rateLimit"]) for p in query.recentProgress
             if "rateLimit" in p["sources"][0].get("metrics", {})]
    query.stop()
    assert sorted(got) == sorted(acknowledged)          # each acknowledged record once
    assert offered[0] > len(acknowledged)               # the admitted rate is below the send rate
    # the estimate (a processing rate, less the backlog's share) is under the sink's 200 a second
    assert rates and min(rates) < 200 and rates[-1] < 200, rates
    assert all(10 <= r <= 100000 for r in rates)
