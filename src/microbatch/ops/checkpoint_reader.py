"""A checkpoint opened by the toolkit: its logs, state and sink, without writing anything.

Reads checkpoints written by microbatch and by Spark's own engine (local or S3, through the
storage layer): ``metadata``, ``offsets/``, ``commits/``, ``sources/``, ``state/`` and
microbatch's ``leases/``, ``progress/`` and ``sinks/``. The file sink's output is not in
the checkpoint; it is found from the progress log (the sink's description
``FileSink[<path>]``) or given by the caller.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from microbatch.checkpoint.commits import CommitLog
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.stores import storage_for
from microbatch.checkpoint.offsets import OffsetSeqLog
from microbatch.checkpoint.progress_log import ProgressLog
from microbatch.checkpoint.run_lease import RunLease
from microbatch.errors import CheckpointError

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
_MICROBATCH_STATE = re.compile(r"^(\d+)\.(delta|snapshot|changes)\.arrow$")
_SPARK_STATE = re.compile(r"^(\d+)\.(delta|snapshot|changelog|zip)$")
_FILE_SINK = re.compile(r"^FileSink\[(?:file:)?(.+)\]$")


@dataclass
class StateStoreFiles:
    """The files of one state store (an operator's partition, or a named store in it).

    A store may hold both engines' files: Spark's beside microbatch's after a checkpoint
    moved between them (docs/porting.md). ``files`` are microbatch's (``<v>.<kind>.arrow``),
    ``spark_files`` Spark's (HDFS-backed ``<v>.delta``/``<v>.snapshot``, RocksDB
    ``<v>.changelog``/``<v>.zip``); ``engine`` is the one whose files are the newest (the
    one the query ran on last)."""

    operator: int
    partition: int
    store: str                      # "default", or the store's directory name
    path: str
    files: dict[int, set[str]] = field(default_factory=dict)         # microbatch's: version -> kinds
    spark_files: dict[int, set[str]] = field(default_factory=dict)   # Spark's: version -> kinds
    engine: str = "microbatch"       # or "spark" (only Spark's HDFS or RocksDB provider's files)

    def versions(self, kind: str) -> list[int]:
        return sorted(v for v, kinds in self._own().items() if kind in kinds)

    def _own(self, engine: str | None = None) -> dict[int, set[str]]:
        return self.spark_files if (engine or self.engine) == "spark" else self.files

    def file(self, version: int, kind: str, engine: str | None = None) -> str:
        suffix = ".arrow" if (engine or self.engine) == "microbatch" else ""
        return f"{self.path}/{version}.{kind}{suffix}"

    def all_files(self) -> list[tuple[int, str]]:
        """(version, path) of every state file of both engines."""
        return [(v, self.file(v, kind, engine)) for engine in ("microbatch", "spark")
                for v, kinds in self._own(engine).items() for kind in kinds]

    def _missing(self, version: int, engine: str) -> list[str]:
        files = self._own(engine)
        delta = "changelog" if engine == "spark" and any("changelog" in k or "zip" in k
                                                         for k in files.values()) else "delta"
        snapshot = "zip" if delta == "changelog" else "snapshot"
        snapshots = [v for v, kinds in files.items() if snapshot in kinds and v <= version]
        start = max(snapshots) if snapshots else 0
        return [self.file(v, delta, engine) for v in range(start + 1, version + 1)
                if delta not in files.get(v, set())]

    def missing_for(self, version: int) -> list[str]:
        """The files that loading ``version`` needs and that are not there (microbatch's and
        Spark's HDFS provider: the newest snapshot at or below it, then every delta after;
        Spark's RocksDB provider: zips and changelogs): none when either engine's files load
        it (a moved checkpoint), else what the store's engine lacks."""
        if self.files and self.spark_files and not all(self._missing(version, e) for e in ("microbatch", "spark")):
            return []
        return self._missing(version, self.engine)


class CheckpointReader:
    def __init__(self, location: str, settings: dict[str, str] | None = None,
                 fs: CheckpointFileSystem | None = None):
        self.fs = fs or storage_for(location, settings or {})
        self.root = self.fs.resolve(location)
        self.offsets = OffsetSeqLog(f"{self.root}/offsets", self.fs, read_only=True)
        self.commits = CommitLog(f"{self.root}/commits", self.fs, read_only=True)
        self.progress = ProgressLog(self.fs, self.root)

    # -- what is there ------------------------------------------------------------------
    def exists(self) -> bool:
        return self.fs.exists(self.root)

    def is_checkpoint(self) -> bool:
        return any(self.fs.exists(f"{self.root}/{name}") for name in ("metadata", "offsets", "commits"))

    def query_id(self) -> str | None:
        path = f"{self.root}/metadata"
        if not self.fs.exists(path):
            return None
        return str(json.loads(self.fs.read_text(path))["id"])

    def last_committed(self) -> int | None:
        ids = self.commits.batch_ids()
        return ids[-1] if ids else None

    def runs(self) -> list[dict[str, Any]]:
        return RunLease(self.fs, self.root, "", "").runs()

    def live_run(self) -> dict[str, Any] | None:
        runs = self.runs()
        return runs[-1] if runs and runs[-1]["live"] else None

    def refuse_if_running(self, what: str) -> None:
        run = self.live_run()
        if run is not None:
            raise CheckpointError(
                f"Cannot {what} checkpoint '{self.root}' while its query runs: run {run.get('runId')} "
                f"(process {run.get('pid')} on host {run.get('host')}) is live ({run['live']}). "
                "Stop the query first.")

    def shuffle_partitions(self, batch_id: int) -> int | None:
        seq = self.offsets.get(batch_id)
        value = seq.metadata.conf.get(SHUFFLE_PARTITIONS) if seq is not None else None
        return int(value) if value is not None else None

    # -- state ------------------------------------------------------------------------------
    def operators(self) -> list[int]:
        return sorted(int(n) for n in self.fs.list(f"{self.root}/state") if n.isdigit())

    def schema_document(self, operator: int) -> dict[str, Any] | None:
        """microbatch's ``state/<op>/_metadata/schema`` (None for Spark's checkpoints)."""
        path = f"{self.root}/state/{operator}/_metadata/schema"
        if not self.fs.exists(path):
            return None
        return json.loads(self.fs.read_text(path))

    def partitions(self, operator: int) -> list[int]:
        return sorted(int(n) for n in self.fs.list(f"{self.root}/state/{operator}") if n.isdigit())

    def stores(self, operator: int) -> list[StateStoreFiles]:
        """Every store of an operator: each partition's default store and named stores."""
        found = []
        for partition in self.partitions(operator):
            directory = f"{self.root}/state/{operator}/{partition}"
            names = self.fs.list(directory)
            default = StateStoreFiles(operator, partition, "default", directory)
            _collect(default, names)
            if default.files or default.spark_files or not any(_is_store_directory(n) for n in names):
                found.append(default)
            for name in sorted(n for n in names if _is_store_directory(n)):
                store = StateStoreFiles(operator, partition, name, f"{directory}/{name}")
                _collect(store, self.fs.list(store.path))
                found.append(store)
        return found

    # -- the file sink ------------------------------------------------------------------------
    def file_sink_output(self) -> str | None:
        """The file sink's output path, from the newest progress entry that names it."""
        for batch_id in reversed(self.progress.batch_ids()):
            try:
                entry = self.progress.get(batch_id)
            except CheckpointError:
                continue
            description = ((entry or {}).get("progress", {}).get("sink") or {}).get("description", "")
            match = _FILE_SINK.match(description)
            if match:
                return match.group(1)
            if entry is not None:
                return None
        return None


def _is_store_directory(name: str) -> bool:
    """A named store's directory in a partition (a join side's, a state variable's), not a
    state file, a hidden or metadata file, or Spark's RocksDB ``SSTs``."""
    return not name[0].isdigit() and not name.startswith((".", "_")) and name != "SSTs" \
        and "." not in name


def _collect(store: StateStoreFiles, names: list[str]) -> None:
    for name in names:
        match = _MICROBATCH_STATE.match(name)
        if match:
            store.files.setdefault(int(match.group(1)), set()).add(match.group(2))
            continue
        match = _SPARK_STATE.match(name)
        if match:
            store.spark_files.setdefault(int(match.group(1)), set()).add(match.group(2))
    # the engine whose files are the newest (the one the query ran on last)
    store.engine = "spark" if store.spark_files and (not store.files or max(store.spark_files) > max(store.files)) \
        else "microbatch"
