"""microbatch on the PySpark it finds (3.5.x to 4.3.x; ``make test-versions`` runs this
with the differential subset on each older line): the version is the JVM's, what the
running Spark lacks is refused naming the version that has it, a checkpoint a newer Spark
wrote is refused where this Spark would refuse it, and one an older Spark wrote (without
the confs it did not record yet) resumes with the behaviour it had."""
from __future__ import annotations

import json
import os

import pytest
from pyspark.errors import StreamingQueryException

from helpers import collect_batches, confs

from microbatch import spark_internals
from microbatch.errors import UnsupportedOperationError
from microbatch.runtime.confs import CHECKPOINTED_CONFS, LEGACY_VALUES, checkpointed_confs


def test_the_running_version_is_the_jvms(spark):
    version = spark_internals.running_version()
    assert version.text == spark.version
    assert (version.major, version.minor) == tuple(int(p) for p in spark.version.split(".")[:2])


def _use(feature, ss, tmp_path):
    """Calls the public API of ``feature`` on microbatch."""
    frame = ss.readStream.format("rate").load()
    if feature == "named sources (readStream.name)":
        return ss.readStream.name("orders")
    if feature == "metadataColumn":
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / "a.json").write_text('{"a": 1}\n')
        return ss.readStream.schema("a INT").json(str(tmp_path / "in")).metadataColumn("_metadata")
    if feature == "clusterBy":
        return frame.writeStream.clusterBy("value")
    if feature.startswith("the state data source"):
        return ss.read.format("statestore").load(str(tmp_path))
    if feature in ("transformWithState", "transformWithStateInPandas"):
        return getattr(frame.groupBy("value"), feature)(None, "value LONG", "append", "None")
    return None


@pytest.mark.parametrize("feature", sorted(spark_internals.FEATURES))
def test_a_feature_this_spark_lacks_is_refused_naming_the_version_that_has_it(ss, feature, tmp_path):
    needed = spark_internals.FEATURES[feature]
    if spark_internals.running_version().at_least(*needed):
        spark_internals.require(feature)          # (no error where the version has it)
        return
    with pytest.raises(UnsupportedOperationError, match=rf"needs Spark {needed[0]}\.{needed[1]} or later; this "
                                                        rf"session runs Spark {spark_internals.running_version().text}"):
        spark_internals.require(feature)
        _use(feature, ss, tmp_path)
    if feature != "Python data sources":        # (reached through spark.dataSource, which such a Spark lacks)
        with pytest.raises(UnsupportedOperationError, match=f"needs Spark {needed[0]}.{needed[1]}"):
            _use(feature, ss, tmp_path)


def test_the_confs_a_checkpoint_fixes_are_this_versions(spark):
    recorded = checkpointed_confs()
    version = spark_internals.running_version()
    assert set(recorded) <= set(CHECKPOINTED_CONFS)
    for key in CHECKPOINTED_CONFS:
        since = spark_internals.CHECKPOINTED_CONF_SINCE.get(key, (3, 5))
        assert (key in recorded) == version.at_least(*since), key


def test_an_offset_log_of_a_newer_spark_is_refused_with_sparks_reason(ss, tmp_path):
    """An offset log version newer than this Spark reads (v2 before 4.2, v3 on 4.2+) stops
    the query at start with Spark's UnsupportedLogVersion reason; nothing is written."""
    ckpt = tmp_path / "ckpt"
    collect_batches(ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 2).load(), ckpt)
    newer = spark_internals.max_offset_log_version() + 1
    lines = (ckpt / "offsets" / "0").read_text().splitlines()
    (ckpt / "offsets" / "0").write_text("\n".join([f"v{newer}"] + lines[1:]))
    before = sorted(os.listdir(ckpt / "offsets"))
    with pytest.raises((StreamingQueryException, AssertionError),
                       match=rf"maximum supported log version is v{newer - 1}, but encountered v{newer}"):
        collect_batches(ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 2).load(), ckpt)
    assert sorted(os.listdir(ckpt / "offsets")) == before


def test_a_checkpoint_without_the_newer_confs_resumes_with_the_behaviour_it_had(ss, spark, tmp_path):
    """A checkpoint an older Spark wrote lacks the confs it did not record yet: the query
    resumes with the values that mean the behaviour it had (Spark's
    relevantSQLConfDefaultValues), and records them from then on."""
    ckpt = tmp_path / "ckpt"
    frame = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 2).load()
    collect_batches(frame.groupBy((frame.value % 2).alias("k")).count(), ckpt, mode="update")
    lines = (ckpt / "offsets" / "0").read_text().splitlines()
    metadata = json.loads(lines[1])
    dropped = [k for k in ("spark.sql.streaming.stateStore.encodingFormat", "spark.sql.streaming.multipleWatermarkPolicy")
               if k in metadata["conf"]]
    for key in dropped:
        del metadata["conf"][key]
    (ckpt / "offsets" / "0").write_text("\n".join([lines[0], json.dumps(metadata, separators=(",", ":"))] + lines[2:]))
    with confs(spark, {"spark.sql.streaming.multipleWatermarkPolicy": "max"}):
        batches, _ = collect_batches(frame.groupBy((frame.value % 2).alias("k")).count(), ckpt, mode="update")
    assert batches and batches[0][0] == 1
    resumed = json.loads((ckpt / "offsets" / "1").read_text().splitlines()[1])["conf"]
    assert dropped and all(resumed[k] == LEGACY_VALUES[k] for k in dropped)
