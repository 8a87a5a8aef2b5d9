"""StreamingQuery: the handle ``start()`` returns (PySpark's names)."""
from __future__ import annotations

from pyspark.errors import PySparkValueError, StreamingQueryException
from pyspark.sql.streaming.listener import StreamingQueryProgress

from microbatch.errors import pyspark_error
from microbatch import spark_internals
from microbatch.runtime.micro_batch import MicroBatchExecution


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
    def lastProgress(self) -> StreamingQueryProgress | None:
        last = self._execution.progress.last_progress
        return None if last is None else spark_internals.user_progress(last)

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]:
        return [spark_internals.user_progress(p) for p in self._execution.progress.recent_progress]

    @property
    def checkpointLocation(self) -> str:
        return self._execution.checkpoint_root

    @property
    def sink(self):
        """The sink object (e.g. a MemorySink, to read what the query wrote)."""
        return self._execution.sink

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        if timeout is not None:
            if not isinstance(timeout, (int, float)) or timeout <= 0:
                raise pyspark_error(PySparkValueError, "VALUE_NOT_POSITIVE", {"arg_name": "timeout", "arg_value": type(timeout).__name__})
            self._execution.await_termination(int(timeout * 1000) / 1000.0)
            return not self.isActive
        self._execution.await_termination(None)
        return None

    def processAllAvailable(self) -> None:
        self._execution.process_all_available()

    def stop(self) -> None:
        self._execution.stop()

    def exception(self) -> StreamingQueryException | None:
        """The exception that ended the query, built as PySpark's ``exception()`` builds
        it (message and stack trace of the JVM exception, its cause converted)."""
        execution = self._execution
        je = execution.stream_death_cause_spark
        if je is None:
            return execution.reported_fallback_cause   # None, or one built without a JVM
        exception = spark_internals.query_exception(je)
        exception.__cause__ = execution._python_cause
        return exception

    def explain(self, extended: bool = False) -> None:
        print("== Stream Plan ==")
        print(self._execution.explain_string())
        last = self._execution.last_batch_df
        if last is None:
            print("No physical plan. Waiting for data.")
        else:
            last.explain(extended=extended)

    def __repr__(self) -> str:
        return f"<StreamingQuery {self._execution.pretty_id}>"
