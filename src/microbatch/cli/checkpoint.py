"""``microbatch checkpoint ...`` and ``microbatch watch``: the toolkit's commands.

Each prints what it found or did and returns the exit code: 0 when all is well, 1 when a
checkpoint is damaged, differs or a change was refused, 2 when a path is no checkpoint.
The work itself is in ``microbatch.ops``.
"""
from __future__ import annotations

import sys
import time

from microbatch.errors import CheckpointError


def _reader(path: str, settings: dict[str, str]):
    from microbatch.ops.checkpoint_reader import CheckpointReader
    ckpt = CheckpointReader(path, settings)
    if not ckpt.exists() or not ckpt.is_checkpoint():
        print(f"'{path}' is not a checkpoint: it has no 'metadata' file and no offsets/ or commits/.")
        return None
    return ckpt


def show_checkpoint(path: str, settings: dict[str, str] | None = None) -> int:
    ckpt = _reader(path, settings or {})
    if ckpt is None:
        return 2
    try:
        committed = set(ckpt.commits.batch_ids())
        print(f"checkpoint {ckpt.root}")
        print(f"query id   {ckpt.query_id()}")
        for batch_id, seq in ckpt.offsets.get_range(None, None):
            state = "committed" if batch_id in committed else "NOT committed (re-run on restart)"
            print(f"batch {batch_id}: {state}; timestamp {seq.metadata.batch_timestamp_ms}, "
                  f"watermark {seq.metadata.batch_watermark_ms}")
            for source_id, offset in seq.by_source_id().items():
                print(f"    source {source_id}: {'-' if offset is None else offset}")
    except CheckpointError as e:
        print(f"error: {e}")
        return 1
    return 0


def verify_checkpoint(path: str, settings: dict[str, str] | None = None, output: str | None = None) -> int:
    from microbatch.ops.verify import DAMAGE, verify
    verifier = verify(path, settings or {}, output)
    for finding in verifier.findings:
        print(finding)
    damage = sum(f.kind == DAMAGE for f in verifier.findings)
    print(f"{verifier.root}: {verifier.files_read} files read, "
          + (f"{damage} damaged" if damage else "no damage found"))
    return 1 if damage else 0


def explain_batch(path: str, batch_id: int, settings: dict[str, str] | None = None) -> int:
    from microbatch.ops.describe import explain_batch as explain
    ckpt = _reader(path, settings or {})
    if ckpt is None:
        return 2
    try:
        print("\n".join(explain(ckpt, batch_id)))
    except CheckpointError as e:
        print(f"error: {e}")
        return 1
    return 0


def diff_checkpoints(a: str, b: str, settings: dict[str, str] | None = None) -> int:
    from microbatch.ops.describe import diff_checkpoints as diff
    first, second = _reader(a, settings or {}), _reader(b, settings or {})
    if first is None or second is None:
        return 2
    print(f"A {first.root}\nB {second.root}")
    try:
        found = diff(first, second)
    except CheckpointError as e:
        print(f"error: {e}")
        return 1
    print("\n".join(found) if found else "the two checkpoints' batches are the same")
    return 1 if found else 0


def rollback_checkpoint(path: str, to_batch: int, settings: dict[str, str] | None = None,
                        output: str | None = None) -> int:
    from microbatch.ops.rollback import rollback
    if _reader(path, settings or {}) is None:
        return 2
    try:
        done = rollback(path, to_batch, settings or {}, output)
    except CheckpointError as e:
        print(f"error: {e}")
        return 1
    for line in done:
        print(line)
    print(f"batch {to_batch} is the last committed batch: a restart runs batch {to_batch + 1} again")
    return 0


def repartition_state(path: str, partitions: int, settings: dict[str, str] | None = None,
                      enforce_exactly_once_sink: bool = True) -> int:
    """Starts an embedded local Spark: the state is rehashed by Spark's own hash, in tasks."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from microbatch.api.session import embedded_spark
    from microbatch.ops.repartition import repartition
    if _reader(path, settings or {}) is None:
        return 2
    started_here = SparkSession.getActiveSession() is None
    spark = embedded_spark(app_name="microbatch state repartition", conf=settings or {})
    try:
        batch = repartition(spark, path, partitions, enforce_exactly_once_sink)
    except (PySparkException, CheckpointError) as e:
        print(f"error: {e}")
        return 1
    finally:
        if started_here:
            spark.stop()
    print(f"the state is in {partitions} partitions from batch {batch} (the repartition batch); "
          f"the query resumes at batch {batch + 1}")
    return 0


def convert_checkpoint(path: str, settings: dict[str, str] | None = None, state_provider: str | None = None) -> int:
    """``checkpoint convert CKPT --to spark``: starts an embedded local Spark (the stores
    are converted in its tasks)."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from microbatch.api.session import embedded_spark
    from microbatch.ops.spark_conversion import convert_to_spark
    if _reader(path, settings or {}) is None:
        return 2
    started_here = SparkSession.getActiveSession() is None
    spark = embedded_spark(app_name="microbatch checkpoint convert", conf=settings or {})
    try:
        result = convert_to_spark(spark, path, settings or {}, state_provider)
    except (PySparkException, CheckpointError) as e:
        print(f"error: {e}")
        return 1
    finally:
        if started_here:
            spark.stop()
    if result.done_before:
        print(f"nothing to do: the checkpoint holds no state, or Spark's provider holds it already (batch "
              f"{result.batch}); Spark's engine resumes it as it is")
    else:
        print(f"converted {result.stores} state stores ({result.rows} rows) in batch {result.batch} for "
              f"{result.provider.rsplit('.', 1)[-1]}: Spark's engine resumes this checkpoint at batch "
              f"{result.batch + 1}")
    return 0


def watch_checkpoints(paths: list[str], settings: dict[str, str], interval: float = 1.0,
                      count: int | None = None) -> int:
    """A live line per checkpoint's query (rich) in a terminal; a plain line per new batch
    otherwise."""
    from microbatch.ops.history import CheckpointQueries
    from microbatch.terminal import LiveLines, is_terminal, plain_line, progress_line
    queries = CheckpointQueries(paths, settings)
    live = LiveLines() if is_terminal() else None
    shown: dict[str, object] = {}
    reads = 0
    try:
        while count is None or reads < count:
            for history in queries.histories():
                fields = progress_line(history.name or history.checkpoint, history.last_progress,
                                       history.status)
                if live is not None:
                    live.update(history.key, fields)
                elif shown.get(history.key) != fields:
                    print(plain_line(fields), flush=True)
                shown[history.key] = fields
            reads += 1
            if count is None or reads < count:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            for key in list(shown):
                live.remove(key)
    sys.stdout.flush()
    return 0
