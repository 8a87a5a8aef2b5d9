"""A state task's hold on its Python worker's heap (docs/design.md, "The Python workers'
heap"): automatic garbage collection off while the task runs (``begin_task``); at its end
its metrics to the operator's accumulator, then what it left collected and the rest
frozen (``end_task``); and the whole heap unfrozen again every ``FULL_COLLECTION_EVERY``
state tasks and when a provider is dropped (``_unfreeze_worker_heap``, which
``state.store`` calls)."""
from __future__ import annotations

from typing import Any

from microbatch import python_worker

#: After how many state tasks a worker's heap is collected whole again (``end_task``).
FULL_COLLECTION_EVERY = 64
_tasks_since_full_collection = 0


def begin_task() -> None:
    """In a Spark task that opens a state store: no automatic garbage collection until
    ``end_task``. A state task makes a tuple or more per row; each 700 of them start a
    collection, which walks every young object (a quarter of the whole batch's time,
    measured by benchmarks/many_groups.py). The task leaves few cycles and ``end_task``
    collects them (as PySpark's daemon does after a task that fails)."""
    import gc

    from pyspark import TaskContext
    if TaskContext.get() is not None:
        gc.disable()


def end_task(accumulator: Any, metrics: dict) -> None:
    """The last step of every state task: its metrics to the operator's accumulator,
    then the Python worker's heap settled.

    PySpark's daemon makes a full garbage collection in a reused worker after every
    task, which walks every object of the worker: pyarrow's and pandas' modules (10-15
    ms here) and the state the providers keep in memory, on the next task's path. So
    the task collects what it left (the objects made since the last task) and freezes
    the rest (``gc.freeze``): the daemon's collection then walks only what came after.
    Frozen objects are still freed when nothing refers to them; only a cycle that
    becomes garbage while frozen waits, until the next whole collection, every
    ``FULL_COLLECTION_EVERY`` tasks or after a provider is dropped (``store.load_provider``).
    Outside a Spark task (a test calling a task) nothing is frozen."""
    global _tasks_since_full_collection
    import gc

    from pyspark import TaskContext
    accumulator.add(metrics)
    if TaskContext.get() is None:
        return
    _tasks_since_full_collection += 1
    if _tasks_since_full_collection >= FULL_COLLECTION_EVERY:
        _unfreeze_worker_heap()
    gc.collect()
    gc.freeze()
    gc.enable()


def _unfreeze_worker_heap() -> None:
    """Let the next collection walk the whole heap (a dropped provider's cycles)."""
    global _tasks_since_full_collection
    import gc
    gc.unfreeze()
    python_worker.unfrozen()
    _tasks_since_full_collection = 0
