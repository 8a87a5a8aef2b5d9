"""Seeded chaos: SIGKILL streaming queries at random moments, then check exactly-once.

    python -m microbatch.testing.chaos [--kills 100] [--seed 7] [--kinds stateless,stateful,foreach,delta]
                                       [--workdir DIR] [--faults]

For each pipeline kind the runner feeds json input files, starts the query in a child
process of its own process group (the Python driver, Spark's JVM and its Python
workers), kills the whole group with SIGKILL at a random moment, feeds more input and
starts it again, ``--kills`` times. Then it lets the query finish in its own process
(``availableNow``) and checks the output against vanilla Spark batch reads of all the
input: nothing lost, nothing twice, aggregates equal. It prints every kill (which run,
how long after start, where it landed in the batch protocol), the restarts, rows in and
out, and exits non-zero when a pipeline's output is wrong. The kinds run side by side,
each in its own directory under ``--workdir``; a seed repeats the same kills' moments
(as far as a machine's speed lets a moment land in the same place).

The pipeline kinds (every one reads json files, ``maxFilesPerTrigger`` 1):

- ``stateless``: filter and project into the file sink (parquet); ``cleanSource``
  archives the files of committed batches.
- ``stateful``: an event-time window count with a watermark, append mode, into the file
  sink; state snapshots and cleanup every few versions.
- ``foreach``: a running count per key, update mode, into ``foreachBatch`` writing an
  idempotent table (each batch overwrites its own ``batch=<id>`` directory).
- ``delta``: filter and project into the Delta sink; the table is read back by
  ``deltalake`` and by DuckDB's delta extension, which must agree.

``--kinds receiver`` (not in the default set) has no input files: an ``http`` source
(docs/receivers.md) into the file sink, while three client threads keep POSTing numbered
records and retry every request (with its ``Idempotency-Key``) until it is answered 200,
across the kills. At the end the clients stop, their last requests are answered, and
every record answered 200 must be in the sink once (``rows in``: records acknowledged).

``--kinds kafka`` (not in the default set): the json files into the Kafka sink's
exactly-once mode on a broker the runner starts; every input row must be in the topic once.

``--faults`` fails the infrastructure too (docs/faults.md): the checkpoints of the
stateless, stateful and foreach kinds go to S3 behind a seeded fault proxy (errors,
resets, short outages), and the kafka kind's broker sits behind one that goes down for
0.5-2.5 s every 5-15 s.

The children run with small log retention, compaction intervals and snapshot
intervals, so that a run of a few batches passes through every step of the protocol.
The same children serve the crash-at-every-step test (``MICROBATCH_CRASH_AT``, see
``microbatch.crash_points``).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

KINDS = ("stateless", "stateful", "foreach", "delta")
#: every kind ``--kinds`` takes: the default ones and ``receiver`` (clients of an http source)
ALL_KINDS = KINDS + ("receiver", "kafka")
ROWS_PER_FILE = 10
#: Confs of the children: small retention and intervals, so a few batches reach every
#: protocol step (log purge and compaction, state snapshots and cleanup).
CHILD_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.sql.streaming.minBatchesToRetain": "3",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
    "spark.sql.streaming.fileSink.log.compactInterval": "3",
    "spark.sql.streaming.fileSource.log.compactInterval": "3",
    # a JVM that lives for seconds starts faster with the client compiler only
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
_BASE_MTIME = 1_700_000_000


# -- input -----------------------------------------------------------------------
def feed(root: str, first: int, count: int) -> int:
    """Write input files ``first``..``first+count-1``; return the next file number.
    File i holds ids ``i*1000 ..`` with event times ``i*10 ..`` seconds, so event time
    never goes back across files (no row is late), and modification time ``base + i``
    so files are taken in order."""
    directory = os.path.join(root, "in")
    os.makedirs(directory, exist_ok=True)
    for i in range(first, first + count):
        rows = [{"id": i * 1000 + j, "name": f"k{(i + j) % 5}", "ts": i * 10 + j}
                for j in range(ROWS_PER_FILE)]
        path = os.path.join(directory, f"f{i:05d}.json")
        tmp = os.path.join(directory, f".f{i:05d}.json.tmp")
        with open(tmp, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(tmp, (_BASE_MTIME + i, _BASE_MTIME + i))
        os.replace(tmp, path)
    return first + count


# -- the pipelines ---------------------------------------------------------------
def writer(ss, kind: str, root: str):
    """The query of ``kind`` on ``root`` (in/, archive/, out/, ckpt/), not started."""
    from pyspark.sql import functions as F
    if kind == "receiver":   # the port is chosen once per chain (``receiver_url``)
        with open(os.path.join(root, "port")) as f:
            port = int(f.read())
        return (ss.readStream.format("http").schema("id INT, client INT").option("port", port)
                .option("maxRecordsPerTrigger", 50).load()
                .writeStream.format("parquet").option("path", os.path.join(root, "out"))
                .option("checkpointLocation", os.path.join(root, "ckpt")))
    reader = ss.readStream.format("json").schema("id INT, name STRING, ts LONG") \
        .option("maxFilesPerTrigger", 1)
    if kind == "kafka":
        return kafka_writer(reader.load(os.path.join(root, "in")), root)
    if kind == "stateless":
        reader = reader.option("cleanSource", "archive") \
            .option("sourceArchiveDir", os.path.join(root, "archive"))
    frame = reader.load(os.path.join(root, "in"))
    out, ckpt = os.path.join(root, "out"), checkpoint_location(kind, root)
    if kind in ("stateless", "delta"):
        return (frame.where("id % 3 != 0").withColumn("label", F.concat_ws("-", "name", "id"))
                .writeStream.format("parquet" if kind == "stateless" else "delta")
                .option("path", out).option("checkpointLocation", ckpt))
    if kind == "stateful":
        counts = (frame.withColumn("event", F.timestamp_seconds("ts")).withWatermark("event", "0 seconds")
                  .groupBy(F.window("event", "50 seconds"), "name").count()
                  .select(F.col("window.start").alias("start"), "name", "count"))
        return (counts.writeStream.format("parquet").outputMode("append")
                .option("path", out).option("checkpointLocation", ckpt))
    if kind == "foreach":
        def write_batch(df, batch_id):   # idempotent: a re-run batch overwrites its own directory
            df.write.mode("overwrite").parquet(os.path.join(out, f"batch={batch_id}"))
        return (frame.groupBy("name").count().writeStream.outputMode("update")
                .foreachBatch(write_batch).option("checkpointLocation", ckpt))
    raise ValueError(f"unknown pipeline kind {kind!r}; one of {', '.join(KINDS)}")


def _all_input(spark, root: str):
    """Every input row, read by plain Spark batch (archived files included)."""
    schema = "id INT, name STRING, ts LONG"
    frame = spark.read.schema(schema).json(os.path.join(root, "in"))
    archive = os.path.join(root, "archive")
    if os.path.isdir(archive):
        frame = frame.unionByName(spark.read.schema(schema).option("recursiveFileLookup", "true")
                                  .option("pathGlobFilter", "*.json").json(archive))
    return frame


def expected_and_actual(spark, kind: str, root: str) -> tuple[collections.Counter, collections.Counter, int]:
    """(expected output rows, output rows, input rows), rows as tuples, by vanilla Spark
    batch reads of the input and of the output."""
    from pyspark.sql import functions as F
    out = os.path.join(root, "out")
    if kind == "kafka":
        return _kafka_expected_and_actual(spark, root)
    if kind == "receiver":   # every record the clients were answered 200 for, once
        with open(os.path.join(root, "acked.json")) as f:
            acked = collections.Counter((i,) for i in json.load(f))
        return acked, collections.Counter(tuple(r) for r in spark.read.parquet(out).select("id").collect()), \
            sum(acked.values())
    source = _all_input(spark, root)
    rows_in = source.count()
    if kind == "delta":
        expected = source.where("id % 3 != 0").withColumn("label", F.concat_ws("-", "name", "id"))
        return (collections.Counter(tuple(r) for r in expected.select("id", "name", "ts", "label").collect()),
                _delta_rows(out), rows_in)
    if kind == "stateless":
        expected = source.where("id % 3 != 0").withColumn("label", F.concat_ws("-", "name", "id")) \
            .select("id", "name", "ts", "label")
        actual = spark.read.parquet(out).select("id", "name", "ts", "label")
    elif kind == "stateful":
        # append mode emits a window once the final watermark (the newest event time) passed its end
        newest = source.agg(F.max("ts")).first()[0]
        expected = (source.groupBy(F.window(F.timestamp_seconds("ts"), "50 seconds"), "name").count()
                    .where(F.col("window.end") <= F.timestamp_seconds(F.lit(newest)))
                    .select(F.col("window.start").alias("start"), "name", "count"))
        actual = spark.read.parquet(out).select("start", "name", "count")
    else:
        expected = source.groupBy("name").count()
        # the table's answer: each key's row from the newest batch that updated it
        batches = spark.read.parquet(out)
        newest = batches.groupBy("name").agg(F.max("batch").alias("batch"))
        actual = batches.join(newest, ["name", "batch"]).select("name", "count")
    return (collections.Counter(tuple(r) for r in expected.collect()),
            collections.Counter(tuple(r) for r in actual.collect()), rows_in)


def _delta_rows(table: str) -> collections.Counter:
    """The Delta table's rows read by ``deltalake``; by DuckDB's delta extension too, when
    it is installed (a second reader: delta-kernel), which must read the same."""
    import glob
    import site

    from deltalake import DeltaTable
    found = collections.Counter((r["id"], r["name"], r["ts"], r["label"])
                                for r in DeltaTable(table).to_pyarrow_table().to_pylist())
    extensions = glob.glob(os.path.join(site.getsitepackages()[0],
                                        "duckdb_ext/extensions/v*/*/delta.duckdb_extension"))
    if extensions:
        import duckdb
        con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
        con.execute(f"LOAD '{extensions[0]}'")
        by_duckdb = collections.Counter(con.execute(
            f"SELECT id, name, ts, label FROM delta_scan('{table}')").fetchall())
        if by_duckdb != found:
            raise AssertionError(f"deltalake and DuckDB read the Delta table at {table} differently")
    return found


def finish(ss, kind: str, root: str) -> None:
    """Run the query on ``root`` to the end of its input in this process."""
    if kind == "receiver":
        _finish_receiver(ss, root)
        return
    # the backlog the kills left (1-3 files fed after each, a batch each) is run here,
    # slowly under --faults: wait for it, then fail loudly rather than check a half-run
    pending = len([n for n in os.listdir(os.path.join(root, "in")) if not n.startswith(".")]) \
        if os.path.isdir(os.path.join(root, "in")) else 0
    timeout = max(600, 15 * pending)
    query = writer(ss, kind, root).trigger(availableNow=True).start()
    query.awaitTermination(timeout)
    if query.exception() is not None:
        raise query.exception()
    if query.isActive:
        query.stop()
        raise RuntimeError(f"the {kind} query's last run (availableNow, in the runner) did not reach "
                           f"the end of its input within {timeout} s: its output is not checked")


#: the clients of each ``receiver`` chain, by root, from its first run to ``finish``
_SENDERS: dict[str, list] = {}


def _receiver_url(root: str) -> str:
    """The chain's port, chosen once: every run listens where the clients send."""
    import socket
    path = os.path.join(root, "port")
    if not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(path, "w") as f:
            f.write(str(port))
    with open(path) as f:
        return f"http://127.0.0.1:{int(f.read())}/"


def _finish_receiver(ss, root: str) -> None:
    """Run the query here while the clients stop (their last requests are answered), then
    until every logged record is in the sink; the acknowledged ids go to acked.json."""
    from microbatch.testing.ingest_clients import stop_senders
    query = writer(ss, "receiver", root).start()
    try:
        acked = stop_senders(_SENDERS.pop(root))
        query.processAllAvailable()
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()
    with open(os.path.join(root, "acked.json"), "w") as f:
        json.dump(acked, f)


# -- the child process -----------------------------------------------------------
def child_main(kind: str, root: str) -> None:
    from microbatch import StreamingQueryListener, StreamingSession, crash_points

    class PrintProgress(StreamingQueryListener):
        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            print(f"PROGRESS {event.progress['batchId']}", flush=True)

        def onQueryTerminated(self, event) -> None:
            pass

    crash_points.arm()
    ss = StreamingSession(conf={**CHILD_CONF, **s3_settings()})
    ss.streams.addListener(PrintProgress())
    query = writer(ss, kind, root).trigger(processingTime="100 milliseconds").start()
    print("STARTED", flush=True)
    query.awaitTermination()


class Child:
    """``child_main`` in a process group of its own; lines it prints arrive in ``lines``."""

    def __init__(self, kind: str, root: str, crash_at: str | None = None):
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
        env.pop("MICROBATCH_CRASH_AT", None)
        if crash_at:
            env["MICROBATCH_CRASH_AT"] = crash_at
        self.log = open(os.path.join(root, "child.log"), "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "microbatch.testing.chaos", "--child", kind, root],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.lines.get(timeout=0.2).startswith(prefix):
                    return
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the child exited ({self.proc.returncode}) before {prefix!r}; "
                                       f"see {self.log.name}") from None
        raise RuntimeError(f"no {prefix!r} from the child in {timeout} s; see {self.log.name}")

    def wait_killed(self, timeout: float) -> int:
        """Wait for the child to die (a crash point kills it); its return code."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the child was not killed within {timeout} s; see {self.log.name}") from None
        code = self.proc.returncode
        self.kill()
        return code

    def kill(self) -> None:
        """SIGKILL the whole group and wait until every process of it is gone."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                self.log.close()
                return
            time.sleep(0.05)
        raise RuntimeError("processes of the killed child survived SIGKILL")


# -- where a kill landed ---------------------------------------------------------
def _ids(directory: str) -> set[int]:
    try:
        return {int(n.split(".")[0]) for n in os.listdir(directory) if n.split(".")[0].isdigit()}
    except FileNotFoundError:
        return set()


#: Where a kill can land, as the checkpoint shows it afterwards.
BETWEEN_BATCHES = "between batches (commits/N is the last entry)"
PLANNED = "in a batch: offsets/N written, sink not committed"
SINK_COMMITTED = "in a batch: sink committed, commits/N not written"
NOTHING_YET = "before the first batch was planned"


def landing(kind: str, root: str) -> tuple[str, int]:
    """Where in the batch protocol the last kill landed, and the batch."""
    offsets = max(_checkpoint_ids(kind, root, "offsets"), default=-1)
    commits = max(_checkpoint_ids(kind, root, "commits"), default=-1)
    if offsets < 0:
        return NOTHING_YET, -1
    if offsets == commits:
        return BETWEEN_BATCHES, commits
    if kind == "foreach":
        # Spark's writer creates the directory when the job starts, _SUCCESS when it is done
        written = os.path.exists(os.path.join(root, "out", f"batch={offsets}", "_SUCCESS"))
    elif kind == "delta":   # the table's txn of the query has the batch
        written = offsets <= _delta_txn(os.path.join(root, "out"))
    else:
        written = offsets in _ids(os.path.join(root, "out", "_spark_metadata"))
    return (SINK_COMMITTED if written else PLANNED), offsets


def _delta_txn(table: str) -> int:
    """The newest batch id any query committed to the Delta table (its ``txn`` actions), -1 if none."""
    newest = -1
    for path in sorted(os.listdir(os.path.join(table, "_delta_log"))) if os.path.isdir(
            os.path.join(table, "_delta_log")) else []:
        if path.endswith(".json"):
            with open(os.path.join(table, "_delta_log", path)) as f:
                for line in f:
                    if '"txn"' in line:
                        newest = max(newest, int(json.loads(line)["txn"]["version"]))
    return newest


# -- the kafka kind (--kinds kafka) -----------------------------------------------
#: ``kafka``: the json files into the Kafka sink's exactly-once mode (topic ``chaos``, two
#: partitions, on a broker the runner starts: Tansu, behind the fault proxy with
#: ``--faults``); the check reads the topic back: every input row in it once.
KAFKA_ENV = "MICROBATCH_CHAOS_KAFKA"        # the broker's bootstrap servers, for the children
KAFKA_TOPIC = "chaos"


def kafka_writer(frame, root: str):
    from pyspark.sql import functions as F
    return (frame.select(F.to_json(F.struct("id", "name", "ts")).alias("value"))
            .writeStream.format("kafka").option("kafka.bootstrap.servers", os.environ[KAFKA_ENV])
            .option("topic", KAFKA_TOPIC).option("microbatch.exactlyOnce", "true")
            .option("kafka.batch.num.messages", 1)     # the broker's quirk (testing/kafka_broker.py)
            .option("checkpointLocation", os.path.join(root, "ckpt")))


def _kafka_expected_and_actual(spark, root: str) -> tuple[collections.Counter, collections.Counter, int]:
    from microbatch.testing.kafka_broker import KafkaBroker
    source = _all_input(spark, root)
    expected = collections.Counter(tuple(r) for r in source.select("id", "name", "ts").collect())
    broker = KafkaBroker.__new__(KafkaBroker)      # the runner's broker, by its address only
    broker.bootstrap = os.environ[KAFKA_ENV]
    actual = collections.Counter()
    for message in broker.read_all(KAFKA_TOPIC):
        row = json.loads(message.value())
        actual[(row["id"], row["name"], row["ts"])] += 1
    return expected, actual, sum(expected.values())


@contextlib.contextmanager
def kafka_broker(seed: int, faults: bool):
    """The broker of the ``kafka`` kind for the block (behind a fault proxy whose outages,
    0.5-2.5 s every 5-15 s, stay under the sink's timeouts, with ``faults``)."""
    from microbatch.testing.fault_proxy import FaultProxy
    from microbatch.testing.kafka_broker import KafkaBroker, free_port
    port = free_port()
    proxy = FaultProxy(port) if faults else None
    broker = KafkaBroker(port=port, advertised_port=proxy.port if proxy else None)
    stop = threading.Event()
    outages = [0]

    def outage_loop() -> None:
        rng = random.Random(f"{seed}-broker-outages")
        while not stop.wait(rng.uniform(5.0, 15.0)):
            proxy.outage(rng.uniform(0.5, 2.5))
            outages[0] += 1
    thread = threading.Thread(target=outage_loop, daemon=True, name="chaos broker outages")
    try:
        broker.create_topic(KAFKA_TOPIC, 2)
        os.environ[KAFKA_ENV] = broker.bootstrap
        if proxy is not None:
            thread.start()
        yield outages
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(20)
        os.environ.pop(KAFKA_ENV, None)
        broker.close()
        if proxy is not None:
            proxy.close()


# -- faults of the store (--faults) ------------------------------------------------
#: With ``--faults`` these kinds keep their checkpoints on S3: moto's server behind the
#: fault proxy (microbatch.testing.fault_proxy), which fails requests at random (seeded)
#: and goes down for 0.5-2.5 s every few seconds, shorter than the children's retry
#: limits (FAULT_LIMITS), while the SIGKILLs go on. The output stays on local disk.
FAULT_KINDS = ("stateless", "stateful", "foreach")
FAULTS_ENV = "MICROBATCH_CHAOS_S3"          # the children's S3 settings, as JSON
FAULT_BUCKET = "chaos"
FAULT_LIMITS = {"spark.hadoop.fs.s3a.attempts.maximum": "3", "spark.hadoop.fs.s3a.retry.limit": "6",
                "spark.hadoop.fs.s3a.retry.interval": "100ms", "spark.hadoop.fs.s3a.connection.timeout": "5s",
                "spark.hadoop.fs.s3a.connection.establish.timeout": "2s"}


def s3_settings() -> dict[str, str]:
    """The S3 settings ``--faults`` gives every session (none without it)."""
    raw = os.environ.get(FAULTS_ENV)
    return json.loads(raw) if raw else {}


def checkpoint_location(kind: str, root: str) -> str:
    if os.environ.get(FAULTS_ENV) and kind in FAULT_KINDS:
        return f"s3://{FAULT_BUCKET}/{os.path.basename(root)}/ckpt"
    return os.path.join(root, "ckpt")


def _checkpoint_ids(kind: str, root: str, log_name: str) -> set[int]:
    location = checkpoint_location(kind, root)
    if "://" not in location:
        return _ids(os.path.join(location, log_name))
    from microbatch.checkpoint.stores import storage_for
    fs = storage_for(location, s3_settings())
    return {int(n) for n in fs.list(f"{location}/{log_name}") if n.isdigit()}


@dataclass
class StoreFaults:
    proxy: object
    outages: int = 0

    def summary(self) -> str:
        faults = collections.Counter(r.fault for r in self.proxy.requests)
        failed = sum(n for fault, n in faults.items() if fault != "pass")
        return (f"store faults: {failed} of {sum(faults.values())} S3 requests failed "
                f"({', '.join(f'{fault} {n}' for fault, n in sorted(faults.items()) if fault != 'pass')}), "
                f"{self.outages} outages, connections reset {self.proxy.dropped}")


@contextlib.contextmanager
def store_faults(seed: int):
    """moto's S3 behind a seeded fault proxy for the block; the children find its
    settings in ``FAULTS_ENV``."""
    import boto3

    from microbatch.testing.fault_proxy import Fault, FaultProxy
    from microbatch.testing.s3_server import s3_server
    with s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="chaos", aws_secret_access_key="chaos",
                     region_name="us-east-1").create_bucket(Bucket=FAULT_BUCKET)
        with FaultProxy(int(endpoint.rsplit(":", 1)[1]), http=True, seed=seed) as proxy:
            for fault in (Fault.error(503), Fault.error(500), Fault.reset(), Fault.reset_after_forward()):
                proxy.inject(fault, times=None, chance=1 / 64)
            faults = StoreFaults(proxy)
            stop = threading.Event()

            def outages() -> None:
                rng = random.Random(f"{seed}-outages")
                while not stop.wait(rng.uniform(3.0, 10.0)):
                    proxy.outage(rng.uniform(0.5, 2.5))
                    faults.outages += 1
            thread = threading.Thread(target=outages, daemon=True, name="chaos store outages")
            thread.start()
            os.environ[FAULTS_ENV] = json.dumps({
                "spark.hadoop.fs.s3a.endpoint": proxy.url, "spark.hadoop.fs.s3a.access.key": "chaos",
                "spark.hadoop.fs.s3a.secret.key": "chaos", "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
                **FAULT_LIMITS})
            try:
                yield faults
            finally:
                stop.set()
                thread.join(15)
                os.environ.pop(FAULTS_ENV, None)


# -- the runner ------------------------------------------------------------------
@dataclass
class Result:
    kind: str
    kills: list[tuple[int, float, str, int]] = field(default_factory=list)   # (run, s, landing, batch)
    restarts: int = 0
    rows_in: int = 0
    rows_out: int = 0
    missing: int = 0
    twice: int = 0

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.twice == 0


def kill_chain(kind: str, root: str, kills: int, rng: random.Random, log=print) -> Result:
    """Start, kill at a random moment and restart the query of ``kind`` ``kills`` times,
    feeding input between the runs."""
    result = Result(kind)
    if kind == "receiver":
        from microbatch.testing.ingest_clients import start_senders
        _SENDERS[root] = start_senders(_receiver_url(root), 3, rng, time.monotonic() + 600 + 60 * kills)
        next_file = 0
    else:
        next_file = feed(root, 0, 3)
    for run in range(kills):
        child = Child(kind, root)
        try:
            child.wait_for("STARTED", timeout=300)
        except RuntimeError as e:
            log(f"  {kind}: FAILED to start run {run + 1}: {e}")
            child.kill()
            raise
        result.restarts += 1 if run else 0
        started = time.monotonic()
        # a random moment: a quarter of the kills during recovery (the first batch of the
        # run, often a re-run), the rest after 1-3 batches, mid-batch or between batches
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.0, 2.0))
        else:
            for _ in range(rng.randint(1, 3)):
                try:
                    child.wait_for("PROGRESS", timeout=20)
                except RuntimeError:
                    break   # the run has no more input: kill it idle
            time.sleep(rng.uniform(0.0, 0.6))
        child.kill()
        where, batch = landing(kind, root)
        result.kills.append((run, time.monotonic() - started, where, batch))
        log(f"  {kind}: kill {run + 1}/{kills} {time.monotonic() - started:5.2f} s after start, "
            f"batch {batch}: {where}")
        if kind != "receiver":   # the receiver's clients keep sending
            next_file = feed(root, next_file, rng.randint(1, 3))
    result.restarts += 1
    return result


def check(spark, ss, result: Result, root: str) -> Result:
    """Finish the query in this process and compare its output with all the input."""
    finish(ss, result.kind, root)
    expected, actual, result.rows_in = expected_and_actual(spark, result.kind, root)
    result.rows_out = sum(actual.values())
    result.missing = sum((expected - actual).values())
    result.twice = sum((actual - expected).values())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m microbatch.testing.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs per pipeline kind (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"pipeline kinds, of {','.join(ALL_KINDS)} (default {','.join(KINDS)})")
    parser.add_argument("--workdir", default=None, help="where input, output and checkpoints go (default: a temp dir)")
    parser.add_argument("--faults", action="store_true",
                        help=f"also fail the store: the checkpoints of {','.join(FAULT_KINDS)} on S3 behind a "
                        "fault proxy (errors, resets, short outages), seeded (docs/faults.md)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(*args.child)
        return 0
    import tempfile
    seed = args.seed if args.seed is not None else int(time.time())
    workdir = args.workdir or tempfile.mkdtemp(prefix="microbatch-chaos-")
    print(f"chaos: seed {seed}, {args.kills} kills per kind, workdir {workdir}"
          f"{', store faults' if args.faults else ''}", flush=True)
    with contextlib.ExitStack() as stack:
        kinds = set(args.kinds.split(","))
        faults = stack.enter_context(store_faults(seed)) if args.faults and kinds & set(FAULT_KINDS) else None
        broker_outages = (stack.enter_context(kafka_broker(seed, args.faults))
                          if "kafka" in kinds else None)
        code = _run_chains(args, seed, workdir, faults)
        if broker_outages is not None and args.faults:
            print(f"broker faults: {broker_outages[0]} outages", flush=True)
        return code


def _run_chains(args, seed: int, workdir: str, faults: "StoreFaults | None") -> int:
    from microbatch import StreamingSession
    ss = StreamingSession(conf={**{k: v for k, v in CHILD_CONF.items() if not k.startswith("spark.driver")},
                                **s3_settings()})
    kinds = args.kinds.split(",")
    printing = threading.Lock()

    def log(line: str) -> None:     # (one line at a time: print writes a line's text and its end apart)
        with printing:
            print(line, flush=True)
    # the kinds' chains run side by side (each child is a driver, a JVM and workers)
    with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
        chains = {kind: pool.submit(kill_chain, kind, os.path.join(workdir, kind), args.kills,
                                    random.Random(f"{seed}-{kind}"), log)
                  for kind in kinds}
        results, broken = {}, {}
        for kind, chain in chains.items():
            try:
                results[kind] = chain.result()
            except Exception as e:  # noqa: BLE001 - one kind's failure must not hide the others' results
                broken[kind] = e
                print(f"{kind}: FAILED during the kills: {e}", flush=True)
    failed = bool(broken)
    for kind, result in list(results.items()):
        try:
            check(ss.spark, ss, result, os.path.join(workdir, kind))
        except Exception as e:  # noqa: BLE001 - named, and the other kinds still checked
            print(f"{kind}: FAILED at the check: {e}", flush=True)
            failed = True
            continue
        places = collections.Counter(where for _, _, where, _ in result.kills)
        print(f"{kind}: {len(result.kills)} kills, {result.restarts} restarts, rows in {result.rows_in}, "
              f"rows out {result.rows_out}, missing {result.missing}, written twice {result.twice}: "
              f"{'EXACTLY ONCE' if result.ok else 'WRONG'}", flush=True)
        for where, n in places.most_common():
            print(f"    {n:4d} kills {where}", flush=True)
        failed |= not result.ok
    if faults is not None:
        print(faults.summary(), flush=True)
    ss.spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
