"""Choosing the state store provider with spark.sql.streaming.stateStore.providerClass:
microbatch's default, Spark's names, a user's provider class, and a checkpoint whose
state another provider wrote."""
from __future__ import annotations

import json

import pytest

from helpers import confs

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
DEFAULT = "microbatch.state.map_provider.MapStateStoreProvider"

#: A user's provider: microbatch's map provider that also reports a custom metric, so a
#: test sees from the query's progress that the executors used it.
USER_PROVIDER = '''
import dataclasses
from microbatch.state.map_provider import MapStateStoreProvider


class MarkedProvider(MapStateStoreProvider):
    def get_store(self, version):
        store = super().get_store(version)
        metrics = store.metrics
        store.metrics = lambda: dataclasses.replace(
            metrics(), custom={**metrics().custom, "markedProviderCommits": 1})
        return store
'''


@pytest.fixture
def words(tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / "a.json").write_text("".join(json.dumps({"w": w}) + "\n" for w in "abcab"))
    return str(directory)


def count_words(ss, words, ckpt, provider=None, name="counts"):
    """Run a word count once (AvailableNow) with ``provider`` set (None: unset); its
    last progress."""
    with confs(ss, {PROVIDER_CONF: provider}):
        query = ss.readStream.schema("w STRING").json(words).groupBy("w").count() \
            .writeStream.format("memory").queryName(name).outputMode("complete") \
            .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
        query.awaitTermination(120)
        return query.lastProgress


def recorded_provider(ckpt, batch=0) -> str:
    return json.loads((ckpt / "offsets" / str(batch)).read_text().split("\n")[1])["conf"][PROVIDER_CONF]


def test_default_and_sparks_default_name_mean_microbatchs_provider(ss, words, tmp_path):
    for i, asked in enumerate((None, "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
                               DEFAULT)):
        ckpt = tmp_path / f"ckpt{i}"
        progress = count_words(ss, words, ckpt, asked)
        assert progress.stateOperators[0].numRowsTotal == 3
        assert recorded_provider(ckpt) == DEFAULT
        assert "loadedMapCacheMissCount" in progress.stateOperators[0].customMetrics


def test_a_users_provider_class_runs_on_the_executors_and_is_recorded(spark, ss, words, tmp_path):
    module = tmp_path / "user_providers_for_test.py"
    module.write_text(USER_PROVIDER)
    spark.sparkContext.addPyFile(str(module))     # executors import it from there; so does the driver
    ckpt = tmp_path / "ckpt"
    progress = count_words(ss, words, ckpt, "user_providers_for_test.MarkedProvider")
    operator = progress.stateOperators[0]
    # every state partition (spark.sql.shuffle.partitions = 2) committed through it
    assert operator.customMetrics["markedProviderCommits"] == 2 and operator.numRowsTotal == 3
    assert recorded_provider(ckpt) == "user_providers_for_test.MarkedProvider"
    # restarted without the conf: the checkpoint's provider is used again
    (tmp_path / "in" / "b.json").write_text(json.dumps({"w": "d"}) + "\n")
    progress = count_words(ss, words, ckpt, None, name="counts2")
    assert progress.stateOperators[0].customMetrics["markedProviderCommits"] == 2
    assert progress.stateOperators[0].numRowsTotal == 4 and recorded_provider(ckpt, 1) == \
        "user_providers_for_test.MarkedProvider"
    # asked for another provider than the one that wrote the state: refused, nothing written
    before = sorted(p.name for p in (ckpt / "offsets").iterdir())
    (tmp_path / "in" / "c.json").write_text(json.dumps({"w": "e"}) + "\n")
    with pytest.raises(Exception, match=r"written by the state store provider "
                                        r"user_providers_for_test\.MarkedProvider, but .* is "
                                        r"microbatch\.state\.map_provider\.MapStateStoreProvider"):
        count_words(ss, words, ckpt, DEFAULT, name="counts3")
    assert sorted(p.name for p in (ckpt / "offsets").iterdir()) == before


def test_providers_microbatch_cannot_use_are_clear_errors(ss, words, tmp_path):
    cases = {
        "no_such_module.Provider": r"Cannot load the state store provider 'no_such_module.Provider'.*"
                                   r"cannot be imported",
        "microbatch.state.files.StateFiles": r"is not a subclass of microbatch.state.store.StateStoreProvider",
    }
    for i, (asked, message) in enumerate(cases.items()):
        ckpt = tmp_path / f"ckpt{i}"
        with pytest.raises(Exception, match=message):
            count_words(ss, words, ckpt, asked, name=f"bad{i}")
        assert not (ckpt / "state").exists() and not (ckpt / "offsets" / "0").exists()
