"""Options and confs Spark documents for streaming that microbatch used to run as without
them (issue 59, tests/test_options_not_ignored.py's walk): each honoured as Spark's engine
honours it, side by side with Spark's engine where it shows an effect, or refused by name.
"""
from __future__ import annotations

import pytest
from pyspark.errors import IllegalArgumentException

from microbatch.kafka.tasks import OffsetRange, split_ranges


# -- Kafka: maxRecordsPerPartition -------------------------------------------------------------
# Spark's Kafka connector is a JVM jar that is not installed here, so its engine cannot run
# beside these tests: Spark 4's KafkaOffsetRangeCalculator.getRanges is stated and checked.

def kafka(ss, broker, **options):
    reader = ss.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _pieces(ranges):
    return [(r.partition, r.start, r.until) for r in ranges]


def test_max_records_per_partition_splits_as_sparks_range_calculator():
    ranges = [OffsetRange("t", 0, 0, 25), OffsetRange("t", 1, 100, 106), OffsetRange("t", 2, 7, 7)]
    # ceil(25 / 10) = 3 pieces by integer division of what remains (8, 8, 9); 6 records stay whole;
    # the empty range is dropped
    assert _pieces(split_ranges(ranges, None, 10)) == [(0, 0, 8), (0, 8, 16), (0, 16, 25), (1, 100, 106)]
    # a range of exactly the maximum is one piece
    assert _pieces(split_ranges([OffsetRange("t", 0, 0, 10)], None, 10)) == [(0, 0, 10)]
    # then minPartitions, over the pieces: 4 pieces >= 3, nothing more
    assert len(split_ranges(ranges, 3, 10)) == 4
    # minPartitions above the pieces' number: the large ones split again in proportion
    # (round(8/31*8) = 2 parts each of partition 0's pieces, 9 -> 2, partition 1's 6 -> 2)
    assert _pieces(split_ranges(ranges, 8, 10)) == [
        (0, 0, 4), (0, 4, 8), (0, 8, 12), (0, 12, 16), (0, 16, 20), (0, 20, 25), (1, 100, 103), (1, 103, 106)]


def test_min_partitions_alone_leaves_small_ranges_whole_as_spark():
    """Spark's getRanges: a range worth one part of minPartitions stays whole, and the
    others share what is left of minPartitions in proportion to their size."""
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 5), OffsetRange("t", 2, 0, 5)]
    # round(5/110*4) = 0 -> 1: partitions 1 and 2 unsplit; partition 0 gets max(4 - 2, 1) = 2 parts
    assert _pieces(split_ranges(ranges, 4)) == [(0, 0, 50), (0, 50, 100), (1, 0, 5), (2, 0, 5)]


def test_max_records_per_partition_gives_a_task_per_piece(ss, broker, tmp_path):
    broker.create_topic("max-records", 2)
    broker.produce("max-records", [(b"%d" % i, None, 0) for i in range(25)] +
                   [(b"%d" % i, None, 1) for i in range(25, 31)])
    seen = []

    def batch(df, batch_id):
        seen.append((df.rdd.getNumPartitions(), sorted(int(r.value) for r in df.collect()),
                     df.groupBy("partition").count().orderBy("partition").collect()))
    q = (kafka(ss, broker, subscribe="max-records", startingOffsets="earliest", maxRecordsPerPartition=10)
         .writeStream.foreachBatch(batch).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    tasks, rows, per_partition = seen[0]
    assert tasks == 4                       # partition 0: 3 pieces of at most 10; partition 1: one
    assert rows == list(range(31))          # every record once
    assert [(r["partition"], r["count"]) for r in per_partition] == [(0, 25), (1, 6)]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_records_per_partition_must_be_positive(ss, broker, value):
    with pytest.raises(IllegalArgumentException, match="maxRecordsPerPartition must be positive"):
        kafka(ss, broker, subscribe="a", maxRecordsPerPartition=value)
