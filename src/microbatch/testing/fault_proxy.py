"""A fault proxy for tests: a TCP proxy on 127.0.0.1 in front of a real server (moto's
S3, the Tansu broker) that breaks the connection the way networks and stores break it.

    with FaultProxy(upstream_port, http=True) as proxy:      # proxy.url: "http://127.0.0.1:<port>"
        proxy.inject(Fault.error(503), times=2, method="PUT")   # S3's SlowDown, twice
        proxy.inject(Fault.reset_after_forward(), path=r"/offsets/3$")  # outcome unknown
        proxy.outage(5)                                         # nothing answers for 5 s

Two modes:

- ``http=True`` (S3): the proxy reads each HTTP/1.1 request whole (it answers
  ``Expect: 100-continue`` itself) and picks its fate from the injected rules, first
  match first: pass, ``delay(s)``, ``error(500|503)`` (S3's ``InternalError`` /
  ``SlowDown`` XML bodies), ``reset()`` (connection reset before the request reaches the
  server), ``reset_after_forward()`` (the server got the request and answered; the client
  gets a reset: the outcome is unknown to it) or ``hang()`` (no answer until the client
  gives up). ``latency`` is added to every request. ``requests`` records what came by.
- raw TCP (the broker): bytes are pumped both ways; ``latency`` delays each chunk,
  ``blackhole()`` holds every byte (connections stay open, nothing answers),
  ``drop_connections()`` resets every live connection.

In both, ``outage(seconds)`` is a full outage: the listening port is closed (connections
are refused), live connections are reset, and after ``seconds`` it listens again on the
same port. Test tooling only: threads, no TLS, one request at a time per connection.
"""
from __future__ import annotations

import random
import re
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fault:
    """What happens to a request (HTTP mode); build with the class methods."""
    kind: str                     # pass, delay, error, reset, reset_after_forward, hang
    status: int = 0
    seconds: float = 0.0

    @classmethod
    def delay(cls, seconds: float) -> "Fault":
        return cls("delay", seconds=seconds)

    @classmethod
    def error(cls, status: int = 503) -> "Fault":
        if status not in _S3_ERRORS:
            raise ValueError(f"Fault.error takes one of {sorted(_S3_ERRORS)}, not {status}")
        return cls("error", status=status)

    @classmethod
    def reset(cls) -> "Fault":
        return cls("reset")

    @classmethod
    def reset_after_forward(cls) -> "Fault":
        return cls("reset_after_forward")

    @classmethod
    def hang(cls) -> "Fault":
        return cls("hang")


_S3_ERRORS = {500: ("Internal Server Error", "InternalError",
                    "We encountered an internal error. Please try again."),
              503: ("Slow Down", "SlowDown", "Please reduce your request rate.")}


@dataclass
class _Rule:
    fault: Fault
    times: int | None             # None: until cleared
    method: str | None
    path: re.Pattern | None
    chance: float = 1.0
    hits: int = 0


@dataclass
class Request:
    """A request the proxy saw (HTTP mode) and what it did with it."""
    method: str
    path: str
    headers: dict[str, str]
    fault: str = "pass"
    body: bytes = field(default=b"", repr=False)


class FaultProxy:
    def __init__(self, upstream_port: int, *, http: bool = False, upstream_host: str = "127.0.0.1",
                 port: int = 0, seed: int = 0):
        self.upstream = (upstream_host, upstream_port)
        self._random = random.Random(seed)        # for rules with a chance
        self.http = http
        self.latency = 0.0
        self.requests: list[Request] = []
        self.dropped = 0                          # connections reset by drop_connections/outage
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._closed = threading.Event()
        self._open_port = threading.Event()       # set while listening
        self._down_until = 0.0
        self._blackhole = threading.Event()       # set: hold every byte (TCP mode)
        self._listener = self._listen(port)
        self.port = self._listener.getsockname()[1]
        self._open_port.set()
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()

    # -- what tests use ----------------------------------------------------------
    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def inject(self, fault: Fault, *, times: int | None = 1, method: str | None = None,
               path: str | None = None, chance: float = 1.0) -> None:
        """Apply ``fault`` to the next ``times`` requests (``None``: every one until
        ``clear()``) whose method is ``method`` and whose path matches the regex ``path``;
        with ``chance`` < 1, to each such request with that probability (the proxy's
        ``seed`` draws)."""
        if not self.http:
            raise ValueError("inject() needs an HTTP proxy (FaultProxy(..., http=True))")
        with self._lock:
            self._rules.append(_Rule(fault, times, method and method.upper(),
                                     re.compile(path) if path else None, chance))

    def clear(self) -> None:
        """Remove every rule, end a blackhole and an outage; latency back to 0."""
        with self._lock:
            self._rules.clear()
        self.latency = 0.0
        self._blackhole.clear()
        self._down_until = 0.0

    def outage(self, seconds: float) -> None:
        """Refuse connections and reset live ones for ``seconds`` (returns at once)."""
        self._down_until = time.monotonic() + seconds
        self._close_listener()
        self.drop_connections()

    def blackhole(self, on: bool = True) -> None:
        """Hold every byte both ways (connections stay open, nothing answers)."""
        if on:
            self._blackhole.set()
        else:
            self._blackhole.clear()

    def drop_connections(self) -> None:
        """Reset every live connection now."""
        with self._lock:
            live = list(self._connections)
            self.dropped += len(live)
        for sock in live:
            _reset(sock)

    def close(self) -> None:
        self._closed.set()
        self._close_listener()
        self.drop_connections()
        self._thread.join(5)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- listening ---------------------------------------------------------------
    @staticmethod
    def _listen(port: int) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        listener.settimeout(0.05)
        return listener

    def _close_listener(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            self._open_port.clear()
        if listener is not None:
            try:        # Linux stops listening at once (a close waits out a blocked accept)
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            if self._listener is None:
                if time.monotonic() < self._down_until:
                    time.sleep(0.02)
                    continue
                try:
                    listener = self._listen(self.port)
                except OSError:
                    time.sleep(0.05)
                    continue
                with self._lock:
                    self._listener = listener
                    self._open_port.set()
            listener = self._listener
            try:
                client, _ = listener.accept()
            except (socket.timeout, OSError, AttributeError):
                continue
            client.settimeout(None)
            self._track(client)
            handler = self._serve_http if self.http else self._serve_tcp
            threading.Thread(target=self._run, args=(handler, client), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.add(sock)

    def _run(self, handler, client: socket.socket) -> None:
        upstream: list[socket.socket] = []
        try:
            handler(client, upstream)
        except OSError:
            pass
        finally:
            for sock in [client, *upstream]:
                with self._lock:
                    self._connections.discard(sock)
                try:
                    sock.close()
                except OSError:
                    pass

    def _connect_upstream(self, upstream: list[socket.socket]) -> socket.socket:
        sock = socket.create_connection(self.upstream, timeout=30)
        sock.settimeout(None)
        self._track(sock)
        upstream.append(sock)
        return sock

    # -- raw TCP -----------------------------------------------------------------
    def _serve_tcp(self, client: socket.socket, upstream: list[socket.socket]) -> None:
        try:
            server = self._connect_upstream(upstream)
        except OSError:
            _reset(client)
            return
        back = threading.Thread(target=self._pump, args=(server, client), daemon=True)
        back.start()
        self._pump(client, server)
        back.join()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while self._blackhole.is_set() and not self._closed.is_set():
                    time.sleep(0.02)
                if self.latency:
                    time.sleep(self.latency)
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):      # one side gone: the other goes too
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- HTTP --------------------------------------------------------------------
    def _serve_http(self, client: socket.socket, upstream: list[socket.socket]) -> None:
        reader = client.makefile("rb")
        server = server_reader = None
        while True:
            head = _read_head(reader)
            if head is None:
                return
            request_line, headers = head
            method, target, _ = request_line.split(" ", 2)
            if headers.get("expect", "").lower() == "100-continue":
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = _read_body(reader, headers)
            request = Request(method, target.split("?", 1)[0], headers, body=body)
            fault = self._fault_for(request)
            request.fault = fault.kind
            self.requests.append(request)
            if self.latency:
                time.sleep(self.latency)
            if fault.kind == "delay":
                time.sleep(fault.seconds)
            elif fault.kind == "reset":
                _reset(client)
                return
            elif fault.kind == "hang":
                while client.recv(65536):       # until the client gives up
                    pass
                return
            elif fault.kind == "error":
                client.sendall(_error_response(fault.status, request.path, method))
                continue
            if server is None:
                server = self._connect_upstream(upstream)
                server_reader = server.makefile("rb")
            server.sendall(_forwarded(request_line, headers, body))
            response, keep_alive = _read_response(server_reader, method)
            if fault.kind == "reset_after_forward":
                _reset(client)
                return
            client.sendall(response)
            if not keep_alive:
                server.close()
                server = None
            if headers.get("connection", "").lower() == "close":
                return

    def _fault_for(self, request: Request) -> Fault:
        with self._lock:
            for rule in self._rules:
                if rule.times is not None and rule.hits >= rule.times:
                    continue
                if rule.method and rule.method != request.method:
                    continue
                if rule.path and not rule.path.search(request.path):
                    continue
                if rule.chance < 1.0 and self._random.random() >= rule.chance:
                    continue
                rule.hits += 1
                return rule.fault
        return Fault("pass")


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a peer that crashed or a middlebox does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _read_head(reader) -> tuple[str, "_Headers"] | None:
    """The first line and headers of a message; None at the end of the stream."""
    line = reader.readline()
    while line in (b"\r\n", b"\n"):
        line = reader.readline()
    if not line:
        return None
    raw: list[tuple[str, str]] = []
    while True:
        header = reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        raw.append((name.strip(), value.strip()))
    return line.decode("latin-1").rstrip("\r\n"), _Headers(raw)


class _Headers(dict):
    """Headers looked up by lower-cased name, kept in their order and spelling to forward."""

    def __init__(self, raw: list[tuple[str, str]]):
        super().__init__((name.lower(), value) for name, value in raw)
        self.raw = raw


def _read_body(reader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = reader.readline()
            out += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:                      # trailers, then the empty line
                    trailer = reader.readline()
                    out += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return bytes(out)
            out += reader.read(size + 2)
    length = int(headers.get("content-length", "0") or 0)
    return reader.read(length) if length else b""


def _forwarded(request_line: str, headers: "_Headers", body: bytes) -> bytes:
    lines = [request_line] + [f"{name}: {value}" for name, value in headers.raw
                              if name.lower() != "expect"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _read_response(reader, method: str) -> tuple[bytes, bool]:
    """The server's whole response (raw bytes) and whether its connection stays open."""
    while True:
        head = _read_head(reader)
        if head is None:
            raise ConnectionResetError("the server closed the connection")
        status_line, headers = head
        status = int(status_line.split(" ", 2)[1])
        raw = ("\r\n".join([status_line] + [f"{n}: {v}" for n, v in headers.raw]) + "\r\n\r\n").encode("latin-1")
        if 100 <= status < 200:
            continue                              # interim responses are the proxy's to give
        break
    keep_alive = headers.get("connection", "").lower() != "close"
    if method == "HEAD" or status in (204, 304):
        return raw, keep_alive
    if "content-length" in headers or headers.get("transfer-encoding", "").lower() == "chunked":
        return raw + _read_body(reader, headers), keep_alive
    return raw + reader.read(), False             # until the server closes


def _error_response(status: int, path: str, method: str) -> bytes:
    reason, code, message = _S3_ERRORS[status]
    request_id = uuid.uuid4().hex[:16].upper()
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{path}</Resource>"
            f"<RequestId>{request_id}</RequestId><HostId>fault-proxy</HostId></Error>").encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nx-amz-request-id: {request_id}\r\n\r\n")
    return head.encode() + (b"" if method == "HEAD" else body)     # a HEAD's answer has no body
