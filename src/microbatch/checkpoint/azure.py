"""Azure Data Lake Storage Gen2 (``abfss://`` and ``abfs://``, Hadoop's ABFS connector's
URIs ``abfss://<container>@<account>.dfs.core.windows.net/<path>``) as a checkpoint,
file-source and file-sink store, through adlfs over the account's Blob endpoint, with
the ABFS settings a Spark job already gives, per account (``<host>`` is
``<account>.dfs.core.windows.net``):

- ``fs.azure.account.key.<host>``: the shared key;
- ``fs.azure.account.auth.type.<host>`` ``OAuth`` with
  ``fs.azure.account.oauth2.client.id.<host>``, ``...client.secret.<host>`` and
  ``...client.endpoint.<host>`` (``https://login.microsoftonline.com/<tenant>/oauth2/token``):
  a service principal;
- ``fs.azure.sas.fixed.token.<host>``: a SAS token;
- none of these: the Azure SDK's default credential (environment, managed identity, az
  login), as adlfs takes it.

An emulator (Azurite) or a private endpoint: ``spark.microbatch.azure.blobEndpoint.<account>``
(microbatch's own setting: ABFS has none for the Blob endpoint adlfs talks to), e.g.
``http://127.0.0.1:10000/devstoreaccount1``.

A log entry's create-if-absent is an upload with ``If-None-Match: *`` (adlfs's
``mode="create"``), which Azure refuses (409) when the blob exists. Faults: the Azure
SDK's retry policy (exponential, 3 retries of each request on 5xx, 408, 429 and
connection errors; waits of 15 s and more), the one bounded layer (``AzureRetries``:
the storage layer adds no second loop, only the read-back of a create whose answer was
lost). Where a job gives ABFS's retry settings (``fs.azure.io.retry.max.retries``,
``.min.backoff.interval``, ``.backoff.interval``, ``.max.backoff.interval``, in ms), the
SDK retries as ABFS's ExponentialRetryPolicy does with them (``AbfsRetry``): that many
retries, the n-th after ``min + 2^(n-1) * backoff * [0.8, 1.2)`` ms, at most ``max``; the
settings not given take ABFS's defaults (30 retries, 3 s, 3 s, 30 s). With none given the
SDK's own policy stays (ABFS's defaults would retry a dead endpoint for a quarter of an hour).
A container is a bucket: keys inside the storage layer are
``<container>@<host>/<path>`` (the URI without its scheme), which ``AzureAccounts`` maps
to each account's adlfs file system.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from microbatch.checkpoint.fs import CheckpointFileSystem, ObjectStoreFileSystem, StoreTerms
from microbatch.errors import CheckpointError

ENDPOINT_SETTING = "spark.microbatch.azure.blobEndpoint."
_HOST = re.compile(r"^(?P<container>[^@/]+)@(?P<account>[a-z0-9]+)\.(?P<suffix>dfs\.core\.windows\.net|[^/]+)$")


#: ABFS's retry settings (hadoop-azure's names, ms) and their defaults
ABFS_RETRY_SETTINGS = {"fs.azure.io.retry.max.retries": 30, "fs.azure.io.retry.min.backoff.interval": 3000,
                       "fs.azure.io.retry.backoff.interval": 3000, "fs.azure.io.retry.max.backoff.interval": 30000}


@dataclass(frozen=True)
class AbfsRetrySettings:
    """ABFS's ExponentialRetryPolicy's numbers, from the job's settings."""
    max_retries: int
    min_backoff_ms: int
    backoff_ms: int
    max_backoff_ms: int

    @classmethod
    def given(cls, settings: Mapping[str, str]) -> "AbfsRetrySettings | None":
        """The settings a job gave (``spark.hadoop.fs.azure.io.retry.*``), or None when it
        gave none of them."""
        values = {}
        for name, default in ABFS_RETRY_SETTINGS.items():
            raw = settings.get(f"spark.hadoop.{name}")
            if raw in (None, ""):
                values[name] = default
                continue
            try:
                values[name] = int(str(raw).strip())
                if values[name] < 0:
                    raise ValueError
            except ValueError:
                raise CheckpointError(f"spark.hadoop.{name} is '{raw}': ABFS takes a whole number "
                                      f"{'of retries' if name.endswith('retries') else 'of milliseconds'}, 0 or more.") from None
        if all(settings.get(f"spark.hadoop.{name}") in (None, "") for name in ABFS_RETRY_SETTINGS):
            return None
        return cls(*values.values())

    def backoff_s(self, retry: int, fraction: float) -> float:
        """The wait before the ``retry``-th retry (1 the first), ``fraction`` in [0, 1) the
        random part: ABFS's ``min(min + 2^(retry-1) * backoff * [0.8, 1.2), max)``."""
        delta = self.backoff_ms * (0.8 + 0.4 * fraction)
        return min(self.min_backoff_ms + 2 ** (retry - 1) * delta, self.max_backoff_ms) / 1000


def abfs_retry_policy(numbers: AbfsRetrySettings) -> Any:
    """The Azure SDK's (async) retry policy retrying as ABFS's with ``numbers``."""
    import random

    from azure.storage.blob.aio import ExponentialRetry

    class AbfsRetry(ExponentialRetry):
        def get_backoff_time(self, settings: dict) -> float:
            return numbers.backoff_s(max(1, settings["count"]), random.random())

    retries = numbers.max_retries    # (ABFS counts every kind of failure against one limit)
    return AbfsRetry(retry_total=retries, retry_connect=retries, retry_read=retries, retry_status=retries)


@dataclass(frozen=True)
class AzureRetries:
    """The storage layer's retries of an Azure operation: none after the SDK's own."""
    retry_limit: int = 0
    retry_interval_s: float = 1.0
    abfs: AbfsRetrySettings | None = None
    terms = StoreTerms("Azure", "the account's endpoint (spark.microbatch.azure.blobEndpoint.<account> for an "
                       "emulator)", "Storage Blob Data Contributor: write and delete",
                       "Storage Blob Data Contributor: delete", "the Azure SDK's own retries")

    def settings_text(self) -> str:
        if self.abfs is not None:
            return (f"the Azure SDK's retries of each request as ABFS's fs.azure.io.retry.* settings say "
                    f"({self.abfs.max_retries}, waits from {self.abfs.min_backoff_ms} ms, at most "
                    f"{self.abfs.max_backoff_ms} ms)")
        return ("the Azure SDK's retries of each request (3, from 15 s apart; fs.azure.io.retry.max.retries "
                "and its .min.backoff.interval, .backoff.interval and .max.backoff.interval change them)")


def split_location(key: str) -> tuple[str, str, str]:
    """(container, account, host) of ``<container>@<account>.<suffix>[/...]``."""
    head = key.split("/", 1)[0]
    found = _HOST.match(head)
    if not found:
        raise CheckpointError(
            f"'{key}' is not an ABFS location: write abfss://<container>@<account>.dfs.core.windows.net/<path>.")
    return found.group("container"), found.group("account"), head.split("@", 1)[1]


def _denials_as_permission_errors(call: Callable) -> Callable:
    """A refused authentication or authorisation (401, 403: a wrong key, an expired SAS, a
    principal without the role) as ``PermissionError``, as the other stores' libraries
    raise it, with the SDK's first line only (never a header or a key)."""
    @functools.wraps(call)
    def translated(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except Exception as e:
            module = type(e).__module__ or ""
            if module.startswith("azure.core") and (
                    type(e).__name__ == "ClientAuthenticationError" or getattr(e, "status_code", None) in (401, 403)):
                raise PermissionError(str(e).splitlines()[0][:200]) from None
            raise
    return translated


class AzureAccounts:
    """The fsspec calls the storage layer makes, over one adlfs file system per account:
    keys ``<container>@<host>/<path>`` in, the same form out."""

    def __init__(self, settings: Mapping[str, str]):
        self._settings = dict(settings)
        self._accounts: dict[str, Any] = {}
        self._retries = AbfsRetrySettings.given(self._settings)

    def _inner(self, key: str) -> tuple[Any, str, str]:
        """(the account's adlfs, ``<container>/<path>``, ``<container>@<host>``)."""
        container, account, host = split_location(key)
        rest = key.split("/", 1)[1] if "/" in key else ""
        return self._account(account, host), f"{container}/{rest}".rstrip("/"), f"{container}@{host}"

    def _account(self, account: str, host: str) -> Any:
        if account not in self._accounts:
            from adlfs import AzureBlobFileSystem
            fs = AzureBlobFileSystem(skip_instance_cache=True, use_listings_cache=False,
                                     **credentials(account, host, self._settings))
            if self._retries is not None:
                fs.service_client = _with_retry_policy(fs, abfs_retry_policy(self._retries))
            self._accounts[account] = fs
        return self._accounts[account]

    @staticmethod
    def _outer(name: str, head: str) -> str:
        return head + "/" + name.split("/", 1)[1] if "/" in name else head

    def _info_out(self, info: dict, head: str) -> dict:
        out = dict(info)
        out["name"] = self._outer(str(info["name"]), head)
        out.setdefault("mtime", info.get("last_modified"))
        return out

    @_denials_as_permission_errors
    def cat_file(self, key: str, **kwargs: Any) -> bytes:
        fs, inner, _ = self._inner(key)
        return fs.cat_file(inner, **kwargs)

    @_denials_as_permission_errors
    def open(self, key: str, mode: str = "rb", **kwargs: Any) -> Any:
        fs, inner, _ = self._inner(key)
        return fs.open(inner, mode, **kwargs)

    @_denials_as_permission_errors
    def pipe_file(self, key: str, data: bytes, **kwargs: Any) -> Any:
        fs, inner, _ = self._inner(key)
        return fs.pipe_file(inner, data, **kwargs)

    def invalidate_cache(self, key: str | None = None) -> None:
        if key:
            fs, inner, _ = self._inner(key)
            fs.invalidate_cache(inner)

    @_denials_as_permission_errors
    def exists(self, key: str) -> bool:
        fs, inner, _ = self._inner(key)
        return fs.exists(inner)

    @_denials_as_permission_errors
    def ls(self, key: str, detail: bool = True, refresh: bool = False) -> list:
        fs, inner, head = self._inner(key)
        found = fs.ls(inner, detail=detail, refresh=refresh)
        if detail:
            return [self._info_out(info, head) for info in found]
        return [self._outer(str(name), head) for name in found]

    @_denials_as_permission_errors
    def info(self, key: str, **kwargs: Any) -> dict:
        fs, inner, head = self._inner(key)
        return self._info_out(fs.info(inner, **kwargs), head)

    @_denials_as_permission_errors
    def find(self, key: str) -> list[str]:
        fs, inner, head = self._inner(key)
        return [self._outer(str(name), head) for name in fs.find(inner)]

    @_denials_as_permission_errors
    def glob(self, pattern: str) -> list[str]:
        fs, inner, head = self._inner(pattern)
        return [self._outer(str(name), head) for name in fs.glob(inner)]

    @_denials_as_permission_errors
    def copy(self, source: str, target: str) -> None:
        fs, inner, _ = self._inner(source)
        target_fs, target_inner, _ = self._inner(target)
        if target_fs is not fs:
            target_fs.pipe_file(target_inner, fs.cat_file(inner))
        else:
            fs.copy(inner, target_inner)

    @_denials_as_permission_errors
    def rm_file(self, key: str) -> None:
        fs, inner, _ = self._inner(key)
        fs.rm_file(inner)

    @_denials_as_permission_errors
    def rm(self, key: str, recursive: bool = False) -> None:
        fs, inner, _ = self._inner(key)
        fs.rm(inner, recursive=recursive)

    @_denials_as_permission_errors
    def mkdir(self, key: str) -> None:
        fs, inner, _ = self._inner(key)
        fs.mkdir(inner)


def _with_retry_policy(fs: Any, policy: Any) -> Any:
    """adlfs's service client made again with ``policy``: adlfs passes the SDK no client
    arguments, and a client's pipeline is fixed when it is made. The same account URL (its
    SAS token included) and credential adlfs's ``do_connect`` chose."""
    from azure.storage.blob.aio import BlobServiceClient
    made = fs.service_client
    if fs.connection_string is not None:
        return BlobServiceClient.from_connection_string(fs.connection_string, retry_policy=policy)
    return BlobServiceClient(made.url, credential=made.credential, retry_policy=policy)


def credentials(account: str, host: str, settings: Mapping[str, str]) -> dict:
    """adlfs's arguments for ``account`` from the ABFS settings (module docstring)."""
    def given(name: str) -> str | None:
        value = settings.get(f"spark.hadoop.{name}.{host}") or settings.get(f"spark.hadoop.{name}")
        return str(value).strip() if value not in (None, "") else None

    kwargs: dict[str, Any] = {"account_name": account}
    endpoint = settings.get(ENDPOINT_SETTING + account)
    key = given("fs.azure.account.key")
    auth = (given("fs.azure.account.auth.type") or "").lower()
    if auth and auth not in ("sharedkey", "sas", "oauth"):
        raise CheckpointError(
            f"fs.azure.account.auth.type for {host} is '{auth}', which microbatch's storage layer (adlfs) "
            "cannot take. Use SharedKey (fs.azure.account.key.<host>), OAuth with a service principal's "
            "client credentials, or SAS (fs.azure.sas.fixed.token.<host>).")
    if endpoint:
        protocol = endpoint.split("://", 1)[0] if "://" in endpoint else "https"
        parts = [f"DefaultEndpointsProtocol={protocol}", f"AccountName={account}", f"BlobEndpoint={endpoint}"]
        if key:
            parts.append(f"AccountKey={key}")
        return {"connection_string": ";".join(parts) + ";"}
    if auth == "oauth":
        client_id, secret = given("fs.azure.account.oauth2.client.id"), given("fs.azure.account.oauth2.client.secret")
        token_url = given("fs.azure.account.oauth2.client.endpoint") or ""
        tenant = re.search(r"login\.microsoftonline\.com/([^/]+)/", token_url)
        if not (client_id and secret and tenant):
            raise CheckpointError(
                f"The ABFS account {account} is set to OAuth, which needs fs.azure.account.oauth2.client.id, "
                f".client.secret and .client.endpoint (https://login.microsoftonline.com/<tenant>/oauth2/token) "
                f"for {host}; microbatch's storage layer takes a service principal's client credentials only.")
        kwargs.update(client_id=client_id, client_secret=secret, tenant_id=tenant.group(1))
    elif key:
        kwargs["account_key"] = key
    elif given("fs.azure.sas.fixed.token"):
        kwargs["sas_token"] = given("fs.azure.sas.fixed.token")
    else:
        kwargs["anon"] = False     # (the Azure SDK's DefaultAzureCredential)
    return kwargs


def azure_storage(scheme: str, location: str, conf: Mapping[str, str] | None) -> CheckpointFileSystem:
    """The ``abfs(s)://`` store of ``location`` with the ABFS settings in ``conf``."""
    try:
        import adlfs  # noqa: F401
    except ImportError:
        raise CheckpointError(
            f"Location '{location}' is on Azure Data Lake Storage, which needs the Python package "
            "adlfs: pip install adlfs.") from None
    settings = {k: str(v) for k, v in (conf or {}).items()
                if k.startswith(("spark.hadoop.fs.azure.", ENDPOINT_SETTING)) and str(v).strip()}
    accounts = AzureAccounts(settings)
    rest = location.split("://", 1)[1] if "://" in location else ""
    if rest:
        container, account, host = split_location(rest)
        credentials(account, host, settings)      # (bad settings fail here, at start)
    return ObjectStoreFileSystem(scheme, accounts, settings, AzureRetries(abfs=AbfsRetrySettings.given(settings)))
