"""The file source's ``cleanSource``: the files of a committed batch deleted, or moved
under ``sourceArchiveDir`` (which must not match the source's pattern); a failure only
warns. On an object store (``store``) the same: a delete, or a copy then a delete, under
an archive directory on the same bucket."""
from __future__ import annotations

import fnmatch
import logging
import os
from typing import Any
from urllib.parse import urlsplit

from microbatch import crash_points
from microbatch.checkpoint.file_stream_log import FileEntry
from microbatch.errors import IllegalArgumentException
from microbatch.util import local_path

log = logging.getLogger(__name__)


def _path_components(path: str) -> list[str]:
    return [c for c in path.split("/") if c]


#: Spark's conf: the threads that delete or move a committed batch's files
CLEANER_THREADS = "spark.sql.streaming.fileSource.cleaner.numThreads"


class SourceFileCleaner:
    """``cleanSource``: delete or archive files of committed batches. Failures only warn.

    ``threads`` (``spark.sql.streaming.fileSource.cleaner.numThreads``, 1 by default): how
    many threads clean a batch's files. Spark's cleaner hands them to a pool of that many
    threads and does not wait; microbatch's cleans them on that many threads and waits, so
    a batch's files are gone (or archived) when its commit returns, as its crash recovery
    expects. 0 or 1: one after another on the query's thread."""

    def __init__(self, mode: str, source_path: str, archive_dir: str | None, threads: int = 1,
                 store: Any = None):
        self.mode = mode
        self.threads = threads
        self.store = store        # checkpoint.fs.ObjectStoreFileSystem, or None on local disk
        if archive_dir and store is not None:
            self.archive_dir = self._store_archive_dir(source_path, archive_dir)
        else:
            self.archive_dir = local_path(archive_dir, "sourceArchiveDir") if archive_dir else None
        if self.archive_dir is not None:
            self._check_archive_dir(source_path)

    @staticmethod
    def _store_archive_dir(source_path: str, archive_dir: str) -> str:
        """As Spark's: the archive must be on the source's file system (scheme and bucket)."""
        src, arc = urlsplit(source_path), urlsplit(archive_dir)
        if (arc.scheme.lower(), arc.netloc) != (src.scheme.lower(), src.netloc):
            raise IllegalArgumentException(
                f"Source archive directory '{archive_dir}' must be on the same file system as the "
                f"source path '{source_path}' ({src.scheme}://{src.netloc}): archiving moves the "
                "files within that store. Give a sourceArchiveDir in the same bucket.")
        return archive_dir.rstrip("/")

    @staticmethod
    def _path_part(path: str) -> str:
        """The path of ``path`` without a scheme and bucket (``/in/a.json``)."""
        return urlsplit(path).path if "://" in path else path

    def _check_archive_dir(self, source_path: str) -> None:
        src = _path_components(self._path_part(source_path))
        arc = _path_components(self._path_part(self.archive_dir))
        depth = min(len(src), len(arc))
        if all(fnmatch.fnmatchcase(a, s) for s, a in zip(src[:depth], arc[:depth])):
            raise IllegalArgumentException(
                "Base archive path cannot be set to the path where archived path can possibly "
                "match with source pattern. Ensure the base archive path doesn't match with "
                f"source pattern in depth, where the depth is minimum of depth on both paths. "
                f"(source: {source_path}, sourceArchiveDir: {self.archive_dir})")

    def clean_all(self, entries: list[FileEntry]) -> None:
        """Clean a committed batch's files, on ``threads`` threads when more than one."""
        if self.threads > 1 and len(entries) > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(min(self.threads, len(entries)), thread_name_prefix="file-source-cleaner") as pool:
                list(pool.map(self.clean, entries))
            crash_points.reached("source-file-cleaned")
            return
        for entry in entries:
            self.clean(entry)
            crash_points.reached("source-file-cleaned")

    def clean(self, entry: FileEntry) -> None:
        if self.store is not None:
            self._clean_on_store(entry.path)
            return
        current = entry.local_path
        if self.mode == "delete":
            log.debug("Removing completed file %s", current)
            try:
                os.remove(current)
            except FileNotFoundError:
                log.debug("Completed file %s is already gone", current)
            except OSError as e:
                log.warning("Fail to remove %s / skip removing file. (%s)", current, e)
            return
        target = self.archive_dir.rstrip("/") + current
        try:
            if not os.path.exists(current):
                log.debug("Completed file %s is already gone", current)
                return
            os.makedirs(os.path.dirname(target), exist_ok=True)
            log.debug("Archiving completed file %s to %s", current, target)
            os.rename(current, target)
        except OSError as e:
            log.warning("Fail to move %s to %s / skip moving file. (%s)", current, target, e)

    def _clean_on_store(self, current: str) -> None:
        if self.mode == "delete":
            log.debug("Removing completed file %s", current)
            try:
                self.store.delete(current)
            except OSError as e:
                log.warning("Fail to remove %s / skip removing file. (%s)", current, e)
            return
        target = self.archive_dir + self._path_part(current)
        try:
            log.debug("Archiving completed file %s to %s", current, target)
            self.store.move(current, target)
        except FileNotFoundError:
            log.debug("Completed file %s is already gone", current)
        except OSError as e:
            log.warning("Fail to move %s to %s / skip moving file. (%s)", current, target, e)
