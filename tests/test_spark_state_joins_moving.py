"""Stream-stream joins move between the engines with their four stores (from Spark's
HDFS-backed and RocksDB providers): two batches run on one engine; the checkpoint is copied; the copy continues on the same engine and the
original on the other (after ``checkpoint convert --to spark`` when it goes to Spark's
engine), over the same new files. Every later batch's rows and progress are equal."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers import collect_batches, confs, json_stream, sorted_rows
from stream_events import comparable
from test_spark_state_adoption import PROVIDERS
from test_stream_join_differential import CASES, LEFT, RIGHT, write

from microbatch.ops.spark_conversion import convert_to_spark

#: a separate bounded step (make test-porting): moving state between the engines
pytestmark = pytest.mark.porting

MOVED = {name: CASES[name] for name in (
    "time range, left outer", "full outer", "a deduplicated side", "on id and a time window, inner")}
#: a join whose result drops a column of each side: both engines' state rows leave them out
#: (Spark's optimizer prunes them from the join's input; microbatch reads which from it)
MOVED["time range, left outer, a column of each side dropped"] = lambda l, r: CASES["time range, left outer"](
    l, r).select("id", "lts", "rts")
BEFORE = 2


def run(session, live, ckpt, transform):
    left = json_stream(session, live[0], "id INT, ts TIMESTAMP, a STRING")
    right = json_stream(session, live[1], "id INT, ts TIMESTAMP, b INT")
    batches, progress = collect_batches(transform(left, right), ckpt, rows=lambda df: (df.columns, sorted_rows(df)))
    return batches, [json.loads(p.json) for p in progress]


def arrive(sources, live, files) -> None:
    for source, target in zip(sources, live):
        for name in files:
            os.rename(os.path.join(source, name), os.path.join(target, name))


#: each join moves both ways, one way on Spark's default provider and the other on RocksDB,
#: and each of the four moves runs under two of the joins (every move under all four joins
#: read the same layouts again: issue 58)
DIRECTIONS = (("spark to microbatch", "microbatch's rocksdb to spark's rocksdb"),
              ("spark's rocksdb to microbatch", "microbatch to spark"))


@pytest.mark.parametrize("case, direction", [(case, direction) for i, case in enumerate(MOVED)
                                             for direction in DIRECTIONS[i % 2]])
def test_a_join_moves_between_the_engines_with_its_state(spark, ss, tmp_path, case, direction):
    transform = MOVED[case]
    provider_confs = PROVIDERS["rocksdb, changelogs"] if "rocksdb" in direction else {}
    sources = write(tmp_path / "left", LEFT, "a"), write(tmp_path / "right", RIGHT, "b")
    live = [tmp_path / "live-left", tmp_path / "live-right"]
    for d in live:
        d.mkdir()
    names = sorted(os.listdir(sources[0]))
    first_engine, second_engine = (ss, spark) if direction.startswith("microbatch") else (spark, ss)
    moved, stayed = tmp_path / "moved", tmp_path / "stayed"
    arrive(sources, live, names[:BEFORE])
    with confs(spark, provider_confs):
        first, _ = run(first_engine, live, moved, transform)
    assert len(first) >= BEFORE     # (and a batch without data when the watermark moved)
    shutil.copytree(moved, stayed)
    shift = 0
    if second_engine is spark:
        result = convert_to_spark(spark, str(moved))
        assert result.stores > 0 and result.rows > 0
        assert result.provider.endswith("RocksDBStateStoreProvider" if "rocksdb" in direction
                                        else "HDFSBackedStateStoreProvider")
        shift = 1
        stores = {m.stateStoreName for m in spark.read.format("state-metadata").load(str(moved)).collect()
                  if m.operatorId == 0}   # (the join is operator 0)
        assert stores == {"left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues",
                          "right-keyWithIndexToValue"}
        for side in ("left", "right"):
            theirs = sorted(((tuple(r.key), tuple(r.value)) for r in
                             spark.read.format("statestore").option("joinSide", side).load(str(moved)).collect()),
                            key=repr)
            ours = sorted(((tuple(r.key), tuple(r.value)) for r in
                           ss.read.format("statestore").option("joinSide", side).load(str(stayed)).collect()),
                          key=repr)
            assert theirs == ours
    arrive(sources, live, names[BEFORE:])
    with confs(spark, provider_confs):
        theirs, their_progress = run(first_engine, live, stayed, transform)
    ours, our_progress = run(second_engine, live, moved, transform)
    assert [rows for _, rows in ours] == [rows for _, rows in theirs] and any(rows[1] for _, rows in ours)
    assert [(b, *rest) for b, *rest in comparable(our_progress)] == \
        [(b + shift, *rest) for b, *rest in comparable(their_progress)]
