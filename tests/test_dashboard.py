"""The dashboard in a real browser (Debian's chromium, driven by Playwright), its
Prometheus endpoint, and ``microbatch ui`` over checkpoints.

``.ci/run`` installs chromium; without it these tests fail in CI and are skipped elsewhere.
``MICROBATCH_SCREENSHOT=docs/dashboard.png`` keeps a screenshot of the query page.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from helpers import wait_for
from microbatch import StreamingSession

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    if os.environ.get("CI"):
        raise RuntimeError("chromium is not installed: .ci/run installs it with apt-get")
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        yield chromium
        chromium.close()


@pytest.fixture
def dashboard(spark):
    session = StreamingSession(spark, ui_port=0)
    yield session
    session.stop()


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


#: helpers.wait_for's pace for a page (or the query behind it): every 0.2 s, for at most 90 s
PAGE = {"timeout": 90, "every": 0.2}


def windowed_counts(session, checkpoint, name):
    counts = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", 50)
              .option("startTimestamp", 1_795_000_000_000).option("advanceMillisPerBatch", 5000).load()
              .withWatermark("timestamp", "10 seconds")
              .groupBy(F.window("timestamp", "10 seconds")).count())
    return (counts.writeStream.format("noop").outputMode("update").queryName(name)
            .option("checkpointLocation", str(checkpoint)).trigger(processingTime="300 milliseconds").start())


def query_page(browser, url: str, name: str):
    """A new page on the dashboard at ``url``, opened on the query named ``name``."""
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(url)
    row = page.locator("#queries tbody tr", has_text=name)
    row.wait_for()
    row.locator("a").click()
    return page


def chart_points(page, chart: str) -> int:
    return page.evaluate(f"""() => {{
        const div = document.getElementById({json.dumps(chart)});
        return div && div.data && div.data.length ? Math.max(...div.data.map(t => (t.x || []).length)) : 0;
    }}""")


def test_the_page_draws_a_running_query_live_and_shows_a_failed_query(dashboard, browser, tmp_path):
    query = windowed_counts(dashboard, tmp_path / "counts", "counts")
    wait_for(lambda: len(query.recentProgress) >= 3, what="three batches", **PAGE)
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(dashboard.ui_url)
    row = page.locator("#queries tbody tr", has_text="counts")
    row.wait_for()
    assert "RUNNING" in row.inner_text() and query.id in row.inner_text()

    row.locator("a").click()
    page.wait_for_function("() => document.getElementById('chart-rates').data !== undefined")
    first = wait_for(lambda: chart_points(page, "chart-rates") >= 3, what="the rates chart", **PAGE)
    assert first
    for chart in ("chart-durations", "chart-input-rows", "chart-state-rows", "chart-state-memory"):
        assert chart_points(page, chart) >= 3, chart
    assert chart_points(page, "chart-watermark") >= 2   # batch 0 has no watermark yet
    phases = page.evaluate("() => document.getElementById('chart-durations').data.map(t => t.name)")
    assert phases == ["latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets"]
    state_traces = page.evaluate("() => document.getElementById('chart-state-rows').data.map(t => t.name)")
    assert state_traces == ["op 0 stateStoreSave"]
    # live: the charts grow as batches finish, without reloading the page
    drawn = chart_points(page, "chart-rates")
    wait_for(lambda: chart_points(page, "chart-rates") > drawn + 1, what="new batches on the chart", **PAGE)
    last = json.loads(page.inner_text("#last-progress"))
    assert last["id"] == query.id and last["batchId"] >= drawn
    assert "Aggregate [window]" in page.inner_text("#plan")
    if os.environ.get("MICROBATCH_SCREENSHOT"):
        page.screenshot(path=os.environ["MICROBATCH_SCREENSHOT"], full_page=True)
    query.stop()

    def fail(df, batch_id):
        raise RuntimeError("the warehouse table is read-only")

    failing = (dashboard.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
               .writeStream.foreachBatch(fail).queryName("loader")
               .option("checkpointLocation", str(tmp_path / "loader")).start())
    with pytest.raises(StreamingQueryException):
        failing.awaitTermination(60)
    page.goto(dashboard.ui_url)
    row = page.locator("#queries tbody tr", has_text="loader")
    row.wait_for()
    wait_for(lambda: "FAILED" in row.inner_text(), what="the failed status", **PAGE)
    row.locator("a").click()
    page.locator("#exception").wait_for(state="visible")
    assert "the warehouse table is read-only" in page.inner_text("#exception")
    assert page.inner_text("#query-status") == "FAILED"
    page.goto(dashboard.ui_url)
    counts_row = page.locator("#queries tbody tr", has_text="counts")
    wait_for(lambda: "FINISHED" in counts_row.inner_text(), what="the stopped query's status", **PAGE)
    page.close()


def test_the_page_draws_a_receivers_lag(dashboard, browser, tmp_path):
    """A receiver source (docs/receivers.md) reports the records logged beyond each
    batch's end; the page draws them (the chart is hidden for other sources)."""
    from test_receivers import free_port, post, wait_listening
    port = free_port()
    query = (dashboard.readStream.format("http").schema("id INT").option("port", port)
             .option("maxRecordsPerTrigger", 2).load()
             .writeStream.format("noop").queryName("ingest").option("checkpointLocation", str(tmp_path / "ingest"))
             .trigger(processingTime="300 milliseconds").start())
    wait_listening(port)
    assert post(f"http://127.0.0.1:{port}/", [{"id": i} for i in range(10)]).status_code == 200
    wait_for(lambda: len(query.recentProgress) >= 5, what="five batches of two records", **PAGE)
    page = query_page(browser, dashboard.ui_url, "ingest")
    wait_for(lambda: chart_points(page, "chart-source-lag") >= 5, what="the source lag chart", **PAGE)
    assert page.locator("#chart-source-lag").is_visible()
    assert page.evaluate("() => document.getElementById('chart-source-lag').data[0].y")[:5] == [8, 6, 4, 2, 0]
    query.stop()
    page.close()


def test_metrics_have_sparks_names_labelled_by_query(dashboard, tmp_path):
    query = windowed_counts(dashboard, tmp_path / "metrics", "metered")
    wait_for(lambda: len(query.recentProgress) >= 2, what="two batches", **PAGE)
    with urllib.request.urlopen(dashboard.ui_url + "metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    labels = {"query_name": "metered", "query_id": query.id}
    for name in ("spark_streaming_inputRate_total", "spark_streaming_processingRate_total",
                 "spark_streaming_latency", "spark_streaming_eventTime_watermark",
                 "spark_streaming_states_rowsTotal", "spark_streaming_states_usedBytes",
                 "microbatch_batch_id", "microbatch_batch_input_rows"):
        samples = [s for s in families[name].samples if s.labels == labels]
        assert len(samples) == 1, (name, families[name].samples)
    value = lambda name: [s.value for s in families[name].samples if s.labels == labels][0]  # noqa: E731
    assert value("spark_streaming_states_rowsTotal") >= 1
    assert value("spark_streaming_eventTime_watermark") > 0
    assert value("microbatch_batch_input_rows") == 50
    assert value("microbatch_trigger_interval_ms") == 300
    phases = {s.labels["phase"] for s in families["microbatch_batch_duration_ms"].samples if s.labels.get("query_id") == query.id}
    assert {"addBatch", "walCommit", "triggerExecution"} <= phases
    query.stop()
    with urllib.request.urlopen(dashboard.ui_url + "metrics", timeout=10) as response:
        text = response.read().decode()
    assert query.id not in text   # as in Spark, a query's metrics go with it


def test_microbatch_ui_serves_checkpoints_read_only(ss, browser, tmp_path):
    query = windowed_counts(ss, tmp_path / "ckpt", "from-a-checkpoint")
    wait_for(lambda: len(query.recentProgress) >= 3, what="three batches", **PAGE)
    before = sorted(os.listdir(tmp_path / "ckpt"))
    server = subprocess.Popen([sys.executable, "-m", "microbatch.cli.main", "ui", str(tmp_path / "ckpt"),
                               "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"is at (http://\S+/) ", server.stdout.readline()).group(1)
        summary = get_json(url + "api/queries")["queries"][0]
        assert summary["status"] == "RUNNING" and summary["id"] == query.id
        assert summary["name"] == "from-a-checkpoint" and summary["origin"] == "checkpoint"
        page = browser.new_page()
        page.goto(url + "#/query/" + summary["key"])
        wait_for(lambda: chart_points(page, "chart-rates") >= 3, what="the checkpoint's batches", **PAGE)
        seen = chart_points(page, "chart-rates")
        wait_for(lambda: chart_points(page, "chart-rates") > seen, what="batches the running query adds", **PAGE)
        assert page.locator("#runs tbody tr").count() == 1
        query.stop()
        wait_for(lambda: get_json(url + "api/queries")["queries"][0]["status"] == "FINISHED",
                 what="the stopped run", **PAGE)
        page.close()
    finally:
        server.terminate()
        server.wait(10)
    assert sorted(os.listdir(tmp_path / "ckpt")) == before


def test_the_page_draws_a_real_time_querys_latencies(dashboard, browser, broker, tmp_path):
    """A real-time query's record latencies (its batches' sink metrics) on their chart,
    hidden for other queries."""
    dashboard.spark.conf.set("spark.sql.streaming.realTimeMode.minBatchDuration", "1000")
    try:
        broker.create_topic("dash-rt", 2)
        broker.create_topic("dash-rt-out", 2)
        broker.produce("dash-rt", [(b"%d" % i, None, i % 2) for i in range(40)])
        query = (dashboard.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                 .option("subscribe", "dash-rt").option("startingOffsets", "earliest").load()
                 .selectExpr("CAST(value AS STRING) AS value").writeStream.format("kafka")
                 .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "dash-rt-out")
                 .option("kafka.batch.num.messages", 1).queryName("alerts").outputMode("update")
                 .option("checkpointLocation", str(tmp_path / "alerts")).trigger(realTime="1 second").start())
        wait_for(lambda: any(p.numInputRows for p in query.recentProgress), what="a batch with records", **PAGE)
        page = query_page(browser, dashboard.ui_url, "alerts")
        wait_for(lambda: chart_points(page, "chart-real-time-latency") >= 1, what="the latency chart", **PAGE)
        assert page.locator("#chart-real-time-latency").is_visible()
        names = page.evaluate("() => document.getElementById('chart-real-time-latency').data.map(t => t.name)")
        assert names == ["e2eLatencyMs.P50", "e2eLatencyMs.P99", "processingLatencyMs.P99"]
        p99 = page.evaluate("() => document.getElementById('chart-real-time-latency').data[1].y[0]")
        assert p99 >= page.evaluate("() => document.getElementById('chart-real-time-latency').data[0].y[0]") >= 0
        query.stop()
        page.close()
    finally:
        dashboard.spark.conf.unset("spark.sql.streaming.realTimeMode.minBatchDuration")
