"""Two processes on one checkpoint: the second run is refused at start while the first
lives, the first goes on untouched, and a run killed with SIGKILL does not block the
restart (its lease names a process that no longer exists). On local disk and with the
checkpoint on a real S3 endpoint (moto's server); see ``checkpoint/run_lease.py``."""
from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import time

import boto3
import pytest

from child_process import Child
from microbatch.testing.s3_server import s3_server

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lease_child.py")


@pytest.fixture
def s3_checkpoint():
    with s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="moto", aws_secret_access_key="moto",
                     region_name="us-east-1").create_bucket(Bucket="runs")
        yield "s3://runs/ckpt", {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.access.key": "moto",
                                 "spark.hadoop.fs.s3a.secret.key": "moto",
                                 "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}


def line_starting(child: Child, prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = child.lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line in {timeout} s; see {child.log.name}")


def two_runs(ckpt: str, conf: dict, out, log_path) -> None:
    env = {"LEASE_CHILD_CONF": json.dumps(conf)}

    def child():
        return Child("-", out, ckpt, log_path, script=CHILD, env=env)
    first = child()
    first.wait_for("PROGRESS", timeout=180)
    second = child()
    refused = line_starting(second, "REFUSED", timeout=180)
    second.proc.wait(60)
    assert second.proc.returncode == 3, second.proc.returncode
    assert "Another run of this query is active" in refused and ckpt in refused, refused
    assert f"process {first.proc.pid} on host" in refused, refused
    second.kill()
    for _ in range(3):                        # the first run goes on
        first.wait_for("PROGRESS", timeout=60)
    assert first.proc.poll() is None
    first.kill()                              # its lease stays behind, naming a dead process
    restarted = child()
    restarted.wait_for("PROGRESS", timeout=180)
    restarted.wait_for("PROGRESS", timeout=60)
    restarted.kill()


def test_a_second_process_is_refused_and_a_killed_run_does_not_block(spark, tmp_path, s3_checkpoint):
    runs = {"local": (str(tmp_path / "ckpt"), {}), "s3": s3_checkpoint}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:   # the two stories side by side
        done = {where: pool.submit(two_runs, ckpt, conf, tmp_path / f"out-{where}", tmp_path / f"{where}.log")
                for where, (ckpt, conf) in runs.items()}
        for future in done.values():
            future.result()
    for where in runs:
        values = [r.value for r in spark.read.parquet(str(tmp_path / f"out-{where}")).collect()]
        assert values and len(values) == len(set(values)), f"{where}: a batch was written twice"


def test_a_run_of_this_process_whose_release_failed_does_not_block_the_next(tmp_path):
    """A run ended while its store refused writes (a full disk, an outage): its lease
    still reads as held by this live process, but this process knows the run is over."""
    from microbatch.checkpoint.fs import FailingFileSystem
    from microbatch.checkpoint.run_lease import RunLease
    from microbatch.errors import ConcurrentUpdateError
    failing = {"on": False}
    fs = FailingFileSystem(lambda op, path: failing["on"])
    first = RunLease(fs, str(tmp_path), "q", "first")
    first.acquire()
    with pytest.raises(ConcurrentUpdateError, match="its process .* on this host is running"):
        RunLease(fs, str(tmp_path), "q", "while-first-runs").acquire()
    failing["on"] = True
    first.release("the disk was full")            # its write fails; the lease reads as held
    failing["on"] = False
    assert "released" not in json.loads(fs.read_text(f"{tmp_path}/leases/1"))
    second = RunLease(fs, str(tmp_path), "q", "second")
    second.acquire()
    assert second.number == 2
    second.release()
