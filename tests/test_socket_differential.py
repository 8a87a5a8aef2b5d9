"""The socket source splits lines as Spark's does (issue 64): Java's
``BufferedReader.readLine`` ends a line at ``\\n``, ``\\r`` or ``\\r\\n``, including a
``\\r\\n`` whose two bytes arrive in different reads. The same bytes, sent in the same
pieces, go to Spark's socket source and to microbatch's."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from helpers import wait_for
from microbatch.sources.socket import LineSplitter

#: each piece is sent on its own (a pause between): a \r ends one piece, its \n starts the next
PIECES = [b"plain\nlone\rcarriage return\ntwo\r\r\n", b"crlf\r\nsplit\r", b"\nafter split\r",
          b"x\n\n", b"\xc3\xa9t\xc3\xa9 \x00nul\r", b"\r\n", b"last without an ending"]
LINES = ["plain", "lone", "carriage return", "two", "", "crlf", "split", "after split", "x", "",
         "\u00e9t\u00e9 \x00nul", "", "last without an ending"]


def test_lines_end_where_readline_ends_them():
    splitter = LineSplitter()
    lines = [line for piece in PIECES for line in splitter.feed(piece)] + splitter.end()
    assert [line.decode() for line in lines] == LINES
    whole = LineSplitter()     # (the same bytes in one read: the same lines)
    assert [line.decode() for line in whole.feed(b"".join(PIECES)) + whole.end()] == LINES
    byte_by_byte = LineSplitter()
    single = [line for i in range(len(b"".join(PIECES))) for line in byte_by_byte.feed(b"".join(PIECES)[i:i + 1])]
    assert [line.decode() for line in single + byte_by_byte.end()] == LINES


class PieceServer:
    """Sends each connection ``PIECES`` one by one, pausing between them, then closes it."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                for piece in PIECES:
                    conn.sendall(piece)
                    time.sleep(0.3)     # (deliberate: each piece its own read)

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("engine", ["spark", "microbatch"])
def test_the_socket_source_gives_the_lines_sparks_gives(spark, ss, tmp_path, engine):
    server = PieceServer()
    session = spark if engine == "spark" else ss
    seen: list = []

    def sink(df, batch_id):
        seen.extend(r.value for r in df.collect())

    frame = session.readStream.format("socket").option("host", "127.0.0.1").option("port", server.port).load()
    query = (frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / engine))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: len(seen) >= len(LINES), timeout=60, what=lambda: f"{len(LINES)} lines, got {seen}")
        time.sleep(0.5)     # (deliberate: a line too many would arrive in this time)
    finally:
        query.stop()
        server.close()
    # (Spark deals a batch's lines round-robin into its partitions: the lines, not their order)
    assert sorted(seen) == sorted(LINES), seen
