"""The file source and file sink logs: Spark's CompactibleFileStreamLog, in its format.

One file per batch, ``v1`` then one JSON entry per line (no trailing newline).
Every ``compactInterval`` batches (batch ids ``k*interval - 1``) the entry is a
``N.compact`` file holding every live entry of batches ``0..N``, so a reader
needs only the latest compact file plus the batches after it. Old files before
the compact file that keeps ``minBatchesToRetain`` batches are deleted once they
are older than ``cleanupDelay`` (so a reader listing the directory meanwhile can
still find the next compact file).

- ``FileStreamSourceLog`` (``<checkpoint>/sources/<i>/``): ``FileEntry``
  ``{"path":"file:///in/a.json","timestamp":<mtime ms>,"batchId":<log batch>}``.
- ``FileStreamSinkLog`` (``<output>/_spark_metadata/``): ``SinkFileStatus``
  ``{"path":..,"size":..,"isDir":false,"modificationTime":..,"blockReplication":1,
  "blockSize":33554432,"action":"add"}``; Spark's batch readers list an output
  directory through it, so only files of committed batches are ever read.

Entries are plain dataclasses serialised in field order, as json4s writes them.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Callable, Generic, Iterable, TypeVar
from urllib.parse import unquote, urlparse

from microbatch import crash_points
from microbatch.checkpoint.fs import LOCAL, CheckpointFileSystem
from microbatch.checkpoint.metadata_log import MetadataLog, parse_version
from microbatch.errors import CheckpointError

log = logging.getLogger(__name__)

FILE_FORMATS = ("text", "csv", "json", "parquet", "orc", "xml")
#: The file sink's log directory inside its output directory.
SINK_METADATA_DIR = "_spark_metadata"
COMPACT_FILE_SUFFIX = ".compact"
VERSION = 1
#: Hadoop's local file system reports these for every file (Spark writes them as is).
LOCAL_BLOCK_REPLICATION = 1
LOCAL_BLOCK_SIZE = 33554432

# java.net.URI leaves these unescaped in a path (unreserved, punct, '/', '@');
# non-ASCII characters stay as they are, as in URI.toString, unless space or control.
_URI_PATH_UNSAFE = re.compile(r"[^A-Za-z0-9_\-!.~'()*,;:$&+=/@]")


def _escape(match: re.Match) -> str:
    ch = match.group()
    if ord(ch) > 127 and ch.isprintable() and not ch.isspace():
        return ch
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8"))


def path_to_uri(path: str) -> str:
    """``/in/a b.json`` -> ``file:///in/a%20b.json``, the string Spark logs for a local file."""
    return "file://" + _URI_PATH_UNSAFE.sub(_escape, path)


def uri_to_path(uri: str) -> str:
    """The inverse of ``path_to_uri``; also accepts Spark's ``file:/x`` and bare paths."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path)
    raise CheckpointError(
        f"The file log entry '{uri}' is on the file system '{parsed.scheme}://', which "
        "microbatch cannot read yet: only local files are supported.")


@dataclass(frozen=True)
class FileEntry:
    """A file the file source took into batch ``batchId`` of its log."""
    path: str           # URI, as path_to_uri writes it
    timestamp: int      # modification time, ms
    batchId: int

    @property
    def local_path(self) -> str:
        return uri_to_path(self.path)


@dataclass(frozen=True)
class SinkFileStatus:
    """A file the file sink committed; readers see it unless ``action`` is ``delete``."""
    path: str
    size: int
    isDir: bool
    modificationTime: int
    blockReplication: int
    blockSize: int
    action: str

    @classmethod
    def of_local_file(cls, path: str) -> "SinkFileStatus":
        st = os.stat(path)
        return cls(path_to_uri(path), st.st_size, False, st.st_mtime_ns // 1_000_000,
                   LOCAL_BLOCK_REPLICATION, LOCAL_BLOCK_SIZE, "add")

    @property
    def local_path(self) -> str:
        return uri_to_path(self.path)


E = TypeVar("E", FileEntry, SinkFileStatus)


def is_compaction_batch(batch_id: int, interval: int) -> bool:
    return (batch_id + 1) % interval == 0


def valid_batches_before_compaction(compaction_batch_id: int, interval: int) -> range:
    """The batches a compaction at ``compaction_batch_id`` merges (including the previous one)."""
    return range(max(0, compaction_batch_id - interval), compaction_batch_id)


def all_valid_batches(batch_id: int, interval: int) -> range:
    """The batches that together hold every live entry as of ``batch_id``."""
    return range(max(0, (batch_id + 1) // interval * interval - 1), batch_id + 1)


def derive_compact_interval(default: int, latest_compact_batch_id: int) -> int:
    """An interval compatible with an existing compact file (Spark's SPARK-18187 rule)."""
    n = latest_compact_batch_id + 1
    if n <= default:
        return n
    if default < n // 2:
        for i in range(default, n // 2 + 1):
            if n % i == 0:
                return i
    return n


class CompactibleFileStreamLog(MetadataLog[list[E]], Generic[E]):
    """A metadata log whose entries are lists of file records, compacted periodically."""

    entry_type: type = FileEntry

    def __init__(self, path: str, fs: CheckpointFileSystem = LOCAL, *,
                 default_compact_interval: int = 10, cleanup_delay_ms: int = 600_000,
                 deleting_expired: bool = True, min_batches_to_retain: int = 100,
                 clock: Callable[[], float] = time.time, read_only: bool = False):
        if default_compact_interval <= 0:
            raise ValueError(f"The compact interval must be positive (was {default_compact_interval}).")
        super().__init__(path, fs, read_only=read_only)
        self.default_compact_interval = default_compact_interval
        self.cleanup_delay_ms = cleanup_delay_ms
        self.deleting_expired = deleting_expired
        self.min_batches_to_retain = min_batches_to_retain
        self._now_ms = lambda: int(clock() * 1000)
        self.compact_interval = self._choose_compact_interval()

    def _choose_compact_interval(self) -> int:
        compacts = sorted((b for b, name in self._listed() if name.endswith(COMPACT_FILE_SUFFIX)),
                          reverse=True)
        interval = self.default_compact_interval
        if len(compacts) >= 2:
            interval = compacts[0] - compacts[1]
        elif len(compacts) == 1:
            interval = derive_compact_interval(self.default_compact_interval, compacts[0])
        log.info("Set the compact interval to %d [defaultCompactInterval: %d]",
                 interval, self.default_compact_interval)
        return interval

    # -- entries ----------------------------------------------------------
    def should_retain(self, entry: E, now_ms: int) -> bool:
        return True

    def serialize(self, metadata: list[E]) -> str:
        lines = [f"v{VERSION}"]
        lines.extend(json.dumps(asdict(e), separators=(",", ":"), ensure_ascii=False)
                     for e in metadata)
        return "\n".join(lines)

    def deserialize(self, text: str, path: str) -> list[E]:
        lines = text.split("\n")
        parse_version(lines[0].strip(), VERSION, path)
        entries = []
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                entries.append(self.entry_type(**json.loads(line)))
            except (ValueError, TypeError) as e:
                raise CheckpointError(
                    f"Log file '{path}' is damaged at line {number} ({e}): {line[:200]!r}. "
                    "It is not a JSON file entry. Restore it from a backup, or use a new "
                    "checkpoint (for a sink: a new output directory).") from e
        return entries

    # -- files ------------------------------------------------------------
    def _listed(self) -> list[tuple[int, str]]:
        out = []
        for name in self.fs.list(self.path):
            stem = name[:-len(COMPACT_FILE_SUFFIX)] if name.endswith(COMPACT_FILE_SUFFIX) else name
            if stem.isdigit():
                out.append((int(stem), name))
        return out

    def batch_file(self, batch_id: int) -> str:
        if is_compaction_batch(batch_id, self.compact_interval):
            return f"{self.path}/{batch_id}{COMPACT_FILE_SUFFIX}"
        return f"{self.path}/{batch_id}"

    def batch_ids(self) -> list[int]:
        return sorted({b for b, _ in self._listed()})

    def get_latest_batch_id(self) -> int | None:
        """The newest batch id, by listing only (a compact file can be big)."""
        for batch_id in reversed(self.batch_ids()):
            if self.fs.exists(self.batch_file(batch_id)):
                return batch_id
        return None

    def purge(self, threshold_batch_id: int) -> None:
        raise CheckpointError("Cannot purge a compactible file stream log: it removes its "
                              "own expired files after each compaction.")

    # -- writing ----------------------------------------------------------
    def add(self, batch_id: int, metadata: list[E]) -> bool:
        if is_compaction_batch(batch_id, self.compact_interval):
            added = self._compact(batch_id, metadata)
        else:
            added = super().add(batch_id, metadata)
        if added and self.deleting_expired:
            self._delete_expired(batch_id)
        return added

    def _compact(self, batch_id: int, entries: list[E]) -> bool:
        started = time.monotonic()
        now = self._now_ms()
        merged: list[E] = []
        for previous in valid_batches_before_compaction(batch_id, self.compact_interval):
            batch = self.get(previous)
            if batch is None:
                raise CheckpointError(
                    f"{self.batch_file(previous)} doesn't exist when compacting batch {batch_id} "
                    f"(compactInterval: {self.compact_interval}). The log '{self.path}' is "
                    "missing a file: restore it, or start over with a new checkpoint/output.")
            merged.extend(e for e in batch if self.should_retain(e, now))
        merged.extend(e for e in entries if self.should_retain(e, now))
        added = super().add(batch_id, merged)
        crash_points.reached("log-compacted")
        elapsed_ms = (time.monotonic() - started) * 1000
        if elapsed_ms >= 2000:
            log.warning("Compacting took %d ms for compact batch %d", elapsed_ms, batch_id)
        return added

    def _delete_expired(self, current_batch_id: int) -> None:
        if self.compact_interval > current_batch_id + 1 - self.min_batches_to_retain:
            return
        min_batch_id = current_batch_id + 1 - self.min_batches_to_retain
        min_compaction_batch_id = min_batch_id - (min_batch_id % self.compact_interval) - 1
        log.info("Current compact batch id = %d min compaction batch id to delete = %d",
                 current_batch_id, min_compaction_batch_id)
        expired = self._now_ms() - self.cleanup_delay_ms
        for batch_id, name in self._listed():
            if batch_id >= min_compaction_batch_id:
                continue
            path = f"{self.path}/{name}"
            found = self.fs.stat(path)
            if found is not None and found[1] <= expired:
                self.fs.delete(path)

    # -- reading ----------------------------------------------------------
    def all_files(self) -> list[E]:
        """Every live entry: the latest compact file plus the batches after it."""
        now = self._now_ms()
        latest = self.get_latest_batch_id()
        while latest is not None:
            try:
                entries: list[E] = []
                for batch_id in all_valid_batches(latest, self.compact_interval):
                    batch = self.get(batch_id)
                    if batch is None:
                        raise FileNotFoundError(
                            f"{self.batch_file(batch_id)} doesn't exist (latestId: {latest}, "
                            f"compactInterval: {self.compact_interval})")
                    entries.extend(e for e in batch if self.should_retain(e, now))
                return entries
            except FileNotFoundError as e:
                # Another process compacted and deleted old files meanwhile: the next
                # compact file holds everything.
                newer = self.get_latest_batch_id()
                next_compaction = ((latest + self.compact_interval + 1) // self.compact_interval
                                   * self.compact_interval - 1)
                if newer is None or newer < next_compaction:
                    raise CheckpointError(f"Cannot list the files of log '{self.path}': {e}.") from e
                latest = newer
        return []

    def log_size(self) -> tuple[int, int]:
        """(number of log files, their total bytes): what progress reports as the log's size."""
        count = size = 0
        for _, name in self._listed():
            found = self.fs.stat(f"{self.path}/{name}")
            if found is not None:
                size += found[0]
                count += 1
        return count, size


class FileStreamSourceLog(CompactibleFileStreamLog[FileEntry]):
    """``<checkpoint>/sources/<i>``: which files each log batch of a file source took."""

    entry_type = FileEntry

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Entries of batches added by this run: getBatch need not re-read compact files.
        self._cache: dict[int, list[FileEntry]] = {}

    def add(self, batch_id: int, metadata: list[FileEntry]) -> bool:
        added = super().add(batch_id, metadata)
        if added:
            self._cache[batch_id] = list(metadata)
            for old in [b for b in self._cache if b <= batch_id - self.compact_interval]:
                del self._cache[old]
        return added

    def files_in_range(self, start_batch: int, end_batch: int) -> list[FileEntry]:
        """The entries of log batches ``start_batch..end_batch`` (inclusive), in order."""
        out: list[FileEntry] = []
        missing: list[int] = []
        for batch_id in range(start_batch, end_batch + 1):
            if batch_id in self._cache:
                out.extend(self._cache[batch_id])
                continue
            batch = self.get(batch_id)
            if batch is None:
                missing.append(batch_id)
            else:
                out.extend(e for e in batch if e.batchId == batch_id)
        if missing:
            # The batch files were removed after a compaction: take them from the
            # compact file that holds them.
            log.warning("Get batches from removed files, this is unexpected in the current code path!!!")
            wanted = set(missing)
            found = [e for e in self.all_files() if e.batchId in wanted]
            if {e.batchId for e in found} != wanted:
                raise CheckpointError(
                    f"The file source log '{self.path}' has no record of batches "
                    f"{sorted(wanted - {e.batchId for e in found})}, which the offset log "
                    "refers to. The checkpoint is damaged: restore the missing files from a "
                    "backup or use a new checkpoint location.")
            out.extend(found)
            out.sort(key=lambda e: e.batchId)
        return out


class FileStreamSinkLog(CompactibleFileStreamLog[SinkFileStatus]):
    """``<output>/_spark_metadata``: the files each committed batch of a file sink wrote."""

    entry_type = SinkFileStatus

    def __init__(self, *args, retention_ms: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.retention_ms = retention_ms
        if retention_ms is not None:
            log.info("Retention is set to %d ms", retention_ms)

    def should_retain(self, entry: SinkFileStatus, now_ms: int) -> bool:
        if self.retention_ms is None:
            return True
        return now_ms - entry.modificationTime <= self.retention_ms


def live_files(entries: Iterable[SinkFileStatus]) -> list[SinkFileStatus]:
    """Entries a reader sees: not directories, not deleted."""
    return [e for e in entries if e.action != "delete" and not e.isDir]
