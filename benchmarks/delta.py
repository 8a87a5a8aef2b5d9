"""The Delta Lake sink against the parquet file sink, and the Delta source against the file
source reading the same files, on the same query, with microbatch.

``python -m benchmarks.delta [--files 8] [--rows 100000] [--runs 3]``

Input: ``files`` parquet files of ``rows`` rows each (an id, a string, a double). Sink:
the query ``select(id, name, score * 2)`` runs ``availableNow``, one file a batch, into a
Delta table and into a parquet file sink in turn (``runs`` times each, alternating, fresh
outputs and checkpoints); the figure is the median batch duration (progress
``triggerExecution``) of each. Source: the Delta table the sink wrote, streamed by the Delta
source (one commit a batch) against the file source over the same data files (one file a
batch), each into the ``noop`` sink. Prints the medians and the Delta/parquet ratios, and
writes ``benchmarks/results/delta.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def batch_ms(query) -> list[float]:
    return [p.durationMs["triggerExecution"] for p in query.recentProgress if p.numInputRows]


def run(frame, fmt: str, out: str, ckpt: str) -> list[float]:
    query = frame.writeStream.format(fmt).option("checkpointLocation", ckpt).trigger(availableNow=True)
    query = query.start(out) if fmt != "noop" else query.start()
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()
    return batch_ms(query)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from microbatch import StreamingSession, embedded_spark

    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": "2"})
    ss = StreamingSession(spark)
    times: dict[str, list[float]] = {"delta sink": [], "parquet sink": [], "delta source": [], "file source": []}
    with tempfile.TemporaryDirectory() as root:
        source = os.path.join(root, "in")
        for i in range(args.files):
            (spark.range(i * args.rows, (i + 1) * args.rows, numPartitions=1)
             .select("id", F.concat(F.lit("name-"), (F.col("id") % 1000).cast("string")).alias("name"),
                     (F.col("id") / 7).alias("score"))
             .write.mode("append").parquet(source))
        schema = spark.read.parquet(source).schema

        def query():
            return ss.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source) \
                .select("id", "name", (F.col("score") * 2).alias("score"))

        table = None
        for r in range(args.runs + 1):      # run 0 warms both up and is not counted
            for fmt in ("delta", "parquet"):
                out = os.path.join(root, f"{fmt}-{r}")
                measured = run(query(), fmt, out, os.path.join(root, f"ckpt-{fmt}-{r}"))
                if r:
                    times[f"{fmt} sink"] += measured
                if fmt == "delta":
                    table = out
        for r in range(args.runs + 1):
            delta = ss.readStream.format("delta").option("maxFilesPerTrigger", 1).load(table)
            files = ss.readStream.schema(delta.schema).option("maxFilesPerTrigger", 1).parquet(table)
            for name, frame in (("delta source", delta), ("file source", files)):
                measured = run(frame, "noop", "", os.path.join(root, f"ckpt-read-{name}-{r}"))
                if r:
                    times[name] += measured
    spark.stop()
    medians = {k: statistics.median(v) for k, v in times.items()}
    sink_ratio = medians["delta sink"] / medians["parquet sink"]
    source_ratio = medians["delta source"] / medians["file source"]
    print(f"microbatch, {args.files} batches of {args.rows} rows, {args.runs} runs; median batch duration")
    for name, value in medians.items():
        print(f"  {name:13s} {value:7.0f} ms")
    print(f"  Delta sink / parquet file sink:   {sink_ratio:.2f}")
    print(f"  Delta source / file source:       {source_ratio:.2f}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "delta.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "args": vars(args), "times_ms": times, "medians_ms": medians,
                   "delta_sink_over_parquet_sink": sink_ratio, "delta_source_over_file_source": source_ratio},
                  f, indent=1)


if __name__ == "__main__":
    main()
