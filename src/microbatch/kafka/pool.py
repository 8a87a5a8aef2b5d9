"""Kafka clients kept in each Python worker between tasks, as Spark keeps them in each
executor: its source's consumers in a pool keyed by the consumer's settings and the
topic-partition (``KafkaDataConsumer``: ``spark.kafka.consumer.cache.capacity``, 64, and
``spark.kafka.consumer.cache.timeout``, 5m), its sink's producers keyed by their settings
(``CachedKafkaProducer``: ``spark.kafka.producer.cache.timeout``, 10m).

A new librdkafka client costs a connection, metadata and, for a consumer, a first fetch:
17-41 ms for a consumer and 5-10 ms for a producer measured here (benchmarks/RESULTS.md),
paid by every task of every batch without the pool. PySpark reuses its Python workers
(``spark.python.worker.reuse``), so a module-level pool lives as long as the worker.

A client is taken out of the pool for one task and given back when the task is done
with it; a client whose task failed is closed instead (its state is unknown, as Spark
marks such a consumer for close). Idle clients past the timeout are closed, and past the
capacity the longest idle first, whenever a client is taken or given back, and by an
evictor thread every minute (Spark's ``evictorThreadRunInterval``, 1m), so a worker that
runs no more Kafka tasks does not keep them: an idle librdkafka client whose broker has
gone tries to reconnect (and logs it) many times a second.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from microbatch.util import time_string_as_ms

CONSUMER_CAPACITY = ("spark.kafka.consumer.cache.capacity", "64")
CONSUMER_TIMEOUT = ("spark.kafka.consumer.cache.timeout", "5m")
PRODUCER_TIMEOUT = ("spark.kafka.producer.cache.timeout", "10m")


class ClientPool:
    """Idle clients by key, each with the time it was given back."""

    def __init__(self, close: Callable[[Any], None], evict_every_s: float = 60.0):
        self._close = close
        self._idle: dict[Hashable, list[tuple[Any, float]]] = {}
        self._lock = threading.Lock()
        self._evict_every_s = evict_every_s
        self._limits = (1 << 30, float("inf"))     # the last (capacity, timeout) given
        self._evictor: threading.Thread | None = None
        #: clients made and clients taken from the pool, for tests and metrics
        self.created = 0
        self.reused = 0

    def take(self, key: Hashable, make: Callable[[], Any], capacity: int, timeout_s: float) -> Any:
        with self._lock:
            stale = self._expired(capacity, timeout_s)
            idle = self._idle.get(key)
            client = idle.pop()[0] if idle else None
            if idle == []:
                del self._idle[key]
        self._close_all(stale)
        if client is not None:
            self.reused += 1
            return client
        self.created += 1
        return make()

    def give_back(self, key: Hashable, client: Any, capacity: int, timeout_s: float) -> None:
        with self._lock:
            self._idle.setdefault(key, []).append((client, time.monotonic()))
            self._limits = (capacity, timeout_s)
            stale = self._expired(capacity, timeout_s)
            if self._evictor is None:
                self._evictor = threading.Thread(target=self._evict, name="kafka client pool evictor",
                                                 daemon=True)
                self._evictor.start()
        self._close_all(stale)

    def _evict(self) -> None:
        while True:
            time.sleep(self._evict_every_s)
            with self._lock:
                stale = self._expired(*self._limits)
            self._close_all(stale)

    def discard(self, client: Any) -> None:
        self._close_all([client])

    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def clear(self) -> None:
        with self._lock:
            stale = [c for clients in self._idle.values() for c, _ in clients]
            self._idle.clear()
        self._close_all(stale)

    def _expired(self, capacity: int, timeout_s: float) -> list:
        """Take out (under the lock) the idle clients past the timeout, then the longest
        idle ones past the capacity."""
        now = time.monotonic()
        entries = sorted(((since, key, client) for key, clients in self._idle.items()
                          for client, since in clients), key=lambda e: e[0])
        over = max(0, len(entries) - max(0, capacity))
        gone = [e for i, e in enumerate(entries) if i < over or now - e[0] > timeout_s]
        for _since, key, client in gone:
            self._idle[key] = [(c, s) for c, s in self._idle[key] if c is not client]
            if not self._idle[key]:
                del self._idle[key]
        return [client for _, _, client in gone]

    def _close_all(self, clients: list) -> None:
        for client in clients:
            try:
                self._close(client)
            except Exception:  # noqa: BLE001 (closing a broken client must not fail a task)
                pass


def _close_consumer(consumer) -> None:
    consumer.close()


def _close_producer(producer) -> None:
    producer.flush(0)    # nothing is pending (a producer is given back flushed); drop it


#: this worker's consumers and producers
CONSUMERS = ClientPool(_close_consumer)
PRODUCERS = ClientPool(_close_producer)


def settings_key(config: dict) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in config.items()))


def pool_settings(conf_get: Callable[[str, str], str], capacity: tuple[str, str] | None,
                  timeout: tuple[str, str]) -> tuple[int, float]:
    """(capacity, timeout in seconds) from the session's conf, read on the driver."""
    cap = int(conf_get(*capacity)) if capacity else 1 << 30
    return cap, time_string_as_ms(conf_get(*timeout)) / 1000
