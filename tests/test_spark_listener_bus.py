"""microbatch's query events on Spark's own streaming listener bus: the listeners of the
plain session's ``spark.streams`` (PySpark's, JVM ones named in
``spark.sql.streaming.streamingQueryListeners``) and the Spark UI's Structured Streaming tab
see microbatch's queries as they see Spark's.

The UI test runs a Spark of its own (the UI on, a JVM listener compiled here with ``javac``)
in a child process, beside the same window count on Spark's engine for comparison.
``MICROBATCH_SCREENSHOT_DIR=docs`` keeps the tab's screenshot as ``docs/spark-ui-streaming.png``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from pyspark.sql.streaming import StreamingQueryListener

from helpers import wait_for

HERE = Path(__file__).parent


class Recorder(StreamingQueryListener):
    def __init__(self):
        self.events, self.lock = [], threading.Lock()

    def _add(self, kind, event):
        with self.lock:
            self.events.append((kind, event))

    def onQueryStarted(self, event):  # noqa: N802 - PySpark's names
        self._add("started", event)

    def onQueryProgress(self, event):  # noqa: N802 - PySpark's names
        self._add("progress", event)

    def onQueryIdle(self, event):  # noqa: N802 - PySpark's names
        self._add("idle", event)

    def onQueryTerminated(self, event):  # noqa: N802 - PySpark's names
        self._add("terminated", event)

    def of(self, query_id: str) -> list:
        with self.lock:
            return [(k, e) for k, e in self.events
                    if str(getattr(e, "id", None) or e.progress.id) == query_id]


def test_a_listener_of_the_plain_session_sees_microbatchs_query(spark, ss, tmp_path):
    """A listener added to ``spark.streams`` (the wrapped session's, as a team's monitoring
    code adds it) gets the query's events from Spark's bus, with the progress microbatch
    reports; a listener added to microbatch's ``ss.streams`` gets each event once."""
    plain, own = Recorder(), Recorder()
    spark.streams.addListener(plain)
    ss.streams.addListener(own)
    try:
        query = (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
                 .writeStream.format("noop").queryName("seen_by_spark").option("checkpointLocation", str(tmp_path))
                 .trigger(processingTime="50 milliseconds").start())
        wait_for(lambda: len([k for k, _ in plain.of(query.id) if k == "progress"]) >= 3, 60, "three progress events")
        query.stop()
        wait_for(lambda: any(k == "terminated" for k, _ in plain.of(query.id)), 30, "the terminated event")
        assert ss.streams._wait_for_listeners()
    finally:
        spark.streams.removeListener(plain)
        ss.streams.removeListener(own)
    kinds = [k for k, _ in plain.of(query.id)]
    assert kinds[0] == "started" and kinds[-1] == "terminated"
    started = plain.of(query.id)[0][1]
    assert (started.id, started.runId, started.name) == (uuid.UUID(query.id), uuid.UUID(query.runId), "seen_by_spark")
    reported = {p.batchId: json.loads(p.json) for p in query.recentProgress}
    for kind, event in plain.of(query.id):
        if kind == "progress":
            got = json.loads(event.progress.json)
            assert got["runId"] == query.runId
            assert got["numInputRows"] == reported[got["batchId"]]["numInputRows"] == 5
            assert got["sources"][0]["endOffset"] == reported[got["batchId"]]["sources"][0]["endOffset"]
    # microbatch's own bus delivered each event once, not once more from Spark's
    batches = [e.progress.batchId for k, e in own.of(query.id) if k == "progress"]
    assert len(batches) == len(set(batches))


@pytest.fixture(scope="module")
def listener_classes(tmp_path_factory):
    """``CountingListener`` compiled against this PySpark's jars (javac of Java 17)."""
    javac = shutil.which("javac")
    assert javac, "javac is not installed: .ci/run installs openjdk-17-jdk-headless"
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    out = tmp_path_factory.mktemp("classes")
    subprocess.run([javac, "-cp", f"{jars}/*", "-d", str(out), str(HERE / "jvm" / "CountingListener.java")],
                   check=True, capture_output=True)
    return out


def test_the_spark_ui_a_jvm_listener_and_a_metrics_sink_see_microbatchs_queries(broker, listener_classes, tmp_path):
    broker.create_topic("ui", 2)
    broker.produce("ui", [(b"record %d" % i, None, i % 2, [], None) for i in range(200)])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(HERE / "spark_ui_child.py"), broker.bootstrap, str(listener_classes),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    queries, pages, counts = found["queries"], found["pages"], found["counts"]
    # the tab lists microbatch's two queries beside Spark's own, by name and run id
    for name, query in queries.items():
        assert name in pages["listing"] and query["runId"] in pages["listing"], (name, pages["listing"])
        # each query's statistics page: its charts of the batches it ran, as for Spark's
        assert "Streaming Query Statistics" in pages[name]
        assert query["runId"] in pages[name]
        assert "Input Rate" in pages[name] and "Operation Duration" in pages[name]
    # the JVM listener counted every query's events, microbatch's as Spark's
    for name, query in queries.items():
        assert counts.get(f"started {query['id']}") == 1, (name, counts)
        assert counts.get(f"progress {query['id']}", 0) >= 3, (name, counts)
        assert counts.get(f"terminated {query['id']}") == 1, (name, counts)
    # spark.sql.streaming.metricsEnabled: the same gauges under Spark's names in Spark's CSV sink
    for name in queries:
        assert set(found["metrics"][name]) >= {"inputRate-total", "processingRate-total", "latency",
                                               "eventTime-watermark", "states-rowsTotal", "states-usedBytes"}, name
    for name in ("microbatch_window_counts", "spark_window_counts"):
        assert found["metrics"][name]["eventTime-watermark"] > 0 and found["metrics"][name]["states-rowsTotal"] >= 1
    if os.environ.get("MICROBATCH_SCREENSHOT_DIR"):
        shutil.copy(tmp_path / "streaming-tab.png", Path(os.environ["MICROBATCH_SCREENSHOT_DIR"]) / "spark-ui-streaming.png")
