"""Test-only crash points: kill the whole query process exactly at a named step.

Off unless the environment names a step: ``MICROBATCH_CRASH_AT="<step>:<count>"`` makes
the ``count``-th arrival at ``step`` in one process SIGKILL the process group recorded by
``arm()`` (the driver and its JVM) and the arriving process's own group (PySpark's
worker daemon and its workers, which have a group of their own). A
process that did not call ``arm()`` is never killed, so a stray variable cannot take a
test runner down.

The steps, in the order a batch meets them (``runtime.micro_batch`` has the protocol):

- ``offsets-written``: ``offsets/N`` is durable (the batch's write-ahead entry);
  ``source-file-cleaned``: the file source archived or deleted a file of batch N-1
  (``cleanSource``); ``logs-purged``: old offsets and commits entries deleted.
- ``source-get-batch``: a source returned batch N's DataFrame (driver).
- ``receiver-block-written`` (any time, on a receiver's block-writer thread): a block of
  a receiver source (``socket``, ``http``) is durable and its senders not yet answered.
- In the batch's Spark tasks (the count is per Python worker): ``state-loaded`` (a
  state store at version N handed to an operator), ``state-delta-written`` (a store
  committed version N+1), ``state-snapshot-written`` and ``state-cleanup`` (maintenance);
  ``kafka-sink-record`` (one more record delivered: each record is flushed before the
  next when armed, i.e. a kill in the middle of a sink write) and ``kafka-sink-flushed``
  (a task's producer flushed).
- ``sink-data-written``: the file sink's (or the Delta sink's) data files are in place,
  its manifest (Delta commit) not yet; ``sink-manifest-written``: ``_spark_metadata/N``
  written (the file sink's commit), or the Delta table's commit of the batch made;
  ``log-compacted``: a compact file of the file source's or the file sink's log written;
  ``foreach-batch-returned``: the user's ``foreachBatch`` function returned.
- ``sink-added``: the sink is done with batch N (every state partition committed).
- ``commit-written``: ``commits/N`` is durable.

``microbatch.testing.chaos`` has the pipelines the crash-at-every-step test walks.

**Executor loss** (a cluster's executor dying mid-task, e.g. ``local-cluster``):
``MICROBATCH_KILL_EXECUTOR_AT="<step>:<count>[,<count>...]"`` with
``MICROBATCH_KILL_EXECUTOR_DIR`` naming a directory every process of the cluster can
write. Arrivals at ``step`` in the Spark tasks are counted across the whole cluster (each
takes the next numbered file there, created exclusively), and each ``count``-th SIGKILLs
the executor JVM it runs in and that executor's PySpark daemon and workers:
``killed-<count>.json`` there then says which step, stage, partition and attempt it
struck. The driver and the other executors live on, so Spark's task retry and the batch
protocol must recover.
"""
from __future__ import annotations

import json
import os
import signal

CRASH_AT = "MICROBATCH_CRASH_AT"
_GROUP = "MICROBATCH_CRASH_GROUP"
KILL_EXECUTOR_AT = "MICROBATCH_KILL_EXECUTOR_AT"
KILL_EXECUTOR_DIR = "MICROBATCH_KILL_EXECUTOR_DIR"
_arrivals: dict[str, int] = {}


def arm() -> None:
    """Make this process's group the one a crash point kills (called by a test's child
    process before it starts Spark, so the JVM and workers inherit the setting)."""
    os.environ[_GROUP] = str(os.getpgid(0))


def armed(step: str) -> bool:
    """True when this process will be killed at ``step`` (a step may then make its moment
    exact, e.g. the Kafka sink delivers each record before the next)."""
    spec = os.environ.get(CRASH_AT)
    return bool(spec) and spec.rpartition(":")[0] == step and _GROUP in os.environ


def reached(step: str) -> None:
    if os.environ.get(KILL_EXECUTOR_AT, "").rpartition(":")[0] == step:
        _kill_executor_at(step)
    if not armed(step):
        return
    count = os.environ[CRASH_AT].rpartition(":")[2]
    _arrivals[step] = _arrivals.get(step, 0) + 1
    if _arrivals[step] == int(count):
        group = int(os.environ[_GROUP])
        os.killpg(group, signal.SIGKILL)
        # PySpark's worker daemon puts its workers in a group of their own: that group
        # (this process included) goes too, or a worker would write on after the driver died
        if os.getpgid(0) != group:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def _kill_executor_at(step: str) -> None:
    directory = os.environ.get(KILL_EXECUTOR_DIR)
    executor = _executor_jvm()
    if not directory or executor is None:
        return    # not in a cluster's executor: the driver, or local mode
    counts = {int(c) for c in os.environ[KILL_EXECUTOR_AT].rpartition(":")[2].split(",")}
    arrival = 1
    while True:     # take the next arrival's number, cluster-wide
        try:
            os.close(os.open(os.path.join(directory, f"arrival-{arrival}"), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            arrival += 1
    if arrival not in counts:
        return
    from pyspark import TaskContext
    task = TaskContext.get()
    record = {"step": step, "arrival": arrival, "executorPid": executor, "workerPid": os.getpid(),
              "stageId": task.stageId() if task else None,
              "partitionId": task.partitionId() if task else None,
              "attemptNumber": task.attemptNumber() if task else None}
    written = os.path.join(directory, f"killed-{arrival}.json")
    with open(written + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(written + ".tmp", written)
    os.kill(executor, signal.SIGKILL)
    if os.getpgid(0) != os.getpgid(executor):
        os.killpg(os.getpgid(0), signal.SIGKILL)    # the executor's PySpark daemon and workers
    os.kill(os.getpid(), signal.SIGKILL)


def _executor_jvm() -> int | None:
    """The pid of the executor JVM (``CoarseGrainedExecutorBackend``) this process runs
    under, found up the parent chain in /proc; None outside a cluster's executor."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None
