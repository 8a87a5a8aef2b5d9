"""Google Cloud Storage (fake-gcs-server, a real GCS JSON API endpoint on 127.0.0.1): a
stateful query with its input files, its checkpoint and its file sink on ``gs://``, as
Spark's engine runs it over the same files copied to local disk, batch by batch; a
restart takes only new files; a SIGKILL mid-batch loses and repeats nothing; the logs'
create-if-absent is GCS's ``ifGenerationMatch=0``; bad locations and settings fail at
start naming them. This Spark has no GCS connector: the files are listed through gcsfs
and read and written in Spark tasks (issue 60)."""
from __future__ import annotations

import pytest

from helpers import confs
from microbatch.checkpoint.stores import storage_for
from microbatch.errors import CheckpointError
from microbatch.testing.gcs_server import gcs_server, settings
from object_store_queries import (check_metadata_read_in_tasks, check_sigkill_mid_batch,
                                  check_sink_output_read_through_its_log,
                                  check_two_writers, check_windowed_count)

BUCKET = "lake"


@pytest.fixture(scope="module")
def gcs(spark):
    with gcs_server() as endpoint:
        given = settings(endpoint)
        store = storage_for(f"gs://{BUCKET}/", given)
        store._fs.mkdir(BUCKET)
        with confs(spark, given):
            yield store, given


def test_a_windowed_count_with_input_checkpoint_and_sink_on_gcs_as_spark_runs_it(ss, spark, gcs, tmp_path):
    check_windowed_count(ss, spark, gcs[0], f"gs://{BUCKET}/q", tmp_path)


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_sigkill_mid_batch_on_gcs_loses_and_repeats_nothing(ss, spark, gcs, tmp_path):
    check_sigkill_mid_batch(ss, spark, gcs[0], f"gs://{BUCKET}/killed", gcs[1], tmp_path)


def test_two_writers_of_one_log_entry_cannot_both_win(gcs):
    store, given = gcs
    check_two_writers(store, storage_for(f"gs://{BUCKET}" + "/race", given), f"gs://{BUCKET}")


def test_bad_locations_and_settings_fail_at_start_naming_them(ss, spark, gcs, tmp_path):
    store, _ = gcs
    stream = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    with pytest.raises(CheckpointError, match="bucket 'no-such-bucket' does not exist"):
        stream.writeStream.format("noop").option("checkpointLocation", "gs://no-such-bucket/q").start()
    with confs(spark, {"spark.hadoop.fs.gs.auth.type": "USER_CREDENTIALS"}), \
            pytest.raises(CheckpointError, match="fs.gs.auth.type is 'USER_CREDENTIALS'"):
        stream.writeStream.format("noop").option("checkpointLocation", f"gs://{BUCKET}/bad").start()
    with confs(spark, {"spark.hadoop.fs.gs.auth.type": "SERVICE_ACCOUNT_JSON_KEYFILE"}), \
            pytest.raises(CheckpointError, match="json.keyfile is not set"):
        stream.writeStream.format("noop").option("checkpointLocation", f"gs://{BUCKET}/bad").start()
    assert not store.find(f"gs://{BUCKET}/bad")


def test_a_listing_that_starts_after_a_key(gcs):
    """The listing ``useIncrementalListing`` asks for: GCS's startOffset (inclusive, so the
    start key itself is left out), the objects directly in the directory, its subdirectories
    told apart."""
    store, _ = gcs
    for name in ("a1", "a2", "b1", "sub/c1"):
        store.write_bytes(f"gs://{BUCKET}/listed/{name}", b"x")
    everything, subdirectories = store.files_after(f"{BUCKET}/listed", None)
    assert [k for k, _, _ in everything] == [f"{BUCKET}/listed/{n}" for n in ("a1", "a2", "b1")] and subdirectories
    after, _ = store.files_after(f"{BUCKET}/listed", f"{BUCKET}/listed/a1")
    assert [k for k, _, _ in after] == [f"{BUCKET}/listed/a2", f"{BUCKET}/listed/b1"]
    assert all(size == 1 and modified > 0 for _, size, modified in after)


def test_a_file_sinks_output_is_read_through_its_log(ss, gcs, tmp_path):
    check_sink_output_read_through_its_log(ss, gcs[0], f"gs://{BUCKET}/logged", tmp_path)


def test_metadata_of_parquet_files_read_in_tasks_is_sparks(ss, spark, gcs, tmp_path):
    check_metadata_read_in_tasks(ss, spark, gcs[0], f"gs://{BUCKET}/hidden", tmp_path)
