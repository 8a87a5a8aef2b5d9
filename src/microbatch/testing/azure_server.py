"""A real Azure Blob Storage endpoint for tests: Azurite (Microsoft's emulator, the npm
package ``azurite``) on 127.0.0.1.

    with azure_server() as endpoint:      # "http://127.0.0.1:<port>/devstoreaccount1"
        ...

``make test-setup`` installs Azurite into the virtual environment
(``.venv/azurite/node_modules/.bin/azurite-blob``, with the machine's Node.js); elsewhere
``azurite-blob`` on the PATH is used. Blobs kept in a temporary directory, the server
killed when the block ends. It keeps Azure's conditional create (``If-None-Match: *``,
409 when the blob exists), which the checkpoint's logs rely on. Azurite serves the Blob
API only (no Data Lake ``dfs`` endpoint): microbatch's storage layer talks to ADLS Gen2
through its Blob endpoint anyway (adlfs). ``settings(endpoint)``: the Spark settings
that point ``abfss://<container>@devstoreaccount1.dfs.core.windows.net/`` at it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Iterator

from microbatch.testing.s3_server import wait_until_listening

ACCOUNT = "devstoreaccount1"
#: Azurite's well-known development key (public, in Microsoft's documentation)
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
HOST = f"{ACCOUNT}.dfs.core.windows.net"


def settings(endpoint: str) -> dict[str, str]:
    """The account's shared key as ABFS takes it, and its Blob endpoint (the emulator's)."""
    return {f"spark.hadoop.fs.azure.account.key.{HOST}": KEY,
            f"spark.microbatch.azure.blobEndpoint.{ACCOUNT}": endpoint}


def _binary() -> str:
    local = os.path.join(sys.prefix, "azurite", "node_modules", ".bin", "azurite-blob")
    found = local if os.path.exists(local) else shutil.which("azurite-blob")
    if not found:
        raise RuntimeError("Azurite is not installed: make test-setup (npm install --prefix .venv/azurite azurite)")
    return found


@contextlib.contextmanager
def azure_server(timeout_s: float = 30.0) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="azurite-") as data:
        server = subprocess.Popen([_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                                   "--location", data, "--silent", "--skipApiVersionCheck", "--loose"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until_listening(server, port, timeout_s, "Azurite did not start")
            yield f"http://127.0.0.1:{port}/{ACCOUNT}"
        finally:
            server.terminate()     # (Node's Azurite may take its time over SIGTERM)
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
