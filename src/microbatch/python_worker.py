"""What microbatch changes in the PySpark worker processes its tasks run in.

PySpark keeps a Python worker process for task after task (``spark.python.worker.reuse``,
on by default), and its daemon runs a full garbage collection, ``gc.collect()``, after
each task. A worker that has imported microbatch (with pyarrow, pandas, pyspark.sql and a
Kafka client) holds about 95,000 objects the collector tracks, and a full collection walks
them all: about 50 ms of CPU here, after every task of every worker. A stateless batch
over Kafka runs two Python workers in each of its tasks (the source's read, the sink's
write), so on two cores four collections a batch took about 200 of the 500 ms of CPU a
batch of 3,000 records cost, and batches took 260 ms where they take 160 ms without them
(benchmarks/RESULTS.md, "Nexmark latency: the workers' heap").

Nearly all of those objects live as long as the process: modules, classes, functions,
the Kafka clients' pool. So after a full collection that follows new imports, the
objects that survived it are moved out of the collector's reach (``gc.freeze()``, made
for this: Python's documentation suggests it for long-lived objects of forked workers).
Later collections walk only what the tasks made since. An object that survived and only
later becomes garbage in a reference cycle is not freed; freezing happens only when
modules were imported since the last time, so that is bounded by the imports a process
makes, not by the tasks it runs (and by the whole collections state tasks make now and
then: ``state.worker_heap.end_task`` unfreezes every 64 tasks and after dropping a provider, and
the next full collection freezes again). Objects freed by their reference count (nearly
all) are freed as before.

Only in PySpark's worker processes (run as ``pyspark.daemon`` or ``pyspark.worker``),
never in the driver. ``install`` is called when microbatch is imported, which in a worker
happens when the first task's function that refers to it is unpickled.
"""
from __future__ import annotations

import gc
import sys

WORKER_MODULES = ("pyspark.daemon", "pyspark.worker")
_modules_at_freeze = 0


def in_pyspark_worker() -> bool:
    """True in a process PySpark started to run tasks' Python code."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in WORKER_MODULES


def _freeze_survivors(phase: str, info: dict) -> None:
    """A ``gc.callbacks`` entry: after a full collection, if modules were imported since
    the last freeze (or ``unfrozen`` was called since), freeze what survived it. (Not
    ``gc.get_freeze_count()``: it walks every frozen object, and q0's Kafka batches took
    125 ms instead of 75 with it here.)"""
    global _modules_at_freeze
    if phase == "stop" and info.get("generation") == 2 and len(sys.modules) != _modules_at_freeze:
        _modules_at_freeze = len(sys.modules)
        gc.freeze()


def unfrozen() -> None:
    """Called after ``gc.unfreeze()`` (``state.worker_heap`` does it now and then, to collect
    the cycles of what it had frozen): the next full collection freezes again."""
    global _modules_at_freeze
    _modules_at_freeze = -1


def install() -> bool:
    """Freeze long-lived objects after full collections in this process, if it is a PySpark
    worker; returns whether it is one."""
    if not in_pyspark_worker():
        return False
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
    return True
