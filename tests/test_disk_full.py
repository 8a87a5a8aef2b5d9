"""A local checkpoint on a disk that fills: a real tmpfs the test mounts (the tests run as
root; without the right to mount they are skipped, saying so).

Every write of the storage layer goes to a hidden temporary file first, so a disk that
fills mid-write leaves no partial entry, and the error names the file and ENOSPC. The
query test fills the disk from inside a batch (a task of the batch's first stage) so the
batch's state files fail to write, then fills it before a run starts so its lease cannot
be taken; each time, once space returns, the restart resumes (in the same process: the
failed run's lease, which could not be marked released, does not block it) and the
output equals a run on a roomy disk."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from file_inputs import write_json_files
from microbatch.checkpoint.fs import LOCAL
from microbatch.errors import CheckpointError, StorageFullError


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs at tmp_path/disk, unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):    # CI runs as root here: a skip would hide the disk-full tests
            raise RuntimeError(f"cannot mount a tmpfs to fill a disk: {mounted.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here to fill a disk ({mounted.stderr.strip() or 'mount failed'}); "
                    "these tests need root or CAP_SYS_ADMIN")
    try:
        yield str(disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(directory: str) -> str:
    """Fill the file system of ``directory`` to the last byte; returns the filler's path."""
    filler = os.path.join(directory, "filler")
    with open(filler, "ab", buffering=0) as f:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return filler


def hidden_files(directory: str) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(directory) for n in names if n.startswith(".")]


@pytest.mark.timeout(60)
def test_a_full_disk_fails_each_write_naming_the_file_and_leaves_nothing(small_disk):
    ckpt = os.path.join(small_disk, "ckpt")
    assert LOCAL.create(f"{ckpt}/offsets/0", "v1\n{}\n")
    filler = fill(small_disk)
    for write, path in ((LOCAL.create, f"{ckpt}/offsets/1"), (LOCAL.write, f"{ckpt}/commits/0"),
                        (LOCAL.write_bytes, f"{ckpt}/state/0/0/1.delta.arrow")):
        content = "v1\n" + "x" * 10_000
        with pytest.raises(StorageFullError) as full:
            write(path, content.encode() if write == LOCAL.write_bytes else content)
        assert f"Cannot write '{path}': no space left on its device (ENOSPC" in str(full.value)
        assert "restart the query" in str(full.value) and isinstance(full.value, CheckpointError)
        assert not os.path.exists(path)
    assert hidden_files(ckpt) == []                  # no temporary file left behind
    assert sorted(os.listdir(f"{ckpt}/offsets")) == ["0"]
    os.remove(filler)                                # space returns
    assert LOCAL.create(f"{ckpt}/offsets/1", "v1\n" + "x" * 10_000)
    assert LOCAL.read_text(f"{ckpt}/offsets/1") == "v1\n" + "x" * 10_000


def windowed_counts(ss, src, out, ckpt):
    disk = os.path.dirname(ckpt)

    def fill_when_asked(i):
        """In a task of the batch's first stage: fill the disk when the flag file asks
        (a closure, so the worker gets it by value, not by this module's name)."""
        import os as _os
        if _os.path.exists(_os.path.join(disk, "fill-now")) and not _os.path.exists(_os.path.join(disk, "filler")):
            with open(_os.path.join(disk, "filler"), "ab", buffering=0) as f:
                for chunk in (65536, 4096, 1):
                    try:
                        while True:
                            f.write(b"\0" * chunk)
                    except OSError:
                        pass
        return i
    filling = F.udf(fill_when_asked, "int")
    counts = (ss.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(src)
              .withColumn("id", filling("id"))
              .withColumn("ts", F.timestamp_seconds("id")).withWatermark("ts", "50 seconds")
              .groupBy(F.window("ts", "100 seconds"), "name").count())
    query = (counts.writeStream.format("parquet").outputMode("append").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start(out))
    try:
        query.awaitTermination(180)
    except StreamingQueryException:
        pass
    assert not query.isActive, "the query did not end within its timeout"
    return query


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_a_disk_that_fills_mid_batch_fails_the_query_clearly_and_the_restart_resumes(ss, spark, small_disk, tmp_path):
    src, out, ckpt = str(tmp_path / "in"), str(tmp_path / "out"), os.path.join(small_disk, "ckpt")
    write_json_files(src, 0, 2)
    assert windowed_counts(ss, src, out, ckpt).exception() is None
    committed = sorted(os.listdir(f"{ckpt}/commits"), key=int)

    # 1. the disk fills inside the next batch's job: its state files cannot be written
    write_json_files(src, 2, 2)
    open(os.path.join(small_disk, "fill-now"), "w").close()
    failed = windowed_counts(ss, src, out, ckpt).exception()
    assert failed is not None
    assert "StorageFullError: Cannot write" in str(failed) and f"{ckpt}/state/0/" in str(failed), str(failed)
    assert "(ENOSPC" in str(failed)
    assert sorted(os.listdir(f"{ckpt}/commits"), key=int) == committed     # nothing committed
    assert hidden_files(ckpt) == []                  # no partial file anywhere in the checkpoint
    os.remove(os.path.join(small_disk, "fill-now"))
    os.remove(os.path.join(small_disk, "filler"))    # space returns
    assert windowed_counts(ss, src, out, ckpt).exception() is None
    committed = sorted(os.listdir(f"{ckpt}/commits"), key=int)

    # 2. the disk is full when the next run starts: its lease cannot be taken, and start()
    # says so; nothing of the run is written
    write_json_files(src, 4, 1)
    offsets, leases = sorted(os.listdir(f"{ckpt}/offsets"), key=int), sorted(os.listdir(f"{ckpt}/leases"))
    filler = fill(small_disk)
    with pytest.raises(StorageFullError, match=f"Cannot write '{ckpt}/leases/[0-9]+': no space left"):
        windowed_counts(ss, src, out, ckpt)
    assert sorted(os.listdir(f"{ckpt}/offsets"), key=int) == offsets
    assert sorted(os.listdir(f"{ckpt}/leases")) == leases
    assert hidden_files(ckpt) == []
    os.remove(filler)
    assert windowed_counts(ss, src, out, ckpt).exception() is None
    assert len(os.listdir(f"{ckpt}/commits")) > len(committed)

    # the output equals one run on a roomy disk
    reference = windowed_counts(ss, src, str(tmp_path / "ref_out"), str(tmp_path / "ref_ckpt"))
    assert reference.exception() is None

    def rows(path):
        return sorted((r.window.start, r.name, r["count"]) for r in spark.read.parquet(path).collect())
    assert rows(out) == rows(str(tmp_path / "ref_out")) != []



@pytest.mark.faults
@pytest.mark.timeout(300)
def test_sparks_engine_on_the_same_full_disk(spark, small_disk, tmp_path):
    """The catalogue's column for Spark's engine, run here: the same query, the same disk
    filling inside a batch. Spark's engine fails the batch with
    ``CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT`` (an ``FSError``: no space left on device),
    commits nothing, leaves its state stores' partial temporary files behind (which a
    restart ignores), and resumes once space returns."""
    src, out, ckpt = str(tmp_path / "in"), str(tmp_path / "out"), os.path.join(small_disk, "ckpt")
    write_json_files(src, 0, 2)
    assert windowed_counts(spark, src, out, ckpt).exception() is None
    committed = sorted(n for n in os.listdir(f"{ckpt}/commits") if n.isdigit())
    write_json_files(src, 2, 2)
    open(os.path.join(small_disk, "fill-now"), "w").close()
    failed = windowed_counts(spark, src, out, ckpt).exception()
    assert failed is not None
    assert "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT" in str(failed), str(failed)[:2000]
    assert sorted(n for n in os.listdir(f"{ckpt}/commits") if n.isdigit()) == committed
    left = [f for f in hidden_files(ckpt) if f.endswith(".tmp")]
    assert left and all("/state/0/" in f and ".delta." in f for f in left), left
    os.remove(os.path.join(small_disk, "fill-now"))
    os.remove(os.path.join(small_disk, "filler"))
    assert windowed_counts(spark, src, out, ckpt).exception() is None

    reference = windowed_counts(spark, src, str(tmp_path / "ref_out"), str(tmp_path / "ref_ckpt"))
    assert reference.exception() is None

    def rows(path):
        return sorted((r.window.start, r.name, r["count"]) for r in spark.read.parquet(path).collect())
    assert rows(out) == rows(str(tmp_path / "ref_out")) != []
