"""``microbatch checkpoint show PATH``: what a checkpoint holds, batch by batch."""
from __future__ import annotations

import os

from microbatch.checkpoint.commits import CommitLog
from microbatch.checkpoint.fs import LOCAL
from microbatch.checkpoint.offsets import OffsetSeqLog
from microbatch.checkpoint.stream_metadata import StreamMetadata
from microbatch.errors import CheckpointError


def show_checkpoint(path: str) -> int:
    root = LOCAL.resolve(path)
    if not os.path.isdir(root) or not os.path.exists(os.path.join(root, "metadata")):
        print(f"'{path}' is not a checkpoint: it has no 'metadata' file.")
        return 2
    try:
        query_id = StreamMetadata.read_or_create(LOCAL, root).id
        offsets = OffsetSeqLog(os.path.join(root, "offsets"))
        commits = CommitLog(os.path.join(root, "commits"))
        committed = set(commits.batch_ids())
        print(f"checkpoint {root}")
        print(f"query id   {query_id}")
        for batch_id, seq in offsets.get_range(None, None):
            state = "committed" if batch_id in committed else "NOT committed (re-run on restart)"
            print(f"batch {batch_id}: {state}; timestamp {seq.metadata.batch_timestamp_ms}, "
                  f"watermark {seq.metadata.batch_watermark_ms}")
            for source_id, offset in seq.by_source_id().items():
                print(f"    source {source_id}: {'-' if offset is None else offset}")
    except CheckpointError as e:
        print(f"error: {e}")
        return 1
    return 0
