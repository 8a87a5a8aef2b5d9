"""Nexmark's queries on microbatch and on Spark's own engine, same events, same run.

``python -m benchmarks nexmark [--events 1000000] [--batches 10] [--reps 3] [--queries q0,q7]``

The events (``microbatch.sources.nexmark``: Nexmark's deterministic generator, Flink's
SQL source setup, 10M events/s of event time as Flink's benchmark suite) are written once
to ``batches`` parquet files. Each query of ``microbatch.nexmark.queries`` then runs
``reps`` times on each engine, alternating, reading one file a trigger
(``availableNow``) into the ``noop`` sink; the figure is the events per second of the
whole run (query start to end), median of the runs. The floors, in the same run: the
generator's own rate (events generated in Spark tasks into ``noop``) and a plain batch
scan of the files into ``noop``. microbatch also runs each query from the ``nexmark``
source directly (no files), once.

Prints a table (events/s of each engine, microbatch's wall time over Spark's), and for
each query where each engine's time goes per batch (its Spark job, ``addBatch``; the rest
of the batch; the run outside its batches), and writes
``benchmarks/results/nexmark.json`` (and, with matplotlib, ``nexmark.png``).

``--connect``: the same over Spark Connect. A Connect server runs in a process of its own
(``microbatch.testing.connect_server``, 4g driver as here) and this process is its client,
with no JVM: Spark's engine is the server's (``readStream`` of the client session), and
microbatch runs on the client session wrapped by ``StreamingSession``. A query microbatch
does not run over Connect yet is listed with its refusal; the ``nexmark`` source and the
generator's floor are not measured there (that source does not run over Connect). Writes
``results/nexmark-connect.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RATE = 10_000_000.0        # Flink Nexmark's nexmark.yaml: 10M events/s
BASE_TIME = 1_700_000_000_000


def run_query(build, views, checkpoint: str, mode: str, phases: list | None = None) -> float:
    """Seconds from start to the end of an availableNow run of ``build(views)`` into noop;
    each batch's ``durationMs`` is appended to ``phases`` when given."""
    started = time.perf_counter()
    query = (build(views).writeStream.format("noop").outputMode(mode)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()
    elapsed = time.perf_counter() - started
    if phases is not None:
        phases.extend(dict(p.durationMs) for p in query.recentProgress[1:])
    return elapsed


def phase_profile(phases: list[dict], runs: list[float], batches: int) -> dict:
    """Where an engine's time goes, medians over the batches after the first: the
    batch's Spark job (``addBatch``), the rest of the batch (offsets, planning, logs), and
    the rest of the run (start, the first batch, stop) spread over the batches."""
    add = statistics.median(p.get("addBatch", 0) for p in phases) if phases else 0
    rest = statistics.median(p.get("triggerExecution", 0) - p.get("addBatch", 0) for p in phases) if phases else 0
    outside = statistics.median(runs) * 1000 / batches - add - rest
    return {"addBatch_ms": add, "rest_of_batch_ms": rest, "outside_batches_ms": round(outside, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks nexmark", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--queries", default="", help="comma-separated names (default: all that run on both)")
    parser.add_argument("--connect", action="store_true",
                        help="both engines over Spark Connect (a server in its own process)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    out = args.out or os.path.join(HERE, "results", "nexmark-connect.json" if args.connect else "nexmark.json")

    from pyspark.sql import functions as F

    from microbatch import StreamingSession, embedded_spark
    from microbatch.errors import UnsupportedOperationError
    from microbatch.nexmark.files import write_event_files
    from microbatch.nexmark.queries import QUERIES, NexmarkViews
    from microbatch.sources.nexmark.generator import NexmarkConfig
    from microbatch.sources.nexmark.source import spark_schema

    names = [q for q in args.queries.split(",") if q] or sorted(QUERIES, key=lambda q: int(q[1:]))
    # (Spark's engine keeps q3's and q20's join state, all the bids, in its JVM: 1g is not enough)
    conf = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"}
    if args.connect:
        from pathlib import Path

        from pyspark.sql import SparkSession

        from microbatch.testing import connect_server
        server_dir = Path(tempfile.mkdtemp(prefix="nexmark-connect-server-"))
        # (the server stops when this process ends, failed or not: connect_server watches it)
        _, port = connect_server.launch(server_dir, 24 * 3600, conf=conf)
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    else:
        spark = embedded_spark(conf=conf)
    ss = StreamingSession(spark)
    config = NexmarkConfig(base_time_ms=BASE_TIME, events_per_second=RATE)
    per_batch = -(-args.events // args.batches)
    side_input = spark.range(0, 10_000).select(F.col("id").alias("key"),
                                               F.concat(F.lit("value-"), F.col("id")).alias("value")).cache()
    side_input.count()
    results = []
    with tempfile.TemporaryDirectory() as root:
        files = os.path.join(root, "events")
        started = time.perf_counter()
        write_event_files(spark, files, config, args.events, per_batch)
        print(f"{args.events:,} events in {args.batches} files, written in {time.perf_counter() - started:.1f} s")

        def views(session):
            return NexmarkViews(lambda: session.readStream.schema(spark_schema("events"))
                                .option("maxFilesPerTrigger", 1).parquet(files), side_input)

        def source_views():
            return NexmarkViews(lambda: ss.readStream.format("nexmark").option("baseTime", BASE_TIME)
                                .option("eventsPerSecond", RATE).option("numEvents", args.events)
                                .option("maxEventsPerTrigger", per_batch).load(), side_input)

        floors = {}
        generator = lambda: (ss.readStream.format("nexmark").option("baseTime", BASE_TIME)  # noqa: E731
                             .option("eventsPerSecond", RATE).option("numEvents", args.events)
                             .option("maxEventsPerTrigger", per_batch).load())
        for name, job in ((("generator", generator),) if not args.connect else ()):
            times = []
            for rep in range(args.reps):
                times.append(run_query(lambda v, job=job: job(), None, os.path.join(root, f"floor-{name}-{rep}"), "append"))
            floors[name] = args.events / statistics.median(times)
        times = []
        for _rep in range(args.reps):
            t = time.perf_counter()
            spark.read.parquet(files).write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t)
        floors["file scan (batch job)"] = args.events / statistics.median(times)

        print(f"{'query':6} {'Spark ev/s':>12} {'microbatch ev/s':>16} {'ratio':>6} {'mb from source ev/s':>20}")
        refused, failed = {}, {}
        for name in names:
            query = QUERIES[name]
            spark_s, ours_s = [], []
            phases = {"spark": [], "mb": []}
            try:
                run_query(query.build, views(ss), os.path.join(root, f"{name}-warm-mb"), query.output_mode)
            except UnsupportedOperationError as e:   # (over Connect: not run there yet, refused at start)
                refused[name] = str(e).split(" does not run over Spark Connect")[0]
                print(f"{name:6} microbatch refuses it over Connect: {refused[name]}", flush=True)
                continue
            except Exception as e:   # noqa: BLE001 - a failed run is a result of the table, and a bug
                failed[name] = str(e).splitlines()[0][:300]
                print(f"{name:6} microbatch's run FAILED: {failed[name]}", flush=True)
                continue
            run_query(query.build, views(spark), os.path.join(root, f"{name}-warm-spark"), query.output_mode)
            for rep in range(args.reps):
                engines = [("spark", spark, spark_s), ("mb", ss, ours_s)]
                for label, session, sink in (engines if rep % 2 == 0 else engines[::-1]):
                    sink.append(run_query(query.build, views(session),
                                          os.path.join(root, f"{name}-{label}-{rep}"), query.output_mode,
                                          phases[label]))
            source_s = None if args.connect else run_query(
                query.build, source_views(), os.path.join(root, f"{name}-source"), query.output_mode)
            row = {"query": name, "title": query.title, "events": args.events, "batches": args.batches,
                   "spark_s": spark_s, "microbatch_s": ours_s, "microbatch_source_s": source_s,
                   "spark_events_per_s": args.events / statistics.median(spark_s),
                   "microbatch_events_per_s": args.events / statistics.median(ours_s),
                   "ratio": statistics.median(ours_s) / statistics.median(spark_s),
                   "spark_profile": phase_profile(phases["spark"], spark_s, args.batches),
                   "microbatch_profile": phase_profile(phases["mb"], ours_s, args.batches)}
            results.append(row)
            print(f"{name:6} {row['spark_events_per_s']:>12,.0f} {row['microbatch_events_per_s']:>16,.0f} "
                  f"{row['ratio']:>6.2f} {args.events / source_s if source_s else float('nan'):>20,.0f}", flush=True)
            print(f"       per batch (ms): Spark {row['spark_profile']}, microbatch {row['microbatch_profile']}",
                  flush=True)
    for name, rate in floors.items():
        print(f"floor: {name}: {rate:,.0f} events/s")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"events": args.events, "batches": args.batches, "reps": args.reps, "floors": floors,
                   "connect": args.connect, "results": results, "refused": refused, "failed": failed},
                  f, indent=1)
    _chart(results, floors, out.replace(".json", ".png"))
    spark.stop()
    if args.connect:
        # Each microbatch run's batch session is a Connect clone that stays open; at the
        # interpreter's shutdown PySpark's SparkSession.__del__ closes its gRPC channel after
        # grpc's own (daemon) threads stopped, and the close waits forever (py-spy: the main
        # thread in Channel._close). The results are written: leave without that wait.
        sys.stdout.flush()
        os._exit(0)
    return 0


def _chart(results, floors, png: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)")
        return
    names = [r["query"] for r in results]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar([i - 0.2 for i in x], [r["spark_events_per_s"] for r in results], 0.4, label="Spark's engine")
    ax.bar([i + 0.2 for i in x], [r["microbatch_events_per_s"] for r in results], 0.4, label="microbatch")
    for (name, rate), (style, color) in zip(floors.items(), [("--", "tab:green"), (":", "tab:red")] * 4):
        ax.axhline(rate, linestyle=style, color=color, linewidth=1.2, label=f"floor: {name}")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("events / second")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
