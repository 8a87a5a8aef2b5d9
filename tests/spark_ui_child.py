"""The process of the Spark UI test: ``python spark_ui_child.py BOOTSTRAP CLASSES OUT``.

A Spark with its UI on and a JVM listener named in ``spark.sql.streaming.streamingQueryListeners``
(``CountingListener``, compiled into the directory CLASSES) runs a microbatch window count,
a microbatch Kafka query (the broker at BOOTSTRAP, topic ``ui``) and, for comparison, the
same window count on Spark's own engine. Headless Chromium opens the UI's Structured
Streaming tab and each query's statistics page (screenshots into OUT). Prints one line of
JSON: the queries (name, id, run id, batches), what the pages showed, the listener's counts,
and each query's gauges as Spark's CSV metrics sink wrote them (``spark.sql.streaming.metricsEnabled``).
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from pyspark.sql import functions as F

from helpers import wait_for
from microbatch import StreamingSession, embedded_spark


def window_counts(session, name: str, ckpt: str):
    return (session.readStream.format("rate").option("rowsPerSecond", 50).load()
            .withWatermark("timestamp", "1 second").groupBy(F.window("timestamp", "1 second")).count()
            .writeStream.format("noop").outputMode("append").queryName(name)
            .option("checkpointLocation", ckpt).trigger(processingTime="300 milliseconds").start())


def main() -> None:
    bootstrap, classes, out = sys.argv[1:4]
    os.makedirs(f"{out}/metrics", exist_ok=True)
    spark = embedded_spark(conf={
        "spark.ui.enabled": "true", "spark.ui.port": "0", "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.ui.enabled": "true",    # (Spark's default: its streaming tab)
        "spark.driver.extraClassPath": classes,
        "spark.sql.streaming.streamingQueryListeners": "microbatch.test.CountingListener",
        # each query's gauges to Spark's metrics system, and its CSV sink every second
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.metrics.conf.*.sink.csv.class": "org.apache.spark.metrics.sink.CsvSink",
        "spark.metrics.conf.*.sink.csv.period": "1", "spark.metrics.conf.*.sink.csv.unit": "seconds",
        "spark.metrics.conf.*.sink.csv.directory": f"{out}/metrics",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})
    ss = StreamingSession(spark)
    queries = {
        "microbatch_window_counts": window_counts(ss, "microbatch_window_counts", f"{out}/ck-mb"),
        "microbatch_kafka": (ss.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                             .option("subscribe", "ui").option("startingOffsets", "earliest")
                             .option("maxOffsetsPerTrigger", 10).load()
                             .select(F.col("value").cast("string").alias("text"))
                             .writeStream.format("noop").queryName("microbatch_kafka")
                             .option("checkpointLocation", f"{out}/ck-kafka")
                             .trigger(processingTime="300 milliseconds").start()),
        "spark_window_counts": window_counts(spark, "spark_window_counts", f"{out}/ck-spark"),
    }
    for name, query in queries.items():
        wait_for(lambda q=query: len([p for p in q.recentProgress if p.numInputRows]) >= 3, what=f"{name}'s batches")

    from playwright.sync_api import sync_playwright
    ui = spark.sparkContext.uiWebUrl
    pages = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or shutil.which("chromium-browser"),
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{ui}/StreamingQuery/")
        page.wait_for_selector("text=Active Streaming Queries")
        listed = page.locator("table").first.inner_text()
        pages["listing"] = listed
        page.screenshot(path=f"{out}/streaming-tab.png", full_page=True)
        for name, query in queries.items():
            page.goto(f"{ui}/StreamingQuery/statistics/?id={query.runId}")
            page.wait_for_selector("text=Streaming Query Statistics")
            pages[name] = page.locator("body").inner_text()
            page.screenshot(path=f"{out}/statistics-{name}.png", full_page=True)
        browser.close()
    ids = {name: {"id": q.id, "runId": q.runId, "batches": q.lastProgress.batchId + 1} for name, q in queries.items()}

    def gauges() -> dict:
        """The largest value the CSV sink wrote of each query's gauges
        (``<app>.driver.spark.streaming.<query>.<gauge>.csv``, a line a second)."""
        found = {}
        for file in os.listdir(f"{out}/metrics"):
            for name in queries:
                marker = f".spark.streaming.{name}."
                if marker in file:
                    lines = open(f"{out}/metrics/{file}").read().split()
                    if len(lines) > 1:
                        found.setdefault(name, {})[file.split(marker)[1][:-len(".csv")]] = max(
                            float(line.split(",")[1]) for line in lines[1:])
        return found
    wait_for(lambda: all(g.get("latency", 0) > 0 and g.get("inputRate-total", 0) > 0 for g in gauges().values())
             and len(gauges()) == len(queries), 30, "the CSV sink's gauges")
    metrics = gauges()
    for query in queries.values():
        query.stop()
    listener = spark._jvm.microbatch.test.CountingListener
    wait_for(lambda: all(f"terminated {q['id']}" in listener.counts() for q in ids.values()), 30,
             "the listener's terminated events")
    counts = {k: v for k, v in dict(listener.counts()).items()}
    print(json.dumps({"queries": ids, "pages": pages, "counts": counts, "metrics": metrics}), flush=True)
    ss.stop()
    spark.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
