"""One availableNow run of a query of tests/test_connect.py on microbatch over a classic
session (a JVM in this process, which the Connect tests' own process must not have), for
the test that moves a checkpoint between a classic session and Spark Connect.

usage: python connect_classic_run.py QUERY SOURCE CHECKPOINT   (prints one JSON line)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from pyspark.sql import SparkSession

    import test_connect
    from microbatch import StreamingSession
    query, source, checkpoint = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate())
    build = test_connect.MOVING_QUERIES[query]
    batches, progress = test_connect._run_microbatch(StreamingSession(spark), lambda r: build(r, source),
                                                     checkpoint)
    print("RESULT " + json.dumps({"batches": batches, "progress": progress}, default=str), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
