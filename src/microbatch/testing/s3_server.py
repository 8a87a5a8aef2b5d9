"""A real S3 endpoint for tests and benchmarks: moto's server on 127.0.0.1.

    with s3_server() as endpoint:      # "http://127.0.0.1:<port>"
        ...

Needs ``moto[server]`` (the ``test`` extra). The server is a separate process, killed
when the block ends. ``authenticate=N``: after its first N requests (e.g. creating a
bucket, an IAM user, its policy and its access key), the server checks every request's
keys and the IAM policies of their user, as S3 does (``True``: after one request).
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Iterator


def wait_until_listening(server: subprocess.Popen, port: int, timeout_s: float, failed: str) -> None:
    """Until ``server`` accepts connections on 127.0.0.1:``port``; RuntimeError(``failed``)
    if it dies or ``timeout_s`` passes first (the test servers of ``microbatch.testing``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(failed) from None
            try:
                server.wait(0.1)   # returns early only if the server died
            except subprocess.TimeoutExpired:
                pass


@contextlib.contextmanager
def s3_server(timeout_s: float = 30.0, authenticate: bool | int = False) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                               "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": str(int(authenticate))}
                                                    if authenticate else {})})
    try:
        wait_until_listening(server, port, timeout_s, "moto_server did not start (pip install 'moto[server]')")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
