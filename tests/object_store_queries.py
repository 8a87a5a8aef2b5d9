"""The stateful query the object-store tests run with its input files, its checkpoint and
its file sink on a store (``test_gcs.py``, ``test_azure.py``), compared with Spark's
engine over the same files copied to local disk; ``store_child.py`` runs it in a process
a crash point kills."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
from pyspark.sql import functions as F

from stream_events import comparable

#: per file, (id, second) events: 10-second windows closing as the 10-second watermark passes
FILES = [[(1, 1), (2, 4)], [(3, 12), (4, 3)], [(5, 25)], [(6, 31), (7, 22)], [(8, 47)], [(9, 58), (10, 40)]]


def put(store, root: str, local_root, key: str, rows, order: int) -> None:
    """``<root>/<key>`` on the store and its copy under ``local_root``, the copy's
    modification time the object's plus ``order`` seconds (the order both engines take
    the files in: a store may keep whole seconds)."""
    data = "".join(f'{{"id": {i}, "ts": "2026-01-01 00:{s // 60:02d}:{s % 60:02d}"}}\n' for i, s in rows).encode()
    store.write_bytes(f"{root}/{key}", data)
    modified = store.stat(f"{root}/{key}")[1] / 1000 + order
    local = os.path.join(local_root, key)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    with open(local, "wb") as f:
        f.write(data)
    os.utime(local, (modified, modified))


def windowed_to_parquet(session, source: str, out: str, ckpt: str):
    frame = (session.readStream.format("json").schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
             .load(source).withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()
             .select(F.col("window.start").cast("string").alias("start"), "count"))
    query = (frame.writeStream.format("parquet").outputMode("append").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(out))
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return [json.loads(p.json) for p in query.recentProgress]


def batches_written(read_bytes, out: str, batches: range) -> list:
    """The rows of the files each ``_spark_metadata/N`` commits, per batch."""
    found = []
    for n in batches:
        lines = read_bytes(f"{out}/_spark_metadata/{n}").decode().split("\n")
        assert lines[0] == "v1"
        rows = []
        for line in lines[1:]:
            if line:
                rows += pq.read_table(io.BytesIO(read_bytes(json.loads(line)["path"]))).to_pylist()
        found.append(sorted((r["start"], r["count"]) for r in rows))
    return found


def local_bytes(path: str) -> bytes:
    with open(path.replace("file://", ""), "rb") as f:
        return f.read()


def check_windowed_count(ss, spark, store, root: str, tmp_path) -> None:
    """The query with input, checkpoint and sink under ``root`` on ``store`` equals Spark's
    engine over local copies batch by batch (rows written, progress); a restart on the
    same checkpoint takes the new files only; the sink holds only what its log commits."""
    for i, rows in enumerate(FILES[:4]):
        put(store, root, tmp_path / "copy", f"raw/f{i}.json", rows, i)
    ours = (f"{root}/raw", f"{root}/out", f"{root}/ckpt")
    theirs = (str(tmp_path / "copy" / "raw"), str(tmp_path / "spark-out"), str(tmp_path / "spark-ckpt"))
    our_progress = windowed_to_parquet(ss, *ours)
    their_progress = windowed_to_parquet(spark, *theirs)
    assert comparable(our_progress) == comparable(their_progress)
    assert our_progress[0]["sources"][0]["metrics"]["readPath"] == "pythonTasks"
    first = range(len(their_progress))
    assert batches_written(store.read_bytes, ours[1], first) == batches_written(local_bytes, theirs[1], first)

    # the state and the logs are on the store; a restart on the same checkpoint takes the new files only
    assert store.exists(f"{root}/ckpt/state/0/_metadata/schema")
    assert store.exists(f"{root}/ckpt/commits/{len(first) - 1}")
    for i, rows in enumerate(FILES[4:], start=4):
        put(store, root, tmp_path / "copy", f"raw/f{i}.json", rows, i)
    our_progress = windowed_to_parquet(ss, *ours)
    their_progress = windowed_to_parquet(spark, *theirs)
    assert comparable(our_progress) == comparable(their_progress)
    assert sum(p["numInputRows"] for p in our_progress) == 3
    later = range(len(first), len(first) + len(their_progress))
    written = batches_written(store.read_bytes, ours[1], later)
    assert written == batches_written(local_bytes, theirs[1], later)
    assert [row for batch in written for row in batch], "no window closed after the restart: nothing compared"
    # every data object of the sink is one its log commits: nothing staged or left behind
    committed = {json.loads(line)["path"] for n in range(later.stop)
                 for line in store.read_text(f"{ours[1]}/_spark_metadata/{n}").split("\n")[1:] if line}
    data = {k for k in store.find(ours[1]) if "/_spark_metadata/" not in k and "/_microbatch_attempts/" not in k}
    assert data == committed


def check_sigkill_mid_batch(ss, spark, store, root: str, settings: dict, tmp_path) -> None:
    """The query's process group (driver, JVM, Python workers) killed with SIGKILL at a
    step of a batch with everything under ``root``: in a task after a state version is
    written, after the file sink's data objects are in place and before its commit, and
    after the commit log's entry; each restart goes on from the checkpoint on the store,
    and the sink then holds what Spark's engine writes for the same files uninterrupted,
    each window once."""
    for i, rows in enumerate(FILES):
        put(store, root, tmp_path / "copy", f"kill/raw/f{i}.json", rows, i)
    ours = (f"{root}/kill/raw", f"{root}/kill/out", f"{root}/kill/ckpt")
    child = os.path.join(os.path.dirname(__file__), "store_child.py")
    for step in ("state-delta-written:3", "sink-data-written:2", "commit-written:2"):
        env = dict(os.environ, MICROBATCH_CRASH_AT=step, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
        with open(tmp_path / "child.log", "a") as log:
            done = subprocess.run([sys.executable, child, *ours, json.dumps(settings)], env=env,
                                  stdout=subprocess.PIPE, stderr=log, text=True, timeout=300, start_new_session=True)
        assert done.returncode == -9 and "DONE" not in done.stdout, (step, done.returncode, tmp_path / "child.log")
    # One more file, whose batch and the batch without data after it close the windows the
    # others left open: a run that restarts after its last data batch's commit runs no batch
    # without data (Spark's engine neither: it has no last execution to ask), so the windows
    # that batch would have closed wait for new data on both engines.
    put(store, root, tmp_path / "copy", f"kill/raw/f{len(FILES)}.json", [(11, 75)], len(FILES))
    windowed_to_parquet(ss, *ours)
    theirs = (str(tmp_path / "copy" / "kill" / "raw"), str(tmp_path / "spark-out"), str(tmp_path / "spark-ckpt"))
    their_progress = windowed_to_parquet(spark, *theirs)
    # (the batch ids may differ: a restart plans a batch without data where a run would not)
    committed = max(int(n) for n in store.list(f"{ours[1]}/_spark_metadata") if n.isdigit())
    assert store.exists(f"{ours[2]}/commits/{committed}")
    ours_written = [r for batch in batches_written(store.read_bytes, ours[1], range(committed + 1)) for r in batch]
    theirs_written = [r for batch in batches_written(local_bytes, theirs[1], range(len(their_progress)))
                      for r in batch]
    assert sorted(ours_written) == sorted(theirs_written), (ours_written, theirs_written)
    assert len(ours_written) == len(set(ours_written)) == 6, ours_written


def check_two_writers(store, other, root: str) -> None:
    """Two writers of one log entry through the store's conditional create: one wins, the
    other's create is refused, and a create of the winner's own content reads back as its."""
    assert store.create(f"{root}/race/offsets/0", "first") is True
    assert other.create(f"{root}/race/offsets/0", "second") is False
    assert other.create(f"{root}/race/offsets/0", "first") is True    # (its own create, read back)
    assert store.read_text(f"{root}/race/offsets/0") == "first"


def check_sink_output_read_through_its_log(ss, store, root: str, tmp_path) -> None:
    """A stream over a file sink's output on the store lists it through the sink's log, as
    Spark's file source does (tests/test_file_source.py checks the same on local disk):
    the files of the sink's committed batches, in their order, one a batch under
    ``maxFilesPerTrigger``; an object the log does not commit (a copy under another name, a
    partition directory written beside it) is never read; ``cleanSource`` is refused there
    with Spark's words."""
    from pyspark.errors import StreamingQueryException

    from file_inputs import write_json_files
    from microbatch.sinks.memory import MemorySink

    rows = write_json_files(tmp_path / "sunk-in", 0, 3)
    out = f"{root}/sunk"
    query = (ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(str(tmp_path / "sunk-in"))
             .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "sunk-ckpt"))
             .trigger(availableNow=True).start(out))
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    committed = [json.loads(line)["path"] for n in range(3)
                 for line in store.read_text(f"{out}/_spark_metadata/{n}").split("\n")[1:] if line]
    assert len(committed) == 3, committed
    store.write_bytes(f"{out}/part-stray.parquet", store.read_bytes(committed[0]))
    store.write_bytes(f"{out}/k=stray/part-0.parquet", store.read_bytes(committed[1]))

    frame = ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).parquet(out)
    sink = MemorySink(frame._session.spark, frame.schema, "append")
    reading = (frame.writeStream.sink(sink).option("checkpointLocation", str(tmp_path / "reader-ckpt"))
               .trigger(availableNow=True).start())
    reading.awaitTermination(120)
    assert reading.exception() is None, reading.exception()
    assert sorted(r["id"] for r in sink.all_data()) == sorted(r["id"] for r in rows)
    progress = [json.loads(p.json) for p in reading.recentProgress]
    assert [p["numInputRows"] for p in progress if p["numInputRows"]] == [3, 3, 3]
    source_log = [json.loads(f.read_text().splitlines()[-1])["path"]
                  for f in sorted((tmp_path / "reader-ckpt" / "sources" / "0").iterdir(), key=lambda f: int(f.name))]
    assert source_log == committed    # the log's files, in its order, each a batch

    cleaning = (ss.readStream.schema("id INT, name STRING").option("cleanSource", "delete").parquet(out)
                .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cleaning-ckpt"))
                .trigger(availableNow=True).start())
    try:
        cleaning.awaitTermination(120)
    except StreamingQueryException as e:
        assert "Cleaning up source files is not supported" in str(e)
    else:
        raise AssertionError("cleanSource on a file sink's output ran")
    assert store.exists(committed[0])


def check_metadata_read_in_tasks(ss, spark, store, root: str, tmp_path) -> None:
    """``_metadata`` of parquet files read in Python tasks (no connector for the store here)
    equals what Spark's engine gives over local copies with the same modification times,
    batch by batch: name, size, block, modification time and each row's index, read
    directly, under a watermark and in a filter; the path is the store's URI. json files
    there are refused when the query starts, naming the format and what gives it."""
    import pyarrow as pa
    from pyspark.errors import StreamingQueryException

    from helpers import collect_batches

    local = tmp_path / "meta-copy"
    local.mkdir()
    for i in range(3):
        table = pa.table({"id": pa.array(range(i * 10, i * 10 + 3 + i), pa.int32()),
                          "ts": pa.array([1_767_225_600_000_000 + i * 1_000_000] * (3 + i), pa.timestamp("us"))})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=2)     # (row indexes across row groups)
        data = sink.getvalue().to_pybytes()
        store.write_bytes(f"{root}/meta/raw/f{i}.parquet", data)
        modified_ns = store.stat(f"{root}/meta/raw/f{i}.parquet")[1] * 1_000_000
        (local / f"f{i}.parquet").write_bytes(data)
        os.utime(local / f"f{i}.parquet", ns=(modified_ns, modified_ns))

    def fields(row):
        m = row["_metadata"]
        return (row["id"], m["file_name"], m["file_size"], m["file_block_start"], m["file_block_length"],
                m["file_modification_time"], m["row_index"])

    def batches(session, path, ckpt, step):
        frame = (session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).parquet(path))
        found, _ = collect_batches(step(frame), ckpt, "append",
                                   rows=lambda df: sorted(fields(r) for r in df.collect()))
        return found

    steps = {"direct": lambda f: f.select("id", "_metadata"),
             "watermark": lambda f: f.withWatermark("ts", "1 minute").select("id", "_metadata"),
             "filter": lambda f: f.where(F.col("_metadata.row_index") >= 1).select("id", "_metadata")}
    for name, step in steps.items():
        ours = batches(ss, f"{root}/meta/raw", tmp_path / f"meta-{name}", step)
        theirs = batches(spark, str(local), tmp_path / f"spark-meta-{name}", step)
        assert ours == theirs, (name, ours, theirs)
        assert len(ours) == 3 and all(rows for _, rows in ours), (name, ours)
    frame = ss.readStream.schema("id INT, ts TIMESTAMP").parquet(f"{root}/meta/raw").select("_metadata.file_path")
    paths, _ = collect_batches(frame, tmp_path / "meta-paths", "append", rows=lambda df: sorted(df.collect()))
    assert {r["file_path"] for _, rows in paths for r in rows} == {f"{root}/meta/raw/f{i}.parquet" for i in range(3)}

    store.write_bytes(f"{root}/meta/json/a.json", b'{"id": 1}\n')
    query = (ss.readStream.schema("id INT").json(f"{root}/meta/json").select("id", "_metadata.file_name")
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "meta-json"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except StreamingQueryException as e:
        assert "hidden column _metadata is available for parquet files only" in str(e), str(e)
    else:
        raise AssertionError("_metadata of json files read in tasks ran")
