"""What an offline tool leaves in a checkpoint while it changes it, so a query does not start
on a half-changed checkpoint.

``<checkpoint>/rollback`` (``{"toBatch": N, "startedAt": ...}``): written by ``microbatch
checkpoint rollback`` before it deletes anything and removed when it is done
(``ops/rollback.py``). A query refuses to start while it is there; running the same
rollback again finishes it. (An unfinished state repartition needs no marker: its batch is
in the offset log without its commit, which the engine recognises, as Spark's does.)
"""
from __future__ import annotations

import json

from microbatch.checkpoint.fs import CheckpointFileSystem

ROLLBACK_MARKER = "rollback"


def unfinished_rollback(fs: CheckpointFileSystem, root: str) -> str | None:
    """The message refusing a start while a rollback is unfinished, or None."""
    path = f"{root}/{ROLLBACK_MARKER}"
    if not fs.exists(path):
        return None
    try:
        to_batch = json.loads(fs.read_text(path))["toBatch"]
    except (ValueError, KeyError, TypeError):
        to_batch = "N"
    return (f"The checkpoint '{root}' has an unfinished rollback to batch {to_batch} ({path}): "
            "its logs, state and sink may be half rolled back. Finish it with "
            f"`microbatch checkpoint rollback {root} --to-batch {to_batch}`, then start the query.")
