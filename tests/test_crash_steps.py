"""A crash at every step of the batch protocol: the output equals an uninterrupted run.

Each pipeline kind of ``microbatch.testing.chaos`` (stateless into the file sink, an
event-time window count into the file sink, a running count into ``foreachBatch``
writing an idempotent table) runs in a child process that kills itself with SIGKILL
(its whole process group: driver, JVM, Python workers) the first time it reaches the
named step (``MICROBATCH_CRASH_AT=<step>:1``, see ``microbatch.crash_points``). The next
child recovers from that crash and dies at the next step, and so on; then the query
finishes in this process and its output is checked against vanilla Spark batch reads
of all the input: nothing lost, nothing twice, aggregates equal.
"""
from __future__ import annotations

import concurrent.futures

import pytest

from microbatch.testing import chaos
from microbatch.testing.chaos import BETWEEN_BATCHES, PLANNED, SINK_COMMITTED

#: a separate bounded step (make test-faults): real processes killed with SIGKILL
pytestmark = pytest.mark.faults

ANY = {BETWEEN_BATCHES, PLANNED, SINK_COMMITTED}
#: step -> where the checkpoint must show the kill landed
WHERE = {
    "offsets-written": {PLANNED},
    "logs-purged": {PLANNED},
    "source-file-cleaned": {PLANNED},
    "source-get-batch": {PLANNED},
    "state-loaded": {PLANNED},
    "state-delta-written": {PLANNED},
    "state-snapshot-written": {PLANNED},
    "state-cleanup": {PLANNED},
    "sink-data-written": {PLANNED},
    "sink-manifest-written": {SINK_COMMITTED},
    "foreach-batch-returned": {SINK_COMMITTED},
    "sink-added": {SINK_COMMITTED},
    "commit-written": {BETWEEN_BATCHES},
    "log-compacted": ANY,    # the file source's log (planning) or the file sink's (its commit)
}
STEPS = {
    "stateless": ["offsets-written", "source-get-batch", "sink-data-written", "sink-manifest-written",
                  "sink-added", "commit-written", "source-file-cleaned", "log-compacted", "logs-purged"],
    "stateful": ["state-loaded", "state-delta-written", "state-snapshot-written", "sink-manifest-written",
                 "state-cleanup", "commit-written"],
    "foreach": ["offsets-written", "state-delta-written", "foreach-batch-returned", "commit-written"],
    # (sink-data-written: the batch's parquet files are in the table's directory, its Delta
    # commit not made; sink-manifest-written: the Delta commit, with the query's txn, made)
    "delta": ["offsets-written", "sink-data-written", "sink-manifest-written", "commit-written"],
}


def crash_at_each_step(kind: str, root: str) -> tuple[int, list]:
    """Run the chain of children of ``kind``, each killed at the next step; return the
    number of input files fed and where each crash landed."""
    next_file = chaos.feed(root, 0, 2)
    landed = []
    for step in STEPS[kind]:
        child = chaos.Child(kind, root, crash_at=f"{step}:1")
        code = child.wait_killed(timeout=300)
        assert code == -9, f"{kind} {step}: the child ended with {code}, not SIGKILL; see {root}/child.log"
        where, batch = chaos.landing(kind, root)
        landed.append((step, batch, where))
        assert where in WHERE[step], f"{kind}: the crash at {step} landed {where}: {landed}"
        next_file = chaos.feed(root, next_file, 2)
    return next_file, landed


def test_a_crash_at_every_step_loses_nothing_and_repeats_nothing(ss, spark, tmp_path):
    # the three chains run side by side (each child is a driver, a JVM and workers of its own)
    with concurrent.futures.ThreadPoolExecutor(len(STEPS)) as pool:
        chains = {kind: pool.submit(crash_at_each_step, kind, str(tmp_path / kind)) for kind in STEPS}
        done = {kind: chain.result() for kind, chain in chains.items()}
    for kind, (files, landed) in done.items():
        root = str(tmp_path / kind)
        chaos.finish(ss, kind, root)
        expected, actual, rows_in = chaos.expected_and_actual(spark, kind, root)
        assert rows_in == files * chaos.ROWS_PER_FILE, kind
        assert sum(expected.values()) > 0, kind
        assert actual - expected == {}, f"{kind}: written twice or wrong: {actual - expected}; crashes {landed}"
        assert expected - actual == {}, f"{kind}: lost: {expected - actual}; crashes {landed}"
