"""A windowed count with many groups a batch, on microbatch and on Spark's own engine.

``python -m benchmarks.many_groups [--rows 400000] [--keys 1000] [--batches 8] [--reps 3]
[--aggregates count max_by percentile_approx histogram_numeric]``

Input: ``batches`` parquet files of ``rows`` rows: ``keys`` keys, event times advancing
``seconds`` (400) a file, so a batch touches 40 ten-second windows of every key (about
``40 * keys`` state rows changed a batch, and as many evicted once the watermark passes).
Query: ``withWatermark(ts, 10 s).groupBy(window(ts, 10 s), k)`` with one aggregate,
``count()`` by default (``--aggregates`` names others, each run in turn: ``max_by(v, ts)``, a
pair kept in Spark's buffer; ``percentile_approx(v, 0.5)``, a quantile sketch per group; ``histogram_numeric(v, 10)``,
ten bins per group; ``v`` an int column), in append mode into ``noop``, ``availableNow`` one file a trigger; each engine ``reps`` times, alternating. The
figure is the median batch duration (progress ``triggerExecution``, the first batch
left out) and the whole run's wall time; it prints microbatch's phases
(``durationMs``) and the state operator's times beside Spark's and writes ``benchmarks/results/many_groups.json``
(``many_groups-<aggregate>.json`` for an aggregate other than the count).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

#: the aggregate of each run, by name
AGGREGATES = {
    "count": "count(1) AS count",
    "max_by": "max_by(v, ts) AS max_by",
    "percentile_approx": "percentile_approx(v, 0.5) AS percentile_approx",
    "histogram_numeric": "histogram_numeric(v, 10) AS histogram_numeric",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=400, help="event time a file spans")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--aggregates", nargs="+", default=["count"], choices=sorted(AGGREGATES))
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from microbatch import StreamingSession, embedded_spark

    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": "2"})
    ss = StreamingSession(spark)
    with tempfile.TemporaryDirectory() as root:
        source = os.path.join(root, "in")
        t0 = 1_700_000_000
        for i in range(args.batches):
            (spark.range(0, args.rows, numPartitions=2)
             .select((F.col("id") % args.keys).cast("string").alias("k"),
                     F.timestamp_seconds(F.lit(t0 + args.seconds * i)
                                         + (F.col("id") * args.seconds / args.rows).cast("long")).alias("ts"),
                     (F.col("id") % 997).cast("int").alias("v"))
             .coalesce(1).write.mode("append").parquet(source))
            time.sleep(1.1)   # files ordered by modification time

        for aggregate in args.aggregates:
            measure(args, spark, ss, source, root, aggregate)
    spark.stop()
    return 0


def measure(args, spark, ss, source: str, root: str, aggregate: str) -> None:
    """Each engine ``args.reps`` times (alternating, after a warm-up each) with ``aggregate``;
    prints the ratios and writes the JSON."""
    from pyspark.sql import functions as F

    results: dict[str, dict] = {"spark": {"batch_ms": [], "wall_s": [], "phases": [], "state": []},
                                "microbatch": {"batch_ms": [], "wall_s": [], "phases": [], "state": []}}

    def run(session, label, rep):
        frame = (session.readStream.schema("k STRING, ts TIMESTAMP, v INT").option("maxFilesPerTrigger", 1)
                 .parquet(source).withWatermark("ts", "10 seconds")
                 .groupBy(F.window("ts", "10 seconds"), "k").agg(F.expr(AGGREGATES[aggregate])))
        started = time.perf_counter()
        query = (frame.writeStream.format("noop").outputMode("append")
                 .option("checkpointLocation", os.path.join(root, f"{aggregate}-{label}-{rep}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p.numInputRows][1:]
        if label not in results:   # a warm-up
            return 0
        results[label]["wall_s"].append(wall)
        results[label]["batch_ms"] += [p.durationMs["triggerExecution"] for p in progress]
        results[label]["phases"] += [dict(p.durationMs) for p in progress]
        results[label]["state"] += [{k: getattr(p.stateOperators[0], k) for k in
                                     ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")}
                                    for p in progress]
        rows = progress[-1].stateOperators[0].numRowsUpdated if progress else 0
        return rows

    run(ss, "warm-mb", 0)
    run(spark, "warm-spark", 0)
    for rep in range(args.reps):
        order = [("spark", spark), ("microbatch", ss)]
        for label, session in (order if rep % 2 == 0 else order[::-1]):
            updated = run(session, label, rep)
    summary = {label: {"median_batch_ms": statistics.median(r["batch_ms"]), "median_wall_s": statistics.median(r["wall_s"])}
               for label, r in results.items()}
    ratio = summary["microbatch"]["median_batch_ms"] / summary["spark"]["median_batch_ms"]
    print(f"{aggregate}: {args.rows:,} rows a batch, {args.keys} keys, state rows updated a batch: {updated:,}")
    for label, s in summary.items():
        print(f"{label:11} median batch {s['median_batch_ms']:8.0f} ms   median run {s['median_wall_s']:6.1f} s")
    print(f"ratio microbatch/Spark (median batch): {ratio:.2f}; "
          f"(median run): {summary['microbatch']['median_wall_s'] / summary['spark']['median_wall_s']:.2f}")
    for label in ("microbatch", "spark"):
        phases = results[label]["phases"]
        keys = sorted({k for p in phases for k in p})
        print(label, "phases (median ms):", {k: statistics.median(p.get(k, 0) for p in phases) for k in keys})
        state = results[label]["state"]
        print(label, "state operator, summed over its tasks (median ms):",
              {k: statistics.median(x[k] for x in state) for k in state[0]})
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    name = "many_groups.json" if aggregate == "count" else f"many_groups-{aggregate}.json"
    with open(os.path.join(HERE, "results", name), "w") as f:
        json.dump({"args": vars(args), "aggregate": aggregate, "summary": summary, "ratio": ratio,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
