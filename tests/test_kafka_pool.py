"""Kafka clients kept between tasks (``microbatch.kafka.pool``), as Spark's executors keep
theirs: the source's reads and the sink's writes through pooled clients on a real broker
(Tansu), run in this process as a worker would run them. A pooled consumer reads any
range of its partition, earlier ones too; a read that fails closes its consumer; idle
clients go past the timeout or the capacity."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from helpers import wait_for
from microbatch.kafka.pool import CONSUMERS, PRODUCERS, ClientPool
from microbatch.kafka.data_loss import KafkaDataLoss
from microbatch.kafka.sink import _write_task
from microbatch.kafka.tasks import OffsetRange, read_ranges

POOLING = (64, 300.0)


@pytest.fixture
def topic(broker):
    name = f"pool-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, 1)
    broker.produce(name, [(f"v{i}".encode(), None, 0) for i in range(30)])
    return name


def config(broker) -> dict:
    return {"bootstrap.servers": broker.bootstrap, "group.id": f"pool-test-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False, "auto.offset.reset": "error", "fetch.wait.max.ms": "10"}


def values(batches) -> list[str]:
    return [v.decode() for b in batches for v in b.column("value").to_pylist()]


def test_a_pooled_consumer_reads_later_and_earlier_ranges_of_its_partition(broker, topic):
    settings = config(broker)
    CONSUMERS.clear()
    created, reused = CONSUMERS.created, CONSUMERS.reused
    read = [values(read_ranges(settings, [OffsetRange(topic, 0, a, b)], False, True, 10_000, pooling=POOLING))
            for a, b in ((0, 10), (10, 25), (3, 7), (25, 30))]
    assert read == [[f"v{i}" for i in range(a, b)] for a, b in ((0, 10), (10, 25), (3, 7), (25, 30))]
    assert CONSUMERS.created - created == 1 and CONSUMERS.reused - reused == 3
    assert CONSUMERS.idle() == 1
    # the same reads without the pool give the same records
    assert values(read_ranges(settings, [OffsetRange(topic, 0, 3, 7)], False, True, 10_000)) == read[2]
    CONSUMERS.clear()
    assert CONSUMERS.idle() == 0


def test_a_read_that_fails_closes_its_consumer_instead_of_giving_it_back(broker, topic):
    settings = config(broker)
    CONSUMERS.clear()
    with pytest.raises(KafkaDataLoss, match="COULD_NOT_READ_OFFSET_RANGE"):
        list(read_ranges(settings, [OffsetRange(topic, 0, 20, 40)], False, True, 10_000, pooling=POOLING))
    assert CONSUMERS.idle() == 0
    created = CONSUMERS.created
    assert values(read_ranges(settings, [OffsetRange(topic, 0, 28, 30)], False, True, 10_000,
                              pooling=POOLING)) == ["v28", "v29"]
    assert CONSUMERS.created == created + 1      # a new one, not the failed read's
    CONSUMERS.clear()


def test_idle_clients_go_past_the_timeout_and_past_the_capacity():
    closed = []
    pool = ClientPool(closed.append)
    made = iter(range(100))
    a = pool.take("a", lambda: f"client{next(made)}", 2, 300)
    b = pool.take("b", lambda: f"client{next(made)}", 2, 300)
    c = pool.take("a", lambda: f"client{next(made)}", 2, 300)
    for key, client in (("a", a), ("b", b), ("a", c)):
        pool.give_back(key, client, 2, 300)
    assert closed == ["client0"] and pool.idle() == 2          # capacity 2: the longest idle went
    assert pool.take("a", lambda: "new", 2, 300) == "client2"  # the same key's idle client
    pool.give_back("a", "client2", 2, 0.0)                     # timeout 0: every idle one is stale
    assert sorted(closed) == ["client0", "client1", "client2"] and pool.idle() == 0


def test_the_evictor_closes_idle_clients_past_the_timeout_without_another_task():
    closed = []
    pool = ClientPool(closed.append, evict_every_s=0.05)
    pool.give_back("a", pool.take("a", lambda: "client", 64, 0.2), 64, 0.2)
    assert closed == [] and pool.idle() == 1
    wait_for(lambda: closed, 5, "the evictor to close the idle client")
    assert closed == ["client"] and pool.idle() == 0


def test_the_sinks_tasks_share_a_producer_and_a_failed_write_drops_it(broker):
    name = f"pool-sink-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, 1)
    settings = {"bootstrap.servers": broker.bootstrap, "batch.num.messages": 1, "linger.ms": 0}
    PRODUCERS.clear()
    created, reused = PRODUCERS.created, PRODUCERS.reused
    for start in (0, 5):
        rows = pa.RecordBatch.from_pydict({"value": [f"r{i}".encode() for i in range(start, start + 5)]})
        out = list(_write_task(settings, name, None, 30.0, POOLING)(iter([rows])))
        assert out[0].column("rows").to_pylist() == [5]
    assert PRODUCERS.created - created == 1 and PRODUCERS.reused - reused == 1 and PRODUCERS.idle() == 1
    assert broker.latest_offsets(name) == {0: 10}

    bad = pa.RecordBatch.from_pydict({"value": [b"x"], "topic": pa.array([None], pa.string())})
    with pytest.raises(ValueError, match="KAFKA_NULL_TOPIC_IN_DATA"):
        list(_write_task(settings, None, None, 30.0, POOLING)(iter([bad])))
    assert PRODUCERS.idle() == 0       # the failed task's producer was not given back
    PRODUCERS.clear()
