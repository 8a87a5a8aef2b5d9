"""Write a JVM class-data-sharing archive of the classes the test suites load.

``python tests/spark_class_archive.py ARCHIVE`` starts Spark with
``-XX:ArchiveClassesAtExit=ARCHIVE``, runs what the suites run in nearly every JVM they
start (a stateful query on Spark's engine and on microbatch, a stream-stream join, Arrow
Python tasks, parquet and json files) and stops; the JVM writes the classes it loaded to
ARCHIVE as it exits. ``make`` then names the archive in the test runs' Spark conf
directory (``spark.driver.defaultJavaOptions -XX:SharedArchiveFile=ARCHIVE``), and every
Spark driver the tests start, in-process or killed and restarted in a child, maps those
classes instead of loading and verifying them from the jars: a session and its first job
start in about half the time (issue 58: the fault suites start over a hundred).

The archive holds only class metadata of this PySpark's jars and this JDK; a JVM whose
class path differs (another PySpark, another conf directory) ignores it (``-Xshare:auto``).
It is a test-run speed-up only: microbatch itself never needs it.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


def main(archive: str) -> None:
    from microbatch import StreamingSession, embedded_spark

    began = time.monotonic()
    spark = embedded_spark(conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={archive}",
                                 "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    ss = StreamingSession(spark)
    work = Path(tempfile.mkdtemp(prefix="class-archive-"))
    events = work / "events"
    events.mkdir()
    for n in range(2):
        rows = [{"k": i % 3, "v": i, "ts": f"2026-01-01 00:00:{n * 10 + i:02d}"} for i in range(5)]
        (events / f"{n}.json").write_text("\n".join(
            '{"k": %d, "v": %d, "ts": "%s"}' % (r["k"], r["v"], r["ts"]) for r in rows))
    schema = "k INT, v INT, ts TIMESTAMP"

    def windowed(reader):
        from pyspark.sql import functions as F
        df = reader.schema(schema).option("maxFilesPerTrigger", 1).json(str(events))
        return df.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "k").count()

    def joined(reader):
        from pyspark.sql import functions as F
        left = reader.schema(schema).json(str(events)).withWatermark("ts", "5 seconds")
        right = (reader.schema(schema).json(str(events)).withWatermark("ts", "5 seconds")
                 .select(F.col("k").alias("k2"), F.col("ts").alias("ts2")))
        return left.join(right, F.expr("k = k2 AND ts2 BETWEEN ts - INTERVAL 2 SECONDS AND ts"))

    for engine, session in (("spark", spark), ("microbatch", ss)):
        for name, build in (("windowed", windowed), ("joined", joined)):
            out = work / f"{engine}-{name}"
            query = (build(session.readStream).writeStream.outputMode("append").format("parquet")
                     .option("checkpointLocation", str(out) + "-checkpoint").trigger(availableNow=True)
                     .start(str(out)))
            query.awaitTermination()
            spark.read.parquet(str(out)).count()
    # Arrow Python tasks (the state tasks' path) and a Python UDF
    spark.range(100).mapInArrow(lambda batches: batches, "id LONG").count()
    spark.range(10).selectExpr("id % 2 AS g", "id").groupBy("g").applyInPandas(lambda pdf: pdf, "g LONG, id LONG").count()
    spark.stop()
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait
    # for it (a JVM outliving this process would be killed half-way through writing).
    from pyspark import SparkContext
    jvm = SparkContext._gateway.proc
    SparkContext._gateway.shutdown()
    jvm.stdin.close()
    jvm.wait(timeout=300)
    print(f"the classes of a test run's Spark, for {archive} ({time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1])
