"""Receivers (docs/receivers.md): records accepted durably, and acknowledgement to sink.

``python -m benchmarks.receivers [--seconds 5] [--clients 4] [--records 100]``

One process, one local[2] session, an ``http`` source into a ``foreachBatch`` sink that
notes when each record's batch finished (the default trigger):

1. **Accepted durably**: ``clients`` threads POST requests of ``records`` JSON lines as
   fast as they are answered, for ``seconds``, with the checkpoint on local disk and on
   S3 (moto's server on 127.0.0.1: the S3 protocol and the storage layer, not a network
   to a region), in ``ackMode`` ``block`` (a block per request) and ``interval``
   (``blockInterval`` 50ms: one block for all requests of an interval). Records answered
   200 a second, and the median POST-to-200 time.
2. **Latency**: one client POSTs one record every 100 ms for ``seconds``; per record the
   POST-to-200 time (what the sender waits) and the 200-to-sink time (until the batch
   holding it returned from the sink), at ``ackMode=record`` and ``block``, and
   ``interval`` with ``blockInterval`` 50ms and 500ms, on local disk.

Writes ``benchmarks/results/receivers.json``. Timings on a shared 2-core machine: read
the ratios, not the absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import threading
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
BUCKET = "bench-receivers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the http source did not listen on {port}")


class Run:
    """A query over an http source; ``sunk[id]``: when the batch holding ``id`` returned."""

    def __init__(self, ss, checkpoint: str, **options):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.sunk: dict[int, float] = {}
        frame = (ss.readStream.format("http").schema("id BIGINT, pad STRING").option("port", self.port)
                 .options(**options).load())

        def sink(df, _batch_id):
            ids = [r.id for r in df.select("id").collect()]
            done = time.time()
            for i in ids:
                self.sunk[i] = done
        self.query = (frame.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start())
        wait_listening(self.port)

    def stop(self) -> None:
        self.query.stop()


def post(session: requests.Session, url: str, ids: range, pad: str) -> requests.Response:
    body = "".join(f'{{"id": {i}, "pad": "{pad}"}}\n' for i in ids)
    return session.post(url, data=body, headers={"Content-Type": "application/x-ndjson"}, timeout=60)


def throughput(ss, checkpoint: str, clients: int, records: int, seconds: float, **options) -> dict:
    run = Run(ss, checkpoint, **options)
    accepted = [0] * clients
    waits: list[float] = []
    refused = [0]
    end = time.monotonic() + seconds

    def client(c: int) -> None:
        session = requests.Session()
        next_id = c * 10**9
        while time.monotonic() < end:
            t0 = time.monotonic()
            answer = post(session, run.url, range(next_id, next_id + records), "x" * 40)
            if answer.status_code == 200:
                waits.append(time.monotonic() - t0)
                accepted[c] += records
                next_id += records
            else:
                refused[0] += 1
                time.sleep(float(answer.headers.get("Retry-After", "1")))
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    run.stop()
    return {"recordsPerSecond": sum(accepted) / elapsed, "requests": len(waits), "refused": refused[0],
            "medianAckMs": 1000 * statistics.median(waits) if waits else None}


def latency(ss, checkpoint: str, seconds: float, **options) -> dict:
    run = Run(ss, checkpoint, **options)
    session = requests.Session()
    acked: dict[int, float] = {}
    waits = []
    for i in range(int(seconds / 0.1)):
        t0 = time.time()
        answer = post(session, run.url, range(i, i + 1), "x")
        assert answer.status_code == 200, answer.text
        acked[i] = time.time()
        waits.append(acked[i] - t0)
        time.sleep(max(0.0, 0.1 - (time.time() - t0)))
    deadline = time.monotonic() + 60
    while len(run.sunk) < len(acked) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.stop()
    to_sink = sorted(run.sunk[i] - acked[i] for i in acked if i in run.sunk)
    return {"records": len(acked), "medianAckMs": 1000 * statistics.median(waits),
            "medianAckToSinkMs": 1000 * statistics.median(to_sink),
            "p90AckToSinkMs": 1000 * to_sink[int(0.9 * (len(to_sink) - 1))]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--records", type=int, default=100)
    args = parser.parse_args(argv)

    import boto3
    from microbatch import StreamingSession, embedded_spark
    from microbatch.testing.s3_server import s3_server

    results: dict = {"args": vars(args), "throughput": {}, "latency": {}}
    with s3_server() as endpoint:
        settings = {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.access.key": "bench",
                    "spark.hadoop.fs.s3a.secret.key": "bench", "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        ss = StreamingSession(embedded_spark(conf={"spark.sql.shuffle.partitions": "2", **settings}))
        modes = {"block": {"ackMode": "block"}, "interval 50ms": {"ackMode": "interval", "blockInterval": "50ms"}}
        for store in ("local", "s3"):
            for name, options in modes.items():
                checkpoint = (tempfile.mkdtemp(prefix="bench-recv-") if store == "local"
                              else f"s3://{BUCKET}/{name.replace(' ', '-')}")
                r = throughput(ss, checkpoint, args.clients, args.records, args.seconds, **options)
                results["throughput"][f"{store} {name}"] = r
                print(f"accepted durably  {store:5} {name:14} {r['recordsPerSecond']:9.0f} records/s  "
                      f"median POST->200 {r['medianAckMs']:6.1f} ms  ({r['requests']} requests, "
                      f"{r['refused']} refused)", flush=True)
    for name, options in {"record": {"ackMode": "record"}, "block": {"ackMode": "block"},
                          "interval 50ms": {"ackMode": "interval", "blockInterval": "50ms"},
                          "interval 500ms": {"ackMode": "interval", "blockInterval": "500ms"}}.items():
        r = latency(ss, tempfile.mkdtemp(prefix="bench-recv-"), args.seconds, **options)
        results["latency"][name] = r
        print(f"latency  {name:14} POST->200 {r['medianAckMs']:6.1f} ms   200->sink median "
              f"{r['medianAckToSinkMs']:6.0f} ms, p90 {r['p90AckToSinkMs']:6.0f} ms  ({r['records']} records)",
              flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "receivers.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
