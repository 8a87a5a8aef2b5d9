"""The checks of a checkpoint's consistency at a restart: what the logs, the sources and
the state must agree on before any batch runs. Each fails with the file and the problem,
and changes nothing."""
from __future__ import annotations

import json
from typing import Any

from microbatch.checkpoint.commits import CommitLog
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqLog
from microbatch.errors import CheckpointError


def torn_last_entry(error: CheckpointError, offset_log: OffsetSeqLog, commit_log: CommitLog,
                    fs: CheckpointFileSystem) -> CheckpointError:
    """A damaged last ``offsets/N`` that was never committed: a crash while writing it
    (on a store without atomic writes) or damage. No later batch depends on it, so
    deleting it is safe unless the sink already holds batch N; say so, with the command."""
    ids = offset_log.batch_ids()
    last = ids[-1] if ids else None
    path = offset_log.batch_file(last) if last is not None else None
    if path is None or path not in str(error) or fs.exists(commit_log.batch_file(last)):
        return error
    return CheckpointError(
        f"{error} It is the last offsets entry and batch {last} was never committed "
        f"(no {commit_log.batch_file(last)}), so no other batch depends on it. If the "
        f"sink did not record batch {last} (the file sink: no _spark_metadata/{last} in its "
        "output; foreachBatch: your table), deleting it is safe and the restart plans "
        f"batch {last} again: rm '{path}'")


def check_commits_have_offsets(commit_log: CommitLog, latest_offsets_id: int | None, checkpoint_root: str) -> None:
    """A commit names a batch the offset log planned. ``commits/N`` beyond the last
    ``offsets/N`` means the offset log lost entries (a restore, a hand edit): the
    engine would re-run a committed batch. Refuse before anything runs."""
    orphans = [b for b in commit_log.batch_ids()
               if latest_offsets_id is None or b > latest_offsets_id]
    if not orphans:
        return
    files = ", ".join(commit_log.batch_file(b) for b in orphans)
    has = (f"its last is offsets/{latest_offsets_id}" if latest_offsets_id is not None
           else "it is empty")
    raise CheckpointError(
        f"The checkpoint '{checkpoint_root}' is inconsistent: {files} record(s) batch(es) "
        f"{', '.join(map(str, orphans))} as committed, but the offset log has no entry for "
        f"them ({has}). Nothing was run. Restore the missing offsets file(s) from a backup; "
        "or, if those batches must be planned again, delete the listed commit file(s) "
        "(their output may then be written again by a sink that is not idempotent).")


def check_source_count(seq: OffsetSeq, batch_id: int, num_sources: int, checkpoint_root: str) -> None:
    if seq.version >= 2:
        return   # sources by id: added ones start fresh, removed ones are dropped
    if len(seq.offsets) != num_sources:
        raise CheckpointError(
            f"There are [{len(seq.offsets)}] sources in the checkpoint offsets and now there "
            f"are [{num_sources}] sources requested by the query. Cannot continue. "
            f"(checkpoint '{checkpoint_root}', offsets/{batch_id}). A checkpoint belongs "
            "to one query: restore the query's sources, or use a new checkpoint location.")


def check_state_operators(fs: CheckpointFileSystem, checkpoint_root: str, names: list[str],
                          current_batch_id: int) -> None:
    """The stateful operators (``names``, by operator id) must be those whose state the
    checkpoint holds."""
    if current_batch_id == 0:
        return
    state_root = f"{checkpoint_root}/state"
    on_disk = sorted(int(n) for n in fs.list(state_root) if n.isdigit())
    wanted = list(range(len(names)))
    if on_disk == wanted:
        return
    listed = ", ".join(f"{i} ({name})" for i, name in enumerate(names)) or "none"
    raise CheckpointError(
        f"The query's stateful operators [{listed}] do not match the state in checkpoint "
        f"'{checkpoint_root}', which holds state for operators {on_disk or 'none'} after "
        f"{current_batch_id} batches. Adding, removing or reordering stateful operators "
        "of a running query is not supported (as in Spark): restore the query as it was, or "
        "start it with a new checkpoint location.")


class StateSchemas:
    """Each stateful operator's key and value schema (``state/<op>/_metadata/schema``):
    checked at a restart against those its state was written with (a transformWithState's
    may evolve by Spark's rules: each step's ``stored_schema_check``), written when the run's first
    batch runs."""

    def __init__(self, fs: CheckpointFileSystem, checkpoint_root: str, operators: list, empty_inputs: dict):
        self.fs = fs
        self.checkpoint_root = checkpoint_root
        self.operators = operators          # the planner's StatefulOperators
        self._empty_inputs = empty_inputs   # an empty DataFrame per relation
        self._evolved: dict[str, str] = {}  # schema file -> the evolved schema document
        self.written = False

    def schemas(self) -> list[tuple[str, Any, Any, Any]]:
        """(schema file, operator, key schema, value schema) of every stateful operator."""
        found = []
        for op in self.operators:
            children = op.node.children
            key, value = op.step.state_schema([child.build(self._empty_inputs).schema for child in children])
            found.append((f"{self.checkpoint_root}/state/{op.id}/_metadata/schema", op, key, value))
        return found

    def check(self, conf: Any) -> None:
        """Refuse a checkpoint whose state does not fit the query, naming the operator, the
        file and the difference (Spark's errors for a transformWithState). ``conf``: the
        batch session's, with the checkpoint's confs."""
        for path, op, key, value in self.schemas():
            op.step.check_state_conf(conf)
            if not self.fs.exists(path):
                continue
            difference, evolved = op.step.stored_schema_check(json.loads(self.fs.read_text(path)), key, value, conf)
            if evolved is not None:
                self._evolved[path] = evolved
            if difference:
                raise CheckpointError(
                    f"The state of stateful operator {op.id} ({op.name}) in checkpoint "
                    f"'{self.checkpoint_root}' does not fit the query: {difference} ({path}). "
                    "Changing the grouping keys, the aggregate functions, the deduplication "
                    "columns or a join's keys, columns or type of a running query is not "
                    "supported (as in Spark): restore the "
                    "query as it was, or start it with a new checkpoint location.")

    def write(self) -> None:
        """Each operator's schema file: a new one, or the evolved one of a transformWithState."""
        for path, op, key, value in self.schemas():
            if path in self._evolved:
                self.fs.write(path, self._evolved.pop(path))
            elif not self.fs.exists(path):
                self.fs.mkdirs(path.rsplit("/", 1)[0])
                self.fs.write(path, op.step.schema_document(key, value))
        self.written = True

