"""The commit log: ``<checkpoint>/commits/<batchId>``, written when a batch is done.

Spark's CommitLog text format, no trailing newline::

    v1
    {"nextBatchWatermarkMs":0}

A batch whose ``offsets/N`` exists without ``commits/N`` is re-run on restart
with the very same offsets and metadata.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from microbatch.checkpoint.metadata_log import MetadataLog, parse_version
from microbatch.checkpoint.offsets import to_json
from microbatch.errors import CheckpointError

VERSION = 1


@dataclass
class CommitMetadata:
    next_batch_watermark_ms: int = 0


class CommitLog(MetadataLog[CommitMetadata]):
    def serialize(self, metadata: CommitMetadata) -> str:
        return f"v{VERSION}\n" + to_json({"nextBatchWatermarkMs": metadata.next_batch_watermark_ms})

    def deserialize(self, text: str, path: str) -> CommitMetadata:
        lines = text.split("\n")
        parse_version(lines[0].strip(), VERSION, path)
        try:
            data = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
            return CommitMetadata(int(data.get("nextBatchWatermarkMs", 0)))
        except (ValueError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"Log file was malformed: cannot parse commit file '{path}': {e}. Delete it "
                "to re-run that batch, or restore it from a backup.") from e
