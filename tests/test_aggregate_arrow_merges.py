"""The aggregation's state in Arrow tables with merges in Python (``AggregateTask._merged_with_held``:
max_by, collect_list... whose new keys keep the batch's buffers): keys held across batches,
a null key and a NaN key (a group of its own, as Spark groups NaNs; Python's NaNs are
unequal to each other), batch by batch beside Spark's engine."""
from __future__ import annotations

import json
import os
import time

from pyspark.sql import functions as F

from helpers import collect_batches


def test_null_and_nan_keys_merge_across_batches_as_in_sparks_engine(spark, ss, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    base = time.time() - 1000
    for i in range(3):
        rows = [{"x": "NaN", "v": i, "s": f"a{i}"}, {"x": 1.5, "v": 10 - i, "s": f"b{i}"},
                {"x": None, "v": i, "s": "c"}]
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (base + i, base + i))

    def run(session, name):
        frame = (session.readStream.schema("x DOUBLE, v INT, s STRING").option("maxFilesPerTrigger", 1)
                 .option("allowNonNumericNumbers", True).json(str(directory)))
        return collect_batches(frame.groupBy("x").agg(F.expr("max_by(s, v)"), F.collect_list("v")),
                               tmp_path / name, "update",
                               rows=lambda df: sorted(repr(tuple(r)) for r in df.collect()))[0]
    theirs, ours = run(spark, "spark"), run(ss, "microbatch")
    assert ours == theirs
    assert len(ours) == 3 and all(len(rows) == 3 for _, rows in ours)
