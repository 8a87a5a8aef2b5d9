"""A file source's listing of a directory on S3 per trigger, with and without
``useIncrementalListing``, as the directory grows.

``python -m benchmarks.listing [--sizes 1000,10000,100000] [--new 10] [--reps 5]``

For each size, ``size`` objects (names that sort in arrival order: a zero-padded
sequence number) are put under one prefix of an S3 endpoint (moto's server on 127.0.0.1,
started here: the cost of the S3 protocol and of the storage layer, not of a network),
then ``new`` more. A trigger's listing is timed as the file source makes it: the full
listing (Spark's rule: every object of the directory, every trigger:
``file_listing.list_input_files``) and the incremental one (``IncrementalListing``, its
start the last key read before the new objects: S3's ``StartAfter``). It prints the
objects each listing returned and its median time, and writes
``benchmarks/results/listing.json``.

Spark's own engine cannot take part: this PySpark has no hadoop-aws, so its file source
cannot list ``s3a://`` here (its listing is the full one, every trigger, as microbatch's
default).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUCKET = "listing"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.listing", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--new", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "listing.json"))
    args = parser.parse_args(argv)

    import boto3

    from microbatch.checkpoint.stores import storage_for
    from microbatch.sources.file_listing import IncrementalListing, StoreFiles, list_input_files
    from microbatch.testing.s3_server import s3_server

    results = []
    with s3_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        store = storage_for(f"s3a://{BUCKET}/", {"spark.hadoop.fs.s3a.endpoint": endpoint,
                                                 "spark.hadoop.fs.s3a.access.key": "k",
                                                 "spark.hadoop.fs.s3a.secret.key": "s",
                                                 "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"})
        files = StoreFiles(store)
        print(f"{'objects':>8} {'listing':>12} {'objects listed':>15} {'median ms':>10}")
        for size in (int(s) for s in args.sizes.split(",")):
            prefix = f"dir-{size}"
            started = time.perf_counter()
            names = [f"{prefix}/{i:09d}.json" for i in range(size + args.new)]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda key: client.put_object(Bucket=BUCKET, Key=key, Body=b"{}\n"), names))
            put_s = time.perf_counter() - started
            path = f"s3a://{BUCKET}/{prefix}"
            last_read = [f"s3a://{BUCKET}/{names[size - 1]}"]     # the stream's log: the first `size` read
            row = {"objects": size + args.new, "new": args.new, "put_s": round(put_s, 1)}
            for kind in ("full", "incremental"):
                times, listed = [], 0
                for _ in range(args.reps):
                    t = time.perf_counter()
                    if kind == "full":
                        listed = len(list_input_files(path, files=files))
                    else:
                        incremental = IncrementalListing(files, path, last_read, None, False)
                        incremental.list()
                        listed = incremental.listed
                    times.append((time.perf_counter() - t) * 1000)
                row[kind] = {"listed": listed, "median_ms": round(statistics.median(times), 1),
                             "runs_ms": [round(x, 1) for x in times]}
                print(f"{size + args.new:>8} {kind:>12} {listed:>15} {row[kind]['median_ms']:>10}", flush=True)
            results.append(row)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"new": args.new, "reps": args.reps, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
