"""Azure Data Lake Storage Gen2 (``abfss://<container>@<account>.dfs.core.windows.net/``)
on Azurite, Microsoft's emulator, over its Blob endpoint: a stateful query with its
input files, its checkpoint and its file sink there, as Spark's engine runs it over the
same files copied to local disk, batch by batch; a restart takes only new files; a
SIGKILL mid-batch loses and repeats nothing; the logs' create-if-absent is Azure's
``If-None-Match: *``; a missing container, a wrong key and settings the storage layer
cannot take fail at start naming them, without the key. This Spark has no hadoop-azure:
the files are listed through adlfs and read and written in Spark tasks (issue 60)."""
from __future__ import annotations

import logging

import pytest

from helpers import confs
from microbatch.checkpoint.stores import storage_for
from microbatch.errors import CheckpointError
from microbatch.testing.azure_server import HOST, KEY, azure_server, settings
from object_store_queries import (check_sigkill_mid_batch, check_sink_output_read_through_its_log,
                                  check_two_writers, check_windowed_count)

CONTAINER = "lake"
ROOT = f"abfss://{CONTAINER}@{HOST}"


@pytest.fixture(scope="module")
def azure(spark):
    with azure_server() as endpoint:
        given = settings(endpoint)
        store = storage_for(f"{ROOT}/", given)
        store._fs.mkdir(f"{CONTAINER}@{HOST}")
        with confs(spark, given):
            yield store, given


def test_a_windowed_count_with_input_checkpoint_and_sink_on_adls_as_spark_runs_it(ss, spark, azure, tmp_path):
    check_windowed_count(ss, spark, azure[0], f"{ROOT}/q", tmp_path)


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_sigkill_mid_batch_on_adls_loses_and_repeats_nothing(ss, spark, azure, tmp_path):
    check_sigkill_mid_batch(ss, spark, azure[0], f"{ROOT}/killed", azure[1], tmp_path)


def test_two_writers_of_one_log_entry_cannot_both_win(azure):
    store, given = azure
    check_two_writers(store, storage_for(ROOT + "/race", given), ROOT)


def test_bad_locations_and_settings_fail_at_start_naming_them(ss, spark, azure, caplog):
    store, given = azure
    stream = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    with pytest.raises(CheckpointError, match=f"bucket 'missing@{HOST}' does not exist"):
        stream.writeStream.format("noop").option("checkpointLocation", f"abfss://missing@{HOST}/q").start()
    wrong = KEY[:-8] + "AAAAAAA="
    with caplog.at_level(logging.DEBUG), confs(spark, {f"spark.hadoop.fs.azure.account.key.{HOST}": wrong}), \
            pytest.raises(CheckpointError, match="denied|cannot") as raised:
        stream.writeStream.format("noop").option("checkpointLocation", f"{ROOT}/bad").start()
    assert wrong not in str(raised.value) and wrong not in caplog.text and KEY not in caplog.text
    with confs(spark, {f"spark.hadoop.fs.azure.account.auth.type.{HOST}": "Custom"}), \
            pytest.raises(CheckpointError, match="auth.type for .* is 'custom'"):
        stream.writeStream.format("noop").option("checkpointLocation", f"{ROOT}/bad").start()
    with pytest.raises(CheckpointError, match="not an ABFS location"):
        stream.writeStream.format("noop").option("checkpointLocation", "abfss://no-account-here/q").start()
    assert not store.find(f"{ROOT}/bad")


def test_abfs_settings_become_the_sdks_credentials():
    """ABFS's per-account settings as adlfs takes them: a service principal's client
    credentials (the tenant read from the token endpoint), a SAS token, the default
    credential when none is set; an OAuth setting without its secret is refused naming
    what is missing."""
    from microbatch.checkpoint.azure import credentials

    host = "acct.dfs.core.windows.net"

    def given(**settings):
        return {f"spark.hadoop.fs.azure.{k.replace('_', '.')}.{host}": v for k, v in settings.items()}
    oauth = given(account_auth_type="OAuth", account_oauth2_client_id="app",
                  account_oauth2_client_secret="s3cret",
                  account_oauth2_client_endpoint="https://login.microsoftonline.com/tenant-7/oauth2/token")
    assert credentials("acct", host, oauth) == {"account_name": "acct", "client_id": "app",
                                                "client_secret": "s3cret", "tenant_id": "tenant-7"}
    assert credentials("acct", host, given(sas_fixed_token="sv=1&sig=x")) == {"account_name": "acct",
                                                                              "sas_token": "sv=1&sig=x"}
    assert credentials("acct", host, {}) == {"account_name": "acct", "anon": False}
    incomplete = {k: v for k, v in oauth.items() if "secret" not in k}
    with pytest.raises(CheckpointError, match="OAuth, which needs") as raised:
        credentials("acct", host, incomplete)
    assert "app" not in str(raised.value)


def test_abfs_retry_settings_become_the_sdks_retry_policy():
    """ABFS's ``fs.azure.io.retry.*`` settings as the Azure SDK's policy: that many retries
    of every kind, the n-th after ABFS's exponential wait; the settings not given take ABFS's
    defaults; none given keeps the SDK's own policy; a bad value is refused naming it."""
    from microbatch.checkpoint.azure import AbfsRetrySettings, abfs_retry_policy

    assert AbfsRetrySettings.given({}) is None
    numbers = AbfsRetrySettings.given({"spark.hadoop.fs.azure.io.retry.max.retries": "5",
                                       "spark.hadoop.fs.azure.io.retry.backoff.interval": "1000"})
    assert numbers == AbfsRetrySettings(max_retries=5, min_backoff_ms=3000, backoff_ms=1000, max_backoff_ms=30000)
    # min + 2^(n-1) * backoff * [0.8, 1.2), at most max
    assert numbers.backoff_s(1, 0.0) == pytest.approx(3.8)
    assert numbers.backoff_s(3, 0.5) == pytest.approx(3 + 4 * 1.0)
    assert numbers.backoff_s(10, 0.0) == 30.0
    policy = abfs_retry_policy(numbers)
    assert (policy.total_retries, policy.connect_retries, policy.read_retries, policy.status_retries) == (5, 5, 5, 5)
    for count in (1, 2, 3):
        waited = policy.get_backoff_time({"count": count})
        assert 3 + 2 ** (count - 1) * 0.8 <= waited < 3 + 2 ** (count - 1) * 1.2, (count, waited)
    with pytest.raises(CheckpointError, match="fs.azure.io.retry.max.backoff.interval is 'soon'"):
        AbfsRetrySettings.given({"spark.hadoop.fs.azure.io.retry.max.backoff.interval": "soon"})


def test_a_file_sinks_output_is_read_through_its_log(ss, azure, tmp_path):
    check_sink_output_read_through_its_log(ss, azure[0], f"{ROOT}/logged", tmp_path)
    # each account's client retries so, with the credential adlfs chose (a shared key here)
    from microbatch.checkpoint.azure import AzureAccounts
    host = "acct.dfs.core.windows.net"
    accounts = AzureAccounts({f"spark.hadoop.fs.azure.account.key.{host}": KEY,
                              "spark.hadoop.fs.azure.io.retry.max.retries": "4"})
    client = accounts._account("acct", host).service_client
    assert type(client._config.retry_policy).__name__ == "AbfsRetry"
    assert client._config.retry_policy.total_retries == 4
    assert client.credential.account_name == "acct" and client.url.startswith("https://acct.blob.core.windows.net")
