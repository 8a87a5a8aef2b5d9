"""A short seed of the chaos runner (``python -m microbatch.testing.chaos``), as users run it.

Two SIGKILLs per pipeline kind at random moments; the runner's own check (output
against vanilla Spark batch reads of all the input) must say exactly once for every
kind. The kinds are split between the two seeds so that each runs once in CI (issue 58):
the plain seed the foreachBatch and Delta kinds, the seed with store faults the
stateless, stateful and Kafka kinds (a crash at every step of the protocol, for each
kind, is tests/test_crash_steps.py). The README says how to run 100 kills or more.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

#: the kinds the plain seed runs (the others run under store faults, below)
KINDS = ("foreach", "delta")

#: a separate bounded step (make test-faults): real processes killed with SIGKILL
pytestmark = pytest.mark.faults


@pytest.mark.extended   # the kills of the seed below, on two more sinks (make test-extended)
def test_a_short_chaos_seed_is_exactly_once(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, "-m", "microbatch.testing.chaos", "--kills", "2",
                           "--kinds", ",".join(KINDS), "--seed", "20261124", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    for kind in KINDS:
        assert len(re.findall(rf"^  {kind}: kill \d/2 ", out, re.M)) == 2, out
        summary = re.search(rf"^{kind}: 2 kills, 2 restarts, rows in (\d+), rows out (\d+), "
                            r"missing 0, written twice 0: EXACTLY ONCE$", out, re.M)
        assert summary and int(summary.group(1)) > 0 and int(summary.group(2)) > 0, out


def test_a_short_chaos_seed_with_store_faults_is_exactly_once(tmp_path):
    """--faults: the checkpoints on S3 behind the fault proxy (errors, resets with the
    outcome unknown, short outages, seeded), and the kafka kind's broker behind one that
    goes down now and then, while the SIGKILLs go on."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, "-m", "microbatch.testing.chaos", "--kills", "2", "--faults",
                           "--kinds", "stateless,stateful,kafka", "--seed", "40", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    for kind in ("stateless", "stateful", "kafka"):
        summary = re.search(rf"^{kind}: 2 kills, 2 restarts, rows in (\d+), rows out (\d+), "
                            r"missing 0, written twice 0: EXACTLY ONCE$", out, re.M)
        assert summary and int(summary.group(1)) > 0 and int(summary.group(2)) > 0, out
    faults = re.search(r"^store faults: (\d+) of (\d+) S3 requests failed .*, (\d+) outages", out, re.M)
    assert faults and int(faults.group(1)) > 0 and int(faults.group(3)) > 0, out
