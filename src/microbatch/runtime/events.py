"""Listener events and the bus that delivers them (Spark's StreamingQueryListenerBus).

Listeners are users' ``pyspark.sql.streaming.StreamingQueryListener`` subclasses and the
events are PySpark's own classes. Delivery follows Spark:

- ``QueryStartedEvent`` is delivered synchronously, on the query's thread, before
  ``start()`` returns (so a listener sees a query start before anything else of it);
- the other events are delivered asynchronously, in posting order, on one daemon
  thread, so a slow listener never holds up a batch;
- an exception in a listener is logged and does not reach the query;
- ``addListener`` twice registers a listener twice; ``removeListener`` removes one
  registration (the first), and removing one that is not registered does nothing.

Each event also goes, with the same delivery, to the session's own Spark listener bus
(the manager's ``forward``: the Spark UI's streaming tab, JVM listeners, listeners of the
plain ``spark.streams``).

``wait_until_empty`` lets tests wait for delivery.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from pyspark.errors import PySparkAttributeError
from pyspark.sql.streaming.listener import (QueryIdleEvent, QueryProgressEvent,
                                            QueryStartedEvent, QueryTerminatedEvent,
                                            StreamingQueryListener)

from microbatch.errors import pyspark_error

log = logging.getLogger(__name__)

__all__ = ["ListenerBus", "QueryIdleEvent", "QueryProgressEvent", "QueryStartedEvent",
           "QueryTerminatedEvent", "StreamingQueryListener"]

_CALLBACKS = {QueryStartedEvent: "onQueryStarted", QueryProgressEvent: "onQueryProgress",
              QueryIdleEvent: "onQueryIdle", QueryTerminatedEvent: "onQueryTerminated"}


def check_listener(listener: Any) -> None:
    """PySpark fails on anything else with an ``AttributeError`` (``_jlistener``): this is
    one too, with a message that says what is expected."""
    if not isinstance(listener, StreamingQueryListener):
        raise pyspark_error(PySparkAttributeError, "NOT_EXPECTED_TYPE", {"arg_name": "listener",
                               "expected_type": "StreamingQueryListener",
                               "arg_type": type(listener).__name__})


class ListenerBus:
    """``forward``, if given, gets every event too, with the same delivery (Spark's own
    listener bus: ``spark_internals.post_to_spark_listeners``), off the batch's path."""

    def __init__(self, forward: Callable[[Any], None] | None = None):
        self._listeners: list[StreamingQueryListener] = []
        self._forward = forward
        self._lock = threading.Lock()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread: threading.Thread | None = None

    def add(self, listener: StreamingQueryListener) -> None:
        check_listener(listener)
        with self._lock:
            self._listeners.append(listener)
            self._start_thread()

    def _start_thread(self) -> None:
        """(Under the lock.)"""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="microbatch-listener-bus", daemon=True)
            self._thread.start()

    @property
    def _listener_bus(self) -> list[StreamingQueryListener]:
        """The listeners added, as PySpark's Connect ``StreamingQueryListenerBus`` names
        them (a copy: removing each while iterating removes them all)."""
        with self._lock:
            return list(self._listeners)

    def remove(self, listener: StreamingQueryListener) -> None:
        with self._lock:
            for i, registered in enumerate(self._listeners):
                if registered is listener:
                    del self._listeners[i]
                    return

    def post(self, event: Any) -> None:
        with self._lock:
            if not self._listeners and self._forward is None:
                return
            listeners = list(self._listeners)
            if not isinstance(event, QueryStartedEvent):
                self._start_thread()
        if isinstance(event, QueryStartedEvent):
            self._deliver(listeners, event, self._forward)
        else:
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
            self._deliver(listeners, event, self._forward)

    @staticmethod
    def _deliver(listeners: list[StreamingQueryListener], event: Any, forward: Callable[[Any], None] | None) -> None:
        name = _CALLBACKS[type(event)]
        for listener in listeners:
            try:
                getattr(listener, name)(event)
            except Exception:  # as Spark: a listener never fails the query
                log.exception("Listener %s threw an exception", type(listener).__name__)
        if forward is not None:
            forward(event)
