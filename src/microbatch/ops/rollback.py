"""``microbatch checkpoint rollback CKPT --to-batch N``: make batch N the last committed one.

For the day a bad batch must be redone: after the rollback, the checkpoint, its state and
the file sink's output are as they were when batch N had just committed, and a restart
plans batch N+1 again from N's offsets (a file source lists its files again; Kafka
re-reads from N's offsets).

What is removed, all of it checked possible before anything is touched:

- ``offsets/``, ``commits/`` and ``progress/`` entries after N;
- state versions after N+1 (batch N commits version N+1), in every operator, partition
  and store; version N+1 must still be loadable (the newest snapshot at or below it and
  the deltas after it: state older than ``minBatchesToRetain`` batches is gone);
- each file source's log entries after the log batch ``offsets/N`` names;
- the file sink's ``_spark_metadata`` entries after N and the data files they added (the
  output is found from the progress log, or given with ``--output``), so ``spark.read`` of
  the output shows batch N's rows once the rollback is done and a re-run's rows once;
- the Kafka sink's ``sinks/kafka/`` records after N. Records a Kafka sink wrote stay in
  their topic (a topic is append-only), and what ``foreachBatch`` wrote is the user's
  to undo: the rollback says so.

The tool refuses a checkpoint whose query runs and holds the run lease while it works.
It writes ``<checkpoint>/rollback`` first and deletes it last: a rollback cut short
leaves it, and a query refuses to start until the same command is run again to finish.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from microbatch.checkpoint.file_stream_log import (SINK_METADATA_DIR, FileStreamSinkLog,
                                                   FileStreamSourceLog, all_valid_batches,
                                                   live_files, uri_to_path)
from microbatch.checkpoint.fs import CheckpointFileSystem
from microbatch.checkpoint.stores import storage_for
from microbatch.checkpoint.markers import ROLLBACK_MARKER, unfinished_rollback
from microbatch.checkpoint.run_lease import RunLease
from microbatch.errors import CheckpointError
from microbatch.ops.checkpoint_reader import CheckpointReader

@dataclass
class RollbackPlan:
    to_batch: int
    deletions: list[tuple[CheckpointFileSystem, str]] = field(default_factory=list)
    report: list[str] = field(default_factory=list)

    def delete(self, fs: CheckpointFileSystem, paths: list[str], what: str) -> None:
        if paths:
            self.deletions += [(fs, p) for p in paths]
            self.report.append(f"removed {len(paths)} {what}")


def plan_rollback(ckpt: CheckpointReader, to_batch: int, settings: dict[str, str],
                  output: str | None) -> RollbackPlan:
    """Everything the rollback deletes, in a safe order; raises before anything is
    deleted when batch ``to_batch`` cannot be restored."""
    fs, root = ckpt.fs, ckpt.root
    commits, planned = ckpt.commits.batch_ids(), ckpt.offsets.batch_ids()
    if to_batch < 0 or to_batch not in commits or ckpt.offsets.get(to_batch) is None:
        kept = [b for b in commits if b in planned]
        raise CheckpointError(
            f"Cannot roll checkpoint '{root}' back to batch {to_batch}: it is not a committed batch "
            "the checkpoint still holds (committed batches kept: "
            + (f"{kept[0]}..{kept[-1]}" if kept else "none") + ").")
    plan = RollbackPlan(to_batch)
    after = lambda ids: sorted((b for b in ids if b > to_batch), reverse=True)  # noqa: E731
    plan.delete(fs, [ckpt.progress.batch_file(b) for b in after(ckpt.progress.batch_ids())],
                "progress log entries")
    plan.delete(fs, [ckpt.commits.batch_file(b) for b in after(commits)], "commits")
    _file_sink(plan, ckpt, settings, output)
    kafka = f"{root}/sinks/kafka"
    later = after(int(n) for n in fs.list(kafka) if n.isdigit())
    plan.delete(fs, [f"{kafka}/{b}" for b in later], "Kafka sink records of batches")
    if later:
        plan.report.append(f"the Kafka sink's records of batches {later[-1]}..{later[0]} stay in "
                           "their topic: a re-run writes those batches again")
    _state(plan, ckpt)
    _sources(plan, ckpt)
    plan.delete(fs, [ckpt.offsets.batch_file(b) for b in after(planned)], "offsets entries")
    if not plan.deletions:
        plan.report.append(f"batch {to_batch} is already the last batch: nothing to do")
    return plan


def _state(plan: RollbackPlan, ckpt: CheckpointReader) -> None:
    version = plan.to_batch + 1
    doomed = []
    for operator in ckpt.operators():
        for store in ckpt.stores(operator):
            if not store.files and not store.spark_files:
                continue
            missing = store.missing_for(version)
            if missing:
                raise CheckpointError(
                    f"Cannot roll checkpoint '{ckpt.root}' back to batch {plan.to_batch}: the state "
                    f"after it (version {version}) of operator {operator}, partition {store.partition} "
                    f"is no longer there ({missing[0]} is gone: state older than "
                    "spark.sql.streaming.minBatchesToRetain batches is removed). Nothing was changed.")
            doomed += [path for v, path in store.all_files() if v > version]   # (both engines' files)
    plan.delete(ckpt.fs, sorted(doomed), "state files of later versions")


def _sources(plan: RollbackPlan, ckpt: CheckpointReader) -> None:
    fs, root = ckpt.fs, ckpt.root
    seq = ckpt.offsets.get(plan.to_batch)
    for source_id, offset in seq.by_source_id().items():
        if not (isinstance(offset, dict) and "logOffset" in offset):
            continue   # not a file source: its offsets are all it has
        directory = f"{root}/sources/{source_id}"
        log = FileStreamSourceLog(directory, fs, read_only=True, deleting_expired=False)
        keep = int(offset["logOffset"])
        listed = log._listed()
        remaining = {b for b, _ in listed if b <= keep}
        for needed in all_valid_batches(keep, log.compact_interval):
            if needed not in remaining:
                raise CheckpointError(
                    f"Cannot roll checkpoint '{root}' back to batch {plan.to_batch}: the file source "
                    f"log {directory} no longer holds log batch {needed}, which batch {plan.to_batch}'s "
                    "view of the input needs. Nothing was changed.")
        later = sorted(((b, name) for b, name in listed if b > keep), reverse=True)
        gone = []
        for _b, name in later:
            for entry in log.deserialize(fs.read_text(f"{directory}/{name}"), f"{directory}/{name}"):
                if entry.batchId > keep and not storage_for(entry.local_path).exists(entry.local_path):
                    gone.append(entry.local_path)
        plan.delete(fs, [f"{directory}/{name}" for _, name in later], f"file source {source_id} log entries")
        if gone:
            plan.report.append(f"{len(gone)} input file(s) of the rolled back batches are gone (cleanSource "
                               f"or deleted), e.g. {gone[0]}: a re-run cannot read them again")


def _file_sink(plan: RollbackPlan, ckpt: CheckpointReader, settings: dict[str, str],
               output: str | None) -> None:
    output = output or ckpt.file_sink_output()
    if output is None:
        return
    fs = storage_for(output, settings)
    directory = f"{fs.resolve(output)}/{SINK_METADATA_DIR}"
    log = FileStreamSinkLog(directory, fs, read_only=True, deleting_expired=False)
    listed = dict(log._listed())
    if not any(b > plan.to_batch for b in listed):
        return
    keep = set()
    for needed in all_valid_batches(plan.to_batch, log.compact_interval):
        if needed not in listed:
            raise CheckpointError(
                f"Cannot roll checkpoint '{ckpt.root}' back to batch {plan.to_batch}: the file sink's "
                f"log {directory} no longer holds its batch {needed}, which the output's view of batch "
                f"{plan.to_batch} needs. Nothing was changed.")
        keep |= {e.path for e in live_files(log.deserialize(
            fs.read_text(f"{directory}/{listed[needed]}"), listed[needed]))}
    later = sorted((b for b in listed if b > plan.to_batch), reverse=True)
    added = set()
    for b in later:
        added |= {e.path for e in live_files(log.deserialize(
            fs.read_text(f"{directory}/{listed[b]}"), listed[b]))}
    planned = ckpt.offsets.batch_ids()
    if later[0] > planned[-1]:
        raise CheckpointError(
            f"Cannot roll checkpoint '{ckpt.root}' back: the file sink's log {directory} has batch "
            f"{later[0]}, which this checkpoint never planned (its last batch is {planned[-1]}), so "
            "that output is not this query's. Give the query's output with --output. Nothing was changed.")
    data = [p if "://" in p and not p.startswith("file:") else uri_to_path(p) for p in sorted(added - keep)]
    outside = [p for p in data if not _inside(p, fs.resolve(output))]
    if outside:   # a manifest names only files of its own output: anything else is not deleted
        raise CheckpointError(
            f"Cannot roll checkpoint '{ckpt.root}' back: the file sink's log {directory} lists "
            f"{outside[0]}, which is not inside the output {output}. Nothing was changed.")
    plan.delete(fs, [f"{directory}/{listed[b]}" for b in later], "file sink log entries")
    plan.delete(fs, data, f"data files of the rolled back batches from {output}")


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` lies below ``root`` (either with or without a URI scheme)."""
    strip = lambda p: p.split("://", 1)[-1].rstrip("/")  # noqa: E731
    return strip(path).startswith(strip(root) + "/")


def rollback(location: str, to_batch: int, settings: dict[str, str] | None = None,
             output: str | None = None) -> list[str]:
    """Roll the checkpoint at ``location`` back to ``to_batch``; return what was done."""
    settings = settings or {}
    ckpt = CheckpointReader(location, settings)
    fs, root = ckpt.fs, ckpt.root
    marker = f"{root}/{ROLLBACK_MARKER}"
    if fs.exists(marker):
        started = json.loads(fs.read_text(marker)).get("toBatch")
        if started != to_batch:
            raise CheckpointError(unfinished_rollback(fs, root) + f" (asked now: batch {to_batch})")
    lease = RunLease(fs, root, ckpt.query_id() or "", f"rollback-{uuid.uuid4()}")
    lease.acquire()   # a live run refuses the rollback; a query starting meanwhile is refused
    try:
        plan = plan_rollback(ckpt, to_batch, settings, output)
        if plan.deletions:
            fs.write(marker, json.dumps({"toBatch": to_batch, "startedAt": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
            for store, path in plan.deletions:
                if store.exists(path):
                    store.delete(path)
            fs.delete(marker)
        return plan.report
    finally:
        lease.release()
