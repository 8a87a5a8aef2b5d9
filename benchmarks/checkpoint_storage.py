"""The checkpoint on S3 against local disk, for a stateful query.

``python -m benchmarks.checkpoint_storage [--batches 30] [--rows 20000]``

A ``rate-micro-batch`` stream of ``rows`` new distinct values per batch,
``dropDuplicates(["value"])`` (the state grows by ``rows`` keys a batch) into the ``noop``
sink, run twice in one process: with its checkpoint on local disk, and on an S3 endpoint
(moto's server on 127.0.0.1, started here: it shows the cost of the S3 protocol and of
the storage layer, not of a network to a real region). Per batch it records
``triggerExecution``, ``walCommit``, ``commitOffsets`` and the state's ``commitTimeMs``;
it prints their medians per engine, the S3/local ratios, and the state commit time per
tenth of the run (flat: the last tenth about the second), and writes everything to
``benchmarks/results/checkpoint_storage.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from benchmarks.progress import by_tenth, first_batches

HERE = os.path.dirname(os.path.abspath(__file__))
BUCKET = "bench"


def run(ss, checkpoint: str, rows: int, batches: int) -> list[dict]:
    frame = (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
             .option("numPartitions", 2).load().dropDuplicates(["value"]))
    query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start())
    progress = first_batches(query, batches)
    return [{"batchId": p.batchId, "triggerMs": p.durationMs.get("triggerExecution", 0),
             "walCommitMs": p.durationMs.get("walCommit", 0),
             "commitOffsetsMs": p.durationMs.get("commitOffsets", 0),
             "stateCommitMs": p.stateOperators[0].commitTimeMs,
             "stateRows": p.stateOperators[0].numRowsTotal} for p in progress]


def medians(batches: list[dict]) -> dict:
    body = batches[1:]   # the first batch warms the Python workers up
    return {k: statistics.median(b[k] for b in body)
            for k in ("triggerMs", "walCommitMs", "commitOffsetsMs", "stateCommitMs")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args(argv)

    import boto3
    from microbatch import StreamingSession, embedded_spark
    from microbatch.testing.s3_server import s3_server

    with s3_server() as endpoint:
        settings = {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.access.key": "bench",
                    "spark.hadoop.fs.s3a.secret.key": "bench", "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        ss = StreamingSession(embedded_spark(conf={"spark.sql.shuffle.partitions": "4", **settings}))
        results = {"local": run(ss, tempfile.mkdtemp(prefix="bench-ckpt-"), args.rows, args.batches),
                   "s3": run(ss, f"s3://{BUCKET}/dedup", args.rows, args.batches)}
    summary = {store: medians(batches) for store, batches in results.items()}
    print(f"{args.batches} batches of {args.rows} new keys, dropDuplicates, medians (ms) of batches 1..:")
    print(f"{'checkpoint':10} {'trigger':>8} {'walCommit':>10} {'commitOffsets':>14} {'state commit':>13}")
    for store, m in summary.items():
        print(f"{store:10} {m['triggerMs']:8.0f} {m['walCommitMs']:10.0f} {m['commitOffsetsMs']:14.0f} "
              f"{m['stateCommitMs']:13.0f}")
    local, s3 = summary["local"], summary["s3"]
    print(f"S3 / local: trigger {s3['triggerMs'] / max(local['triggerMs'], 1):.2f}, per-batch extra "
          f"{s3['triggerMs'] - local['triggerMs']:.0f} ms")
    for store, batches in results.items():
        tenths = by_tenth(batches, "stateCommitMs")
        ratio = tenths[-1] / max(tenths[1], 1) if len(tenths) > 2 else float("nan")
        print(f"state commit per tenth ({store}): {[round(t) for t in tenths]}  last/second {ratio:.2f}  "
              f"(state rows at end: {batches[-1]['stateRows']})")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "checkpoint_storage.json"), "w") as f:
        json.dump({"args": vars(args), "summary": summary, "batches": results}, f, indent=1)


if __name__ == "__main__":
    main()
