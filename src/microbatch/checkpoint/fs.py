"""The one file-system layer all checkpoint I/O goes through.

The contract every store keeps: a reader never sees a partial log entry, and of two
writers of the same entry (``create``) exactly one wins.

- Local disk (``CheckpointFileSystem``): every file is written to a hidden temporary
  file and then renamed; ``create`` links the temporary file to its name, which fails
  atomically when the name is taken.
- Object stores (``ObjectStoreFileSystem``, on fsspec): an object appears whole when its
  PUT completes, so a write is a plain PUT; ``create`` is a conditional PUT
  (S3's and Azure's ``If-None-Match: *``, GCS's ``ifGenerationMatch=0``:
  ``checkpoint/gcs.py``, ``checkpoint/azure.py``),
  which the store refuses when the key exists. A store without
  conditional writes is refused at start (``storage_for``), naming what is missing.

``checkpoint.stores.storage_for(location, conf)`` picks the store from the location's scheme
and Spark's usual settings (``spark.hadoop.fs.s3a.endpoint``, ``...access.key``, ...,
``spark.hadoop.fs.gs.*``, ``spark.hadoop.fs.azure.*``, or the environment's credentials); no secret is ever logged or put in a message.

**Faults of the store** (S3). Two bounded layers, each set by the S3A name Spark's users
already set (``spark.hadoop.`` + the name; Hadoop's S3A defaults when unset), and no
third: s3fs's own retry loop is off (``retries=1``).

- botocore's standard retry mode retries each request on a connection error, a timeout,
  500/502/503/504 and throttling (``SlowDown``), with exponential backoff and jitter:
  ``fs.s3a.attempts.maximum`` retries (5), ``fs.s3a.connection.establish.timeout`` to
  connect (30 s), ``fs.s3a.connection.timeout`` to wait for an answer (200 s). (Under it
  aiohttp sends an idempotent request once more when a kept-alive connection was reset,
  as RFC 9112 allows: at most twice per botocore attempt.)
- Then this layer retries the whole operation on a transient failure, as S3A's retry
  policy does: ``fs.s3a.retry.limit`` times (7), waiting ``fs.s3a.retry.interval``
  (500 ms) doubled each time. Past that the operation fails with a
  ``StorageUnavailableError`` naming the location, the attempts and the settings.

A create whose outcome is unknown (the connection reset after the PUT was sent, the
store may have written it) is retried as a create; finding the key taken, it reads the
object back: the same content is this writer's own create (True), another is a lost race
(False). A log entry is never written twice with different contents.

``FailingFileSystem`` wraps any file system and fails chosen writes; tests use it
to break the batch protocol at each of its steps.

fsspec rather than pyarrow.fs: Arrow's S3 client has no conditional PUT, which the
logs' create-if-absent needs on S3; fsspec's s3fs has it (``mode="create"``), and fsspec
reaches the same stores (gcs, abfs, hdfs through pyarrow) with one API.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple
from urllib.parse import urlparse

from microbatch.errors import CheckpointError, StorageFullError, StorageUnavailableError

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def _space_for(path: str) -> Iterator[None]:
    """A full disk (ENOSPC) or quota (EDQUOT) as an error naming the file; the writes
    here leave nothing behind when it strikes (their temporary file is removed)."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise StorageFullError(
            f"Cannot write '{path}': no space left on its device ({errno.errorcode[e.errno]}: "
            f"{os.strerror(e.errno)}). Nothing was half written. Free space there or move the "
            "checkpoint to a larger disk, then restart the query: it resumes from its checkpoint.") from e


class CheckpointFileSystem:
    """Local-disk implementation; the base class other file systems follow."""

    scheme = "file"

    def resolve(self, path: str) -> str:
        """Return the absolute form of ``path`` (``file:`` URIs accepted)."""
        parsed = urlparse(path)
        if parsed.scheme == "file":
            path = parsed.path
        elif parsed.scheme and len(parsed.scheme) > 1:
            raise CheckpointError(
                f"Checkpoint location '{path}' uses the scheme '{parsed.scheme}://', "
                "which microbatch cannot write yet. Use a local path or a file: URI.")
        return os.path.abspath(os.path.expanduser(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def list(self, path: str) -> list[str]:
        """Names (not paths) in a directory; empty when it does not exist."""
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def read_text(self, path: str) -> str:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()

    def find(self, path: str) -> list[str]:
        """Paths of every file below a directory (recursively); empty when it does not exist."""
        return [os.path.join(d, name) for d, _, names in os.walk(path) for name in names]

    def stat(self, path: str) -> tuple[int, int] | None:
        """(size in bytes, modification time in ms) of a file, or None if it is not there."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns // 1_000_000

    def _write_temp(self, path: str, text: str) -> str:
        directory, name = os.path.split(path)
        self.mkdirs(directory)
        tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
        except BaseException:
            self._remove_quietly(tmp)      # a disk that filled mid-write leaves no partial file
            raise
        return tmp

    def spec(self) -> tuple[str, tuple]:
        """What an executor needs to reach this store (``storage_from_spec``)."""
        return "file", ()

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def open_input(self, path: str) -> Any:
        """A seekable binary file to read ``path`` from (a context manager)."""
        return open(path, "rb")

    def write_bytes(self, path: str, data: bytes) -> None:
        """Atomically write ``path`` (temporary file, then rename), replacing it."""
        with _space_for(path):
            directory, name = os.path.split(path)
            self.mkdirs(directory)
            tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                self._remove_quietly(tmp)
                raise

    def write(self, path: str, text: str) -> None:
        """Atomically write ``path``, replacing it if it exists."""
        with _space_for(path):
            tmp = self._write_temp(path, text)
            try:
                os.replace(tmp, path)
            except BaseException:
                self._remove_quietly(tmp)
                raise

    def create(self, path: str, text: str) -> bool:
        """Atomically create ``path``; return False (writing nothing) if it exists."""
        if os.path.exists(path):
            return False
        with _space_for(path):
            tmp = self._write_temp(path, text)
            try:
                os.link(tmp, path)
            except OSError as e:
                if e.errno == errno.EEXIST:
                    return False
                raise
            finally:
                self._remove_quietly(tmp)
        return True

    def delete(self, path: str) -> None:
        self._remove_quietly(path)

    def delete_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _remove_quietly(path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


#: Spark's Hadoop settings for S3 (``spark.hadoop.`` + key) and the s3fs arguments they
#: become. Credentials not given here come from the environment, as boto finds them.
_S3A_SETTINGS = {
    "fs.s3a.endpoint": "endpoint_url",
    "fs.s3a.access.key": "key",
    "fs.s3a.secret.key": "secret",
    "fs.s3a.session.token": "token",
    "fs.s3a.endpoint.region": "region_name",
}
#: S3A's retry settings (``spark.hadoop.`` + key) and Hadoop's defaults for them.
_S3A_RETRY_DEFAULTS = {
    "fs.s3a.attempts.maximum": "5",                  # botocore's retries of one request
    "fs.s3a.retry.limit": "7",                       # this layer's retries of an operation
    "fs.s3a.retry.interval": "500ms",                # its first wait, doubled each time
    "fs.s3a.connection.establish.timeout": "30s",    # to connect
    "fs.s3a.connection.timeout": "200s",             # to wait for an answer
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6, "d": 8.64e7}


class StoreTerms(NamedTuple):
    """How the storage layer's messages name a store and what to set or grant there."""
    store: str                 # "S3"
    endpoint_setting: str      # the setting to check when the store cannot be reached
    write_access: str          # the permissions a checkpoint needs: write and delete
    delete_access: str
    client_retries: str        # the client library's own retries, under this layer's


@dataclass(frozen=True)
class S3Retries:
    """The retry limits and timeouts of one S3 store (see the module docstring)."""
    attempts_maximum: int = 5
    retry_limit: int = 7
    retry_interval_s: float = 0.5
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 200.0

    @classmethod
    def from_conf(cls, conf: Mapping[str, str] | None) -> "S3Retries":
        def value(key: str) -> str:
            given = conf.get(f"spark.hadoop.{key}") if conf else None
            return str(given) if given not in (None, "") else _S3A_RETRY_DEFAULTS[key]

        def count(key: str) -> int:
            text = value(key).strip()
            if not text.isdigit():
                raise CheckpointError(
                    f"spark.hadoop.{key} is '{text}', which is not a count. Set it to a whole "
                    f"number of at least 0 (Hadoop's default: {_S3A_RETRY_DEFAULTS[key]}).")
            return int(text)

        def seconds(key: str) -> float:
            text = value(key)
            found = _DURATION.match(text.lower())
            if not found:
                raise CheckpointError(
                    f"spark.hadoop.{key} is '{text}', which is not a duration. Give a number "
                    f"of milliseconds or one with a unit, as Hadoop takes it: 500ms, 30s, 2m "
                    f"(Hadoop's default: {_S3A_RETRY_DEFAULTS[key]}).")
            return float(found.group(1)) * _UNIT_MS[found.group(2) or "ms"] / 1000.0

        return cls(count("fs.s3a.attempts.maximum"), count("fs.s3a.retry.limit"),
                   seconds("fs.s3a.retry.interval"), seconds("fs.s3a.connection.establish.timeout"),
                   seconds("fs.s3a.connection.timeout"))

    def botocore_config(self) -> dict:
        """s3fs's ``config_kwargs``: botocore's retries and timeouts, explicit."""
        return {"retries": {"mode": "standard", "total_max_attempts": self.attempts_maximum + 1},
                "connect_timeout": self.connect_timeout_s, "read_timeout": self.read_timeout_s}

    #: how a message names the store, the setting of its endpoint and the permissions a
    #: checkpoint needs there
    terms = StoreTerms("S3", "spark.hadoop.fs.s3a.endpoint", "s3:PutObject, s3:DeleteObject", "s3:DeleteObject",
                       "botocore's own retries")

    def settings_text(self) -> str:
        return (f"spark.hadoop.fs.s3a.attempts.maximum={self.attempts_maximum}, "
                f"spark.hadoop.fs.s3a.retry.limit={self.retry_limit}, "
                f"spark.hadoop.fs.s3a.retry.interval={self.retry_interval_s:g}s, "
                f"spark.hadoop.fs.s3a.connection.timeout={self.read_timeout_s:g}s")


def _transient(error: BaseException) -> bool:
    """Whether a failure of an S3 operation may pass if the operation is tried again: the
    store or the network, not the request (a missing key, a denial, a taken key)."""
    if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                          NotADirectoryError)):
        return False
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if isinstance(error, OSError):
        return error.errno in (None, errno.EIO, errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT,
                               errno.EREMOTEIO, errno.ECONNRESET, errno.ECONNREFUSED, errno.EPIPE)
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:       # pragma: no cover - s3fs needs botocore
        return False
    if isinstance(error, BotoCoreError):
        return True
    if type(error).__module__.startswith("azure.core"):
        # (the Azure SDK's, after its own retries: the network, or the store's 5xx or throttling)
        code = getattr(error, "status_code", None)
        return type(error).__name__ in ("ServiceRequestError", "ServiceResponseError") or (
            code is not None and (code == 429 or code >= 500))
    if type(error).__name__ == "HttpError" and type(error).__module__.startswith("gcsfs"):
        # (gcsfs's, after its own retries: the store's 5xx or throttling; 4xx are the request's)
        code = getattr(error, "code", None)
        return code is None or code == 429 or code >= 500
    module = type(error).__module__ or ""
    return module.startswith(("aiohttp", "http.client")) or type(error).__name__ in (
        "IncompleteRead", "FSTimeoutError", "ResponseParserError")


#: Stores whose fsspec implementation writes an object only if its key is free.
CONDITIONAL_CREATE = {"s3", "gs", "abfs"}
#: The object stores' schemes: S3 (Hadoop's s3a, and the older names), Google Cloud
#: Storage (the GCS connector's gs) and Azure Data Lake Storage Gen2 (ABFS's abfs, abfss).
OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss")


class ObjectStoreFileSystem(CheckpointFileSystem):
    """A checkpoint on an object store (``s3://``, ``s3a://``, ``gs://``, ``abfss://``), through fsspec.

    Paths are ``<scheme>://bucket/key``; an object store has no directories, so
    ``mkdirs`` does nothing and a listing is the keys under a prefix."""

    def __init__(self, scheme: str, fs: Any, settings: Mapping[str, str] | None = None,
                 retries: S3Retries | None = None, list_page: Callable | None = None):
        self.scheme = scheme
        self._fs = fs
        self._settings = dict(settings or {})   # the store's Spark settings: for the executors
        self.retries = retries or S3Retries()
        self._sleep = time.sleep
        self._one_get = {"max_concurrency": 1} if scheme.startswith("s3") else {}
        # (fs, bucket, prefix, start key or None, page token or None) -> (the page's
        # (key in bucket, size, modification ms), whether it showed subdirectories, next token)
        self._list_page = list_page

    def spec(self) -> tuple[str, tuple]:
        return self.scheme, tuple(sorted(self._settings.items()))

    def _retrying(self, what: str, path: str, operation: Callable[[], Any]) -> Any:
        """``operation()``, tried again on a transient failure (the module docstring)."""
        wait = self.retries.retry_interval_s
        for attempt in range(self.retries.retry_limit + 1):
            try:
                return operation()
            except Exception as e:  # sorted by _transient
                if not _transient(e):
                    raise
                if attempt == self.retries.retry_limit:
                    raise StorageUnavailableError(
                        f"Cannot {what} '{self.resolve(path)}': the store failed "
                        f"{attempt + 1} times, each after {self.retries.terms.client_retries} ({reason_of(e)}). "
                        f"The store is unreachable or failing; once it answers again, restart "
                        f"the query: it resumes from its checkpoint. The limits are "
                        f"{self.retries.settings_text()}.") from e
                _log.warning("%s %s of %s failed (%s); trying again in %.2f s (%d of %d)", self.retries.terms.store, what,
                             self.resolve(path), reason_of(e), wait, attempt + 1, self.retries.retry_limit)
                self._sleep(wait)
                wait *= 2

    def read_bytes(self, path: str) -> bytes:
        # one GET (with max_concurrency > 1, s3fs asks the size first, a second request)
        return self._retrying("read", path, lambda: self._fs.cat_file(self._key(path), **self._one_get))

    def open_input(self, path: str) -> Any:
        return self._retrying("open", path, lambda: self._fs.open(self._key(path), "rb"))

    def write_bytes(self, path: str, data: bytes) -> None:
        self._retrying("write", path, lambda: self._fs.pipe_file(self._key(path), bytes(data)))

    def _key(self, path: str) -> str:
        parsed = urlparse(path)
        return f"{parsed.netloc}{parsed.path}" if parsed.scheme else path

    def resolve(self, path: str) -> str:
        parsed = urlparse(path)
        return f"{self.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"

    def exists(self, path: str) -> bool:
        key = self._key(path)

        def exists() -> bool:
            self._fs.invalidate_cache(key)
            return self._fs.exists(key)
        return self._retrying("check", path, exists)

    def mkdirs(self, path: str) -> None:
        pass

    def list(self, path: str) -> list[str]:
        key = self._key(path)
        try:
            return [name.rstrip("/").rsplit("/", 1)[-1]
                    for name in self._retrying("list", path, lambda: self._fs.ls(key, detail=False, refresh=True))]
        except FileNotFoundError:
            return []

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def find(self, path: str) -> list[str]:
        key = self._key(path).rstrip("/")

        def find() -> list[str]:
            self._fs.invalidate_cache(key)
            return self._fs.find(key)
        return [f"{self.scheme}://{k}" for k in self._retrying("list", path, find)]

    def stat(self, path: str) -> tuple[int, int] | None:
        try:
            info = self._retrying("stat", path, lambda: self._fs.info(self._key(path), refresh=True))
        except FileNotFoundError:
            return None
        modified = info.get("LastModified") or info.get("mtime")
        ms = int(modified.timestamp() * 1000) if hasattr(modified, "timestamp") else 0
        return int(info.get("size") or 0), ms

    def write(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    # -- the file source's listing (keys are ``bucket/key``, without the scheme) ----------
    @staticmethod
    def _entry(info: Mapping[str, Any]) -> tuple[str, bool, int, int]:
        modified = info.get("LastModified") or info.get("mtime")
        ms = int(modified.timestamp() * 1000) if hasattr(modified, "timestamp") else 0
        return (str(info["name"]).rstrip("/"), info.get("type") == "directory",
                int(info.get("size") or 0), ms)

    def entries(self, key: str) -> list[tuple[str, bool, int, int]]:
        """(key, is a directory, size, modification ms) of what is directly under ``key``
        (one LIST with ``/`` as delimiter); empty when nothing is."""
        try:
            found = self._retrying("list", key, lambda: self._fs.ls(key, detail=True, refresh=True))
        except FileNotFoundError:
            return []
        return [self._entry(info) for info in found if str(info["name"]).rstrip("/") != key.rstrip("/")]

    def kind(self, key: str) -> tuple[str, int, int] | None:
        """("file" or "directory", size, modification ms) of ``key``, or None if absent."""
        try:
            info = self._retrying("stat", key, lambda: self._fs.info(key, refresh=True))
        except FileNotFoundError:
            return None
        _, is_dir, size, ms = self._entry(info)
        return ("directory" if is_dir else "file"), size, ms

    def files_after(self, directory: str, after: str | None) -> tuple[list[tuple[str, int, int]], bool]:
        """The objects directly under the key ``directory`` whose keys sort after ``after``
        (all with None), as (key, size, modification ms) in key order, and whether the
        directory holds subdirectories: LIST pages that start after the key (the store's
        ``list_page``: S3's ``StartAfter``, GCS's ``startOffset``), so a listing costs the
        new objects, not the directory's. A store without such a listing (Azure) raises
        NotImplementedError."""
        if self._list_page is None:
            raise NotImplementedError(f"{self.scheme}:// has no listing that starts after a key")
        bucket, _, prefix = directory.rstrip("/").partition("/")
        prefix = prefix + "/" if prefix else ""
        start = after.partition("/")[2] if after else None
        found: list[tuple[str, int, int]] = []
        subdirectories, token = False, None
        while True:
            objects, more, token = self._retrying("list", directory, lambda t=token: self._list_page(
                self._fs, bucket, prefix, start, t))
            found += [(f"{bucket}/{name}", size, ms) for name, size, ms in objects]
            subdirectories = subdirectories or more
            if not token:
                return found, subdirectories

    def glob(self, pattern: str) -> list[str]:
        """Keys matching a glob pattern (``*``, ``?``, ``[...]``; braces already expanded)."""
        return list(self._retrying("list", pattern, lambda: self._fs.glob(pattern)))

    def move(self, source: str, target: str) -> None:
        """Copy ``source`` to ``target`` then delete ``source`` (a store has no rename)."""
        self._retrying("copy", source, lambda: self._fs.copy(self._key(source), self._key(target)))
        self.delete(source)

    def create(self, path: str, text: str) -> bool:
        """A conditional PUT. Any attempt may have written the object without this writer
        learning it (a reset after the request was sent; botocore and this layer then
        send it again and find the key taken), so a taken key is read back: our content
        is our create, another is a lost race."""
        data = text.encode("utf-8")
        try:
            self._retrying("create", path, lambda: self._fs.pipe_file(self._key(path), data, mode="create"))
        except FileExistsError:
            try:
                return self.read_bytes(path) == data
            except FileNotFoundError:     # deleted since: a clean-up; not ours to take
                return False
        except StorageUnavailableError as unavailable:
            # every attempt's answer lost: one read (botocore's retries only) may still tell
            try:
                found = self._fs.cat_file(self._key(path), **self._one_get)
            except Exception:             # noqa: BLE001 - absent or unreadable: the outage stands
                raise unavailable from unavailable.__cause__
            return found == data
        return True

    def delete(self, path: str) -> None:
        try:
            self._retrying("delete", path, lambda: self._fs.rm_file(self._key(path)))
        except FileNotFoundError:
            pass

    def delete_tree(self, path: str) -> None:
        try:
            self._retrying("delete", path, lambda: self._fs.rm(self._key(path), recursive=True))
        except FileNotFoundError:
            pass

    def check_reachable(self, location: str, what: str = "Checkpoint location") -> None:
        """At start: the bucket must exist, and the credentials given must read it and
        write and delete under the location (a probe object, deleted at once)."""
        bucket = urlparse(location).netloc
        try:      # through the retries: a store failing for a moment does not fail a start
            self._retrying("list", location, lambda: self._fs.ls(bucket, detail=False, refresh=True))
            probe = f"{self._key(location).rstrip('/')}/.microbatch-write-probe-{uuid.uuid4().hex}"
            try:
                self._retrying("write", location, lambda: self._fs.pipe_file(probe, b""))
            except PermissionError as e:
                raise CheckpointError(
                    f"{what} '{location}': these credentials cannot write to it "
                    f"({reason_of(e)}). Give them write and delete access ({self.retries.terms.write_access}) "
                    "under the location.") from None
            try:
                self._retrying("delete", location, lambda: self._fs.rm_file(probe))
            except PermissionError as e:
                raise CheckpointError(
                    f"{what} '{location}': these credentials cannot delete objects "
                    f"under it ({reason_of(e)}), which the logs' clean-up needs. Give them "
                    f"{self.retries.terms.delete_access} there (and remove the probe object {self.scheme}://{probe}).") from None
        except FileNotFoundError:
            raise CheckpointError(
                f"{what} '{location}': the bucket '{bucket}' does not exist. "
                "Create it, or choose a location in an existing bucket.") from None
        except PermissionError as e:
            raise CheckpointError(
                f"{what} '{location}': access to bucket '{bucket}' is denied "
                f"({reason_of(e)}). Give these credentials read and write access to it.") from None
        except StorageUnavailableError as e:
            raise CheckpointError(
                f"{what} '{location}': cannot reach the store ({reason_of(e.__cause__ or e)}; "
                f"tried {self.retries.retry_limit + 1} times). Check {self.retries.terms.endpoint_setting} "
                "and the credentials.") from None
        except Exception as e:  # an error botocore did not sort
            if not isinstance(e, OSError):
                raise
            raise CheckpointError(
                f"{what} '{location}': cannot reach the store ({reason_of(e)}). "
                f"Check {self.retries.terms.endpoint_setting} and the credentials.") from None


def reason_of(error: BaseException) -> str:
    """An error's message without anything a secret could hide in (only the first line)."""
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


def s3_storage(scheme: str, location: str, conf: Mapping[str, str] | None) -> "ObjectStoreFileSystem":
    """The S3 store of ``location`` (``s3``, ``s3a``, ``s3n``) with S3A's settings in ``conf``
    (the module docstring)."""
    try:
        import s3fs
    except ImportError:
        raise CheckpointError(
            f"Checkpoint location '{location}' is on S3, which needs the Python package "
            "s3fs: pip install s3fs.") from None
    settings = {arg: conf[f"spark.hadoop.{key}"] for key, arg in _S3A_SETTINGS.items()
                if conf and conf.get(f"spark.hadoop.{key}")}
    client_kwargs = {k: settings.pop(k) for k in ("endpoint_url", "region_name") if k in settings}
    if "endpoint_url" in client_kwargs and "://" not in client_kwargs["endpoint_url"]:
        client_kwargs["endpoint_url"] = "https://" + client_kwargs["endpoint_url"]
    retries = S3Retries.from_conf(conf)
    # no listings cache: a listing is a moment's view, and a read or stat answered
    # from it would miss an object created since (by another process, or by a create
    # whose first answer was lost: its read-back found "no such key" in the cache)
    fs = s3fs.S3FileSystem(client_kwargs=client_kwargs, config_kwargs=retries.botocore_config(),
                           use_listings_cache=False, **settings)
    fs.retries = 1      # s3fs's own loop off: botocore's and this layer's are the two, bounded
    spark_settings = {f"spark.hadoop.{key}": conf[f"spark.hadoop.{key}"]
                      for key in [*_S3A_SETTINGS, *_S3A_RETRY_DEFAULTS]
                      if conf and conf.get(f"spark.hadoop.{key}")}
    return ObjectStoreFileSystem(scheme, fs, spark_settings, retries, list_s3_page)


def list_s3_page(fs: Any, bucket: str, prefix: str, start: str | None, token: str | None) -> tuple:
    """One ListObjectsV2 page of ``prefix`` after ``start`` (``ObjectStoreFileSystem.files_after``)."""
    request = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
    request.update({"StartAfter": start} if start else {})
    request.update({"ContinuationToken": token} if token else {})
    page = fs.call_s3("list_objects_v2", **request)
    return ([(o["Key"], int(o["Size"]), int(o["LastModified"].timestamp() * 1000)) for o in page.get("Contents", [])],
            bool(page.get("CommonPrefixes")), page.get("NextContinuationToken"))


class InjectedFailure(OSError):
    """The failure a ``FailingFileSystem`` raises."""


class FailingFileSystem(CheckpointFileSystem):
    """A file system that fails the writes ``should_fail(operation, path)`` picks.

    ``operation`` is ``"write"``, ``"create"`` or ``"delete"``. Used by tests to
    break each step of the batch protocol and check nothing is lost.
    """

    def __init__(self, should_fail: Callable[[str, str], bool]):
        self.should_fail = should_fail

    def _check(self, operation: str, path: str) -> None:
        if self.should_fail(operation, path):
            raise InjectedFailure(f"injected failure: {operation} {path}")

    def write(self, path: str, text: str) -> None:
        self._check("write", path)
        super().write(path, text)

    def create(self, path: str, text: str) -> bool:
        self._check("create", path)
        return super().create(path, text)

    def delete(self, path: str) -> None:
        self._check("delete", path)
        super().delete(path)


LOCAL = CheckpointFileSystem()
