"""``http``: an HTTP ingest source. Senders POST records; the answer is ``200`` only once
they are in a durable block of the source's write-ahead log (docs/receivers.md).

    ss.readStream.format("http").schema("id INT, name STRING")
      .option("port", 8090).load()

The server is Starlette on uvicorn, in a thread of the driver, started when the query
starts and stopped with it. ``POST <path>`` with a body of

- JSON lines (``Content-Type: application/x-ndjson``, ``application/json`` or none): one
  JSON object a line, read into the schema's columns by Arrow's JSON reader (a missing
  field is null, an unknown one ignored);
- Arrow IPC stream (``application/vnd.apache.arrow.stream``): record batches whose
  columns are the schema's (by name; cast to its types).

Answers: ``200 {"accepted": n, "first": i}`` (``i``: the stream index of the first
record) once durable; ``400 {"error": ..., "line": k}`` naming the first bad line and
why (nothing of the request is accepted; the line itself is never logged); ``413`` over
``maxRequestBytes``; ``429`` over ``maxRate`` and ``503`` over the unconsumed bound or
when the log cannot be written, both with ``Retry-After``. A request with an
``Idempotency-Key`` header whose records are already in the log is answered ``200``
again without logging them twice, so a client may retry any request it got no answer
for.

Options: ``port`` (required; ``0`` picks a free one), ``host`` (default ``127.0.0.1``;
``0.0.0.0`` for every interface), ``path`` (default ``/``), ``maxRequestBytes`` (default
``16m``), and the receiver's: ``ackMode`` (default ``block``: a request is a block),
``blockInterval``, ``maxRecordsPerTrigger``, ``maxRate``, ``backpressure.*`` (Spark
Streaming's adaptive rate: 429 over it), ``maxUnconsumedBlocks``, ``maxUnconsumedBytes``.
"""
from __future__ import annotations

import asyncio
import io
import logging
import math
import re
import socket
import threading
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.json as pa_json
from pyspark.sql.types import StructType

from microbatch.errors import AnalysisException
from microbatch.sources.base import SourceProvider
from microbatch.sources.backpressure import Backpressure
from microbatch.sources.receiver import ReceiverSource
from microbatch.sources.receiver_blocks import arrow_schema
from microbatch.sources.receiver_options import ReceiverOptions, backpressure_confs
from microbatch.util import byte_size

if TYPE_CHECKING:   # (the web server's modules are imported when a receiver starts it)
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json", "text/plain", "")


class BadInput(Exception):
    def __init__(self, reason: str, line: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.line = line


def _arrow_reason(error: Exception) -> str:
    """Arrow's reason for a rejected line, without the line's content (some of Arrow's
    messages quote the value they could not parse)."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = re.sub(r"\s*in row \d+$", "", text)
    text = re.sub(r"(couldn't parse|could not parse)\s*:.*$", r"\1 the value", text, flags=re.I)
    return text[:300]


def parse_json_lines(body: bytes, schema: pa.Schema) -> pa.Table:
    if not body.strip():
        return schema.empty_table()
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read = pa_json.ReadOptions(use_threads=False, block_size=max(1 << 20, len(body) + 1))
    try:
        table = pa_json.read_json(io.BytesIO(body), read_options=read, parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        # find the first bad line and say why, one line at a time
        for number, line in enumerate(body.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                pa_json.read_json(io.BytesIO(line), read_options=read, parse_options=options)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise BadInput(f"line {number} is not a JSON object of the stream's schema "
                               f"({_arrow_reason(e)})", number) from None
        raise BadInput("the body is not JSON lines of the stream's schema") from None
    return table.select(schema.names)


def parse_arrow_stream(body: bytes, schema: pa.Schema) -> pa.Table:
    try:
        table = pa.ipc.open_stream(body).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInput(f"the body is not an Arrow IPC stream ({_arrow_reason(e)})") from None
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise BadInput(f"the Arrow stream has no column {', '.join(missing)}; the stream's columns "
                       f"are {', '.join(schema.names)}")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise BadInput(f"the Arrow stream's columns cannot be cast to the stream's schema "
                       f"({_arrow_reason(e)})") from None


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class HttpIngestSource(ReceiverSource):
    def __init__(self, context, options, schema: StructType):
        self.host = options.get("host", "127.0.0.1")
        self.port = int(options["port"])
        self.path = options.get("path", "/")
        self.max_request_bytes = byte_size(options.get("maxRequestBytes", "16m"))
        super().__init__(context, options, schema)
        self._pending: dict[str, Any] = {}
        self._pending_lock = threading.Lock()
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))   # a port in use fails the query's start
            except OSError as e:
                sock.close()
                raise AnalysisException(
                    f"The http source cannot listen on {self.host}:{self.port} ({e.strerror}). "
                    "Choose a free port with option('port', ...), or stop what holds it.") from None
            self.port = sock.getsockname()[1]
            import uvicorn
            from starlette.applications import Starlette
            from starlette.routing import Route
            app = Starlette(routes=[Route(self.path, self._ingest, methods=["POST"])])
            config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                            daemon=True, name=f"{self} server")
            self._thread.start()
            while not self._server.started and self._thread.is_alive():
                self._thread.join(0.02)
        except BaseException:
            self.stop_log()
            raise
        log.info("%s listening on http://%s:%d%s", self, self.host, self.port, self.path)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def _parse(self, body: bytes, content_type: str) -> pa.Table:
        if content_type == ARROW_STREAM:
            return parse_arrow_stream(body, self._arrow_schema)
        if content_type in JSON_TYPES:
            return parse_json_lines(body, self._arrow_schema)
        raise BadInput(f"unknown Content-Type '{content_type[:100]}': send JSON lines "
                       f"(application/x-ndjson) or an Arrow IPC stream ({ARROW_STREAM})")

    async def _ingest(self, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse
        key = request.headers.get("idempotency-key")
        if key is not None:
            first = self.durable_first(key)
            if first is not None:
                return JSONResponse({"first": first, "duplicate": True})
            with self._pending_lock:
                pending = self._pending.get(key)
            if pending is not None:
                return await self._answer(pending, None)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_request_bytes:
            return JSONResponse({"error": f"the body is over maxRequestBytes ({self.max_request_bytes})"},
                                status_code=413)
        body = await request.body()
        if len(body) > self.max_request_bytes:
            return JSONResponse({"error": f"the body is over maxRequestBytes ({self.max_request_bytes})"},
                                status_code=413)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            table = await run_in_threadpool(self._parse, body, content_type)
        except BadInput as e:
            answer: dict[str, Any] = {"error": e.reason}
            if e.line is not None:
                answer["line"] = e.line
            return JSONResponse(answer, status_code=400)
        if table.num_rows == 0:
            return JSONResponse({"accepted": 0})
        try:
            self.admit(table.num_rows)
        except Backpressure as e:
            return JSONResponse({"error": e.reason}, status_code=e.status, headers=_retry_after(e.retry_after))
        submission = self.writer.submit(table, key)
        if key is not None:
            with self._pending_lock:
                self._pending[key] = submission.future
            submission.future.add_done_callback(lambda _f: self._forget(key))
        return await self._answer(submission.future, table.num_rows)

    def _forget(self, key: str) -> None:
        with self._pending_lock:
            self._pending.pop(key, None)

    async def _answer(self, future, rows: int | None) -> Response:
        from starlette.responses import JSONResponse
        try:
            first = await asyncio.wrap_future(future)
        except Backpressure as e:
            return JSONResponse({"error": e.reason}, status_code=e.status, headers=_retry_after(e.retry_after))
        answer = {"accepted": rows, "first": first} if rows is not None else {"first": first, "duplicate": True}
        return JSONResponse(answer)

    def stop_receiver(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def __str__(self) -> str:
        return f"HttpIngest[host: {self.host}, port: {self.port}, path: {self.path}]"


class HttpIngestSourceProvider(SourceProvider):
    short_name = "http"

    def resolve_schema(self, spark, options, user_schema):
        if user_schema is None:
            raise AnalysisException(
                "The http source needs the schema of the records it takes: add "
                ".schema(\"id INT, name STRING\") (a DDL string or a StructType) before load().")
        if "port" not in options:
            raise AnalysisException("Set a port to listen on with option(\"port\", ...) (0 picks a free one).")
        try:
            port = int(str(options["port"]).strip())
        except ValueError:
            raise AnalysisException(
                f"Invalid value '{options['port']}' for option 'port': expected a port number.") from None
        if not 0 <= port < 65536:
            raise AnalysisException(f"Invalid value '{port}' for option 'port': use 0 to 65535.")
        if not str(options.get("path", "/")).startswith("/"):
            raise AnalysisException(f"Invalid value '{options['path']}' for option 'path': it must "
                                    "start with '/'.")
        byte_size(options.get("maxRequestBytes", "16m"))
        try:
            arrow_schema(user_schema)
        except (TypeError, ValueError) as e:
            raise AnalysisException(f"The http source cannot take records of this schema ({e}). "
                                    "Use columns of atomic types, arrays, maps or structs.") from None
        ReceiverOptions.parse(options, HttpIngestSource.default_ack_mode, backpressure_confs(spark))
        return user_schema

    def create(self, context, options, schema):
        return HttpIngestSource(context, options, schema)
