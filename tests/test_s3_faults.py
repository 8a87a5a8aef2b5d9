"""Faults of S3 under the checkpoint's storage layer (checkpoint/fs.py): a real moto server
behind the fault proxy, reached through s3fs and botocore as a query reaches it.

The storage layer alone here (no Spark): retries bounded by the S3A settings, a create
whose outcome is unknown resolved by reading back, an outage past the limits failing with
the location named. tests/test_s3_query_faults.py runs queries through the same faults."""
from __future__ import annotations

import logging

import boto3
import pytest

from microbatch.checkpoint.fs import ObjectStoreFileSystem, S3Retries

from microbatch.checkpoint.stores import storage_for
from microbatch.errors import CheckpointError, StorageUnavailableError
from microbatch.testing.fault_proxy import Fault, FaultProxy
from microbatch.testing.s3_server import s3_server

pytestmark = pytest.mark.timeout(90)
BUCKET = "faulty"
SECRET = "fault-secret-never-logged"


@pytest.fixture(scope="module")
def server():
    with s3_server() as endpoint:
        direct = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="a", aws_secret_access_key="b",
                              region_name="us-east-1")
        direct.create_bucket(Bucket=BUCKET)
        yield int(endpoint.rsplit(":", 1)[1]), direct


@pytest.fixture
def proxy(server):
    with FaultProxy(server[0], http=True) as p:
        yield p


def store(proxy, **limits) -> ObjectStoreFileSystem:
    conf = {"spark.hadoop.fs.s3a.endpoint": proxy.url, "spark.hadoop.fs.s3a.access.key": "a",
            "spark.hadoop.fs.s3a.secret.key": SECRET, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.attempts.maximum": "1", "spark.hadoop.fs.s3a.retry.limit": "2",
            "spark.hadoop.fs.s3a.retry.interval": "10ms", "spark.hadoop.fs.s3a.connection.timeout": "2s",
            "spark.hadoop.fs.s3a.connection.establish.timeout": "2s"}
    conf.update({f"spark.hadoop.fs.s3a.{k.replace('_', '.')}": v for k, v in limits.items()})
    fs = storage_for(f"s3://{BUCKET}/x", conf)
    assert isinstance(fs, ObjectStoreFileSystem)
    return fs


def puts(proxy, key: str) -> list[str]:
    return [r.fault for r in proxy.requests if r.method == "PUT" and r.path == f"/{BUCKET}/{key}"]


def test_the_s3a_settings_bound_both_layers_of_retries(proxy):
    fs = store(proxy)
    assert fs.retries == S3Retries(attempts_maximum=1, retry_limit=2, retry_interval_s=0.01,
                                   connect_timeout_s=2.0, read_timeout_s=2.0)
    assert fs._fs.retries == 1                    # s3fs's own loop is off: no third layer
    assert dict(fs.spec()[1])["spark.hadoop.fs.s3a.retry.limit"] == "2"   # the executors get them
    # 503 SlowDown and 500 five times: botocore's two attempts, three times over
    proxy.inject(Fault.error(503), times=3, method="PUT")
    proxy.inject(Fault.error(500), times=2, method="PUT")
    fs.write(f"s3://{BUCKET}/t/a", "a")
    assert puts(proxy, "t/a") == ["error"] * 5 + ["pass"]
    assert fs.read_text(f"s3://{BUCKET}/t/a") == "a"


def test_an_outage_past_the_limits_fails_naming_the_location_and_settings(proxy, caplog):
    fs = store(proxy)
    proxy.inject(Fault.error(503), times=None, method="PUT")
    with caplog.at_level(logging.DEBUG), pytest.raises(StorageUnavailableError) as failed:
        fs.create(f"s3://{BUCKET}/down/offsets/0", "v1")
    message = str(failed.value)
    assert f"Cannot create 's3://{BUCKET}/down/offsets/0'" in message
    assert "failed 3 times" in message and "spark.hadoop.fs.s3a.retry.limit=2" in message
    assert "restart the query" in message
    assert puts(proxy, "down/offsets/0") == ["error"] * 6     # bounded: 2 botocore x 3 ours, no more
    assert SECRET not in message and SECRET not in caplog.text
    assert isinstance(failed.value, CheckpointError)


def test_a_create_whose_outcome_is_unknown_is_read_back(server, proxy):
    fs = store(proxy)
    # the PUT reached the store, the answer was lost: the retried create finds the key taken,
    # reads it back, and it is ours
    proxy.inject(Fault.reset_after_forward(), method="PUT", path="/unknown/0$")
    assert fs.create(f"s3://{BUCKET}/unknown/0", "ours") is True
    assert puts(proxy, "unknown/0") == ["reset_after_forward", "pass"]
    assert server[1].get_object(Bucket=BUCKET, Key="unknown/0")["Body"].read() == b"ours"
    # another writer's entry: a reset before our PUT reached the store, then the key is
    # found taken with other content: a lost race, and nothing overwritten
    server[1].put_object(Bucket=BUCKET, Key="unknown/1", Body=b"theirs")
    proxy.inject(Fault.reset(), method="PUT", path="/unknown/1$")
    assert fs.create(f"s3://{BUCKET}/unknown/1", "ours") is False
    assert server[1].get_object(Bucket=BUCKET, Key="unknown/1")["Body"].read() == b"theirs"
    # every attempt's answer lost, past the limits: one read back tells it was ours
    proxy.inject(Fault.reset_after_forward(), times=None, method="PUT", path="/unknown/2$")
    assert fs.create(f"s3://{BUCKET}/unknown/2", "ours") is True
    assert server[1].get_object(Bucket=BUCKET, Key="unknown/2")["Body"].read() == b"ours"
    # bounded: 3 of ours x 2 of botocore's, each sent at most twice by aiohttp (one resend
    # of an idempotent request on a reset connection, RFC 9112)
    assert 6 <= len(puts(proxy, "unknown/2")) <= 12
    assert set(puts(proxy, "unknown/2")) == {"reset_after_forward"}


def test_a_listing_never_answers_for_an_object_created_after_it(server, proxy):
    """Found by the chaos runner with --faults: a run listed ``leases/``, its create of the
    next lease lost its first answer, and the read-back (s3fs asks the size first) was
    answered "no such key" from the listing s3fs had cached, so the run refused to start
    because of its own lease. Reads and stats go to the store, never to a listing."""
    fs = store(proxy)
    assert fs.create(f"s3://{BUCKET}/listed/leases/1", "first") is True
    assert fs.list(f"s3://{BUCKET}/listed/leases") == ["1"]
    proxy.inject(Fault.reset_after_forward(), method="PUT", path="/listed/leases/2$")
    assert fs.create(f"s3://{BUCKET}/listed/leases/2", "ours") is True
    assert fs.read_text(f"s3://{BUCKET}/listed/leases/2") == "ours"
    # another writer's object, created after this store listed the directory
    assert fs.list(f"s3://{BUCKET}/listed/leases") == ["1", "2"]
    server[1].put_object(Bucket=BUCKET, Key="listed/leases/3", Body=b"theirs")
    assert fs.exists(f"s3://{BUCKET}/listed/leases/3")
    assert fs.read_text(f"s3://{BUCKET}/listed/leases/3") == "theirs"
    assert fs.create(f"s3://{BUCKET}/listed/leases/3", "ours") is False


def test_a_request_hung_past_the_read_timeout_is_sent_again(proxy):
    fs = store(proxy, connection_timeout="1s")
    fs.write(f"s3://{BUCKET}/hung/a", "before")
    proxy.inject(Fault.hang(), method="GET", path="/hung/a$")
    assert fs.read_text(f"s3://{BUCKET}/hung/a") == "before"
    assert [r.fault for r in proxy.requests if r.method == "GET"] == ["hang", "pass"]


def test_an_outage_shorter_than_the_retries_is_ridden_out(proxy):
    fs = store(proxy, retry_limit="6", retry_interval="200ms")    # waits 0.2 .. 6.4 s
    fs.write(f"s3://{BUCKET}/short/a", "a")
    proxy.outage(1.5)
    fs.write(f"s3://{BUCKET}/short/b", "b")
    assert fs.list(f"s3://{BUCKET}/short") == ["a", "b"]


def test_a_missing_key_or_a_denial_is_not_retried(proxy):
    fs = store(proxy)
    with pytest.raises(FileNotFoundError):
        fs.read_text(f"s3://{BUCKET}/nothing/here")
    assert len([r for r in proxy.requests if r.path == f"/{BUCKET}/nothing/here"]) == 1


@pytest.mark.parametrize("key, value, problem", [
    ("retry.limit", "seven", "is 'seven', which is not a count"),
    ("attempts.maximum", "-1", "is '-1', which is not a count"),
    ("retry.interval", "soon", "is 'soon', which is not a duration"),
    ("connection.timeout", "10 parsecs", "is '10 parsecs', which is not a duration"),
])
def test_bad_retry_settings_are_refused_naming_the_setting(key, value, problem):
    with pytest.raises(CheckpointError, match=f"spark.hadoop.fs.s3a.{key} {problem}"):
        S3Retries.from_conf({f"spark.hadoop.fs.s3a.{key}": value})


def test_hadoop_durations_are_read_as_hadoop_reads_them():
    retries = S3Retries.from_conf({"spark.hadoop.fs.s3a.retry.interval": "1500",
                                   "spark.hadoop.fs.s3a.connection.timeout": "2m",
                                   "spark.hadoop.fs.s3a.connection.establish.timeout": "5s"})
    assert (retries.retry_interval_s, retries.read_timeout_s, retries.connect_timeout_s) == (1.5, 120.0, 5.0)
    assert S3Retries.from_conf({}) == S3Retries(5, 7, 0.5, 30.0, 200.0)    # Hadoop's defaults


def test_the_start_probe_rides_out_a_short_outage_and_names_a_long_one(proxy):
    fs = store(proxy, retry_limit="6", retry_interval="200ms")
    proxy.outage(1.5)
    fs.check_reachable(f"s3://{BUCKET}/probe")               # a store down for a moment: the start goes on
    assert any(r.path.startswith(f"/{BUCKET}/probe/.microbatch-write-probe-") for r in proxy.requests)
    fs = store(proxy)
    proxy.outage(60)
    with pytest.raises(CheckpointError, match=rf"'s3://{BUCKET}/probe': cannot reach the store \(.*; tried 3 times\)"):
        fs.check_reachable(f"s3://{BUCKET}/probe")
