"""``microbatch checkpoint verify CKPT``: read every file of a checkpoint and report damage.

What it reads, and what counts as damage (each finding names the file and the problem):

- ``metadata``: missing while the logs hold batches (Spark refuses such a checkpoint with
  ``STREAMING_CHECKPOINT_MISSING_METADATA_FILE``), or unreadable;
- ``offsets/N`` and ``commits/N``: each entry parsed (version header, JSON), no gap in
  either log, no commit without its offsets, no planned batch left uncommitted behind a
  later one; the number of sources the same in every version-1 entry;
- ``sources/<id>/``: every file source log entry (and compact file) parsed, and the log
  batches the latest offsets refer to readable; Kafka's and rate's initial offsets parsed;
- ``state/<op>/``: the schema file parsed; every partition (as many as the committed
  batch's ``spark.sql.shuffle.partitions``, or one) able to load the state the next batch
  reads: the newest snapshot at or below that version and every delta after it; every
  microbatch state file read whole, with the schema the schema file gives;
- the file sink's ``_spark_metadata`` (its output is found from the progress log, or given
  with ``--output``): every entry parsed, no batch the checkpoint never planned, every data
  file it lists present with its recorded size;
- ``leases/`` and ``progress/``: records of this query (a file of another query's
  checkpoint copied in is damage);
- any file with a Hadoop checksum beside it (``.name.crc``, as Spark's engine writes): the
  checksum holds.

Checkpoints written by Spark's own engine verify too: its state files (HDFS or RocksDB
provider) are checked by their versions and checksums, not decoded. An uncommitted last
batch is a note, not damage: a restart re-runs it.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
import pyarrow as pa
import pyarrow.ipc as ipc

from microbatch import spark_internals
from microbatch.checkpoint.file_stream_log import (COMPACT_FILE_SUFFIX, SINK_METADATA_DIR,
                                                   FileStreamSinkLog, FileStreamSourceLog,
                                                   all_valid_batches, live_files, uri_to_path)
from microbatch.checkpoint.stores import storage_for
from microbatch.errors import CheckpointError
from microbatch.operators.base import state_layout
from microbatch.ops.checkpoint_reader import SHUFFLE_PARTITIONS, CheckpointReader, StateStoreFiles

DAMAGE, NOTE = "DAMAGE", "NOTE"


@dataclass(frozen=True)
class Finding:
    kind: str          # DAMAGE or NOTE
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.problem}"


class Verifier:
    def __init__(self, location: str, settings: dict[str, str] | None = None, output: str | None = None):
        self.settings = settings or {}
        self.checkpoint = CheckpointReader(location, self.settings)
        self.fs = self.checkpoint.fs
        self.root = self.checkpoint.root
        self.output = output
        self.findings: list[Finding] = []
        self.files_read = 0

    def damage(self, path: str, problem: str) -> None:
        self.findings.append(Finding(DAMAGE, path, problem))

    def note(self, path: str, problem: str) -> None:
        self.findings.append(Finding(NOTE, path, problem))

    @property
    def damaged(self) -> bool:
        return any(f.kind == DAMAGE for f in self.findings)

    # -- the whole checkpoint ----------------------------------------------------------
    def run(self) -> list[Finding]:
        ckpt = self.checkpoint
        if not ckpt.exists():
            self.damage(self.root, "does not exist")
            return self.findings
        if not ckpt.is_checkpoint():
            self.damage(self.root, "is not a streaming checkpoint: it has no metadata file, no "
                                   "offsets/ and no commits/ (a checkpoint location holds them)")
            return self.findings
        query_id = self._metadata()
        offsets = self._offsets()
        commits = self._commits(offsets)
        last_committed = max(commits) if commits else None
        self._sources(offsets)
        if last_committed is not None and last_committed in offsets:
            self._state(last_committed, offsets)
        self._sink(offsets, last_committed)
        self._own_records(query_id)
        self._checksums()
        return self.findings

    def _metadata(self) -> str | None:
        path = f"{self.root}/metadata"
        if not self.fs.exists(path):
            self.damage(path, "is missing while the logs hold batches: the query's id is lost "
                              "(Spark's engine refuses the checkpoint: STREAMING_CHECKPOINT_MISSING_"
                              "METADATA_FILE). Restore it from a backup.")
            return None
        try:
            self.files_read += 1
            return self.checkpoint.query_id()
        except (ValueError, KeyError, TypeError) as e:
            self.damage(path, f"cannot be read ({e}): it should hold {{\"id\":\"<uuid>\"}}")
            return None

    def _read_log(self, log, name: str) -> dict[int, object]:
        entries = {}
        for batch_id in log.batch_ids():
            path = log.batch_file(batch_id)
            try:
                self.files_read += 1
                entry = log.get(batch_id)
            except CheckpointError as e:
                self.damage(path, _first_sentence(str(e), path))
                continue
            if entry is not None:
                entries[batch_id] = entry
        ids = log.batch_ids()
        for missing in sorted(set(range(ids[0], ids[-1] + 1)) - set(ids)) if ids else ():
            self.damage(log.batch_file(missing), f"is missing: the {name} log has batches "
                                                 f"{ids[0]}..{ids[-1]} with a gap here")
        return entries

    def _offsets(self) -> dict:
        offsets = self._read_log(self.checkpoint.offsets, "offsets")
        counts = {len(seq.offsets) for seq in offsets.values() if seq.version == 1}
        if len(counts) > 1:
            by_count = {}
            for batch_id, seq in sorted(offsets.items()):
                by_count.setdefault(len(seq.offsets), batch_id)
            self.damage(f"{self.root}/offsets", "entries disagree on the number of sources ("
                        + ", ".join(f"{n} from batch {b}" for n, b in sorted(by_count.items(), key=lambda x: x[1]))
                        + "): entries of another query's checkpoint are mixed in")
        return offsets

    def _commits(self, offsets: dict) -> list[int]:
        log = self.checkpoint.commits
        commits = self._read_log(log, "commits")
        planned = self.checkpoint.offsets.batch_ids()
        last_planned = planned[-1] if planned else None
        for batch_id in sorted(commits):   # (a commit below the offsets kept: a purge cut short)
            if last_planned is None or batch_id > last_planned:
                self.damage(log.batch_file(batch_id),
                            f"records batch {batch_id} as committed, but there is no offsets/{batch_id}: "
                            "a restart would run a committed batch again")
        committed = set(commits)
        for batch_id in planned[:-1]:
            if batch_id not in committed and commits and batch_id >= min(commits):
                self.damage(log.batch_file(batch_id),
                            f"is missing: batch {batch_id} was planned and batch {batch_id + 1} after it, "
                            "but it was never committed")
        if last_planned is not None and last_planned not in committed and last_planned > 0 \
                and last_planned - 1 in offsets and offsets[last_planned].metadata.conf.get(SHUFFLE_PARTITIONS) \
                != offsets[last_planned - 1].metadata.conf.get(SHUFFLE_PARTITIONS):
            self.damage(self.checkpoint.offsets.batch_file(last_planned),
                        f"batch {last_planned} is an unfinished state repartition (shuffle partitions "
                        f"{offsets[last_planned - 1].metadata.conf.get(SHUFFLE_PARTITIONS)} -> "
                        f"{offsets[last_planned].metadata.conf.get(SHUFFLE_PARTITIONS)}): a query refuses to "
                        "start until the repartition is run again to finish it")
        elif last_planned is not None and last_planned not in committed:
            self.note(self.checkpoint.offsets.batch_file(last_planned),
                      f"batch {last_planned} was planned but not committed: a restart runs it again "
                      "with the same offsets")
        return sorted(commits)

    # -- sources --------------------------------------------------------------------------
    def _sources(self, offsets: dict) -> None:
        root = f"{self.root}/sources"
        latest = offsets[max(offsets)] if offsets else None
        for source_id in sorted(self.fs.list(root)):
            directory = f"{root}/{source_id}"
            names = [n for n in self.fs.list(directory) if not n.startswith(".")]
            if not names:
                continue
            first = sorted(names, key=lambda n: int(n.split(".")[0]) if n.split(".")[0].isdigit() else -1)[0]
            head = self.fs.read_bytes(f"{directory}/{first}")[:64]
            if head.startswith(b"\x00v1") or (head.startswith(b"v1\n") and head[3:4].isdigit()):
                self._initial_offsets(directory, names)
                continue
            offset = latest.by_source_id().get(source_id) if latest is not None else None
            log_offset = offset.get("logOffset") if isinstance(offset, dict) else None
            self._file_source_log(directory, log_offset)

    def _initial_offsets(self, directory: str, names: list[str]) -> None:
        for name in names:
            path = f"{directory}/{name}"
            self.files_read += 1
            text = self.fs.read_text(path).lstrip("\x00")
            lines = text.split("\n", 1)
            try:
                if lines[0] != "v1" or len(lines) < 2:
                    raise ValueError("no 'v1' header and value")
                json.loads(lines[1])
            except ValueError as e:
                self.damage(path, f"the source's initial offsets cannot be read ({e})")

    def _file_source_log(self, directory: str, log_offset: int | None) -> None:
        log = FileStreamSourceLog(directory, self.fs, read_only=True, deleting_expired=False)
        present = set()
        for batch_id, name in sorted(log._listed()):
            path = f"{directory}/{name}"
            try:
                self.files_read += 1
                log.deserialize(self.fs.read_text(path), path)
                present.add(batch_id)
            except CheckpointError as e:
                self.damage(path, _first_sentence(str(e), path))
        if log_offset is not None:
            for needed in all_valid_batches(int(log_offset), log.compact_interval):
                if needed not in present and not self.fs.exists(f"{directory}/{needed}{COMPACT_FILE_SUFFIX}"):
                    self.damage(log.batch_file(needed),
                                f"is missing: the latest offsets refer to log batch {log_offset}, "
                                f"whose files this entry holds")

    # -- state ----------------------------------------------------------------------------
    def _state(self, last_committed: int, offsets: dict) -> None:
        ckpt = self.checkpoint
        version = last_committed + 1
        partitions = ckpt.shuffle_partitions(last_committed)
        for operator in ckpt.operators():
            op_dir = f"{self.root}/state/{operator}"
            doc = None
            schema_path = f"{op_dir}/_metadata/schema"
            if self.fs.exists(schema_path):
                try:
                    self.files_read += 1
                    doc = ckpt.schema_document(operator)
                    for key in ("operatorName", "keySchema", "valueSchema"):
                        if key not in doc:
                            raise ValueError(f"no '{key}'")
                except ValueError as e:
                    self.damage(schema_path, f"the operator's schema file cannot be read ({e})")
                    doc = None
            stores = ckpt.stores(operator)
            spark_written = any(s.engine == "spark" for s in stores)
            if not spark_written and doc is None and not self.fs.exists(schema_path):
                self.damage(schema_path, "is missing: the operator's key and value schema are unknown")
            if doc is not None and partitions is not None:
                expected = 1 if (not doc["keySchema"].get("fields")
                                 or state_layout(doc["operatorName"]).one_partition) else partitions
                present = {s.partition for s in stores}
                for partition in range(expected):
                    if partition not in present:
                        self.damage(f"{op_dir}/{partition}",
                                    f"is missing: operator {operator} ({doc['operatorName']}) has "
                                    f"{expected} state partitions in batch {last_committed}")
                stores = [s for s in stores if s.partition < expected]
            for store in stores:
                for missing in store.missing_for(version):
                    self.damage(missing, f"is missing: state version {version} (the state after batch "
                                         f"{last_committed}) of operator {operator}, partition "
                                         f"{store.partition}{'' if store.store == 'default' else ', store ' + store.store} "
                                         "needs it")
                if store.engine == "microbatch":
                    self._state_files(store, doc)

    def _state_files(self, store: StateStoreFiles, doc: dict | None) -> None:
        expected = _expected_schema(doc) if doc is not None and store.store == "default" else None
        # a transformWithState whose value schemas evolved: older files keep their own
        evolved = doc is not None and "valueSchemaHistory" in doc
        first_schema = None
        for version, kinds in sorted(store.files.items()):
            for kind in sorted(kinds):
                path = store.file(version, kind)
                self.files_read += 1
                try:
                    table = ipc.open_stream(pa.py_buffer(self.fs.read_bytes(path))).read_all()
                except (OSError, pa.ArrowInvalid) as e:
                    self.damage(path, f"the state file cannot be read: {e}")
                    continue
                columns = ["change_type", "key", "value"] if kind == "changes" else ["key", "value"]
                if table.schema.names != columns:
                    self.damage(path, f"is not a state file: its columns are {table.schema.names}")
                    continue
                shape = _shape(table.schema)
                if expected is not None and shape != expected:
                    self.damage(path, f"disagrees with the schema file {self.root}/state/"
                                      f"{store.operator}/_metadata/schema: the file holds {_show(shape)}, "
                                      f"the schema file says {_show(expected)}")
                elif first_schema is not None and (shape[0] != first_schema[0] if evolved else shape != first_schema):
                    self.damage(path, f"has another schema than the other files of its store: "
                                      f"{_show(shape)} against {_show(first_schema)}")
                first_schema = first_schema or shape

    # -- the file sink --------------------------------------------------------------------
    def _sink(self, offsets: dict, last_committed: int | None) -> None:
        output = self.output or self.checkpoint.file_sink_output()
        if output is None:
            return
        fs = storage_for(output, self.settings)
        directory = f"{fs.resolve(output)}/{SINK_METADATA_DIR}"
        if not fs.exists(directory):
            if last_committed is not None:
                self.damage(directory, f"is missing: the file sink's log, which holds the files of "
                                       f"batches up to {last_committed}")
            return
        log = FileStreamSinkLog(directory, fs, read_only=True, deleting_expired=False)
        entries: dict[int, list] = {}
        for batch_id, name in sorted(log._listed()):
            path = f"{directory}/{name}"
            try:
                self.files_read += 1
                entries[batch_id] = log.deserialize(fs.read_text(path), path)
            except CheckpointError as e:
                self.damage(path, _first_sentence(str(e), path))
        if not entries:
            return
        latest = max(entries)
        planned = max(offsets) if offsets else -1
        if latest > planned:
            self.damage(log.batch_file(latest),
                        f"the file sink's log has batch {latest}, which the checkpoint never planned "
                        f"(its last batch is {planned}): output and checkpoint do not belong together")
        if last_committed is not None and latest < last_committed:
            self.damage(directory, f"the file sink's log ends at batch {latest}, but the checkpoint "
                                   f"committed batch {last_committed}: the sink lost committed batches")
        live = []
        for needed in all_valid_batches(latest, log.compact_interval):
            if needed in entries:
                live += entries[needed]
            else:
                self.damage(log.batch_file(needed), "is missing: a reader of the output needs it")
        root = fs.resolve(output).split("://", 1)[-1].rstrip("/") + "/"
        for entry in live_files(live):
            path = entry.path if "://" in entry.path and not entry.path.startswith("file:") \
                else uri_to_path(entry.path)
            if not path.split("://", 1)[-1].startswith(root):
                self.damage(path, f"the file sink's log lists it, but it is not inside the output {output}")
                continue
            stat = fs.stat(path) if "://" in path else storage_for(path).stat(path)
            if stat is None:
                self.damage(path, "is missing: the file sink's log lists it as output")
            elif stat[0] != entry.size:
                self.damage(path, f"has {stat[0]} bytes; the file sink's log recorded {entry.size}")

    # -- leases, progress -----------------------------------------------------------------
    def _own_records(self, query_id: str | None) -> None:
        if query_id is None:
            return
        for run in self.checkpoint.runs():
            if run.get("queryId") not in (query_id, "", None):
                self.damage(f"{self.root}/leases/{run['lease']}",
                            f"is a run lease of query {run.get('queryId')}, not of this checkpoint's "
                            f"query {query_id}")
        log = self.checkpoint.progress
        for batch_id in log.batch_ids():
            try:
                self.files_read += 1
                entry = log.get(batch_id)
            except CheckpointError as e:
                self.note(log.batch_file(batch_id), _first_sentence(str(e), log.batch_file(batch_id)))
                continue
            if entry is not None and entry["progress"].get("id") != query_id:
                self.damage(log.batch_file(batch_id),
                            f"is the progress of query {entry['progress'].get('id')}, not of this "
                            f"checkpoint's query {query_id}")

    def _checksums(self) -> None:
        files = set(self.fs.find(self.root))
        for crc in sorted(files):
            directory, name = crc.rsplit("/", 1)
            if not (name.startswith(".") and name.endswith(".crc")):
                continue
            path = f"{directory}/{name[1:-4]}"
            if path not in files:
                continue
            self.files_read += 1
            problem = hadoop_checksum_problem(self.fs.read_bytes(path), self.fs.read_bytes(crc))
            if problem:
                self.damage(path, f"{problem} (checksum file {name})")


def hadoop_checksum_problem(data: bytes, crc: bytes) -> str | None:
    """What is wrong with ``data`` by its Hadoop checksum file (``crc\\0``, the bytes per
    checksum, then a CRC-32 per chunk), or None."""
    if len(crc) < 8 or crc[:4] != b"crc\x00":
        return "its checksum file is not a Hadoop checksum file"
    per_chunk = struct.unpack(">i", crc[4:8])[0]
    if per_chunk <= 0:
        return "its checksum file is damaged"
    sums = crc[8:]
    chunks = (len(data) + per_chunk - 1) // per_chunk
    if len(sums) != 4 * chunks:
        return f"has {len(data)} bytes, but its checksum covers {len(sums) // 4} chunks of {per_chunk}: it was truncated or extended"
    for i in range(chunks):
        expected = struct.unpack(">I", sums[4 * i:4 * i + 4])[0]
        if zlib.crc32(data[i * per_chunk:(i + 1) * per_chunk]) != expected:
            return f"does not match its checksum at bytes {i * per_chunk}..{min(len(data), (i + 1) * per_chunk)}"
    return None


def _expected_schema(doc: dict) -> tuple | None:
    """The (key, value) storage shapes the schema file gives a default store."""
    from pyspark.sql.types import StructType

    from microbatch.state.files import storage_type
    if not state_layout(doc.get("operatorName")).one_store:
        return None
    try:
        key = storage_type(spark_internals.arrow_type(StructType.fromJson(doc["keySchema"])))
        value = storage_type(spark_internals.arrow_type(StructType.fromJson(doc["valueSchema"])))
    except Exception:  # noqa: BLE001 - a type the check cannot map is left to the engine
        return None
    return _struct_shape(key), _struct_shape(value)


def _struct_shape(kind: pa.DataType) -> tuple:
    return tuple((f.name, str(_plain(f.type))) for f in kind)


def _plain(kind: pa.DataType) -> pa.DataType:
    """A type without what the files need not repeat of the schema file: nullability, and
    the name of a list's element (Arrow's ``item``, Spark's ``element``)."""
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in kind])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(_plain(kind.value_type))
    if pa.types.is_map(kind):
        return pa.map_(_plain(kind.key_type), _plain(kind.item_type))
    return kind


def _shape(schema: pa.Schema) -> tuple:
    return _struct_shape(schema.field("key").type), _struct_shape(schema.field("value").type)


def _show(shape: tuple) -> str:
    key, value = shape
    return ("key <" + ", ".join(f"{n}: {t}" for n, t in key) + ">, value <"
            + ", ".join(f"{n}: {t}" for n, t in value) + ">")


def _first_sentence(message: str, path: str) -> str:
    """An error's problem without its repeated path and its advice."""
    text = message.replace(f"'{path}'", "the file").replace(path, "the file")
    return text.split(". ")[0].rstrip(".")


def verify(location: str, settings: dict[str, str] | None = None, output: str | None = None) -> Verifier:
    verifier = Verifier(location, settings, output)
    verifier.run()
    return verifier
