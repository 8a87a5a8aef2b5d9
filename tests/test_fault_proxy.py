"""The fault proxy (microbatch.testing.fault_proxy) against a real server: moto's S3 on
127.0.0.1, reached by boto3 through the proxy. Each fault is seen by the client as S3's
clients see it, and the server's side (was the object written?) is read directly."""
from __future__ import annotations

import socket
import time

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

from helpers import wait_for
from microbatch.testing.fault_proxy import Fault, FaultProxy
from microbatch.testing.s3_server import s3_server

pytestmark = pytest.mark.timeout(60)
BUCKET = "proxied"


@pytest.fixture(scope="module")
def server():
    with s3_server() as endpoint:
        direct = client_for(endpoint, attempts=1)
        direct.create_bucket(Bucket=BUCKET)
        yield int(endpoint.rsplit(":", 1)[1]), direct


def client_for(endpoint: str, attempts: int, read_timeout: float = 10):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="a", aws_secret_access_key="b",
                        region_name="us-east-1",
                        config=Config(retries={"mode": "standard", "total_max_attempts": attempts},
                                      connect_timeout=2, read_timeout=read_timeout))


@pytest.fixture
def proxy(server):
    with FaultProxy(server[0], http=True) as p:
        yield p


def exists(direct, key: str) -> bool:
    return "Contents" in direct.list_objects_v2(Bucket=BUCKET, Prefix=key)


def test_requests_pass_through_unchanged(server, proxy):
    client = client_for(proxy.url, attempts=1)
    client.put_object(Bucket=BUCKET, Key="pass/a", Body=b"x" * 100_000)
    assert client.get_object(Bucket=BUCKET, Key="pass/a")["Body"].read() == b"x" * 100_000
    assert server[1].get_object(Bucket=BUCKET, Key="pass/a")["Body"].read() == b"x" * 100_000
    assert [(r.method, r.path, r.fault) for r in proxy.requests] == [
        ("PUT", f"/{BUCKET}/pass/a", "pass"), ("GET", f"/{BUCKET}/pass/a", "pass")]


def test_slow_down_and_internal_error_are_s3s_answers_and_retried(server, proxy):
    proxy.inject(Fault.error(503), times=1, method="PUT")
    with pytest.raises(ClientError) as raised:
        client_for(proxy.url, attempts=1).put_object(Bucket=BUCKET, Key="slow/a", Body=b"a")
    assert raised.value.response["Error"]["Code"] == "SlowDown"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert not exists(server[1], "slow/a")
    proxy.inject(Fault.error(500), times=1, method="PUT")
    proxy.inject(Fault.error(503), times=1, method="PUT")
    client_for(proxy.url, attempts=3).put_object(Bucket=BUCKET, Key="slow/b", Body=b"b")
    assert [r.fault for r in proxy.requests if r.path.endswith("slow/b")] == ["error", "error", "pass"]
    assert exists(server[1], "slow/b")


def test_a_reset_before_forwarding_writes_nothing_and_after_forwarding_writes(server, proxy):
    client = client_for(proxy.url, attempts=1)
    proxy.inject(Fault.reset(), method="PUT")
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        client.put_object(Bucket=BUCKET, Key="reset/before", Body=b"a")
    assert not exists(server[1], "reset/before")
    proxy.inject(Fault.reset_after_forward(), method="PUT")
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        client.put_object(Bucket=BUCKET, Key="reset/after", Body=b"b")
    assert server[1].get_object(Bucket=BUCKET, Key="reset/after")["Body"].read() == b"b"   # the outcome the client missed
    client.put_object(Bucket=BUCKET, Key="reset/later", Body=b"c")      # the proxy serves on
    assert exists(server[1], "reset/later")


def test_a_hung_request_ends_in_the_clients_read_timeout(server, proxy):
    proxy.inject(Fault.hang(), path="/hang/")
    with pytest.raises(ReadTimeoutError):
        client_for(proxy.url, attempts=1, read_timeout=1).put_object(Bucket=BUCKET, Key="hang/a", Body=b"a")
    assert not exists(server[1], "hang/a")
    assert [r.fault for r in proxy.requests] == ["hang"]


def test_delay_and_latency_hold_requests_without_failing_them(server, proxy):
    client = client_for(proxy.url, attempts=1)
    proxy.inject(Fault.delay(0.3), method="PUT")
    proxy.latency = 0.1
    started = time.monotonic()
    client.put_object(Bucket=BUCKET, Key="late/a", Body=b"a")
    assert time.monotonic() - started >= 0.4      # the delay happened (a lower bound, not a speed)
    assert exists(server[1], "late/a")


def test_an_outage_refuses_connections_then_ends(server, proxy):
    client = client_for(proxy.url, attempts=1)
    client.put_object(Bucket=BUCKET, Key="outage/a", Body=b"a")   # a live keep-alive connection
    proxy.outage(1.5)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
    with pytest.raises((EndpointConnectionError, ConnectionClosedError)):
        client.put_object(Bucket=BUCKET, Key="outage/b", Body=b"b")
    def put() -> bool:
        try:
            client.put_object(Bucket=BUCKET, Key="outage/c", Body=b"c")
            return True
        except (EndpointConnectionError, ConnectionClosedError):
            return False
    wait_for(put, 10, "the outage's end (a put that gets through)", every=0.2)
    assert exists(server[1], "outage/c") and not exists(server[1], "outage/b")


def test_tcp_mode_pumps_bytes_and_blackholes_and_drops(server):
    with FaultProxy(server[0]) as proxy:
        client = client_for(proxy.url, attempts=1, read_timeout=1)
        client.put_object(Bucket=BUCKET, Key="tcp/a", Body=b"a")
        assert server[1].get_object(Bucket=BUCKET, Key="tcp/a")["Body"].read() == b"a"
        proxy.blackhole()
        with pytest.raises(ReadTimeoutError):
            client.get_object(Bucket=BUCKET, Key="tcp/a")
        proxy.blackhole(False)
        assert client.get_object(Bucket=BUCKET, Key="tcp/a")["Body"].read() == b"a"
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert raw.recv(12).startswith(b"HTTP/1.1")
            proxy.drop_connections()
            with pytest.raises((ConnectionResetError, socket.timeout)):
                while raw.recv(65536):
                    pass
                raise ConnectionResetError("closed")


def test_bad_fault_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"one of \[500, 503\], not 404"):
        Fault.error(404)
