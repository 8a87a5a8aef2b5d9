"""What a checkpoint's batches are, one by one and side by side.

``explain_batch`` gives what batch N read and how it ran: its sources' offsets (from
``offsets/N-1`` to ``offsets/N``), batch time, watermark, the confs the checkpoint fixes,
whether it was committed and the watermark its commit gave the next batch, the state it
left per operator, and, from the progress log, its rows, durations and the run's plan.
``diff_checkpoints`` compares two checkpoints batch by batch: the batches only one has,
and for each batch both have, the offsets, watermarks, confs and commits that differ.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from microbatch.checkpoint.offsets import to_json
from microbatch.errors import CheckpointError
from microbatch.ops.checkpoint_reader import CheckpointReader


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def explain_batch(ckpt: CheckpointReader, batch_id: int) -> list[str]:
    seq = ckpt.offsets.get(batch_id)
    if seq is None:
        kept = ckpt.offsets.batch_ids()
        raise CheckpointError(
            f"Batch {batch_id} is not in checkpoint '{ckpt.root}': its offset log holds "
            + (f"batches {kept[0]}..{kept[-1]}" if kept else "no batch")
            + " (older entries are removed after spark.sql.streaming.minBatchesToRetain batches).")
    previous = ckpt.offsets.get(batch_id - 1) if batch_id > 0 else None
    commit = ckpt.commits.get(batch_id)
    lines = [f"checkpoint {ckpt.root}", f"query id   {ckpt.query_id()}",
             f"batch {batch_id}: " + (f"committed; the next batch's watermark {commit.next_batch_watermark_ms} ms"
                                      if commit is not None else "NOT committed (a restart runs it again)"),
             f"  batch time {_time(seq.metadata.batch_timestamp_ms)} ({seq.metadata.batch_timestamp_ms} ms)",
             f"  watermark  {_time(seq.metadata.batch_watermark_ms)} ({seq.metadata.batch_watermark_ms} ms)",
             f"  offset log v{seq.version}", "  sources:"]
    before = previous.by_source_id() if previous is not None else {}
    entry = _progress(ckpt, batch_id)
    progress = (entry or {}).get("progress", {})
    described = progress.get("sources", [])
    for index, (source_id, end) in enumerate(seq.by_source_id().items()):
        description = described[index]["description"] if index < len(described) else ""
        start = before.get(source_id)
        lines.append(f"    {source_id}{' ' + description if description else ''}: "
                     f"{'-' if start is None else to_json(start)} -> {'-' if end is None else to_json(end)}")
    lines.append("  confs:")
    lines += [f"    {key} = {value}" for key, value in sorted(seq.metadata.conf.items())]
    lines.append("  state:")
    version = batch_id + 1
    operators = ckpt.operators()
    if not operators:
        lines.append("    none (a stateless query)")
    for operator in operators:
        doc = ckpt.schema_document(operator) or {}
        stores = ckpt.stores(operator)
        at_version = sorted({s.partition for s in stores if not s.missing_for(version) and (s.files or s.spark_files)})
        lines.append(f"    operator {operator} ({doc.get('operatorName', 'written by Spark')}): "
                     f"{len({s.partition for s in stores})} partition(s); version {version} "
                     f"(the state after this batch) loadable in {len(at_version)}")
    if entry is None:
        lines.append("  progress: not in the progress log (written by Spark, purged, or logging off)")
        return lines
    durations = ", ".join(f"{k} {v} ms" for k, v in sorted(progress.get("durationMs", {}).items()))
    lines += [f"  progress: {progress.get('numInputRows')} input rows, run {progress.get('runId')}, "
              f"started {progress.get('timestamp')}",
              f"    durations: {durations}",
              f"    sink: {(progress.get('sink') or {}).get('description')}"]
    for i, op in enumerate(progress.get("stateOperators", [])):
        lines.append(f"    state operator {i} {op.get('operatorName')}: {op.get('numRowsTotal')} rows, "
                     f"{op.get('numRowsUpdated')} updated, {op.get('numRowsRemoved', 0)} removed, "
                     f"{op.get('numRowsDroppedByWatermark', 0)} dropped by watermark")
    if entry.get("plan"):
        lines.append("  plan:")
        lines += ["    " + line for line in entry["plan"].splitlines()]
    return lines


def _progress(ckpt: CheckpointReader, batch_id: int) -> dict[str, Any] | None:
    try:
        return ckpt.progress.get(batch_id)
    except CheckpointError:
        return None


def diff_checkpoints(a: CheckpointReader, b: CheckpointReader) -> list[str]:
    """The differences, one per line; empty when the two checkpoints' batches agree."""
    found = []
    ids = (a.query_id(), b.query_id())
    if ids[0] != ids[1]:
        found.append(f"query id: {ids[0]} | {ids[1]}")
    batches_a, batches_b = set(a.offsets.batch_ids()), set(b.offsets.batch_ids())
    for name, only in (("A", batches_a - batches_b), ("B", batches_b - batches_a)):
        if only:
            found.append(f"batches only in {name}: {_ranges(sorted(only))}")
    commits_a, commits_b = set(a.commits.batch_ids()), set(b.commits.batch_ids())
    for batch_id in sorted(batches_a & batches_b):
        seq_a, seq_b = a.offsets.get(batch_id), b.offsets.get(batch_id)
        offsets_a, offsets_b = seq_a.by_source_id(), seq_b.by_source_id()
        for source_id in sorted(set(offsets_a) | set(offsets_b)):
            if offsets_a.get(source_id) != offsets_b.get(source_id):
                found.append(f"batch {batch_id}: source {source_id} offsets "
                             f"{_json(offsets_a.get(source_id))} | {_json(offsets_b.get(source_id))}")
        if seq_a.metadata.batch_watermark_ms != seq_b.metadata.batch_watermark_ms:
            found.append(f"batch {batch_id}: watermark {seq_a.metadata.batch_watermark_ms} | "
                         f"{seq_b.metadata.batch_watermark_ms}")
        conf_a, conf_b = seq_a.metadata.conf, seq_b.metadata.conf
        for key in sorted(set(conf_a) | set(conf_b)):
            if conf_a.get(key) != conf_b.get(key):
                found.append(f"batch {batch_id}: conf {key} {conf_a.get(key, '-')} | {conf_b.get(key, '-')}")
        in_a, in_b = batch_id in commits_a, batch_id in commits_b
        if in_a != in_b:
            found.append(f"batch {batch_id}: {'committed' if in_a else 'not committed'} | "
                         f"{'committed' if in_b else 'not committed'}")
        elif in_a:
            wm_a = a.commits.get(batch_id).next_batch_watermark_ms
            wm_b = b.commits.get(batch_id).next_batch_watermark_ms
            if wm_a != wm_b:
                found.append(f"batch {batch_id}: next batch's watermark {wm_a} | {wm_b}")
        rows_a, rows_b = _input_rows(a, batch_id), _input_rows(b, batch_id)
        if rows_a is not None and rows_b is not None and rows_a != rows_b:
            found.append(f"batch {batch_id}: input rows {rows_a} | {rows_b}")
    operators_a, operators_b = a.operators(), b.operators()
    if operators_a != operators_b:
        found.append(f"stateful operators: {operators_a} | {operators_b}")
    for operator in sorted(set(operators_a) & set(operators_b)):
        name_a = (a.schema_document(operator) or {}).get("operatorName")
        name_b = (b.schema_document(operator) or {}).get("operatorName")
        if name_a != name_b:
            found.append(f"operator {operator}: {name_a} | {name_b}")
        parts_a, parts_b = len(a.partitions(operator)), len(b.partitions(operator))
        if parts_a != parts_b:
            found.append(f"operator {operator}: {parts_a} | {parts_b} state partitions")
    return found


def _input_rows(ckpt: CheckpointReader, batch_id: int) -> int | None:
    entry = _progress(ckpt, batch_id)
    return None if entry is None else entry["progress"].get("numInputRows")


def _json(value: Any) -> str:
    return "-" if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _ranges(ids: list[int]) -> str:
    parts, start = [], None
    for i, batch_id in enumerate(ids):
        if start is None:
            start = batch_id
        if i + 1 == len(ids) or ids[i + 1] != batch_id + 1:
            parts.append(str(start) if start == batch_id else f"{start}..{batch_id}")
            start = None
    return ", ".join(parts)
