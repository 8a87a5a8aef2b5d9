"""Clients of an ``http`` source for the crash tests and the chaos runner.

A ``Sender`` thread POSTs numbered records (``{"id": ..., "client": ...}`` JSON lines) in
requests of 1-5 records, each with an ``Idempotency-Key``, and retries a request (same
key, same records) until it is answered 200: after connection errors (the query was
killed) and after 429/503 (it waits the ``Retry-After``). What it was answered 200 for is
in ``acked``; a query that is exactly once has each of them in its sink once.
Standard library only (``urllib``), so the runner needs nothing the engine does not.
"""
from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request


class Sender(threading.Thread):
    """Sends ids ``client * 1_000_000 + 0, 1, ...`` until ``stop`` is set; the request in
    flight then is still retried until acknowledged (or ``deadline``, a monotonic time,
    passes: ``error`` says so)."""

    def __init__(self, client: int, url: str, seed: float, deadline: float, pause_s: float = 0.03):
        super().__init__(daemon=True, name=f"ingest client {client}")
        self.client, self.url, self.deadline, self.pause_s = client, url, deadline, pause_s
        self.rng = random.Random(seed)
        self.acked: list[int] = []
        self.stop = threading.Event()
        self.error: str | None = None
        self.retries = 0
        self.duplicates = 0

    def _post(self, body: bytes, key: str) -> tuple[int, dict, float]:
        request = urllib.request.Request(self.url, data=body, method="POST", headers={
            "Content-Type": "application/x-ndjson", "Idempotency-Key": key})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read() or b"{}"), 0.0
        except urllib.error.HTTPError as e:
            return e.code, {}, float(e.headers.get("Retry-After") or 1)

    def run(self) -> None:
        next_id, seq = self.client * 1_000_000, 0
        while not self.stop.is_set():
            ids = list(range(next_id, next_id + self.rng.randint(1, 5)))
            body = "".join(json.dumps({"id": i, "client": self.client}) + "\n" for i in ids).encode()
            key = f"c{self.client}-{seq}"
            while True:
                if time.monotonic() > self.deadline:
                    self.error = f"client {self.client}: the deadline passed with request {key} unacknowledged"
                    return
                try:
                    status, answer, retry_after = self._post(body, key)
                # refused, reset, timed out, an answer cut off (IncompleteRead): the query is down
                except (OSError, ValueError, http.client.HTTPException):
                    self.retries += 1
                    time.sleep(0.1)
                    continue
                if status == 200:
                    self.duplicates += bool(answer.get("duplicate"))
                    break
                if status in (429, 503):
                    self.retries += 1
                    time.sleep(min(1.0, retry_after))
                    continue
                self.error = f"client {self.client}: answer {status} to request {key}"
                return
            self.acked.extend(ids)
            next_id += len(ids)
            seq += 1
            time.sleep(self.rng.uniform(0.0, self.pause_s))


def start_senders(url: str, clients: int, rng: random.Random, deadline: float) -> list[Sender]:
    senders = [Sender(c, url, rng.random(), deadline) for c in range(clients)]
    for s in senders:
        s.start()
    return senders


def stop_senders(senders: list[Sender], timeout: float = 60) -> list[int]:
    """Stop sending, wait for the requests in flight to be acknowledged; every acked id.
    Raises if a sender failed or did not finish."""
    for s in senders:
        s.stop.set()
    for s in senders:
        s.join(timeout)
    problems = [s.error or f"client {s.client} did not finish" for s in senders if s.error or s.is_alive()]
    if problems:
        raise RuntimeError("; ".join(problems))
    return [i for s in senders for i in s.acked]
