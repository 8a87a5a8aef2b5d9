"""The Grafana dashboard and the Prometheus alert rules shipped in microbatch/ops/monitoring/,
run by a real Prometheus (Debian's; ``.ci/run`` installs it) against a live ``/metrics``.

- ``promtool`` checks the rules and runs their unit tests (tests/monitoring/alerts-test.yml:
  each alert fires with its text on the series that should raise it, and stays quiet on a
  healthy query's).
- A Prometheus scrapes the dashboard's ``/metrics`` every second while two queries run: a
  window count whose watermark is weeks behind the clock, whose state grows and whose batches
  outlast a 10 ms trigger, and a Kafka query reading three records a batch from a topic
  written faster. Every rule evaluates without error, the alerts those queries should raise
  are pending (their ``for:`` is minutes: pending is the rule matching), the others are not,
  and every query of the Grafana dashboard (its variable substituted as Grafana does) returns
  the queries' series. The falling-behind rule is shown by its unit test; live, both its
  sides are among the dashboard's series. The page of the Kafka query draws its lag.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from importlib.resources import files
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from helpers import wait_for
from microbatch import StreamingSession
from test_dashboard import PAGE, browser, chart_points, get_json, query_page  # noqa: F401 (browser: a fixture)
from test_receivers import free_port

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
if PROMETHEUS is None or PROMTOOL is None:
    if os.environ.get("CI"):
        raise RuntimeError("prometheus is not installed: .ci/run installs it with apt-get")
    pytest.skip("prometheus is not installed (apt-get install prometheus)", allow_module_level=True)

MONITORING = files("microbatch.ops").joinpath("monitoring")
RULES = Path(str(MONITORING.joinpath("prometheus-alerts.yml")))
DASHBOARD = json.loads(MONITORING.joinpath("grafana-dashboard.json").read_text())
UNIT_TESTS = Path(__file__).parent / "monitoring" / "alerts-test.yml"


def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout
    tested = subprocess.run([PROMTOOL, "test", "rules", UNIT_TESTS.name], cwd=UNIT_TESTS.parent,
                            capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert of the rules file has a unit test that expects it to fire
    alerts = set(re.findall(r"- alert: (\w+)", RULES.read_text()))
    tested_alerts = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:", UNIT_TESTS.read_text()))
    assert alerts == tested_alerts, alerts ^ tested_alerts


class Prometheus:
    """A Prometheus server scraping ``target`` every second with microbatch's rules."""

    def __init__(self, workdir: Path, target: str):
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({   # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "microbatch", "metrics_path": "/metrics",
                                "static_configs": [{"targets": [target]}]}]}))
        self.log = open(workdir / "prometheus.log", "w")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(self._ready, 60, "Prometheus ready", every=0.2)

    def _ready(self) -> bool:
        assert self.process.poll() is None, (self.log.flush(), Path(self.log.name).read_text())
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def api(self, path: str, **params):
        answer = get_json(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def dashboard_queries() -> list[tuple[str, str]]:
    """Each (panel title, PromQL) of the Grafana dashboard, ``$query`` as Grafana sends it with
    the variable's "All" selected (its ``allValue``)."""
    variable = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "query")
    return [(panel["title"], target["expr"].replace("$query", variable["allValue"]))
            for panel in DASHBOARD["panels"] for target in panel["targets"]]


def test_the_rules_and_the_dashboard_on_a_live_metrics_endpoint(spark, broker, browser, tmp_path):
    session = StreamingSession(spark, ui_port=0)
    prometheus = None
    stop_writing = threading.Event()
    try:
        # weeks-old event times, windows never closed by a thousand-day watermark, a 10 ms trigger
        windows = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", 20)
                   .option("startTimestamp", 1_795_000_000_000).option("advanceMillisPerBatch", 5000).load()
                   .withWatermark("timestamp", "1000 days").groupBy(F.window("timestamp", "10 seconds")).count()
                   .writeStream.format("noop").outputMode("update").queryName("windows")
                   .option("checkpointLocation", str(tmp_path / "windows"))
                   .trigger(processingTime="10 milliseconds").start())
        broker.create_topic("monitored", 3)

        def write_faster_than_read() -> None:   # about 100 records a second; the query reads 15
            producer = broker.producer()
            while not stop_writing.wait(0.3):
                for i in range(30):
                    producer.produce("monitored", value=b"x", partition=i % 3)
                producer.flush(10)
        writer = threading.Thread(target=write_faster_than_read, daemon=True)
        writer.start()
        lagging = (session.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                   .option("subscribe", "monitored").option("startingOffsets", "earliest")
                   .option("maxOffsetsPerTrigger", 3).load()
                   .writeStream.format("noop").queryName("lagging")
                   .option("checkpointLocation", str(tmp_path / "lagging"))
                   .trigger(processingTime="200 milliseconds").start())
        wait_for(lambda: len(windows.recentProgress) >= 3 and len(lagging.recentProgress) >= 3,
                 what="both queries' first batches", **PAGE)
        target = urllib.parse.urlparse(session.ui_url).netloc
        prometheus = Prometheus(tmp_path, target)
        ids = {"windows": windows.id, "lagging": lagging.id}

        # every rule evaluated over the scraped series, none in error
        def rules_evaluated() -> bool:
            rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            assert len(rules) == 6, rules
            assert not [r for r in rules if r["health"] == "err"], rules
            return all(r["health"] == "ok" for r in rules)
        wait_for(rules_evaluated, 60, "the rules evaluated", every=0.5)

        # the alerts the two queries should raise match (pending: their `for:` is minutes)
        expected = {("StreamingBatchSlowerThanTrigger", "windows"), ("StreamingWatermarkLagging", "windows"),
                    ("StreamingStateGrowing", "windows"), ("StreamingConsumerLagGrowing", "lagging")}

        def raised() -> set[tuple[str, str]]:
            alerts = prometheus.api("alerts")["alerts"]
            for alert in alerts:
                assert alert["state"] in ("pending", "firing"), alert
                assert alert["labels"]["query_id"] == ids[alert["labels"]["query_name"]], alert
            return {(a["labels"]["alertname"], a["labels"]["query_name"]) for a in alerts}
        wait_for(lambda: expected <= raised(), 90, "the four alerts pending", every=0.5)
        # and no other: the Kafka query has no watermark and no state, and its lag is far below
        # 100,000. (Whether a batch outlasts the last interval between batches' starts, which
        # raises the falling-behind rule for a moment, and whether the Kafka query's batches
        # outlast its 200 ms trigger, depend on the machine: those two may show up or not.)
        others = raised() - expected - {("StreamingQueryFallingBehind", "windows"),
                                        ("StreamingQueryFallingBehind", "lagging"),
                                        ("StreamingBatchSlowerThanTrigger", "lagging")}
        assert not others, others
        lag = prometheus.query('microbatch_source_offsets_behind_latest{query_name="lagging",stat="max"}')
        assert len(lag) == 1 and 0 < float(lag[0]["value"][1]) < 100_000, lag
        assert "KafkaV2[Subscribe[monitored]]" == lag[0]["metric"]["source"]
        trigger = prometheus.query('microbatch_trigger_interval_ms{query_name="windows"}')
        assert [float(t["value"][1]) for t in trigger] == [10.0]

        # the Grafana dashboard: its variable lists the queries, and each panel's queries return
        # series of them
        names = prometheus.api("label/query_name/values", **{"match[]": "microbatch_batch_id"})
        assert {"windows", "lagging"} <= set(names)
        for title, expr in dashboard_queries():
            result = prometheus.query(expr)
            assert {r["metric"].get("query_name") for r in result} & {"windows", "lagging"}, (title, expr, result)

        # microbatch's own page draws the Kafka query's lag
        page = query_page(browser, session.ui_url, "lagging")
        wait_for(lambda: chart_points(page, "chart-source-lag") >= 3, what="the source lag chart", **PAGE)
        drawn = page.evaluate("() => document.getElementById('chart-source-lag').data[0]")
        assert drawn["name"] == "KafkaV2[Subscribe[monitored]] maxOffsetsBehindLatest"
        assert max(drawn["y"]) > 0, drawn["y"]
        page.close()
    finally:
        stop_writing.set()
        if prometheus is not None:
            prometheus.close()
        session.stop()
