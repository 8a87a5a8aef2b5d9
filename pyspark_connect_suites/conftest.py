"""PySpark 4.3's own Spark Connect streaming tests, from the installed wheel, unmodified,
run on microbatch against a Connect server in a process of its own: the test processes are
clients with no JVM (``SPARK_SKIP_CONNECT_COMPAT_TESTS``: PySpark's own switch for testing
its Connect-only client, under which its test classes keep no classic SparkContext).

One server serves every test process: the controller starts it (``microbatch.testing.connect_server``)
and points PySpark's test classes at it (``SPARK_CONNECT_TESTING_REMOTE``, which
``ReusedConnectTestCase`` reads) before the workers start; it stops at the end.

``MICROBATCH_PYSPARK_ENGINE=spark`` runs the same tests on Spark's own engine on that
server (the reference: which tests pass there); the default runs them on microbatch.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "pyspark_suites"))   # engine.py: the session wrapped, the engine checked

# (before PySpark is imported: its package exports the classic classes or not by this)
os.environ["SPARK_SKIP_CONNECT_COMPAT_TESTS"] = "1"

from microbatch.testing import connect_server  # noqa: E402
from engine import tests_from_the_wheel  # noqa: E402

tests_from_the_wheel()

_SERVER: dict = {}

#: PySpark's tests read their inputs from ``python/test_support/sql/streaming`` under the
#: working directory of Spark's source tree, which the wheel does not ship: the lines its
#: tests assert (``["hello", "this"]``; ten ``time;id`` rows for the watermark's tests),
#: written here into a working directory the test processes and the server share
_INPUTS = {
    "python/test_support/sql/streaming/text-test.txt": "hello\nthis",
    "python/test_support/sql/streaming/time/text-with-time-test.txt": "\n".join(
        f"2024-05-24 15:03:{second:02d};{key}" for second, key in
        ((20, 1), (21, 2), (24, 3), (25, 3), (31, 4), (31, 1), (32, 3), (45, 2), (46, 5), (50, 6))),
}


#: PySpark's Connect tests that pass on Spark's engine here and not yet on microbatch, each
#: with what is missing: a strict xfail, so that each one fixed fails the run until it leaves
#: this list (every other test must pass on both engines; ``MICROBATCH_PYSPARK_ENGINE=spark``
#: runs them all, these included, on Spark's engine, where all pass)
NOT_YET_ON_MICROBATCH: dict[str, str] = {
    "ForeachBatchParity::test_batch_dataframe_in_root_session_sql_is_unsupported":
        "the batch's DataFrame is a plan of the cloned session, not a relation the server cached in it, "
        "so the user's session reads it too (no DATAFRAME_NOT_FOUND)",
}


def pytest_collection_modifyitems(items):
    from engine import ENGINE
    if ENGINE != "microbatch":
        return
    for item in items:
        reason = NOT_YET_ON_MICROBATCH.get(item.nodeid.split("::", 1)[-1])
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def pytest_configure(config):
    """The controller (or a run without workers) starts the one server."""
    if hasattr(config, "workerinput") or "SPARK_CONNECT_TESTING_REMOTE" in os.environ:
        return
    workdir = Path(tempfile.mkdtemp(prefix="microbatch-connect-suites-"))
    for name, text in _INPUTS.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    # (the server's Python workers import engine.py too; the server is a classic session)
    server, port = connect_server.launch(workdir, 7200, (str(ROOT / "pyspark_suites"),), workdir,
                                         ("SPARK_SKIP_CONNECT_COMPAT_TESTS",))
    os.environ["SPARK_CONNECT_TESTING_REMOTE"] = f"sc://localhost:{port}"
    os.environ["MICROBATCH_CONNECT_SUITES_WORKDIR"] = str(workdir)
    _SERVER.update(process=server, workdir=workdir)


@pytest.fixture(scope="session", autouse=True)
def _in_the_servers_working_directory():
    """The tests' relative paths name the inputs above, for the client and the server alike."""
    os.chdir(os.environ["MICROBATCH_CONNECT_SUITES_WORKDIR"])


def pytest_unconfigure(config):
    if not _SERVER:
        return
    connect_server.shut_down(_SERVER["process"], _SERVER["workdir"])
    shutil.rmtree(_SERVER["workdir"], ignore_errors=True)
