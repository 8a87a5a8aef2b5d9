"""microbatch against Spark's own Structured Streaming, same queries, same data, same run.

``python -m benchmarks [--short] [--sizes 10000,100000,1000000] [--batches 8] [--reps 3]``
(``python -m benchmarks nexmark [...]``: Nexmark's queries, ``nexmark.py``;
``python -m benchmarks soak [...]``: a stateful pipeline held for long, ``soak.py``)

In one process and one local[2] SparkSession, for every query and batch size:

1. deterministic input: ``batches`` parquet (or json) files of ``size`` rows each;
2. a warm-up, then ``reps`` runs on each engine, alternating, each with
   ``maxFilesPerTrigger=1`` and ``trigger(availableNow=True)``: the whole run's wall
   time and every batch's ``durationMs`` are recorded;
3. the *floor*: the same transformation and sink over one file as a plain DataFrame job.

It prints a table (median run seconds, ratio microbatch/Spark, per-batch median against
the floor, engine overhead = triggerExecution - addBatch, and microbatch's phases).

Then the other cells (``OTHER_CELLS``, the modules beside this one), each against its
anchor in the same process: stream-stream joins on a time range and on keys
(``stream_join``) and applyInPandasWithState (``group_state``) against Spark's own
engine, median ``triggerExecution`` of each; Kafka -> parquet (``kafka``) against one
plain confluent-kafka consumer reading the same records, median wall time of each.

It writes ``benchmarks/results/bench.json`` and, with matplotlib,
``benchmarks/results/bench.png`` (per-batch durations of both engines). ``--short`` (the
five queries only, small) finishes in under 3 minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = "value BIGINT, ts TIMESTAMP, k STRING"


@dataclass
class Query:
    name: str
    input_format: str                            # parquet / json
    transform: Callable[[Any, Any], Any]          # (frame, static DataFrame) -> frame
    output_mode: str = "append"
    sink: str = "noop"                           # noop / parquet


def _stateless(frame, static):
    from pyspark.sql import functions as F
    return frame.filter(F.col("value") % 2 == 0).withColumn("double", F.col("value") * 2)


def _window_count(frame, static):
    from pyspark.sql import functions as F
    return frame.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()


def _dedup(frame, static):
    return frame.withWatermark("ts", "10 seconds").dropDuplicates(["value", "ts"])


def _static_join(frame, static):
    return frame.join(static, "k")


def _identity(frame, static):
    return frame


QUERIES = [
    Query("stateless filter/withColumn -> noop", "parquet", _stateless),
    Query("window count, watermark, append -> noop", "parquet", _window_count),
    Query("dropDuplicates with watermark -> noop", "parquet", _dedup),
    Query("stream-static join -> noop", "parquet", _static_join),
    Query("json files -> parquet file sink", "json", _identity, sink="parquet"),
]


def _join_cell(on: str):
    from benchmarks import stream_join
    return lambda: stream_join.measure(rows=20_000, batches=20, on=on)[2]


def _group_state_cell(rows: int, batches: int):
    from benchmarks import group_state
    return lambda: group_state.measure(rows=rows, users=10_000, batches=batches)[2]


def _kafka_cell(records: int):
    from benchmarks import kafka
    return lambda: kafka.measure(records=records, partitions=8, reps=5)["cell"]


#: (name, rows a batch, anchor, measure) of the cells beyond the five queries: each
#: measure returns microbatch's and the anchor's median ms, their ratio, and microbatch's
#: median engine overhead.
OTHER_CELLS = [
    ("stream-stream join, time range -> noop", 20_000, "Spark", _join_cell("range")),
    ("stream-stream join, on keys -> noop", 20_000, "Spark", _join_cell("keys")),
    ("applyInPandasWithState sessions -> noop", 100_000, "Spark", _group_state_cell(100_000, 10)),
    ("applyInPandasWithState sessions -> noop", 1_000_000, "Spark", _group_state_cell(1_000_000, 6)),
    ("kafka -> parquet (whole run)", 100_000, "consumer floor", _kafka_cell(100_000)),
]


def make_input(spark, directory: str, fmt: str, size: int, batches: int) -> None:
    """``batches`` files of ``size`` rows; file i holds values [i*size, (i+1)*size) with
    event times in minute i (so a 10 s watermark evicts the previous file's state)."""
    os.makedirs(directory, exist_ok=True)
    base = time.time() - 100_000
    for i in range(batches):
        tmp = f"{directory}/.tmp-{i}"
        (spark.range(i * size, (i + 1) * size, numPartitions=1)
         .selectExpr("id AS value",
                     f"TIMESTAMP_SECONDS(1767225600 + {i * 60} + CAST((id - {i * size}) * 60 / {size} AS BIGINT)) AS ts",
                     "CAST(id % 100 AS STRING) AS k")
         .write.format(fmt).save(tmp))
        part = next(f for f in os.listdir(tmp) if f.startswith("part-"))
        target = f"{directory}/f{i:04d}.{fmt}"
        os.rename(f"{tmp}/{part}", target)
        os.utime(target, (base + i, base + i))
        shutil.rmtree(tmp)


def run_stream(session, query: Query, input_dir: str, static, workdir: str) -> dict:
    reader = session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
    frame = query.transform(reader.format(query.input_format).load(input_dir), static)
    writer = (frame.writeStream.outputMode(query.output_mode).format(query.sink)
              .option("checkpointLocation", f"{workdir}/ckpt").trigger(availableNow=True))
    if query.sink != "noop":
        writer = writer.option("path", f"{workdir}/out")
    started = time.perf_counter()
    handle = writer.start()
    handle.awaitTermination()
    wall = time.perf_counter() - started
    if handle.exception() is not None:
        raise RuntimeError(str(handle.exception()))
    batches = [{"batchId": p["batchId"], "numInputRows": p["numInputRows"], **p["durationMs"]}
               for p in handle.recentProgress]
    return {"wall_s": wall, "batches": batches}


def run_floor(spark, query: Query, input_dir: str, static, workdir: str, reps: int) -> float:
    """One file's work as a plain batch job, median seconds."""
    first = sorted(os.listdir(input_dir))[0]
    times = []
    for r in range(reps + 1):
        df = query.transform(spark.read.schema(SCHEMA).format(query.input_format)
                             .load(f"{input_dir}/{first}"), static)
        if query.name.startswith("window"):
            pass  # a batch job has no watermark to wait for: it writes every window
        started = time.perf_counter()
        writer = df.write.format(query.sink).mode("append")
        writer.save() if query.sink == "noop" else writer.save(f"{workdir}/floor-{r}")
        if r:  # the first is a warm-up
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict], skip_first: int = 1) -> dict:
    """Medians over runs of whole-run seconds, and over all batches after the first
    of each run (JVM/worker warm-up inside a run) of each phase."""
    batches = [b for run in runs for b in run["batches"][skip_first:]]
    phases = {}
    for phase in ("triggerExecution", "addBatch", "getBatch", "queryPlanning", "walCommit",
                  "commitOffsets", "latestOffset"):
        phases[phase] = median(b.get(phase) for b in batches)
    overhead = median(b.get("triggerExecution", 0) - b.get("addBatch", 0) for b in batches)
    return {"wall_s": median(r["wall_s"] for r in runs), "phases_ms": phases, "overhead_ms": overhead}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="10k and 100k rows, 3 batches, 1 run each")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default="", help="run the queries whose name contains this")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    batches, reps = args.batches, args.reps
    if args.short:
        sizes, batches, reps = [10_000, 100_000], 3, 1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from microbatch import StreamingSession, embedded_spark
    spark = embedded_spark(conf={"spark.driver.memory": "4g"})
    ss = StreamingSession(spark)
    static = spark.createDataFrame([(str(i), f"name-{i}") for i in range(100)], "k STRING, name STRING").cache()
    static.count()
    results: list[dict] = []
    root = tempfile.mkdtemp(prefix="microbatch-bench-")
    started = time.perf_counter()
    try:
        for size in sizes:
            inputs = {}
            for fmt in ("parquet", "json"):
                inputs[fmt] = f"{root}/input-{fmt}-{size}"
                make_input(spark, inputs[fmt], fmt, size, batches)
            for query in QUERIES:
                if args.only and args.only not in query.name:
                    continue
                engines = {"microbatch": ss, "spark": spark}
                runs: dict[str, list[dict]] = {"microbatch": [], "spark": []}
                for rep in range(reps + (0 if args.short else 1)):
                    for engine, session in engines.items():
                        workdir = tempfile.mkdtemp(dir=root)
                        outcome = run_stream(session, query, inputs[query.input_format], static, workdir)
                        shutil.rmtree(workdir, ignore_errors=True)
                        if args.short or rep:   # rep 0 is the warm-up
                            runs[engine].append(outcome)
                floor_dir = tempfile.mkdtemp(dir=root)
                floor = run_floor(spark, query, inputs[query.input_format], static, floor_dir, max(reps, 2))
                ours, theirs = summarize(runs["microbatch"]), summarize(runs["spark"])
                results.append({"query": query.name, "rows_per_batch": size, "batches": batches,
                                "microbatch": {**ours, "runs": runs["microbatch"]},
                                "spark": {**theirs, "runs": runs["spark"]}, "floor_s": floor})
                report_row(results[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cells: list[dict] = []
    if not args.short:
        for name, rows, anchor, measure in OTHER_CELLS:
            if args.only and args.only not in name:
                continue
            cells.append({"cell": name, "rows_per_batch": rows, "anchor": anchor, **measure()})
            report_cell(cells[-1])
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    write_results(results, args, cells)
    return 0


HEADER = (f"{'query':42} {'rows':>8} {'mb s':>6} {'spark s':>7} {'ratio':>5} {'floor ms':>8} "
          f"{'mb/batch':>8} {'x floor':>7} {'ovh mb':>6} {'ovh sp':>6}  microbatch phases (ms)")


def report_row(r: dict) -> None:
    if not getattr(report_row, "printed", False):
        print(HEADER)
        report_row.printed = True
    ours, theirs = r["microbatch"], r["spark"]
    per_batch = ours["phases_ms"]["triggerExecution"]
    phases = " ".join(f"{k}={v:.0f}" for k, v in ours["phases_ms"].items() if k != "triggerExecution")
    print(f"{r['query'][:42]:42} {r['rows_per_batch']:>8} {ours['wall_s']:6.2f} {theirs['wall_s']:7.2f} "
          f"{ours['wall_s'] / theirs['wall_s']:5.2f} {r['floor_s'] * 1000:8.0f} {per_batch:8.0f} "
          f"{per_batch / (r['floor_s'] * 1000):7.2f} {ours['overhead_ms']:6.0f} {theirs['overhead_ms']:6.0f}  {phases}",
          flush=True)


def report_cell(cell: dict) -> None:
    if not getattr(report_cell, "printed", False):
        print(f"\n{'cell':42} {'rows':>9} {'mb ms':>7} {'anchor ms':>9} {'ratio':>5} {'ovh mb':>6}  anchor")
        report_cell.printed = True
    print(f"{cell['cell'][:42]:42} {cell['rows_per_batch']:>9} {cell['microbatch_ms']:7.0f} "
          f"{cell['anchor_ms']:9.0f} {cell['ratio']:5.2f} {cell['overhead_ms']:6.0f}  {cell['anchor']}", flush=True)


def write_results(results: list[dict], args, cells: list[dict]) -> None:
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "bench-short.json" if args.short else "bench.json")
    with open(path, "w") as f:
        json.dump({"machine": f"{os.cpu_count()} cores, local[2]", "date": time.strftime("%Y-%m-%d %H:%M"),
                   "results": results, "cells": cells}, f, indent=1)
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)")
        return
    if not results:
        return
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        for engine, style in (("microbatch", "-o"), ("spark", "--s")):
            for i, run in enumerate(r[engine]["runs"]):
                ax.plot([b["batchId"] for b in run["batches"]],
                        [b.get("triggerExecution", 0) for b in run["batches"]], style, markersize=3,
                        label=engine if i == 0 else None, color="C0" if engine == "microbatch" else "C1")
        ax.axhline(r["floor_s"] * 1000, color="gray", linewidth=0.8, label="batch floor")
        ax.set_title(f"{r['query']}, {r['rows_per_batch']:,} rows/batch", fontsize=8)
        ax.set_ylabel("ms", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.tight_layout()
    png = path.replace(".json", ".png")
    fig.savefig(png, dpi=90)
    print(f"wrote {png}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["nexmark"]:   # python -m benchmarks nexmark [...]: Nexmark's queries (nexmark.py)
        from benchmarks.nexmark import main as nexmark_main
        sys.exit(nexmark_main(sys.argv[2:]))
    if sys.argv[1:2] == ["soak"]:      # python -m benchmarks soak [...]: load held over time (soak.py)
        from benchmarks.soak import main as soak_main
        sys.exit(soak_main(sys.argv[2:]))
    sys.exit(main())
