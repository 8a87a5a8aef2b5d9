"""The offset write-ahead log: ``<checkpoint>/offsets/<batchId>``.

Spark's OffsetSeqLog text formats, byte for byte. Version 1, sources by position::

    v1
    {"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{...}}
    <offset JSON of source 0, or "-" when it has none>
    <offset JSON of source 1> ...

Version 2 (Spark 4.2+, written when source evolution is on), sources by name, so a
query may add, remove or reorder named sources and keep the others' offsets::

    v2
    {"batchWatermarkMs":0,"batchTimestampMs":...,"conf":{...},"sourceMetadataInfo":{}}
    alpha:<offset JSON of source "alpha">
    beta:-

There is no trailing newline. Offsets are kept as parsed JSON values (a number or
an object); sources turn them into their own types.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from microbatch import spark_internals
from microbatch.checkpoint.metadata_log import MetadataLog, parse_version
from microbatch.errors import CheckpointError

VERSION = 1
#: The newest offset log format this engine reads and writes (on Spark 4.2+; before, 1:
#: ``spark_internals.max_offset_log_version``).
MAX_VERSION = 2
#: Spark's switch for named sources and source evolution; a new checkpoint written with
#: it on uses version 2.
SOURCE_EVOLUTION_CONF = "spark.sql.streaming.queryEvolution.enableSourceEvolution"
#: The offset log version a new checkpoint is written with (Spark's conf; default 1).
OFFSET_LOG_VERSION_CONF = "spark.sql.streaming.offsetLog.formatVersion"


def to_json(value: Any) -> str:
    """Compact JSON as Spark's json4s writes it."""
    return json.dumps(value, separators=(",", ":"))


@dataclass
class OffsetSeqMetadata:
    """Per-batch metadata fixed when the batch is planned (re-used on re-runs)."""

    batch_watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    conf: dict[str, str] = field(default_factory=dict)
    #: version 2 only: per-source metadata (Spark writes ``{}``)
    source_metadata_info: dict | None = None

    def json(self) -> str:
        data = {"batchWatermarkMs": self.batch_watermark_ms,
                "batchTimestampMs": self.batch_timestamp_ms, "conf": self.conf}
        if self.source_metadata_info is not None:
            data["sourceMetadataInfo"] = self.source_metadata_info
        return to_json(data)

    @classmethod
    def from_json(cls, text: str) -> "OffsetSeqMetadata":
        data = json.loads(text)
        info = data.get("sourceMetadataInfo")
        return cls(int(data.get("batchWatermarkMs", 0)), int(data.get("batchTimestampMs", 0)),
                   {str(k): str(v) for k, v in (data.get("conf") or {}).items()},
                   dict(info) if isinstance(info, dict) else None)


@dataclass
class OffsetSeq:
    """The end offsets of one batch (None: no offset). Version 1: one per source in plan
    order. Version 2: ``source_ids`` gives each offset's source id (its name, or its
    position as a string for an unnamed source)."""

    offsets: list[Any]
    metadata: OffsetSeqMetadata
    source_ids: list[str] | None = None

    @property
    def version(self) -> int:
        return 1 if self.source_ids is None else 2

    def by_source_id(self) -> dict[str, Any]:
        ids = self.source_ids if self.source_ids is not None else [str(i) for i in range(len(self.offsets))]
        return dict(zip(ids, self.offsets))


class OffsetSeqLog(MetadataLog[OffsetSeq]):
    def serialize(self, seq: OffsetSeq) -> str:
        lines = [f"v{seq.version}", seq.metadata.json()]
        offsets = ["-" if o is None else to_json(o) for o in seq.offsets]
        if seq.source_ids is None:
            lines += offsets
        else:
            lines += [f"{source_id}:{offset}" for source_id, offset in zip(seq.source_ids, offsets)]
        return "\n".join(lines)

    def deserialize(self, text: str, path: str) -> OffsetSeq:
        lines = text.split("\n")
        version = parse_version(lines[0].strip(), spark_internals.max_offset_log_version(), path)
        if len(lines) < 2 or not lines[1].strip():
            raise CheckpointError(
                f"Log file was malformed: '{path}' has no batch metadata line. Restore it "
                "from a backup, or delete it (and any later offsets files) to re-plan that batch.")
        try:
            metadata = OffsetSeqMetadata.from_json(lines[1])
            entries = [line for line in lines[2:] if line.strip()]
            source_ids = None
            if version == 2:
                pairs = [line.split(":", 1) for line in entries]
                if any(len(pair) != 2 for pair in pairs):
                    raise ValueError("a source line is not 'sourceId:offset'")
                source_ids = [source_id for source_id, _ in pairs]
                entries = [offset for _, offset in pairs]
            offsets = [None if line.strip() == "-" else json.loads(line) for line in entries]
        except (ValueError, TypeError) as e:
            raise CheckpointError(
                f"Log file was malformed: cannot parse '{path}': {e}. Restore it from a "
                "backup, or delete it (and any later offsets files) to re-plan that batch.") from e
        return OffsetSeq(offsets, metadata, source_ids)
