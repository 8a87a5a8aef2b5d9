"""``socket``: Spark's text socket source, made replayable by a receiver's write-ahead log.

Options are Spark's: ``host``, ``port`` (both required), ``includeTimestamp`` (adds the
time each line was read); the schema is Spark's ``value STRING`` (``, timestamp
TIMESTAMP``). As Spark's TextSocketSource, the receiver connects to ``host:port`` as a
client when the query starts and reads UTF-8 lines until the peer closes the
connection, split as Java's ``BufferedReader.readLine`` splits them (``LineSplitter``: a
line ends at ``\n``, ``\r`` or ``\r\n``, those two bytes in one read or two). Unlike Spark's, every line goes into a block of the write-ahead log
(docs/receivers.md) before a batch can read it, so batches are replayed after a crash
with exactly the same lines, and a restart continues after the last logged line (and
connects again). The socket protocol has no acknowledgements: lines read but not yet in
a durable block when the process dies are lost; lines in a block are read exactly once.

Receiver options (docs/receivers.md): ``ackMode`` (default ``interval``: one block per
``blockInterval``), ``blockInterval``, ``maxRecordsPerTrigger``, ``maxRate`` and ``backpressure.*`` (the
reader reads no faster), ``maxUnconsumedBlocks``/``maxUnconsumedBytes`` (the reader stops
reading, and TCP holds the sender back).
"""
from __future__ import annotations

import logging
import re
import socket
import threading
import time

import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from microbatch import spark_internals
from microbatch.errors import AnalysisException
from microbatch.sources.base import SourceProvider
from microbatch.sources.backpressure import Backpressure
from microbatch.sources.receiver import ReceiverSource
from microbatch.sources.receiver_options import ReceiverOptions, backpressure_confs

log = logging.getLogger(__name__)

_LINE_END = re.compile(rb"\r\n|\r|\n")


class LineSplitter:
    """Lines of a byte stream as Java's ``BufferedReader.readLine`` (Spark's socket source)
    gives them: each ends at ``\n``, ``\r`` or ``\r\n``, and a ``\r`` that ends one read
    followed by a ``\n`` that starts the next is one ending. ``feed`` gives the lines a read
    completes; ``end`` the last one, without its ending, when the peer closes."""

    def __init__(self):
        self._pending = b""
        self._after_cr = False      # the last read ended a line at a \r: a \n next belongs to it

    def feed(self, data: bytes) -> list[bytes]:
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        self._after_cr = False
        text, lines, start = self._pending + data, [], 0
        for end in _LINE_END.finditer(text):
            lines.append(text[start:end.start()])
            start = end.end()
            self._after_cr = end.group() == b"\r" and start == len(text)
        self._pending = text[start:]
        return lines

    def end(self) -> list[bytes]:
        last, self._pending = self._pending, b""
        return [last] if last else []

SCHEMA_REGULAR = StructType([StructField("value", StringType(), True)])
SCHEMA_TIMESTAMP = StructType([StructField("value", StringType(), True),
                               StructField("timestamp", TimestampType(), True)])


def _include_timestamp(options) -> bool:
    value = str(options.get("includeTimestamp", "false")).strip().lower()
    if value not in ("true", "false"):
        raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1297")
    return value == "true"


class TextSocketSource(ReceiverSource):
    default_ack_mode = "interval"
    retry_failed_writes = True     # a line read cannot be refused: retry until it is logged

    def __init__(self, context, options, schema: StructType):
        self.host = options["host"]
        self.port = int(options["port"])
        self.include_timestamp = _include_timestamp(options)
        super().__init__(context, options, schema)
        self._stopping = threading.Event()
        try:
            # as Spark's: the connection is made when the query starts, and a refused one fails it
            self._socket = socket.create_connection((self.host, self.port), timeout=30)
        except BaseException:
            self.stop_log()
            raise
        self._socket.settimeout(0.5)
        self._thread = threading.Thread(target=self._receive, daemon=True, name=f"{self} receiver")
        self._thread.start()

    def _records(self, lines: list[str]) -> pa.Table:
        columns = {"value": pa.array(lines, pa.string())}
        if self.include_timestamp:
            now_us = int(time.time() * 1_000_000)
            columns["timestamp"] = pa.array([now_us] * len(lines), pa.timestamp("us", tz="UTC"))
        return pa.table(columns)

    def _wait_for_admission(self, n: int) -> bool:
        """Hold the reader while the receiver cannot take ``n`` lines; False when stopping."""
        while not self._stopping.is_set():
            try:
                self.admit(n)
                return True
            except Backpressure as e:
                self._stopping.wait(min(e.retry_after, 0.5))
        return False

    def _receive(self) -> None:
        lines = LineSplitter()
        try:
            while not self._stopping.is_set():
                try:
                    chunk = self._socket.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    if not self._stopping.is_set():
                        log.warning("%s: the connection failed; no more lines are read", self)
                    return
                if not chunk:
                    log.info("Stream closed by %s:%d", self.host, self.port)
                    last = lines.end()   # Spark's readLine gives the last line without its ending
                    if last:
                        self._take(last)
                    return
                complete = lines.feed(chunk)
                if complete:
                    self._take(complete)
        except Exception:  # the reader thread must not die silently
            log.exception("%s: the receiver failed", self)

    def _take(self, lines: list[bytes]) -> None:
        rate = self.rate_limit      # maxRate, or backpressure's rate: a tenth of a second a step
        if self.options.ack_mode == "record":
            step = 1
        elif rate is not None:
            step = max(1, rate // 10)
        else:
            step = len(lines)
        for i in range(0, len(lines), step):
            part = lines[i:i + step]
            if not self._wait_for_admission(len(part)):
                return
            self.writer.submit(self._records([p.decode("utf-8", errors="replace") for p in part]))

    def stop_receiver(self) -> None:
        self._stopping.set()
        try:
            self._socket.close()
        except OSError:
            pass
        self._thread.join(5)

    def __str__(self) -> str:
        return f"TextSocketV2[host: {self.host}, port: {self.port}]"


class TextSocketSourceProvider(SourceProvider):
    short_name = "socket"

    def resolve_schema(self, spark, options, user_schema):
        if "host" not in options:
            raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1295")
        if "port" not in options:
            raise spark_internals.spark_error("AnalysisException", "_LEGACY_ERROR_TEMP_1296")
        if user_schema is not None:
            raise AnalysisException(
                "The socket source does not support a user-specified schema: its schema is "
                "value STRING (with includeTimestamp, and timestamp TIMESTAMP). Remove the "
                ".schema(...) call.")
        try:
            port = int(str(options["port"]).strip())
        except ValueError:
            raise AnalysisException(
                f"Invalid value '{options['port']}' for option 'port': expected a port number.") from None
        if not 0 < port < 65536:
            raise AnalysisException(f"Invalid value '{port}' for option 'port': use 1 to 65535.")
        ReceiverOptions.parse(options, TextSocketSource.default_ack_mode, backpressure_confs(spark))
        return SCHEMA_TIMESTAMP if _include_timestamp(options) else SCHEMA_REGULAR

    def create(self, context, options, schema):
        return TextSocketSource(context, options, schema)
