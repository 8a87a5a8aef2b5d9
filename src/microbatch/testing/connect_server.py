"""A Spark Connect server in its own process, for the Connect tests and benchmarks: a
classic local session with Spark's Connect plugin on the port given, until the stop file
appears or the process that launched it ends.

usage: python -m microbatch.testing.connect_server PORT STOP_FILE MAX_SECONDS [CONF_JSON]

``launch`` and ``shut_down`` start and stop it from a test or benchmark process
(tests/test_connect.py, pyspark_connect_suites/conftest.py, ``benchmarks nexmark --connect``).
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def launch(base: Path, max_seconds: int, python_path: tuple[str, ...] = (), cwd: Path | None = None,
           env_removed: tuple[str, ...] = (), conf: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """This server in a process of its own on a free port, its stop file and log in
    ``base``, its Python workers importing this microbatch and ``python_path``, with the
    Spark confs ``conf`` besides its own; returns once it serves (the process and the
    port), or raises with its log's tail."""
    import microbatch
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(Path(microbatch.__file__).parents[1]), *python_path,
                                           os.environ.get("PYTHONPATH", "")]))
    for name in env_removed:
        env.pop(name, None)
    log_path = base / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "microbatch.testing.connect_server", str(port),
                                   str(base / "stop"), str(max_seconds), json.dumps(conf or {})],
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    deadline = time.monotonic() + 180
    while "SERVER READY" not in log_path.read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the Connect server did not start; its log:\n" + log_path.read_text()[-3000:])
        time.sleep(0.5)
    return server, port


def shut_down(server: subprocess.Popen, base: Path) -> None:
    """Stop a server ``launch`` started (its stop file; killed after a minute)."""
    (base / "stop").touch()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def main() -> None:
    from pyspark.sql import SparkSession
    port, stop_file, max_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    conf = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = (builder.master("local[2]").appName("microbatch-connect-tests")
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
    launcher = os.getppid()
    # (until the stop file, the deadline, or the end of the process that launched it, whose
    # Connect sessions close their channels at its exit while the server still answers)
    while time.monotonic() < deadline and not os.path.exists(stop_file) and os.getppid() == launcher:
        time.sleep(0.2)
    spark.stop()
    print("SERVER STOPPED", flush=True)


if __name__ == "__main__":
    main()
