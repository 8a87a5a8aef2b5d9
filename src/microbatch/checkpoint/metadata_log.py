"""MetadataLog: a directory of numbered, immutable log files, one per batch.

The equivalent of Spark's HDFSMetadataLog. Each entry ``<dir>/<batchId>`` is
written once with create-if-absent semantics (see ``fs.CheckpointFileSystem``),
starts with a version line ``v<N>`` and is text, so Spark's readers and a person
with ``cat`` can read it. Subclasses define ``serialize``/``deserialize``.
"""
from __future__ import annotations

import logging
from typing import Generic, Iterator, TypeVar

from microbatch.checkpoint.fs import LOCAL, CheckpointFileSystem
from microbatch.errors import CheckpointError

log = logging.getLogger(__name__)

T = TypeVar("T")


def parse_version(text: str, max_supported: int, path: str) -> int:
    """Parse the ``v<N>`` line Spark writes first; refuse logs from newer writers."""
    if not text.startswith("v"):
        raise CheckpointError(
            f"Log file was malformed: failed to read correct log version from '{path}'. "
            "The file does not start with a version line such as 'v1'; it was not "
            "written by microbatch or Spark, or it was damaged. Restore it from a backup "
            "or start the query with a new checkpoint location.")
    try:
        version = int(text[1:])
    except ValueError:
        raise CheckpointError(
            f"Log file was malformed: failed to read correct log version from '{path}' "
            f"(found '{text[:20]}'). Restore the file or use a new checkpoint location.") from None
    if version > max_supported:
        raise CheckpointError(
            f"UnsupportedLogVersion: maximum supported log version is v{max_supported}, "
            f"but encountered v{version} in '{path}'. The log file was produced by a newer "
            "version and cannot be read by this version. Please upgrade.")
    if version <= 0:
        raise CheckpointError(f"Log file was malformed: invalid version v{version} in '{path}'.")
    return version


class MetadataLog(Generic[T]):
    """A log of one text file per batch id under ``path``."""

    def __init__(self, path: str, fs: CheckpointFileSystem = LOCAL, *, read_only: bool = False):
        self.fs = fs
        self.path = path
        if not read_only:   # the checkpoint toolkit reads a checkpoint without writing to it
            fs.mkdirs(path)

    # -- subclasses -------------------------------------------------------
    def serialize(self, metadata: T) -> str:
        raise NotImplementedError

    def deserialize(self, text: str, path: str) -> T:
        raise NotImplementedError

    # -- operations -------------------------------------------------------
    def batch_file(self, batch_id: int) -> str:
        return f"{self.path}/{batch_id}"

    def add(self, batch_id: int, metadata: T) -> bool:
        """Write entry ``batch_id`` unless it exists; return whether it was written."""
        assert batch_id >= 0, f"batch id must be non-negative, got {batch_id}"
        return self.fs.create(self.batch_file(batch_id), self.serialize(metadata))

    def get(self, batch_id: int) -> T | None:
        path = self.batch_file(batch_id)
        if not self.fs.exists(path):
            return None
        try:
            text = self.fs.read_text(path)
        except OSError as e:
            raise CheckpointError(
                f"Cannot read checkpoint file '{path}': {e}. Check the file's permissions "
                "and the disk; nothing has been changed.") from e
        if not text:
            raise CheckpointError(
                f"Checkpoint file '{path}' is empty. Log files are written atomically, so "
                "this file was damaged outside microbatch. Restore it from a backup, or "
                "delete it to re-run that batch.")
        return self.deserialize(text, path)

    def batch_ids(self) -> list[int]:
        """All batch ids present, ascending (temporary and foreign files ignored)."""
        ids = []
        for name in self.fs.list(self.path):
            if name.isdigit():
                ids.append(int(name))
        return sorted(ids)

    def get_latest(self) -> tuple[int, T] | None:
        for batch_id in reversed(self.batch_ids()):
            metadata = self.get(batch_id)
            if metadata is not None:
                return batch_id, metadata
        return None

    def get_range(self, start: int | None, end: int | None) -> Iterator[tuple[int, T]]:
        for batch_id in self.batch_ids():
            if (start is None or batch_id >= start) and (end is None or batch_id <= end):
                metadata = self.get(batch_id)
                if metadata is not None:
                    yield batch_id, metadata

    def purge(self, threshold_batch_id: int) -> None:
        """Delete entries whose batch id is below ``threshold_batch_id``."""
        for batch_id in self.batch_ids():
            if batch_id < threshold_batch_id:
                self.fs.delete(self.batch_file(batch_id))
                log.debug("Removed metadata log file: %s", self.batch_file(batch_id))
