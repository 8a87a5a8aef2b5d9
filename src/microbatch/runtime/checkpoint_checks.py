"""The checks of a checkpoint's consistency at a restart: what the logs, the sources and
the state must agree on before any batch runs. Each fails with the file and the problem,
and changes nothing; ``check_state`` alone writes, adopting the state Spark's engine wrote
(``runtime.spark_state``) before it checks the state's schemas."""
from __future__ import annotations

import json
from typing import Any

from microbatch import spark_internals
from microbatch.checkpoint.commits import CommitLog, CommitMetadata
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.offsets import OffsetSeq, OffsetSeqLog
from microbatch.errors import CheckpointError
from microbatch.runtime.confs import SHUFFLE_PARTITIONS
from microbatch.runtime.spark_state import adopt_spark_state, written_by_spark
from microbatch.state.store import PROVIDER_CLASS_CONF, StateStoreConf


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


def check_source_evolution(offset_log_version: int, source_evolution: bool) -> None:
    """Source evolution (sources by id, offset log version 2) cannot be turned on for a
    checkpoint whose offset log has sources by position."""
    if offset_log_version < 2 and source_evolution:
        raise spark_internals.spark_error(
            "AnalysisException", "STREAMING_QUERY_EVOLUTION_ERROR.CANNOT_ENABLE_ON_EXISTING_CHECKPOINT",
            existingVersion=offset_log_version)


def check_previous_offsets(previous: OffsetSeq | None, latest_batch_id: int, offset_log: OffsetSeqLog,
                           num_sources: int, checkpoint_root: str) -> None:
    """The offsets of the batch before the latest (``previous``, the committed offsets)
    exist and name the query's sources."""
    if previous is None:
        raise CheckpointError(
            f"batch {latest_batch_id - 1} doesn't exist: the offset log "
            f"'{offset_log.path}' has batch {latest_batch_id} but not the one "
            "before it. Restore the missing file or use a new checkpoint location.")
    check_source_count(previous, latest_batch_id - 1, num_sources, checkpoint_root)


def check_repartition_finished(latest_batch_id: int, latest_commit: tuple[int, CommitMetadata] | None,
                               conf: dict[str, str], previous_conf: dict[str, str]) -> None:
    """An uncommitted latest batch whose number of shuffle partitions differs from the
    batch before's: a state repartition (ops/repartition.py) planned this batch and did
    not finish."""
    if ((latest_commit is None or latest_commit[0] < latest_batch_id)
            and conf.get(SHUFFLE_PARTITIONS) != previous_conf.get(SHUFFLE_PARTITIONS)):
        raise spark_internals.spark_error(
            "SparkRuntimeException", "STREAMING_UNFINISHED_REPARTITION_DETECTED",
            batchId=latest_batch_id, lastCommittedBatchId=-1 if latest_commit is None else latest_commit[0])


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



def check_state(fs: CheckpointFileSystem, checkpoint_root: str, operators: list, empty_inputs: dict,
                current_batch_id: int, *, recorded_conf: dict[str, str], store_conf: StateStoreConf,
                conf: Any) -> StateSchemas:
    """The checkpoint's state against the run's stateful operators (the planner's), once the
    run is planned: the operators (``check_state_operators``), then, the state Spark's engine
    wrote adopted first (``recorded_conf``: the checkpoint's last batch's confs), each
    operator's schemas (``StateSchemas.check``, with ``conf``, the batch session's).
    Returns the run's ``StateSchemas``, which its first batch writes."""
    check_state_operators(fs, checkpoint_root, [op.name for op in operators], current_batch_id)
    schemas = StateSchemas(fs, checkpoint_root, operators, empty_inputs)
    if operators and written_by_spark(recorded_conf.get(PROVIDER_CLASS_CONF), fs, checkpoint_root):
        adopt_spark_state(fs, checkpoint_root, schemas.schemas(), current_batch_id, recorded_conf, store_conf)
    schemas.check(conf)
    return schemas
