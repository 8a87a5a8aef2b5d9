"""Input rows the differential fuzzer found microbatch counted unlike Spark's engine under a
keyed-state function over pandas (issue 57, seeds 1674, 1750, 1865, 2193), as small
hand-written queries on microbatch next to Spark's own engine, batch by batch: rows,
progress (input rows, state operators), watermarks.

Spark's engine counts a file source's rows after the filters its optimizer pushes into the
scan (a JSON scan returns only the rows that pass them), and the watermark above the scan
sees only those rows. microbatch finds these filters by having Spark's optimizer read the
query as a batch (``runtime.scan_filters``), where each stateful operator is what stands
for it. transformWithState and applyInPandasWithState stood there as their own batch, an
empty relation, which left their input (and the filters in it) out of the plan: a filter
below them (``where("k IS NOT NULL")``) reached no scan, so a batch's row with a null key
was counted (and, with the filter above the watermark, moved the watermark: seed 2193).
They now stand in as a Python function over their whole input (``mapInPandas``), through
which Spark's optimizer pushes nothing, as through their streaming execs.
"""
from __future__ import annotations

import pytest

from helpers import ci_share, collect_batches, confs, json_stream
from microbatch.testing.fuzz import FuzzRunningCount, fuzz_running_count   # (importable by Spark's Python workers)
from stream_events import comparable, watermarks, write_event_files

SCHEMA = "id INT, ts TIMESTAMP, price INT"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: (id, second of the minute, price) per file: a row with no id in the first and the last
#: file, the first one 10 s ahead of the others (a watermark that saw it would be at 5 s)
EVENTS = [
    [(1, 2, 1), (None, 15, 1), (2, 4, 1)],
    [(1, 6, 1), (2, 7, 1)],
    [(None, 20, 1), (1, 9, 1)],
]


@pytest.fixture
def events(tmp_path):
    def files(name):
        return write_event_files(tmp_path / name, EVENTS,
                                 lambda i, s, p: {"id": i, "ts": f"2026-01-01 00:00:{s:02d}", "price": p})
    return files("events"), files("more")


def running_count_over_filtered_keys(stream, other):
    """transformWithStateInPandas after a watermark and a filter on its key (seeds 1865, 2193)."""
    filtered = stream.withWatermark("ts", "10 seconds").withColumnRenamed("id", "k").where("k IS NOT NULL")
    return filtered.groupBy("k").transformWithStateInPandas(FuzzRunningCount("k"), "k INT, n LONG", "update", "None")


def running_count_over_a_union(stream, other):
    """The same over a union of two streams, each with its watermark (seeds 1674, 1750)."""
    filtered = stream.withWatermark("ts", "10 seconds").unionByName(other.withWatermark("ts", "3 seconds")) \
        .where("id IS NOT NULL")
    return filtered.groupBy("id").transformWithStateInPandas(FuzzRunningCount("id"), "id INT, n LONG", "update",
                                                             "None")


def apply_in_pandas_with_state_over_filtered_keys(stream, other):
    """applyInPandasWithState over the same filtered input (the same stand-in)."""
    filtered = stream.withWatermark("ts", "10 seconds").withColumnRenamed("id", "k").where("k IS NOT NULL")
    return filtered.groupBy("k").applyInPandasWithState(
        fuzz_running_count("k"), "k INT, n LONG", "n LONG", "update", "NoTimeout")


FILTERED_BELOW = {
    "transformWithState": (running_count_over_filtered_keys, 1),
    "transformWithState over a union": (running_count_over_a_union, 2),
    "applyInPandasWithState": (apply_in_pandas_with_state_over_filtered_keys, 1),
}


@pytest.mark.parametrize("shape", ci_share(list(FILTERED_BELOW)))   # (helpers.ci_share)
def test_a_filter_below_a_keyed_state_function_reaches_the_scan(spark, ss, events, tmp_path, shape):
    query, reads = FILTERED_BELOW[shape]

    def run(session, ckpt):
        return collect_batches(query(*(json_stream(session, path, SCHEMA) for path in events)), ckpt, "update")
    with confs(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}):   # (Spark's TWS needs it)
        theirs, their_progress = run(spark, tmp_path / "spark")
    ours, our_progress = run(ss, tmp_path / "microbatch")
    assert ours == theirs
    # (Spark's scans dropped the rows with no id: the test reads what it is about)
    assert [p["numInputRows"] for p in their_progress if p["numInputRows"]] == [2 * reads, 2 * reads, reads]
    assert comparable(our_progress) == comparable(their_progress)
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")
