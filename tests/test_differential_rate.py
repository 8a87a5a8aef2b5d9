"""microbatch against Spark's own Structured Streaming, in one process.

Acceptance of the foundation issue: a rate-micro-batch query run three times with
trigger(once=True) on one checkpoint produces batches 0, 1, 2 with exactly Spark's
rows; removing commits/2 and starting again re-runs batch 2 with identical rows;
the checkpoint has Spark's layout and text format. Spark's own engine appears only
here, as the reference.
"""
from __future__ import annotations

import json
import os


from microbatch import ManualClock
from microbatch.sources.rate import value_at_second


def _collect_into(store: dict):
    """Record each attempt's rows of each batch: store[batch_id] = [attempt, ...]."""
    def write(df, batch_id):
        rows = sorted(tuple(r) for r in df.collect())
        store[batch_id] = store.get(batch_id, []) + [rows]
    return write


def _spark_once(spark, options: dict, checkpoint: str, store: dict, fmt="rate-micro-batch"):
    stream = spark.readStream.format(fmt).options(**options).load()
    query = (stream.writeStream.foreachBatch(_collect_into(store))
             .option("checkpointLocation", checkpoint).trigger(once=True).start())
    query.awaitTermination()


def _ours_once(ss, options: dict, checkpoint: str, store: dict, fmt="rate-micro-batch"):
    stream = ss.readStream.format(fmt).options(**options).load()
    query = (stream.writeStream.foreachBatch(_collect_into(store))
             .option("checkpointLocation", checkpoint).trigger(once=True).start())
    query.awaitTermination()
    return query


def _files(root: str) -> set[str]:
    found = set()
    for directory, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".crc"):
                found.add(os.path.relpath(os.path.join(directory, name), root))
    return found


def _lines(path: str) -> list[str]:
    with open(path) as f:
        return f.read().split("\n")


OPTIONS = {"rowsPerBatch": "7", "numPartitions": "3", "startTimestamp": "1000",
           "advanceMillisPerBatch": "250"}


def test_rate_micro_batch_three_once_runs_match_spark(ss, spark, tmp_path):
    spark_ckpt, our_ckpt = str(tmp_path / "spark"), str(tmp_path / "ours")
    spark_rows, our_rows = {}, {}
    ids = set()
    for _ in range(3):
        _spark_once(spark, OPTIONS, spark_ckpt, spark_rows)
        ids.add(_ours_once(ss, OPTIONS, our_ckpt, our_rows).id)
    assert sorted(our_rows) == [0, 1, 2] == sorted(spark_rows)
    for batch_id in range(3):
        assert our_rows[batch_id] == spark_rows[batch_id]
    assert [v for _, v in our_rows[2][0]] == list(range(14, 21))
    assert len(ids) == 1  # the query id survives restarts

    # Spark's layout, minus its .crc files; plus microbatch's own directories, which
    # Spark's engine ignores (docs/design.md, section 5): a run lease per run and a
    # progress entry per batch
    ours = _files(our_ckpt)
    own = {f for f in ours if f.startswith(("leases/", "progress/"))}
    assert own == {"leases/1", "leases/2", "leases/3", "progress/0", "progress/1", "progress/2"}
    assert ours - own == _files(spark_ckpt) == {
        "metadata", "offsets/0", "offsets/1", "offsets/2", "commits/0", "commits/1", "commits/2"}
    for batch_id in range(3):
        ours, theirs = _lines(f"{our_ckpt}/offsets/{batch_id}"), _lines(f"{spark_ckpt}/offsets/{batch_id}")
        assert ours[0] == theirs[0] == "v1"
        assert ours[2:] == theirs[2:]  # the offsets JSON, byte for byte
        our_meta, their_meta = json.loads(ours[1]), json.loads(theirs[1])
        assert list(our_meta) == list(their_meta) == ["batchWatermarkMs", "batchTimestampMs", "conf"]
        assert our_meta["conf"] == their_meta["conf"]
        assert open(f"{our_ckpt}/commits/{batch_id}").read() == \
            open(f"{spark_ckpt}/commits/{batch_id}").read()
    metadata = open(f"{our_ckpt}/metadata").read()
    assert metadata == '{"id":"%s"}' % ids.pop()

    # Remove commits/2: the next start re-runs batch 2, same offsets, same rows.
    offsets_2 = open(f"{our_ckpt}/offsets/2").read()
    os.remove(f"{our_ckpt}/commits/2")
    rerun = {}
    query = _ours_once(ss, OPTIONS, our_ckpt, rerun)
    assert list(rerun) == [2]
    assert rerun[2] == our_rows[2] == spark_rows[2]
    assert open(f"{our_ckpt}/offsets/2").read() == offsets_2
    assert os.path.exists(f"{our_ckpt}/commits/2") and not os.path.exists(f"{our_ckpt}/offsets/3")
    assert query.lastProgress["batchId"] == 2


def test_microbatch_resumes_a_checkpoint_written_by_spark(ss, spark, tmp_path):
    """Format compatibility both ways: Spark writes batches, microbatch re-runs the last one."""
    for fmt, options in (("rate-micro-batch", OPTIONS), ("rate", {"rowsPerSecond": "5",
                                                                  "numPartitions": "2"})):
        checkpoint = str(tmp_path / fmt)
        spark_rows: dict = {}
        stream = spark.readStream.format(fmt).options(**options).load()
        query = (stream.writeStream.foreachBatch(_collect_into(spark_rows))
                 .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start())
        try:
            while len([b for b, rows in list(spark_rows.items()) if rows[0]]) < 2:
                query.awaitTermination(0.2)
        finally:
            query.stop()
        last = max(b for b in spark_rows if os.path.exists(f"{checkpoint}/commits/{b}"))
        assert spark_rows[last][0], "Spark's last committed batch should have rows"
        os.remove(f"{checkpoint}/commits/{last}")
        for extra in range(last + 1, last + 5):  # batches Spark planned after it
            for log in ("offsets", "commits"):
                for name in (str(extra), f".{extra}.crc"):
                    if os.path.exists(f"{checkpoint}/{log}/{name}"):
                        os.remove(f"{checkpoint}/{log}/{name}")
        ours: dict = {}
        _ours_once(ss, options, checkpoint, ours, fmt)
        assert list(ours) == [last], fmt
        assert ours[last][0] == spark_rows[last][0], fmt


def test_rate_value_at_second_matches_sparks_table():
    # the table in Spark's RateStreamProvider.valueAtSecond: rampUpTime 4 s, 10 rows/s
    assert [value_at_second(s, 10, 4) for s in range(7)] == [0, 2, 6, 12, 20, 30, 40]
    assert [value_at_second(s, 7, 0) for s in range(3)] == [0, 7, 14]


def test_rate_source_rows_follow_sparks_formula(ss, tmp_path):
    clock = ManualClock(1_000_000)
    rows: dict = {}
    stream = (ss.readStream.format("rate").option("rowsPerSecond", 10)
              .option("rampUpTime", "4s").option("numPartitions", 2).load())
    query = (stream.writeStream.foreachBatch(_collect_into(rows)).clock(clock)
             .option("checkpointLocation", str(tmp_path)).trigger(processingTime="1 second").start())
    for _ in range(6):
        assert clock.wait_for_waiter(30)
        clock.advance(1000)
    assert clock.wait_for_waiter(30)
    query.stop()
    batches = [rows[b][0] for b in sorted(rows)]
    assert [len(b) for b in batches] == [0, 2, 4, 6, 8, 10, 10]
    values = [v for batch in batches for _, v in batch]
    assert values == list(range(40))
    timestamps = {v: ts.timestamp() * 1000 for batch in batches for ts, v in batch}
    # second 2 holds values 2..5, spread evenly over that second
    assert [round(timestamps[v]) for v in (2, 3, 4, 5)] == [1_001_000, 1_001_250, 1_001_500, 1_001_750]
    assert open(f"{tmp_path}/sources/0/0").read() == "v1\n1000000"
