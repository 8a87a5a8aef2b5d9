"""``<checkpoint>/metadata``: the query id that survives restarts (``{"id":"<uuid>"}``)."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.offsets import to_json
from microbatch.errors import CheckpointError


@dataclass
class StreamMetadata:
    id: str

    @staticmethod
    def missing_with_logs(fs: CheckpointFileSystem, checkpoint_root: str) -> bool:
        """True when ``metadata`` is missing but ``offsets/`` or ``commits/`` hold entries:
        starting would give the query a new id over its old batches (Spark 4.2+ refuses)."""
        if fs.exists(f"{checkpoint_root}/metadata"):
            return False
        for log_dir in ("offsets", "commits"):
            path = f"{checkpoint_root}/{log_dir}"
            if fs.exists(path) and any(name.split("/")[-1].isdigit() for name in fs.list(path)):
                return True
        return False

    @classmethod
    def read_or_create(cls, fs: CheckpointFileSystem, checkpoint_root: str) -> "StreamMetadata":
        path = f"{checkpoint_root}/metadata"
        if fs.exists(path):
            text = fs.read_text(path)
            try:
                return cls(str(json.loads(text)["id"]))
            except (ValueError, KeyError, TypeError) as e:
                raise CheckpointError(
                    f"Cannot read the query metadata file '{path}' ({e}): it should hold "
                    '{"id":"<uuid>"}. Restore it from a backup; deleting it gives the query '
                    "a new id.") from e
        metadata = cls(str(uuid.uuid4()))
        try:
            fs.mkdirs(checkpoint_root)
            fs.write(path, to_json({"id": metadata.id}))
        except OSError as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CheckpointError(
                f"Cannot write the query metadata file '{path}' ({reason}). Give this user (or "
                "these credentials) write access to the checkpoint location, or choose another.") from None
        return metadata
