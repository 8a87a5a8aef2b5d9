"""A Spark Connect server in its own process, for tests/test_connect.py: a classic local
session with Spark's Connect plugin on the port given, until the stop file appears.

usage: python connect_server.py PORT STOP_FILE MAX_SECONDS
"""
import os
import sys
import time

from pyspark.sql import SparkSession


def main() -> None:
    port, stop_file, max_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    spark = (SparkSession.builder.master("local[2]").appName("microbatch-connect-tests")
             .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
             .config("spark.connect.grpc.binding.port", port)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.python.unix.domain.socket.enabled", "true")
             # (managed tables beside the stop file, not in the working directory)
             .config("spark.sql.warehouse.dir", os.path.join(os.path.dirname(os.path.abspath(stop_file)), "warehouse"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    print("SERVER READY", flush=True)
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline and not os.path.exists(stop_file):
        time.sleep(0.2)
    spark.stop()
    print("SERVER STOPPED", flush=True)


if __name__ == "__main__":
    main()
