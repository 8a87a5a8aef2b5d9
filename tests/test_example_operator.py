"""A new stateful operator, written the way docs/design.md (section 2) says to add one: its
plan node with its policy, its step, its task and its state schema in one home (here, this
module), plus its API method. Nothing else in microbatch changes: the planner, the
watermark, the output-mode checks and the checkpoint ask the node.

The example is a running count per key (each batch, every key it saw with the number of
rows seen so far): what Spark's engine computes for ``groupBy(key).count()`` in update
mode, so the test runs both side by side, batch by batch, across a restart."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from helpers import collect_batches, json_stream
from microbatch import StreamFrame
from microbatch.operators.base import OperatorBatch, StatefulStep, StateTask, store_field, task_partition
from microbatch.plan.checks import output_mode_error
from microbatch.plan.logical import PlanNode, StatefulNode
from stream_events import comparable, write_event_files

cloudpickle.register_pickle_by_value(sys.modules[__name__])   # (the task, on Spark's workers)

COUNT = pa.schema([pa.field("count", pa.int64())])


# -- the operator's home: node, step, task ---------------------------------------------------
@dataclass(eq=False)
class RunningCount(StatefulNode):
    """Per key, the rows seen so far; a batch emits the keys it saw (update mode)."""

    child: PlanNode
    key: str

    def make_step(self, operator_id: int, state_root: str, shuffle_partitions: int) -> "RunningCountStep":
        return RunningCountStep(self, operator_id, state_root, shuffle_partitions)

    def state_partitions(self, shuffle_partitions: int) -> int:
        return shuffle_partitions

    def output_watermark_ms(self, input_ms: int) -> int | None:
        return input_ms

    def evicts_with(self, output_mode: str) -> bool:
        return False     # (a count is never final: nothing to evict)

    def runs_every_batch(self) -> bool:
        return False

    def statistics_inputs(self, watermark_below) -> dict[int, tuple]:
        return {}        # (a watermark below is observed by the tracker)

    def output_mode_refusal(self, mode: str, aggregations: list) -> Exception | None:
        return None if mode == "update" else output_mode_error(mode, "running counts")

    def affected_by_late_rows(self) -> bool:
        return True

    def connect_refusal(self, output_mode: str) -> str | None:
        return "runningCount"

    def spark_state_refusal(self, recorded_conf, provider: str) -> str | None:
        return "Spark's engine keeps no running count"

    def build(self, inputs):     # (the batch equivalent: the stream's template)
        return self.child.build(inputs).groupBy(self.key).count()

    def describe(self) -> str:
        return f"RunningCount [{self.key}]"


@dataclass(frozen=True)
class RunningCountTask(StateTask):
    """Per state partition: adds the batch's rows per key to the stored counts."""

    key_schema: pa.Schema = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = task_partition()
        started = time.monotonic()
        store = self.store(partition, self.key_schema, COUNT)
        seen: dict = {}
        for batch in batches:
            for key in batch.column(0).to_pylist():
                seen[key] = seen.get(key, 0) + 1
        keys = [(k,) for k in seen]
        totals = [(0 if old is None else old[0]) + seen[k] for (k,), old in zip(keys, store.get_many(keys))]
        store.put_many(keys, [(t,) for t in totals])
        updates_ms = (time.monotonic() - started) * 1000
        store.commit()
        self.finish(partition, store.metrics(), numRowsUpdated=len(keys), allUpdatesTimeMs=int(updates_ms))
        if keys:
            yield pa.RecordBatch.from_arrays([pa.array([k for (k,) in keys], self.key_schema.field(0).type),
                                              pa.array(totals, pa.int64())],
                                             names=[self.key_schema.field(0).name, "count"])


class RunningCountStep(StatefulStep):
    """The key column, hash-partitioned into the state partitions, then the task."""

    name = "runningCount"

    def build(self, inputs: list[DataFrame], batch: OperatorBatch) -> DataFrame:
        keys = inputs[0].select(self.node.key)
        key_schema, output = self.cached("schemas", lambda: self._schemas(keys.schema))
        task = RunningCountTask(self.state_root, self.operator_id, batch.batch_id, batch.store_conf,
                                batch.metrics, key_schema=key_schema)
        return self.bind([keys], task, self.map_by_keys([F.col(self.node.key)], output))

    def _schemas(self, schema: StructType) -> tuple[pa.Schema, StructType]:
        key = schema.fields[0]
        return pa.schema([store_field(key)]), StructType([key, StructField("count", LongType(), False)])

    def state_schema(self, input_schemas: list[StructType]) -> tuple[StructType, StructType]:
        key = input_schemas[0][self.node.key]
        return StructType([key]), StructType([StructField("count", LongType(), False)])


# -- its API method ----------------------------------------------------------------------------
def running_count(frame: StreamFrame, key: str) -> StreamFrame:
    """``frame.runningCount(key)``: per key, the rows seen so far."""
    node = RunningCount(frame._plan, key)
    return StreamFrame(frame._session, node, frame._template.groupBy(key).count())


# -- the test ----------------------------------------------------------------------------------
EVENTS = [[(1, "a"), (2, "b"), (3, "a")], [(4, "a"), (5, "c")], [], [(6, "b"), (7, "b"), (8, "c")]]


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS, lambda i, k: {"id": i, "k": k})


def test_a_new_operator_runs_from_its_home_alone_as_spark_runs_its_equivalent(spark, ss, events, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(StreamFrame, "runningCount", running_count, raising=False)
    theirs, their_progress = collect_batches(
        json_stream(spark, events, "id INT, k STRING").groupBy("k").count(), tmp_path / "spark", "update")
    ours, our_progress = collect_batches(
        json_stream(ss, events, "id INT, k STRING").runningCount("k"), tmp_path / "microbatch", "update")
    assert ours == theirs
    assert [rows for _, rows in ours][-1] == [("b", 3), ("c", 2)]
    fields = ("numRowsTotal", "numRowsUpdated")
    assert [[{k: op[k] for k in fields} for op in p["stateOperators"]] for p in our_progress] == \
        [[{k: op[k] for k in fields} for op in p["stateOperators"]] for p in their_progress]
    assert [p["stateOperators"][0]["operatorName"] for p in our_progress][:1] == ["runningCount"]
    assert [c[-1] for c in comparable(our_progress)] == [c[-1] for c in comparable(their_progress)]
    # a restart resumes the counts from the checkpoint's state
    (tmp_path / "events" / "f9.json").write_text('{"id": 9, "k": "a"}\n')
    again, _ = collect_batches(json_stream(ss, events, "id INT, k STRING").runningCount("k"),
                               tmp_path / "microbatch", "update")
    assert [rows for _, rows in again] == [[("a", 4)]]


def test_its_own_rules_refuse_what_it_does_not_run(ss, events, tmp_path):
    frame = running_count(json_stream(ss, events, "id INT, k STRING"), "k")
    with pytest.raises(Exception, match="running counts"):
        frame.writeStream.outputMode("append").format("noop") \
            .option("checkpointLocation", str(tmp_path / "ck")).start()
