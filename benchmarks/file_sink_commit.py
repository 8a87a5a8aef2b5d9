"""The file sink's two commit protocols on local disk: Spark's writer into a staging
directory plus a rename of each file, against writing each file in place from Python tasks
(the protocol the sink uses on object stores, where a rename is a copy).

``python -m benchmarks.file_sink_commit [--batches 8] [--rows 200000] [--format parquet]``

The same DataFrame (``rows`` rows of an id, a string and a double, 2 partitions, cached
so both protocols write identical input) is written ``batches`` times by each protocol in
turn (alternating, so drift on a shared machine hits both), each batch into a fresh output
directory through ``FileStreamSink.add_batch``, manifest included. It prints the median
time per batch of each protocol and the in-place/staged ratio, and writes
``benchmarks/results/file_sink_commit.json``. The sink keeps staging-and-rename on local
disk when this ratio is above 1.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--format", default="parquet")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from microbatch import embedded_spark
    from microbatch.checkpoint.fs import LOCAL
    from microbatch.sinks.file import FileStreamSink

    spark = embedded_spark(conf={"spark.sql.shuffle.partitions": "2"})
    frame = (spark.range(args.rows, numPartitions=2)
             .select("id", F.concat(F.lit("name-"), (F.col("id") % 1000).cast("string")).alias("name"),
                     (F.col("id") / 7).alias("score"))
             .cache())
    frame.count()
    times: dict[str, list[float]] = {"staged": [], "in_place": []}
    with tempfile.TemporaryDirectory() as root:
        for batch in range(args.batches + 1):   # batch 0 warms both up and is not counted
            for protocol in ("staged", "in_place"):
                out = os.path.join(root, f"{protocol}-{batch}")
                sink = FileStreamSink(spark, args.format, out, [], {}, None, LOCAL,
                                      in_place=protocol == "in_place")
                started = time.perf_counter()
                sink.add_batch(0, frame)
                elapsed = (time.perf_counter() - started) * 1000
                if batch:
                    times[protocol].append(elapsed)
    spark.stop()
    medians = {k: statistics.median(v) for k, v in times.items()}
    ratio = medians["in_place"] / medians["staged"]
    print(f"file sink on local disk, {args.format}, {args.rows} rows a batch, {args.batches} batches")
    print(f"  staged + rename (Spark's writer): median {medians['staged']:.0f} ms")
    print(f"  in place (Python tasks, Arrow):   median {medians['in_place']:.0f} ms")
    print(f"  in place / staged: {ratio:.2f}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "file_sink_commit.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "args": vars(args), "times_ms": times,
                   "medians_ms": medians, "in_place_over_staged": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
