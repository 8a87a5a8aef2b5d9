"""Google Cloud Storage (``gs://``) as a checkpoint, file-source and file-sink store,
through gcsfs, with the settings of Hadoop's GCS connector a Spark job already gives.

- ``spark.hadoop.fs.gs.storage.root.url``: the API's root (an emulator's address; the
  connector's default ``https://storage.googleapis.com/``), or the environment's
  ``STORAGE_EMULATOR_HOST``, which gcsfs reads itself.
- ``spark.hadoop.fs.gs.project.id``: the project.
- Credentials as the connector's ``fs.gs.auth.type`` says: ``APPLICATION_DEFAULT`` (its
  default, and gcsfs's ``google_default``: ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
  login, the metadata server), ``SERVICE_ACCOUNT_JSON_KEYFILE`` with
  ``fs.gs.auth.service.account.json.keyfile`` (the key file's path; the path alone is
  passed, never the key), ``COMPUTE_ENGINE`` (the metadata server), ``UNAUTHENTICATED``
  (an emulator, public buckets). A type gcsfs cannot take is refused naming it.

A log entry's create-if-absent is an upload with ``ifGenerationMatch=0``, which GCS
refuses (412) when the object exists: gcsfs's ``mode="create"``. Faults: gcsfs's own loop
tries each request six times (5xx, 429, timeouts, resets; waits from 1 s doubling to
32 s, about 31 s in all), the one bounded layer (``GcsRetries``: the storage layer adds
no second loop, only the read-back of a create whose answer was lost).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from microbatch.checkpoint.fs import CheckpointFileSystem, ObjectStoreFileSystem, StoreTerms
from microbatch.errors import CheckpointError

#: The connector's settings (``spark.hadoop.`` + key) the store reads; the executors get
#: the same ones (``spec()``), never a key's content.
GCS_SETTINGS = ("fs.gs.storage.root.url", "fs.gs.project.id", "fs.gs.auth.type",
                "fs.gs.auth.service.account.json.keyfile")

_AUTH_TYPES = {"APPLICATION_DEFAULT": "google_default", "COMPUTE_ENGINE": "cloud",
               "UNAUTHENTICATED": "anon"}


@dataclass(frozen=True)
class GcsRetries:
    """The storage layer's retries of a GCS operation: none after gcsfs's six attempts of
    each request (the module docstring)."""
    retry_limit: int = 0
    retry_interval_s: float = 1.0
    terms = StoreTerms("GCS", "spark.hadoop.fs.gs.storage.root.url",
                       "storage.objects.create, storage.objects.delete", "storage.objects.delete",
                       "gcsfs's own six attempts")

    def settings_text(self) -> str:
        return "gcsfs's six attempts of each request (waits from 1 s doubling to 32 s)"


def gcs_storage(location: str, conf: Mapping[str, str] | None) -> CheckpointFileSystem:
    """The ``gs://`` store of ``location`` with the connector's settings in ``conf``."""
    try:
        from gcsfs.core import GCSFileSystem    # (not the package's default class, whose
    except ImportError:                         # bucket-type probe over gRPC an emulator lacks)
        raise CheckpointError(
            f"Location '{location}' is on Google Cloud Storage, which needs the Python package "
            "gcsfs: pip install gcsfs.") from None
    given = {key: str(conf[f"spark.hadoop.{key}"]).strip() for key in GCS_SETTINGS
             if conf and str(conf.get(f"spark.hadoop.{key}") or "").strip()}
    kwargs: dict = {}
    if "fs.gs.storage.root.url" in given:
        kwargs["endpoint_url"] = given["fs.gs.storage.root.url"].rstrip("/")
    if "fs.gs.project.id" in given:
        kwargs["project"] = given["fs.gs.project.id"]
    auth = given.get("fs.gs.auth.type", "").upper()
    keyfile = given.get("fs.gs.auth.service.account.json.keyfile")
    if auth == "SERVICE_ACCOUNT_JSON_KEYFILE" or (not auth and keyfile):
        if not keyfile:
            raise CheckpointError(
                f"Location '{location}': spark.hadoop.fs.gs.auth.type is SERVICE_ACCOUNT_JSON_KEYFILE "
                "but spark.hadoop.fs.gs.auth.service.account.json.keyfile is not set. Set it to the "
                "key file's path.")
        kwargs["token"] = keyfile
    elif auth in _AUTH_TYPES:
        kwargs["token"] = _AUTH_TYPES[auth]
    elif auth:
        raise CheckpointError(
            f"Location '{location}': spark.hadoop.fs.gs.auth.type is '{auth}', which microbatch's "
            f"storage layer (gcsfs) cannot take. Use one of {', '.join(sorted([*_AUTH_TYPES, 'SERVICE_ACCOUNT_JSON_KEYFILE']))}.")
    # no listings cache: a listing is a moment's view (as for S3)
    fs = GCSFileSystem(use_listings_cache=False, skip_instance_cache=True, **kwargs)
    return ObjectStoreFileSystem("gs", fs, {f"spark.hadoop.{k}": v for k, v in given.items()}, GcsRetries(),
                                 list_gcs_page)


def list_gcs_page(fs: Any, bucket: str, prefix: str, start: str | None, token: str | None) -> tuple:
    """One page of the JSON API's object list of ``prefix`` after ``start``
    (``ObjectStoreFileSystem.files_after``; ``startOffset`` is inclusive, so the start key
    itself is left out)."""
    params = {"prefix": prefix, "delimiter": "/", "maxResults": 1000}
    params.update({"startOffset": start} if start else {})
    params.update({"pageToken": token} if token else {})
    page = fs.call("GET", "b/{}/o", bucket, json_out=True, **params)
    return ([(o["name"], int(o["size"]), int(datetime.fromisoformat(o["updated"].replace("Z", "+00:00")).timestamp() * 1000))
             for o in page.get("items", []) if o["name"] != start],
            bool(page.get("prefixes")), page.get("nextPageToken"))
