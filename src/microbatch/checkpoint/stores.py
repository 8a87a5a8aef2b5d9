"""Which store a location is on: ``storage_for(location, conf)`` picks it by the
location's scheme and makes it with Spark's settings for it (local disk; S3 with S3A's
settings, in ``fs.py``; Google Cloud Storage, ``gcs.py``; Azure Data Lake Storage Gen2,
``azure.py``), and ``storage_from_spec`` remakes one in an executor from what the driver's
store says of itself (``spec()``). A scheme without a store is refused at start, naming
what is served."""
from __future__ import annotations

from typing import Mapping
from urllib.parse import urlparse

from microbatch.checkpoint.azure import azure_storage
from microbatch.checkpoint.fs import CONDITIONAL_CREATE, LOCAL, CheckpointFileSystem, reason_of, s3_storage
from microbatch.checkpoint.gcs import gcs_storage
from microbatch.errors import CheckpointError


def is_local(location: str) -> bool:
    """Whether ``location`` is a local path (no scheme, ``file:``, or a Windows drive)."""
    scheme = urlparse(location).scheme.lower()
    return scheme in ("", "file") or len(scheme) == 1


def storage_for(location: str, conf: Mapping[str, str] | None = None) -> CheckpointFileSystem:
    """The file system a checkpoint location lives on (see the module docstring); ``conf``:
    the Spark settings a remote store may take its endpoint and credentials from."""
    scheme = urlparse(location).scheme.lower()
    if is_local(location):
        return LOCAL
    if scheme in ("s3", "s3a", "s3n"):
        return s3_storage(scheme, location, conf)
    if scheme == "gs":
        return gcs_storage(location, conf)
    if scheme in ("abfs", "abfss"):
        return azure_storage(scheme, location, conf)
    if scheme in ("hdfs", "viewfs"):
        from microbatch.util import HDFS_NEEDS
        raise CheckpointError(f"Checkpoint location '{location}' is on HDFS, which microbatch does not serve yet"
                              f"{HDFS_NEEDS}.")
    import fsspec
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as e:
        raise CheckpointError(
            f"Checkpoint location '{location}' uses the scheme '{scheme}://', which no installed "
            f"file-system library serves ({reason_of(e)}). Use a local path, file:, s3://, gs:// or abfss://.") from None
    raise CheckpointError(
        f"Checkpoint location '{location}' is on a '{scheme}' store, which microbatch cannot "
        "write a checkpoint to: its logs need an atomic create-if-absent (a conditional write) "
        f"so that two runs cannot both write a batch, and microbatch has it for "
        f"{', '.join(sorted(CONDITIONAL_CREATE))} and local disk only.")


_FROM_SPEC: dict[tuple, CheckpointFileSystem] = {}


def storage_from_spec(spec: tuple[str, tuple]) -> CheckpointFileSystem:
    """The store a ``spec()`` names, made once per process (executors reuse it)."""
    if spec not in _FROM_SPEC:
        scheme, settings = spec
        _FROM_SPEC[spec] = LOCAL if scheme == "file" else storage_for(f"{scheme}://", dict(settings))
    return _FROM_SPEC[spec]
