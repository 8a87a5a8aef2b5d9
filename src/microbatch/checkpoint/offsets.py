"""The offset write-ahead log: ``<checkpoint>/offsets/<batchId>``.

Spark's OffsetSeqLog text format, byte for byte::

    v1
    {"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{...}}
    <offset JSON of source 0, or "-" when it has none>
    <offset JSON of source 1> ...

There is no trailing newline. Offsets are kept as parsed JSON values (a number or
an object); sources turn them into their own types.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from microbatch.checkpoint.metadata_log import MetadataLog, parse_version
from microbatch.errors import CheckpointError

VERSION = 1


def to_json(value: Any) -> str:
    """Compact JSON as Spark's json4s writes it."""
    return json.dumps(value, separators=(",", ":"))


@dataclass
class OffsetSeqMetadata:
    """Per-batch metadata fixed when the batch is planned (re-used on re-runs)."""

    batch_watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    conf: dict[str, str] = field(default_factory=dict)

    def json(self) -> str:
        return to_json({"batchWatermarkMs": self.batch_watermark_ms,
                        "batchTimestampMs": self.batch_timestamp_ms,
                        "conf": self.conf})

    @classmethod
    def from_json(cls, text: str) -> "OffsetSeqMetadata":
        data = json.loads(text)
        return cls(int(data.get("batchWatermarkMs", 0)), int(data.get("batchTimestampMs", 0)),
                   {str(k): str(v) for k, v in (data.get("conf") or {}).items()})


@dataclass
class OffsetSeq:
    """The end offsets of one batch, one per source in plan order (None: no offset)."""

    offsets: list[Any]
    metadata: OffsetSeqMetadata


class OffsetSeqLog(MetadataLog[OffsetSeq]):
    def serialize(self, seq: OffsetSeq) -> str:
        lines = [f"v{VERSION}", seq.metadata.json()]
        lines += ["-" if o is None else to_json(o) for o in seq.offsets]
        return "\n".join(lines)

    def deserialize(self, text: str, path: str) -> OffsetSeq:
        lines = text.split("\n")
        parse_version(lines[0].strip(), VERSION, path)
        if len(lines) < 2 or not lines[1].strip():
            raise CheckpointError(
                f"Log file was malformed: '{path}' has no batch metadata line. Restore it "
                "from a backup, or delete it (and any later offsets files) to re-plan that batch.")
        try:
            metadata = OffsetSeqMetadata.from_json(lines[1])
            offsets = [None if line.strip() == "-" else json.loads(line)
                       for line in lines[2:] if line.strip()]
        except (ValueError, TypeError) as e:
            raise CheckpointError(
                f"Log file was malformed: cannot parse '{path}': {e}. Restore it from a "
                "backup, or delete it (and any later offsets files) to re-plan that batch.") from e
        return OffsetSeq(offsets, metadata)
