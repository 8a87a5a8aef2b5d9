"""A checkpoint on a real S3 endpoint (moto's server on 127.0.0.1): the logs go through
the storage layer with S3's conditional PUT, a restart resumes, a second run of the same
checkpoint is refused, and bad locations fail at start with nothing written.

Spark here has no hadoop-aws jar, so the query's input and output data stay on local
disk; only the checkpoint is on S3."""
from __future__ import annotations

import json
import logging

import boto3
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from file_inputs import write_json_files
from helpers import confs, wait_for
from microbatch import StreamingSession
from microbatch.checkpoint.fs import ObjectStoreFileSystem
from microbatch.checkpoint.stores import storage_for
from microbatch.checkpoint.run_lease import RunLease
from microbatch.errors import CheckpointError, ConcurrentUpdateError
from microbatch.testing.s3_server import s3_server

BUCKET = "checkpoints"
SECRET = "moto-secret-never-logged"


@pytest.fixture(scope="module")
def s3(spark):
    with s3_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="moto",
                              aws_secret_access_key=SECRET, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        settings = {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.access.key": "moto",
                    "spark.hadoop.fs.s3a.secret.key": SECRET,
                    "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
        with confs(spark, settings):
            yield client, settings


def keys(client, prefix: str) -> list[str]:
    found = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix):] for o in found)


def json_to_parquet(ss, src, out, ckpt):
    query = (ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
             .writeStream.format("parquet").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(out))
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def test_stateless_query_keeps_its_checkpoint_on_s3_and_resumes(ss, spark, s3, tmp_path, caplog):
    client, _ = s3
    src, out = str(tmp_path / "in"), str(tmp_path / "out")
    rows = write_json_files(src, 0, 2)
    ckpt = f"s3a://{BUCKET}/json-to-parquet"
    with caplog.at_level(logging.DEBUG):
        first = json_to_parquet(ss, src, out, ckpt)
    assert SECRET not in caplog.text
    assert first.lastProgress.batchId == 1
    assert keys(client, "json-to-parquet/") == [
        "commits/0", "commits/1", "leases/1", "metadata", "offsets/0", "offsets/1", "progress/0",
        "progress/1", "sources/0/0", "sources/0/1"]
    lease = json.loads(client.get_object(Bucket=BUCKET, Key="json-to-parquet/leases/1")["Body"].read())
    assert lease["runId"] == first.runId and lease["released"] is True
    assert client.get_object(Bucket=BUCKET, Key="json-to-parquet/offsets/1")["Body"].read() \
        .decode().endswith('\n{"logOffset":1}')
    rows += write_json_files(src, 2, 1)
    second = json_to_parquet(ss, src, out, ckpt)
    assert second.id == first.id and [p.batchId for p in second.recentProgress] == [2]
    assert sorted(r.id for r in spark.read.parquet(out).collect()) == sorted(r["id"] for r in rows)


def test_two_writers_of_one_log_entry_cannot_both_win(spark, s3):
    fs = storage_for(f"s3://{BUCKET}/race", {**s3[1]})
    assert isinstance(fs, ObjectStoreFileSystem)
    assert fs.create(f"s3://{BUCKET}/race/offsets/0", "first") is True
    assert fs.create(f"s3://{BUCKET}/race/offsets/0", "second") is False
    assert fs.read_text(f"s3://{BUCKET}/race/offsets/0") == "first"


def test_a_second_run_on_the_same_checkpoint_is_refused(spark, s3):
    """Two runs of one query (two sessions of one application): the second is refused at
    start by the first run's lease on S3, the first goes on; once it stops, a run starts."""
    ckpt = f"s3://{BUCKET}/twice"

    def start():
        return (StreamingSession(spark).readStream.format("rate-micro-batch").option("rowsPerBatch", 10)
                .load().writeStream.format("noop").option("checkpointLocation", ckpt)
                .trigger(processingTime="50 milliseconds").start())
    first = start()
    with pytest.raises(ConcurrentUpdateError, match="Another run of this query is active") as refused:
        start()
    assert first.runId in str(refused.value) and "is running" in str(refused.value)
    batches_after(first, 2)
    assert first.isActive and first.exception() is None
    first.stop()
    again = start()
    batches_after(again, first.lastProgress.batchId + 2)
    again.stop()
    assert again.exception() is None


def batches_after(query, batch_id: int) -> None:
    def reached() -> bool:
        if query.lastProgress and query.lastProgress.batchId >= batch_id:
            return True
        assert query.isActive, query.exception()
        return False
    wait_for(reached, 60, f"batch {batch_id}")


def test_a_run_whose_lease_was_taken_over_is_fenced_before_it_writes(s3):
    """A run on another host stopped renewing its lease (a frozen host) for longer than
    the timeout: a new run takes the lease over, and the old run's next log write is
    refused with a clear error (leases on S3, written with conditional PUTs)."""
    fs = storage_for(f"s3://{BUCKET}/fenced", {**s3[1]})
    old = RunLease(fs, f"s3://{BUCKET}/fenced", "q", "old-run", timeout_ms=1000)
    old.acquire()
    old._stop.set()                          # its heartbeat stops, as on a frozen host
    record = json.loads(fs.read_text(f"s3://{BUCKET}/fenced/leases/1"))
    fs.write(f"s3://{BUCKET}/fenced/leases/1", json.dumps({**record, "host": "elsewhere",
                                                           "heartbeatMs": record["heartbeatMs"] - 5000}))
    old.check()                              # nobody took over yet
    new = RunLease(fs, f"s3://{BUCKET}/fenced", "q", "new-run", timeout_ms=1000)
    new.acquire()
    with pytest.raises(ConcurrentUpdateError, match="took this run's lease over") as fenced:
        old.check()
    assert "new-run" in str(fenced.value)
    new.check()
    refused = RunLease(fs, f"s3://{BUCKET}/fenced", "q", "third-run", timeout_ms=1000)
    with pytest.raises(ConcurrentUpdateError, match="is running"):
        refused.acquire()
    new.release()


def test_bad_locations_fail_at_start_and_write_nothing(ss, s3, tmp_path):
    client, _ = s3
    stream = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    with pytest.raises(CheckpointError, match="bucket 'no-such-bucket' does not exist"):
        stream.writeStream.format("noop").option("checkpointLocation", "s3://no-such-bucket/q").start()
    with pytest.raises(CheckpointError, match="scheme 'nosuch://'"):
        stream.writeStream.format("noop").option("checkpointLocation", "nosuch://x/q").start()
    assert [b["Name"] for b in client.list_buckets()["Buckets"]] == [BUCKET]


def test_unknown_credentials_fail_at_start_without_the_secret(ss, spark, s3):
    with s3_server(authenticate=True) as endpoint:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="admin", aws_secret_access_key="admin",
                     region_name="us-east-1").create_bucket(Bucket="locked")
        overrides = {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.access.key": "nobody",
                     "spark.hadoop.fs.s3a.secret.key": "not-the-secret-" + SECRET}
        with (confs(spark, overrides),
              pytest.raises(CheckpointError, match="access to bucket 'locked' is denied") as raised):
            (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load().writeStream
             .format("noop").option("checkpointLocation", "s3://locked/q").start())
    assert SECRET not in str(raised.value) and "nobody" not in str(raised.value)


def test_credentials_without_write_access_fail_at_start_and_write_nothing(ss, spark, s3):
    """IAM users of the S3 endpoint: one may only read the bucket, one may read and write
    but not delete. Each gets a clear error at start naming the location and the
    permission it lacks; the read-only one leaves the bucket as it was."""
    import json
    with s3_server(authenticate=8) as endpoint:
        admin = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "admin",
                 "aws_secret_access_key": "admin"}
        boto3.client("s3", **admin).create_bucket(Bucket="shared")
        iam = boto3.client("iam", **admin)
        users = {}
        for user, actions in (("reader", ["s3:GetObject", "s3:ListBucket"]),
                              ("writer", ["s3:GetObject", "s3:ListBucket", "s3:PutObject"])):
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="access", PolicyDocument=json.dumps(
                {"Version": "2012-10-17",
                 "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
            users[user] = iam.create_access_key(UserName=user)["AccessKey"]
        expected = {"reader": r"'s3://shared/q': these credentials cannot write to it \(Access Denied\)",
                    "writer": r"'s3://shared/q': these credentials cannot delete objects under it"}
        for user, message in expected.items():
            overrides = {"spark.hadoop.fs.s3a.endpoint": endpoint,
                         "spark.hadoop.fs.s3a.access.key": users[user]["AccessKeyId"],
                         "spark.hadoop.fs.s3a.secret.key": users[user]["SecretAccessKey"]}
            with confs(spark, overrides), pytest.raises(CheckpointError, match=message) as raised:
                (ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load().writeStream
                 .format("noop").option("checkpointLocation", "s3://shared/q").start())
            assert users[user]["SecretAccessKey"] not in str(raised.value)
            listed = [o["Key"] for o in boto3.client(
                "s3", endpoint_url=endpoint, region_name="us-east-1",
                aws_access_key_id=users[user]["AccessKeyId"],
                aws_secret_access_key=users[user]["SecretAccessKey"]).list_objects_v2(
                    Bucket="shared").get("Contents", [])]
            if user == "reader":
                assert listed == []           # nothing written
            else:                             # only the probe, which the error names
                assert len(listed) == 1 and listed[0] in str(raised.value)


def windowed_counts(session, src, out, ckpt):
    counts = (session.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
              .withColumn("ts", F.timestamp_seconds("id")).withWatermark("ts", "50 seconds")
              .groupBy(F.window("ts", "100 seconds"), "name").count())
    query = (counts.writeStream.format("parquet").outputMode("append").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(out))
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return query


def test_stateful_query_keeps_its_state_on_s3(ss, spark, s3, tmp_path):
    """Logs and state files on S3, written by the executors through the same storage layer;
    a restart reads the state back; the output equals a local-checkpoint run's."""
    client, _ = s3
    src = str(tmp_path / "in")
    write_json_files(src, 0, 3)
    ckpt = f"s3://{BUCKET}/windowed"
    windowed_counts(ss, src, str(tmp_path / "out"), ckpt)
    state = keys(client, "windowed/state/")
    assert "0/_metadata/schema" in state and "0/0/1.delta.arrow" in state and "0/1/3.delta.arrow" in state
    write_json_files(src, 3, 3)
    windowed_counts(ss, src, str(tmp_path / "out"), ckpt)
    windowed_counts(ss, src, str(tmp_path / "local_out"), str(tmp_path / "local_ckpt"))

    def rows(out):
        return sorted((r.window.start, r.name, r["count"]) for r in spark.read.parquet(out).collect())
    assert rows(str(tmp_path / "out")) == rows(str(tmp_path / "local_out")) and len(rows(str(tmp_path / "out"))) >= 3
    state_rows = ss.read.format("statestore").load(ckpt).count()
    assert state_rows == ss.read.format("statestore").load(str(tmp_path / "local_ckpt")).count()


def manifest_batches(read_text, path: str, batches: int) -> list[list[str]]:
    """The files each ``_spark_metadata/N`` lists (N < ``batches``), by ``read_text(path)``."""
    out = []
    for n in range(batches):
        lines = read_text(f"{path}/_spark_metadata/{n}").split("\n")
        assert lines[0] == "v1"
        out.append(sorted(json.loads(line)["path"] for line in lines[1:] if line))
    return out


def test_file_sink_on_s3_commits_through_its_manifest_without_renames(ss, spark, s3, tmp_path):
    """The file sink writes to s3:// in place: each batch's files at their final names
    (batch id and attempt in the name), the _spark_metadata entry as the commit. Batch by
    batch, the rows (parquet, partitioned) and the lines (json, csv with a header) are
    those Spark's own engine writes for the same query into a local directory."""
    import io
    import pyarrow.parquet as pq
    client, _ = s3
    src = str(tmp_path / "in")
    write_json_files(src, 0, 3)
    fs = storage_for(f"s3://{BUCKET}/sink", {**s3[1]})
    cases = [("parquet", ["name"], {}), ("json", [], {}), ("csv", [], {"header": "true"})]
    for fmt, partition_by, options in cases:
        theirs, ours = str(tmp_path / f"spark-{fmt}"), f"s3://{BUCKET}/sink/{fmt}"
        for engine, out in ((spark, theirs), (ss, ours)):
            query = (engine.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
                     .writeStream.format(fmt).options(**options).partitionBy(*partition_by)
                     .option("checkpointLocation", str(tmp_path / f"ckpt-{fmt}-{engine is ss}"))
                     .trigger(availableNow=True).start(out))
            query.awaitTermination(120)
            assert query.exception() is None
        mine = manifest_batches(fs.read_text, ours, 3)
        spark_files = manifest_batches(lambda p: open(p).read(), theirs, 3)
        for n, (files, reference) in enumerate(zip(mine, spark_files)):
            assert files and all(f.startswith(ours + "/") and f"-{n}-" in f.rsplit("/", 1)[1] for f in files)
            if fmt == "parquet":
                def rows(paths, read):
                    found = []
                    for p in paths:
                        name = p.split("/")[-2].split("=", 1)[1]
                        found += [(r["id"], name) for r in pq.read_table(io.BytesIO(read(p))).to_pylist()]
                    return sorted(found)
                assert rows(files, fs.read_bytes) == \
                    rows(reference, lambda p: open(p.replace("file://", ""), "rb").read()), n
                assert all(f.endswith(".snappy.parquet") and "/name=n" in f for f in files)
            else:
                def lines(paths, read):
                    return sorted(line for p in paths for line in read(p).splitlines())
                assert lines(files, fs.read_text) == \
                    lines(reference, lambda p: open(p.replace("file://", "")).read()), (fmt, n)
        # every data object is one the manifest lists: nothing was staged or left behind
        data = [k for k in keys(client, f"sink/{fmt}/") if not k.startswith("_spark_metadata/")]
        assert sorted(f"{ours}/{k}" for k in data) == sorted(f for batch in mine for f in batch)


def test_an_interrupted_attempt_on_s3_stays_invisible_and_is_removed(ss, spark, s3, tmp_path):
    """A batch whose job fails after some tasks wrote their files: the files are listed by
    no manifest entry; the restart removes them and writes the batch again, once."""
    import os
    src, flag = str(tmp_path / "in"), str(tmp_path / "fail")
    rows = write_json_files(src, 0, 2, rows_per_file=4)
    out = f"s3://{BUCKET}/interrupted"
    fs = storage_for(out, {**s3[1]})

    endpoint = s3[1]["spark.hadoop.fs.s3a.endpoint"]

    def run():
        def check(i):
            if i == 101 and os.path.exists(flag):     # one row of batch 1, while the flag is up,
                import time as clock                  # fails once the other task wrote its file
                import boto3 as aws
                client = aws.client("s3", endpoint_url=endpoint, aws_access_key_id="moto",
                                    aws_secret_access_key=SECRET, region_name="us-east-1")
                deadline = clock.monotonic() + 60     # (in a Python worker: no tests' helpers there)
                while clock.monotonic() < deadline and not [
                        o for o in client.list_objects_v2(Bucket=BUCKET, Prefix="interrupted/part-")
                        .get("Contents", []) if "-1-" in o["Key"]]:
                    clock.sleep(0.05)
                raise ValueError("injected failure in a task")
            return i
        checked = F.udf(check, "int")
        query = (ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
                 .repartition(2).withColumn("id", checked("id"))
                 .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start(out))
        try:
            query.awaitTermination(120)
        except StreamingQueryException:
            pass
        return query

    open(flag, "w").close()
    assert "injected failure" in str(run().exception())
    assert [k.split("-")[0] for k in keys(s3[0], "interrupted/_microbatch_attempts/")] == ["1"]
    assert fs.list(f"{out}/_spark_metadata") == ["0"]
    committed = manifest_batches(fs.read_text, out, 1)[0]
    orphans = [f"{out}/{k}" for k in keys(s3[0], "interrupted/") if k.startswith("part-")
               and f"{out}/{k}" not in committed]
    assert orphans and all(o.rsplit("/", 1)[1].startswith(("part-00000-1-", "part-00001-1-")) for o in orphans)
    os.remove(flag)
    assert run().exception() is None
    listed = [f for batch in manifest_batches(fs.read_text, out, 2) for f in batch]
    data = [f"{out}/{k}" for k in keys(s3[0], "interrupted/")
            if not k.startswith("_spark_metadata/")]
    assert sorted(data) == sorted(listed)            # the failed attempt's files are gone
    import io
    import pyarrow.parquet as pq
    written = sorted(r["id"] for f in listed for r in pq.read_table(io.BytesIO(fs.read_bytes(f))).to_pylist())
    assert written == sorted(r["id"] for r in rows)


def test_hdfs_is_refused_naming_what_it_would_need():
    """No HDFS here (no libhdfs, no Hadoop installation): a checkpoint or a file path on it
    is refused naming pyarrow's client and what that needs, not a generic scheme error."""
    from microbatch.errors import UnsupportedOperationError
    from microbatch.util import local_path

    with pytest.raises(CheckpointError, match="on HDFS.*libhdfs.*hadoop classpath"):
        storage_for("hdfs://namenode:8020/checkpoints/q")
    with pytest.raises(UnsupportedOperationError, match="HDFS is not supported yet: .*libhdfs"):
        local_path("hdfs://namenode:8020/raw", "file source")


def test_a_file_sinks_output_on_s3_is_read_through_its_log(ss, s3, tmp_path):
    from object_store_queries import check_sink_output_read_through_its_log
    check_sink_output_read_through_its_log(ss, storage_for(f"s3://{BUCKET}/", {**s3[1]}), f"s3://{BUCKET}/logged", tmp_path)
