"""Listener events and the bus that delivers them.

The events carry Spark's fields. Delivery is asynchronous on one daemon thread,
in posting order, so a slow listener never holds up a batch (Spark's
StreamingQueryListenerBus); ``wait_until_empty`` lets tests wait for delivery.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueryStartedEvent:
    id: str
    runId: str
    name: str | None
    timestamp: str


@dataclass(frozen=True)
class QueryProgressEvent:
    progress: dict


@dataclass(frozen=True)
class QueryIdleEvent:
    id: str
    runId: str
    timestamp: str


@dataclass(frozen=True)
class QueryTerminatedEvent:
    id: str
    runId: str
    exception: str | None
    errorClassOnException: str | None = None


class StreamingQueryListener:
    """Subclass and override the callbacks you need (PySpark's method names)."""

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        pass

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass


_CALLBACKS = {QueryStartedEvent: "onQueryStarted", QueryProgressEvent: "onQueryProgress",
              QueryIdleEvent: "onQueryIdle", QueryTerminatedEvent: "onQueryTerminated"}


class ListenerBus:
    def __init__(self):
        self._listeners: list[Any] = []
        self._lock = threading.Lock()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread: threading.Thread | None = None

    def add(self, listener: Any) -> None:
        with self._lock:
            self._listeners.append(listener)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="microbatch-listener-bus",
                                                daemon=True)
                self._thread.start()

    def remove(self, listener: Any) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def post(self, event: Any) -> None:
        with self._lock:
            if not self._listeners:
                return
        self._queue.put(event)

    def wait_until_empty(self, timeout: float = 10.0) -> bool:
        """Block until every posted event was delivered."""
        done = threading.Event()
        with self._lock:
            if self._thread is None:
                return True
        self._queue.put(done)
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if isinstance(event, threading.Event):
                event.set()
                continue
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                callback = getattr(listener, _CALLBACKS[type(event)], None)
                if callback is None:
                    continue
                try:
                    callback(event)
                except Exception:
                    log.exception("Listener %s threw an exception handling %s",
                                  listener, type(event).__name__)
