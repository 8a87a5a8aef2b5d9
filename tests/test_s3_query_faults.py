"""Queries whose checkpoint (logs, leases, state files) and file sink are on S3 while the
store fails under them: moto's server behind the fault proxy, seeded.

- Transient faults (SlowDown, 500, resets before and after the request reached the store,
  a hung request) sprinkled over every request: the query rides them out through the
  storage layer's bounded retries and its output equals a local run's.
- A persistent outage: the query fails with StorageUnavailableError naming the location;
  once the store is back the restart resumes, nothing lost or written twice."""
from __future__ import annotations

import io
import json

import boto3
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from file_inputs import write_json_files
from helpers import confs
from microbatch.checkpoint.fs import LOCAL
from microbatch.checkpoint.stores import storage_for
from microbatch.testing.fault_proxy import Fault, FaultProxy
from microbatch.testing.s3_server import s3_server

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]
BUCKET = "faulty"
LIMITS = {"spark.hadoop.fs.s3a.attempts.maximum": "2", "spark.hadoop.fs.s3a.retry.limit": "3",
          "spark.hadoop.fs.s3a.retry.interval": "50ms", "spark.hadoop.fs.s3a.connection.timeout": "2s",
          "spark.hadoop.fs.s3a.connection.establish.timeout": "2s"}


@pytest.fixture(scope="module")
def store(spark):
    with s3_server() as endpoint:
        direct = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="moto",
                              aws_secret_access_key="moto-secret", region_name="us-east-1")
        direct.create_bucket(Bucket=BUCKET)
        with FaultProxy(int(endpoint.rsplit(":", 1)[1]), http=True, seed=40) as proxy:
            settings = {"spark.hadoop.fs.s3a.endpoint": proxy.url, "spark.hadoop.fs.s3a.access.key": "moto",
                        "spark.hadoop.fs.s3a.secret.key": "moto-secret",
                        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1", **LIMITS}
            with confs(spark, settings):
                yield proxy, direct, settings


@pytest.fixture
def proxy(store):
    store[0].clear()
    yield store[0]
    store[0].clear()


def windowed_counts(ss, src, out, ckpt, timeout=180):
    counts = (ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
              .withColumn("ts", F.timestamp_seconds("id")).withWatermark("ts", "50 seconds")
              .groupBy(F.window("ts", "100 seconds"), "name").count())
    query = (counts.writeStream.format("parquet").outputMode("append").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(out))
    try:
        query.awaitTermination(timeout)
    except StreamingQueryException:
        pass                      # the caller reads query.exception()
    assert not query.isActive, "the query did not end within its timeout"
    return query


def sink_rows(fs, out: str) -> list[tuple]:
    """The rows of every file the sink's manifest lists (only committed files count)."""
    rows = []
    for entry in sorted(fs.list(f"{out}/_spark_metadata"), key=lambda n: int(n.split(".")[0])):
        for line in fs.read_text(f"{out}/_spark_metadata/{entry}").split("\n")[1:]:
            if line:
                table = pq.read_table(io.BytesIO(fs.read_bytes(json.loads(line)["path"])))
                rows += [(r["window"]["start"].timestamp(), r["name"], r["count"]) for r in table.to_pylist()]
    return sorted(rows)


def local_rows(spark, out: str) -> list[tuple]:
    return sorted((r.window.start.timestamp(), r.name, r["count"]) for r in spark.read.parquet(out).collect())


def test_transient_faults_on_every_request_are_ridden_out(ss, spark, store, proxy, tmp_path):
    """One request in eight fails (seeded): 503 SlowDown, 500, a reset before the store
    saw it, a reset after it did (the answer lost), and two hang past the read timeout.
    The checkpoint's logs, leases and state files and the sink's files and manifest all
    go through them; the output equals a local run's and every batch committed once."""
    src = str(tmp_path / "in")
    write_json_files(src, 0, 4)
    for fault in (Fault.error(503), Fault.error(500), Fault.reset(), Fault.reset_after_forward()):
        proxy.inject(fault, times=None, chance=1 / 32)
    proxy.inject(Fault.hang(), times=2, method="PUT", path="/state/")
    ckpt, out = f"s3://{BUCKET}/transient/ckpt", f"s3://{BUCKET}/transient/out"
    query = windowed_counts(ss, src, out, ckpt)
    assert query.exception() is None, query.exception()
    faults = [r.fault for r in proxy.requests]
    assert faults.count("hang") == 2 and {"error", "reset", "reset_after_forward"} <= set(faults)
    proxy.clear()
    local = windowed_counts(ss, src, str(tmp_path / "local_out"), str(tmp_path / "local_ckpt"))
    assert local.exception() is None
    fs = storage_for(ckpt, store[2])
    assert sink_rows(fs, out) == local_rows(spark, str(tmp_path / "local_out")) != []
    batches = sorted(LOCAL.list(str(tmp_path / "local_ckpt" / "commits")), key=int)
    assert len(batches) >= 4
    assert sorted(fs.list(f"{ckpt}/commits"), key=int) == sorted(fs.list(f"{ckpt}/offsets"), key=int) == batches


def test_a_persistent_outage_fails_the_query_naming_the_location_and_the_restart_resumes(
        ss, spark, store, proxy, tmp_path):
    src = str(tmp_path / "in")
    write_json_files(src, 0, 2)
    ckpt, out = f"s3://{BUCKET}/outage/ckpt", f"s3://{BUCKET}/outage/out"
    assert windowed_counts(ss, src, out, ckpt).exception() is None
    fs = storage_for(ckpt, store[2])
    before = sorted(fs.list(f"{ckpt}/commits"), key=int)
    manifest_before = fs.list(f"{out}/_spark_metadata")
    write_json_files(src, 2, 3)
    # the store goes down for good for the state files the next batch's tasks write
    proxy.inject(Fault.error(503), times=None, method="PUT", path=r"/outage/ckpt/state/0/\d+/")
    failed = windowed_counts(ss, src, out, ckpt)
    error = failed.exception()
    assert error is not None
    message = str(error)
    assert "StorageUnavailableError: Cannot write" in message, message
    assert f"s3://{BUCKET}/outage/ckpt/state/0/" in message and "spark.hadoop.fs.s3a.retry.limit=3" in message
    assert sorted(fs.list(f"{ckpt}/commits"), key=int) == before        # the failed batch committed nothing
    assert fs.list(f"{out}/_spark_metadata") == manifest_before         # nor wrote its sink's entry
    proxy.clear()                                              # the store is back
    assert windowed_counts(ss, src, out, ckpt).exception() is None
    assert windowed_counts(ss, src, str(tmp_path / "local_out"), str(tmp_path / "local_ckpt")).exception() is None
    assert len(fs.list(f"{ckpt}/commits")) > len(before)
    assert sink_rows(fs, out) == local_rows(spark, str(tmp_path / "local_out")) != []
