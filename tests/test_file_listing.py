"""The file source reads the files Spark 4.3's file source reads for the same directory
layout: side by side with ``spark.readStream`` on nested layouts, with and without
``recursiveFileLookup``, with globs, and Spark's errors for layouts it refuses."""
from __future__ import annotations

import json
import os

import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import functions as F

LAYOUTS = {
    "files in a plain subdirectory": ["a.json", "sub/b.json", "sub/deeper/c.json"],
    "partition directories": ["k=1/a.json", "k=2/b.json"],
    "a plain directory inside a partition": ["k=1/a.json", "k=1/sub/b.json"],
    "a file beside partition directories": ["a.json", "k=1/b.json"],
    "only a plain subdirectory": ["sub/b.json"],
    "hidden and underscore directories": ["a.json", "_tmp/b.json", ".hidden/c.json", "_k=1/d.json"],
}


def make(root, relative_paths):
    for i, relative in enumerate(relative_paths):
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps({"v": i}) + "\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def files_read(session, path, tmp_path, tag, **options):
    frame = (session.readStream.format("json").schema("v INT").options(**options).load(path)
             .withColumn("file", F.input_file_name()))
    rows = []
    query = (frame.writeStream.foreachBatch(lambda df, i: rows.extend(df.collect()))
             .option("checkpointLocation", str(tmp_path / f"ckpt_{tag}")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return frame.columns, sorted((r.file.split("/input/", 1)[1], tuple(r)[1:-1]) for r in rows)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("recursive", [False, True])
def test_listing_matches_sparks_file_source(spark, ss, tmp_path, layout, recursive):
    root = tmp_path / "input"
    make(str(root), LAYOUTS[layout])
    options = {"recursiveFileLookup": "true"} if recursive else {}
    theirs = files_read(spark, str(root), tmp_path, "spark", **options)
    ours = files_read(ss, str(root), tmp_path, "microbatch", **options)
    assert ours == theirs


@pytest.mark.parametrize("pattern", ["*", "*/*.json", "y/*"])
def test_glob_listing_matches_sparks_file_source(spark, ss, tmp_path, pattern):
    root = tmp_path / "input"
    make(str(root), ["x/a.json", "y/b.json", "y/z/c.json"])
    theirs = files_read(spark, f"{root}/{pattern}", tmp_path, "spark")
    ours = files_read(ss, f"{root}/{pattern}", tmp_path, "microbatch")
    assert ours == theirs and ours[1]


def test_conflicting_layouts_fail_as_in_spark(spark, ss, tmp_path):
    for layout, error_class in ((["k=1/a.json", "sub/b.json"], "CONFLICTING_DIRECTORY_STRUCTURES"),
                                (["k=1/j=2/a.json", "k=1/b.json"], "CONFLICTING_PARTITION_COLUMN_NAMES")):
        root = tmp_path / error_class / "input"
        os.makedirs(root)
        for engine, session in (("spark", spark), ("microbatch", ss)):
            # the layout appears after the stream started: the running query fails
            frame = session.readStream.format("json").schema("v INT").load(str(root))
            query = (frame.writeStream.format("noop").option("checkpointLocation", str(root.parent / engine))
                     .trigger(processingTime="50 milliseconds").start())
            make(str(root), layout)
            with pytest.raises(StreamingQueryException) as raised:
                query.awaitTermination(60)
            assert f"[{error_class}]" in raised.value.getMessageParameters()["message"], engine
            for f in layout:
                os.remove(root / f)
        # and at definition, when the files are there already
        make(str(root), layout)
        for session in (spark, ss):
            with pytest.raises(PySparkException, match=error_class):
                session.readStream.format("json").schema("v INT").load(str(root))
