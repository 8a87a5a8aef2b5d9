"""Faults of Google Cloud Storage and Azure under the storage layer (checkpoint/fs.py,
gcs.py, azure.py): fake-gcs-server and Azurite behind the fault proxy, reached through
gcsfs and adlfs as a query reaches them. The storage layer alone (no Spark): 503s ridden
out by the client's own retries, a create whose answer was lost resolved by reading back
(ours: True; another writer's: False, nothing overwritten), an outage past the retries
failing with StorageUnavailableError naming the location. tests/test_s3_faults.py does
the same for S3."""
from __future__ import annotations

import time

import pytest

from microbatch.checkpoint.azure import AzureRetries
from microbatch.checkpoint.stores import storage_for
from microbatch.checkpoint.gcs import GcsRetries
from microbatch.errors import StorageUnavailableError
from microbatch.testing import azure_server, gcs_server
from microbatch.testing.fault_proxy import Fault, FaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]


#: ABFS's retry settings a job gives (hadoop-azure's names): three attempts of a request,
#: 0.1-0.5 s apart, instead of the Azure SDK's own four, 15 s and more apart
ABFS_RETRIES = {"spark.hadoop.fs.azure.io.retry.max.retries": "2",
                "spark.hadoop.fs.azure.io.retry.min.backoff.interval": "100",
                "spark.hadoop.fs.azure.io.retry.backoff.interval": "100",
                "spark.hadoop.fs.azure.io.retry.max.backoff.interval": "500"}


@pytest.fixture(scope="module", params=["gcs", "azure", pytest.param("azure-sdk-retries", marks=pytest.mark.extended)])
def store(request):
    """(the store behind the proxy, the proxy, the store directly, the root URI). Azure with
    ABFS's retry settings given, and (make test-extended) with the SDK's own retries."""
    if request.param == "gcs":
        with gcs_server.gcs_server() as endpoint:
            direct = storage_for("gs://faulty/", gcs_server.settings(endpoint))
            direct._fs.mkdir("faulty")
            with FaultProxy(int(endpoint.rsplit(":", 1)[1]), http=True) as proxy:
                yield storage_for("gs://faulty/", gcs_server.settings(proxy.url)), proxy, direct, "gs://faulty"
    else:
        with azure_server.azure_server() as endpoint:
            direct = storage_for(f"abfss://faulty@{azure_server.HOST}/", azure_server.settings(endpoint))
            direct._fs.mkdir(f"faulty@{azure_server.HOST}")
            port = int(endpoint.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            with FaultProxy(port, http=True) as proxy:
                through = endpoint.replace(f":{port}/", f":{proxy.port}/")
                given = dict(azure_server.settings(through), **(ABFS_RETRIES if request.param == "azure" else {}))
                yield (storage_for(f"abfss://faulty@{azure_server.HOST}/", given),
                       proxy, direct, f"abfss://faulty@{azure_server.HOST}")


@pytest.fixture
def faulty(store):
    store[1].clear()
    store[1].requests.clear()
    yield store
    store[1].clear()


def writes(proxy) -> list[str]:
    return [r.fault for r in proxy.requests if r.method in ("PUT", "POST")]


def test_errors_of_the_store_are_ridden_out(faulty):
    fs, proxy, direct, root = faulty
    proxy.inject(Fault.error(503), times=1, method="PUT")
    proxy.inject(Fault.error(503), times=1, method="POST")
    fs.write(f"{root}/ridden/0", "entry")
    assert direct.read_text(f"{root}/ridden/0") == "entry"
    assert writes(proxy) == ["error", "pass"]


def test_a_create_whose_outcome_is_unknown_is_read_back(faulty):
    fs, proxy, direct, root = faulty
    # the upload reached the store, the answer was lost: the client's retry finds the
    # object there (412/409), the layer reads it back, and it is ours
    proxy.inject(Fault.reset_after_forward(), times=1, method="PUT")
    proxy.inject(Fault.reset_after_forward(), times=1, method="POST")
    assert fs.create(f"{root}/unknown/0", "ours") is True
    assert direct.read_text(f"{root}/unknown/0") == "ours"
    assert "reset_after_forward" in writes(proxy)
    # another writer's entry, our first attempt reset before it reached the store: a lost
    # race, nothing overwritten
    direct.write(f"{root}/unknown/1", "theirs")
    proxy.inject(Fault.reset(), times=1, method="PUT")
    proxy.inject(Fault.reset(), times=1, method="POST")
    assert fs.create(f"{root}/unknown/1", "ours") is False
    assert direct.read_text(f"{root}/unknown/1") == "theirs"


# (with the Azure SDK's own retries, 15 s and more apart, an outage takes three minutes to
# give up: make test-extended; with ABFS's settings given, as they say)
def test_an_outage_past_the_retries_fails_naming_the_location(faulty):
    fs, proxy, direct, root = faulty
    fs._sleep = lambda seconds: None          # (this layer's own wait; the clients' stay real)
    proxy.outage(240)
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError) as raised:
        fs.read_text(f"{root}/down/0")
    took = time.monotonic() - started
    assert f"{root}/down/0" in str(raised.value)
    retries = fs.retries
    assert isinstance(retries, (GcsRetries, AzureRetries)) and f"failed {retries.retry_limit + 1} times" in str(
        raised.value)
    assert took < 200, took                  # bounded: the clients' retries, twice
    if isinstance(retries, AzureRetries) and retries.abfs is not None:
        # ABFS's settings: three attempts of the request 0.1-0.5 s apart (the SDK's own
        # retries take three minutes), and the error says which settings bound them
        assert "as ABFS's fs.azure.io.retry.* settings say (2, waits from 100 ms, at most 500 ms)" in str(raised.value)
        assert took < 15, took
