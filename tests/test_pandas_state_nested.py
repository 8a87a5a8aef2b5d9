"""applyInPandasWithState with nested state, keys and output next to Spark's own engine
(issue 59): structs in the state (timestamps inside, a struct in a struct), struct, array
and map grouping columns, structs, arrays and maps in the function's output; the rows, the
state rows per batch, the state as the state reader reads it, event-time and
processing-time timeouts, a restart in the middle. Arrays and maps in the state, which
Spark 4.3's engine fails on (its Python worker cannot read the state schema), run on
microbatch with the answers of the same function keeping them as JSON on Spark's engine.
And group aggregate pandas UDFs in a streaming aggregation, refused as Spark refuses them."""
from __future__ import annotations

import json
import sys
from datetime import datetime

import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf, pandas_udf
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.types import DoubleType

import test_chained_differential as chained
from helpers import ci_share, collect_batches, json_stream
from stream_events import comparable, first_batches
from test_chained_differential import restarts_with_the_same_answer, run, same_as_spark

# the functions below run in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def shapes(*values) -> str:
    """What the function was given, by type, at every depth (numpy's too)."""
    def shape(v):
        if hasattr(v, "__fields__"):
            return "Row(" + ",".join(f"{n}={shape(x)}" for n, x in zip(v.__fields__, v)) + ")"
        if isinstance(v, dict):
            return "dict{" + ",".join(f"{shape(k)}:{shape(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)) or type(v).__name__ == "ndarray":
            dtype = f"<{v.dtype}>" if hasattr(v, "dtype") else ""
            return f"{type(v).__name__}{dtype}[" + ",".join(shape(x) for x in v) + "]"
        return type(v).__name__
    return " ".join(shape(v) for v in values)


STRUCT_STATE = ("session STRUCT<start: TIMESTAMP, end: TIMESTAMP>, "
                "counts STRUCT<rows: LONG, last: STRUCT<id: INT, at: TIMESTAMP>>")
STRUCT_OUTPUT = ("id INT, session STRUCT<start: TIMESTAMP, end: TIMESTAMP>, times ARRAY<TIMESTAMP>, "
                 "per_second MAP<STRING, LONG>, rows LONG, timedout BOOLEAN, seen STRING")


def nested_sessions(key, frames, state):
    """Each id's session (a struct of times) and counts (a struct holding a struct), closed
    15 s of event time after its last batch; the output has a struct, an array and a map."""
    if state.hasTimedOut:
        session, counts = state.get
        state.remove()
        yield pd.DataFrame({"id": [key[0]], "session": [session.asDict()], "times": [[session.start, session.end]],
                            "per_second": [{}], "rows": [counts.rows], "timedout": [True],
                            "seen": [shapes(session, counts)]})
        return
    if state.exists:
        session, counts = state.get
        start, end, rows, seen = session.start, session.end, counts.rows, shapes(key, session, counts)
    else:
        start = end = None
        rows, seen = 0, "new " + shapes(key)
    per_second: dict = {}
    last = None
    for frame in frames:
        seen += " " + ",".join(str(t) for t in frame.dtypes)
        for t in frame["ts"]:
            t = t.to_pydatetime()
            start = t if start is None else min(start, t)
            end = t if end is None else max(end, t)
            per_second[str(t.second)] = per_second.get(str(t.second), 0) + 1
            last = (None if pd.isna(key[0]) else int(key[0]), t)    # a struct given as a tuple
        rows += len(frame)
    state.update(({"start": start, "end": end}, (rows, last)))        # ... and as a dict
    state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 15000)
    yield pd.DataFrame({"id": [key[0]], "session": [{"start": start, "end": end}], "times": [[start, end]],
                        "per_second": [per_second], "rows": [rows], "timedout": [False], "seen": [seen]})


STRUCT_CASE = ("update", lambda f: f.withWatermark("ts", "10 seconds").groupBy("id").applyInPandasWithState(
    nested_sessions, STRUCT_OUTPUT, STRUCT_STATE, "update", GroupStateTimeout.EventTimeTimeout))


def test_struct_state_and_nested_output_match_spark_batch_by_batch(spark, ss, events, tmp_path):
    """Rows (the Rows, datetimes and numpy types the function saw included), state rows,
    timeouts and watermarks per batch; Spark's reader on Spark's checkpoint and microbatch's
    on microbatch's read the same nested state."""
    case = "struct state with an event-time timeout"
    ours, _ = same_as_spark(spark, ss, events, tmp_path, case, STRUCT_CASE)
    outputs = [row for _, rows in ours for row in rows]
    assert any(row[5] for row in outputs), "a timeout fired"
    assert any("Row(start=datetime,end=datetime) Row(rows=int,last=Row(id=int,at=datetime))" in row[6]
               for row in outputs)
    for batch in (1, 2, 3):
        theirs = spark.read.format("statestore").option("batchId", batch).load(str(tmp_path / "spark"))
        mine = ss.read.format("statestore").option("batchId", batch).load(str(tmp_path / "microbatch"))
        assert mine.schema.simpleString() == theirs.schema.simpleString()
        assert sorted(map(str, mine.collect())) == sorted(map(str, theirs.collect())) != []


def test_a_restart_in_the_middle_resumes_the_struct_state(ss, events, tmp_path):
    second = restarts_with_the_same_answer(ss, events, tmp_path, "struct state with an event-time timeout",
                                           STRUCT_CASE)
    assert any("Row(" in row[6] for _, rows in second for row in rows)   # the state read back


def seen_keys(key, frames, state):
    """The key and rows as the function sees them; a key without rows in the next batch
    times out there (processing time, 1 ms)."""
    if state.hasTimedOut:
        yield pd.DataFrame({"seen": ["timed out " + shapes(key) + " " + repr(key) + f" after {state.get[0]}"]})
        state.remove()
        return
    rows = (state.get[0] if state.exists else 0)
    seen = shapes(key) + " " + repr(key)
    for frame in frames:
        rows += len(frame)
        seen += " " + ",".join(str(t) for t in frame.dtypes) + " " + shapes(*frame.iloc[0, 2:])
    state.update((rows,))
    state.setTimeoutDuration(1)
    yield pd.DataFrame({"seen": [seen]})


KEYS = {   # (Columns made in the test: a Column needs the session)
    "a struct": lambda: F.struct("id", (F.col("id") % 2).alias("odd"), F.col("ts").alias("at")),
    "an array": lambda: F.array("id", F.lit(7)),
    "a map": lambda: F.create_map(F.lit("id"), "id"),
    "an array of structs": lambda: F.array(F.struct("id"), F.struct(F.lit(0).alias("id"))),
}


@pytest.mark.parametrize("kind", ci_share(list(KEYS)))   # half in CI's run (helpers.ci_share)
def test_a_nested_grouping_column_matches_spark_with_processing_time_timeouts(spark, ss, events, tmp_path, kind):
    """Keys as the function gets them (a struct as a dict, an array as a numpy array, a
    map as a dict), rows, timed-out keys (read back from the state) and state rows."""
    def transform(frame):
        return frame.withColumn("k", KEYS[kind]()).groupBy("k").applyInPandasWithState(
            seen_keys, "seen STRING", "rows LONG", "update", GroupStateTimeout.ProcessingTimeTimeout)
    theirs, their_progress = first_batches(spark, events, tmp_path / "spark", 4, transform)
    ours, our_progress = first_batches(ss, events, tmp_path / "microbatch", 4, transform)
    assert ours == theirs
    assert any("timed out" in row[0] for _, rows in ours for row in rows)
    assert comparable(our_progress) == comparable(their_progress)


def test_a_grouping_expression_is_refused_as_spark_refuses_it(spark, ss, events):
    for session in (spark, ss):
        with pytest.raises(AnalysisException) as raised:
            json_stream(session, events, "id INT, ts TIMESTAMP").groupBy(F.struct("id")).applyInPandasWithState(
                seen_keys, "seen STRING", "rows LONG", "update", GroupStateTimeout.NoTimeout)
        assert raised.value.getCondition().startswith("UNRESOLVED_COLUMN")


# -- arrays and maps in the state -----------------------------------------------------------
COLLECTIONS_STATE = "times ARRAY<TIMESTAMP>, per_second MAP<STRING, LONG>, marks ARRAY<STRUCT<at: TIMESTAMP, n: INT>>"
COLLECTIONS_OUTPUT = ("id INT, times ARRAY<TIMESTAMP>, per_second MAP<STRING, LONG>, "
                      "marks ARRAY<STRUCT<at: TIMESTAMP, n: INT>>")


def keeping(native: bool):
    """Each id's event times, rows per second and a mark per batch: kept as an array, a map
    and an array of structs (``native``), or as the same in one JSON string."""
    def collections(key, frames, state):
        if not state.exists:
            times, per_second, marks = [], {}, []
        elif native:
            times, per_second, marks = state.get
            assert isinstance(times, list) and isinstance(per_second, dict), shapes(*state.get)
            marks = [(m.at, m.n) for m in marks]
        else:
            kept = json.loads(state.get[0])
            times = [datetime.fromisoformat(t) for t in kept["times"]]
            per_second = kept["per_second"]
            marks = [(datetime.fromisoformat(at), n) for at, n in kept["marks"]]
        rows = 0
        for frame in frames:
            for t in frame["ts"]:
                t = t.to_pydatetime()
                times.append(t)
                per_second[str(t.second)] = per_second.get(str(t.second), 0) + 1
            rows += len(frame)
        marks.append((max(times), rows))
        if native:
            state.update((times, per_second, [{"at": at, "n": n} for at, n in marks]))
        else:
            state.update((json.dumps({"times": [t.isoformat() for t in times], "per_second": per_second,
                                      "marks": [(at.isoformat(), n) for at, n in marks]}),))
        yield pd.DataFrame({"id": [key[0]], "times": [sorted(times)], "per_second": [per_second],
                            "marks": [[{"at": at, "n": n} for at, n in marks]]})
    return collections


NATIVE = ("update", lambda f: f.groupBy("id").applyInPandasWithState(
    keeping(True), COLLECTIONS_OUTPUT, COLLECTIONS_STATE, "update", GroupStateTimeout.NoTimeout))
AS_JSON = ("update", lambda f: f.groupBy("id").applyInPandasWithState(
    keeping(False), COLLECTIONS_OUTPUT, "kept STRING", "update", GroupStateTimeout.NoTimeout))


def test_arrays_and_maps_in_the_state_give_the_answers_spark_gives_keeping_them_as_json(
        spark, ss, events, tmp_path):
    """Spark 4.3's engine fails the first batch of a state with an array or a map: its
    Python worker cannot parse the state schema the JVM sends (``KeyError: 'elementType'``,
    ``'keyType'``). microbatch runs it: the rows and state rows per batch are those of
    Spark's engine running the same function with the state as a JSON string; the state
    files keep Arrow's nested types (no pickled bytes), which the state reader reads."""
    chained.CASES["collections"], chained.CASES["as json"] = NATIVE, AS_JSON
    with pytest.raises(Exception, match="elementType|keyType"):
        run(spark, events, tmp_path / "spark-native", "collections")
    theirs, their_progress = run(spark, events, tmp_path / "spark", "as json")
    ours, our_progress = run(ss, events, tmp_path / "microbatch", "collections")
    assert ours == theirs and len(ours) == 4
    assert comparable(our_progress) == comparable(their_progress)
    files = sorted((tmp_path / "microbatch" / "state" / "0").rglob("*.arrow"))
    assert files
    for path in files:
        with pa.ipc.open_stream(pa.OSFile(str(path))) as reader:
            group_state = reader.schema.field("value").type.field("groupState").type
        times, per_second, marks = (group_state.field(i).type for i in range(3))
        assert pa.types.is_list(times) and pa.types.is_int64(times.value_type)   # (µs)
        assert pa.types.is_map(per_second) and pa.types.is_string(per_second.key_type)
        assert pa.types.is_list(marks) and pa.types.is_struct(marks.value_type)
    state = ss.read.format("statestore").load(str(tmp_path / "microbatch"))
    assert state.schema["value"].dataType["groupState"].dataType.simpleString() == \
        "struct<times:array<timestamp>,per_second:map<string,bigint>,marks:array<struct<at:timestamp,n:int>>>"
    ids = {r.key.id: r.value.groupState for r in state.collect()}
    assert ids[3].per_second == {"40": 2, "45": 1} and len(ids[3].times) == 3
    assert [m.n for m in ids[3].marks] == [1, 1, 1] and isinstance(ids[3].times[0], datetime)


def test_a_restart_in_the_middle_resumes_arrays_and_maps(ss, events, tmp_path):
    second = restarts_with_the_same_answer(ss, events, tmp_path, "collections", NATIVE)
    assert any(len(row[3]) > 1 for _, rows in second for row in rows)   # marks of earlier batches, read back


# -- group aggregate pandas UDFs ----------------------------------------------------------
@pandas_udf(DoubleType())
def mean_udf(v: pd.Series) -> float:
    return v.mean()


@arrow_udf(DoubleType())
def mean_arrow(v: pa.Array) -> pa.Scalar:
    import pyarrow.compute as pc
    return pc.mean(v)


UDAFS = {
    "a pandas UDAF": ("update", lambda f: f.groupBy("id").agg(mean_udf(F.col("id").cast("double")).alias("m"))),
    "an Arrow UDAF": ("update", lambda f: f.groupBy("id").agg(mean_arrow(F.col("id").cast("double")).alias("m"))),
    "a pandas UDAF beside count over a window": (
        "append", lambda f: f.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).agg(
            F.count("*"), mean_udf(F.col("id").cast("double")).alias("m"))),
}


@pytest.mark.parametrize("case", list(UDAFS))
def test_a_group_aggregate_pandas_udf_in_a_streaming_aggregation_is_refused_as_spark_refuses_it(
        spark, ss, events, tmp_path, case):
    """Spark's engine fails the query as it plans its first batch (StatefulAggregationStrategy:
    AnalysisException "Streaming aggregation doesn't support group aggregate pandas UDF");
    microbatch refuses it at start with the same exception and words, before any batch."""
    mode, transform = UDAFS[case]
    with pytest.raises(Exception) as theirs:
        collect_batches(transform(json_stream(spark, events, "id INT, ts TIMESTAMP")), tmp_path / "spark", mode)
    message = "Streaming aggregation doesn't support group aggregate pandas UDF"
    assert message in str(theirs.value)
    frame = transform(json_stream(ss, events, "id INT, ts TIMESTAMP"))   # (defined as on Spark)
    with pytest.raises(AnalysisException) as ours:
        collect_batches(frame, tmp_path / "microbatch", mode)
    assert str(ours.value).startswith(message)
    assert not (tmp_path / "microbatch" / "commits").exists() or \
        not list((tmp_path / "microbatch" / "commits").iterdir())


@pytest.mark.parametrize("first_engine", ["microbatch", "spark"])
def test_the_struct_state_moves_between_the_engines(spark, ss, tmp_path, first_engine):
    """Some batches on one engine, the rest on the other (microbatch's checkpoint converted
    for Spark's engine, ``checkpoint convert``; Spark's adopted by microbatch), beside a copy
    that stays: the later batches' rows and state rows are equal, and Spark's state reader
    reads the converted nested state as microbatch's reads its own."""
    import os
    import shutil

    from microbatch.ops.spark_conversion import convert_to_spark
    from stream_events import write_event_files
    from test_spark_state_adoption import BEFORE, EVENTS, SCHEMA, arrive
    events = write_event_files(tmp_path / "events", EVENTS, lambda k, t, v: {"id": k, "ts": f"2026-01-01 {t}", "v": v})
    mode, transform = STRUCT_CASE
    live, moved, stayed = tmp_path / "live", tmp_path / "moved", tmp_path / "stayed"
    live.mkdir()
    names = sorted(os.listdir(events))
    arrive(events, live, names[:BEFORE])
    first = ss if first_engine == "microbatch" else spark
    collect_batches(transform(json_stream(first, live, SCHEMA)), moved, mode)
    shutil.copytree(moved, stayed)
    if first_engine == "microbatch":
        convert_to_spark(spark, str(moved))
        theirs_state = sorted(map(str, spark.read.format("statestore").load(str(moved)).collect()))
        ours_state = sorted(map(str, ss.read.format("statestore").load(str(stayed)).collect()))
        assert theirs_state == ours_state != []
    arrive(events, live, names[BEFORE:])
    second = spark if first_engine == "microbatch" else ss
    moved_rows, moved_progress = collect_batches(transform(json_stream(second, live, SCHEMA)), moved, mode)
    stayed_rows, stayed_progress = collect_batches(transform(json_stream(first, live, SCHEMA)), stayed, mode)
    assert [rows for _, rows in moved_rows] == [rows for _, rows in stayed_rows]
    assert any("Row(" in row[6] for _, rows in moved_rows for row in rows)   # the moved state, read
    as_dicts = [json.loads(p.json) if hasattr(p, "json") else p for p in moved_progress + stayed_progress]
    totals = [[op["numRowsTotal"] for op in p["stateOperators"]] for p in as_dicts]
    assert totals[:len(moved_progress)] == totals[len(moved_progress):]
