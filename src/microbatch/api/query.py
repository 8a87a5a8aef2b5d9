"""StreamingQuery: the handle ``start()`` returns (PySpark's names)."""
from __future__ import annotations

from microbatch.errors import StreamingQueryException
from microbatch.execution.micro_batch import MicroBatchExecution


class StreamingQuery:
    def __init__(self, execution: MicroBatchExecution):
        self._execution = execution

    @property
    def id(self) -> str:
        return self._execution.id

    @property
    def runId(self) -> str:
        return self._execution.run_id

    @property
    def name(self) -> str | None:
        return self._execution.name

    @property
    def isActive(self) -> bool:
        return self._execution.is_active

    @property
    def status(self) -> dict:
        return self._execution.progress.status

    @property
    def lastProgress(self) -> dict | None:
        return self._execution.progress.last_progress

    @property
    def recentProgress(self) -> list[dict]:
        return self._execution.progress.recent_progress

    @property
    def checkpointLocation(self) -> str:
        return self._execution.checkpoint_root

    @property
    def sink(self):
        """The sink object (e.g. a MemorySink, to read what the query wrote)."""
        return self._execution.sink

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"timeout must be a positive integer or float. Got {timeout}")
        finished = self._execution.await_termination(timeout)
        return finished if timeout is not None else None

    def processAllAvailable(self) -> None:
        self._execution.process_all_available()

    def stop(self) -> None:
        self._execution.stop()

    def exception(self) -> StreamingQueryException | None:
        return self._execution.stream_death_cause

    def explain(self, extended: bool = False) -> None:
        print("== Stream Plan ==")
        print(self._execution.plan.tree_string())
        last = self._execution.last_batch_df
        if last is None:
            print("No physical plan. Waiting for data.")
        else:
            last.explain(extended=extended)

    def __repr__(self) -> str:
        return f"<StreamingQuery {self._execution.pretty_id}>"
