"""StreamTest: drive a streaming query through a script of actions and check its output.

A port of Spark's StreamTest DSL::

    ms = MemoryStream(ss, "value INT")
    test_stream(ms.toDF().filter("value > 1"), "append", [
        AddData(ms, 1, 2, 3),
        CheckAnswer(2, 3),
        StopStream(),
        AddData(ms, 4),
        StartStream(),
        CheckNewAnswer(4),
    ])

The query writes to one MemorySink kept across StopStream/StartStream, on one
checkpoint. Checks wait until the query has processed every row added so far
(never a fixed sleep); with a ManualClock the test advances time itself, and a
start or a check waits until the stream waits on the clock again. A
failure raises AssertionError listing the actions with a pointer at the failing
one, the offsets, the sink's contents and the plan.
"""
from __future__ import annotations

import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pyspark.sql import Row

from microbatch.runtime.clock import Clock, ManualClock
from microbatch.runtime.triggers import ProcessingTime, Trigger
from microbatch.sinks.memory import MemorySink
from microbatch.sources.memory import MemoryStreamSource



@dataclass
class AddData:
    source: MemoryStreamSource
    rows: tuple

    def __init__(self, source: MemoryStreamSource, *rows: Any):
        self.source, self.rows = source, rows

    def __str__(self) -> str:
        return f"AddData to {self.source}: {', '.join(map(repr, self.rows))}"


@dataclass
class _Check:
    rows: tuple
    name = "Check"

    def __init__(self, *rows: Any):
        self.rows = rows

    def __str__(self) -> str:
        return f"{self.name}: {', '.join(map(repr, self.rows))}"


class CheckAnswer(_Check):
    """All rows the sink holds equal ``rows`` (any order)."""
    name = "CheckAnswer"


class CheckNewAnswer(_Check):
    """The rows written since the previous check equal ``rows`` (any order)."""
    name = "CheckNewAnswer"


class CheckLastBatch(_Check):
    """The last batch written equals ``rows`` (any order)."""
    name = "CheckLastBatch"


@dataclass
class StopStream:
    def __str__(self) -> str:
        return "StopStream"


@dataclass
class StartStream:
    trigger: Trigger | str | None = None
    clock: Clock | None = None

    def __str__(self) -> str:
        return f"StartStream(trigger={self.trigger}, clock={type(self.clock).__name__ if self.clock else None})"


@dataclass
class AdvanceManualClock:
    ms: int

    def __str__(self) -> str:
        return f"AdvanceManualClock({self.ms})"


@dataclass
class ExpectFailure:
    exception_type: type = Exception
    message: str | None = None

    def __str__(self) -> str:
        return f"ExpectFailure[{self.exception_type.__name__}{': ' + self.message if self.message else ''}]"


@dataclass
class AssertOnQuery:
    condition: Callable[[Any], bool]
    message: str = ""

    def __str__(self) -> str:
        return f"AssertOnQuery({self.message})"


@dataclass
class Execute:
    fn: Callable[[Any], None]
    message: str = ""

    def __str__(self) -> str:
        return f"Execute({self.message})"


def _as_tuple(row: Any) -> tuple:
    if isinstance(row, Row):
        return tuple(row)
    if isinstance(row, (tuple, list)):
        return tuple(row)
    return (row,)


def _same_rows(actual: Sequence[Any], expected: Sequence[Any]) -> bool:
    return Counter(map(_as_tuple, actual)) == Counter(map(_as_tuple, expected))


@dataclass
class StreamTestResult:
    sink: MemorySink
    queries: list = field(default_factory=list)
    checkpoint_location: str = ""


def test_stream(frame, output_mode: str = "append", actions: Sequence[Any] = (), *,  # noqa: C901 - its actions share the query (run, below)
                checkpoint_location: str | None = None, timeout: float = 60.0) -> StreamTestResult:
    """Run ``actions`` against a query of ``frame``; raise AssertionError on the first failure."""
    checkpoint = checkpoint_location or tempfile.mkdtemp(prefix="microbatch-streamtest-")
    sink = MemorySink(frame.sparkSession, frame.schema, output_mode)
    result = StreamTestResult(sink, [], checkpoint)
    state = {"query": None, "clock": None, "trigger": None, "seen": 0}
    sources = [r.source_instance for r in frame._plan.relations()
               if isinstance(r.source_instance, MemoryStreamSource)]

    def start(action: StartStream) -> None:
        trigger = action.trigger
        if isinstance(trigger, str):
            trigger = ProcessingTime.of(trigger)
        writer = (frame.writeStream.sink(sink).outputMode(output_mode)
                  .option("checkpointLocation", checkpoint))
        writer._trigger = trigger or ProcessingTime(0)
        if action.clock is not None:
            writer.clock(action.clock)
        state["clock"] = action.clock
        state["trigger"] = writer._trigger
        state["query"] = writer.start()
        result.queries.append(state["query"])
        wait_for_clock()

    def wait_for_clock() -> None:
        """With a ManualClock and a trigger interval, wait until the stream waits on the
        clock for a time after now: every batch due at the clock's time has run (Spark's
        tests' ``waitUntilBatchProcessed``). A batch without data, such as one firing a
        processing-time timeout, has no offset to wait for."""
        query, clock = state["query"], state["clock"]
        if (isinstance(clock, ManualClock) and getattr(state["trigger"], "interval_ms", 0) > 0
                and query is not None and query.isActive
                and not clock.wait_for_waiter(timeout) and query.isActive):
            raise AssertionError("the stream never waited on the manual clock")

    def wait_for_data() -> None:
        query = state["query"]
        if query is None:
            raise AssertionError("the stream is not started; add StartStream() before checking")
        execution = query._execution
        deadline = time.monotonic() + timeout
        while True:
            if execution.stream_death_cause is not None:
                raise AssertionError(f"the query failed: {execution.stream_death_cause}")
            pending = [s for s in sources if s.current_offset >= 0 and
                       execution.committed_offsets.get(execution.sources.index(s)
                                                       if s in execution.sources else -1)
                       != s.current_offset]
            if not pending:
                return
            if not query.isActive:
                raise AssertionError(f"the query stopped with unprocessed data in {pending[0]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {pending[0]} to be processed")
            time.sleep(0.01)

    def run(action: Any) -> None:  # noqa: C901 - one case per action, as Spark's testStream
        query = state["query"]
        if isinstance(action, AddData):
            action.source.add_data(action.rows)
        elif isinstance(action, StartStream):
            if query is not None and query.isActive:
                raise AssertionError("the stream is already running; StopStream first")
            start(action)
        elif isinstance(action, StopStream):
            if query is not None:
                query.stop()
                if query.exception() is not None:
                    raise AssertionError(f"the query had failed: {query.exception()}")
        elif isinstance(action, AdvanceManualClock):
            clock = state["clock"]
            if not isinstance(clock, ManualClock):
                raise AssertionError("AdvanceManualClock needs StartStream(clock=ManualClock())")
            if query is not None and query.isActive and not clock.wait_for_waiter(timeout):
                raise AssertionError("the stream never waited on the manual clock")
            clock.advance(action.ms)
        elif isinstance(action, _Check):
            wait_for_data()
            wait_for_clock()
            if isinstance(action, CheckAnswer):
                actual = sink.all_data()
            elif isinstance(action, CheckNewAnswer):
                actual = sink.all_data()[state["seen"]:]
            else:
                last = sink.latest_batch_id()
                actual = [] if last is None else sink.batch(last)
            state["seen"] = len(sink.all_data())
            if not _same_rows(actual, action.rows):
                raise AssertionError(
                    f"rows differ\n  expected: {sorted(map(_as_tuple, action.rows), key=repr)}\n"
                    f"  actual:   {sorted(map(_as_tuple, actual), key=repr)}")
        elif isinstance(action, ExpectFailure):
            if query is None:
                raise AssertionError("ExpectFailure needs a started stream")
            try:
                query.awaitTermination(timeout)
            except Exception as e:
                cause = e.__cause__ or e   # the engine chains the Python error behind a failure
                if not isinstance(cause, action.exception_type):
                    raise AssertionError(f"expected {action.exception_type.__name__}, got "
                                         f"{type(cause).__name__}: {cause}") from e
                if action.message and action.message not in str(cause):
                    raise AssertionError(f"expected a message containing '{action.message}', "
                                         f"got: {cause}") from e
                return
            raise AssertionError("the query did not fail")
        elif isinstance(action, AssertOnQuery):
            if not action.condition(query):
                raise AssertionError(f"assertion on the query failed: {action.message}")
        elif isinstance(action, Execute):
            action.fn(query)
        else:
            raise AssertionError(f"unknown action {action!r}")

    try:
        for index, action in enumerate(actions):
            try:
                run(action)
            except AssertionError as e:
                raise AssertionError(_report(actions, index, str(e), frame, sink, state["query"])) from None
            except Exception as e:
                raise AssertionError(_report(actions, index, f"{type(e).__name__}: {e}\n"
                                             f"{traceback.format_exc()}", frame, sink,
                                             state["query"])) from e
    finally:
        if state["query"] is not None and state["query"].isActive:
            state["query"].stop()
    return result


test_stream.__test__ = False  # a helper, not a pytest test


def _report(actions: Sequence[Any], failed: int, error: str, frame, sink: MemorySink, query) -> str:
    lines = ["", "== Stream test failed ==", error, "", "== Actions =="]
    for i, action in enumerate(actions):
        lines.append(f"{'=> ' if i == failed else '   '}{action}")
    lines += ["", "== Sink =="]
    for batch_id in sink.batch_ids():
        lines.append(f"batch {batch_id}: {[tuple(r) for r in sink.batch(batch_id)]}")
    if query is not None:
        execution = query._execution
        lines += ["", "== Offsets ==",
                  f"committed: {execution.committed_offsets}",
                  f"available: {execution.available_offsets}",
                  f"query active: {query.isActive}, exception: {query.exception()}"]
    lines += ["", "== Plan ==", frame._plan.tree_string()]
    return "\n".join(lines)
