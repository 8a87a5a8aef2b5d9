"""A stateful checkpoint written under an older Spark line resumes under this one, as
Spark's own engine resumes its checkpoint (docs/spark-versions.md).

The older line runs in its own virtual environment (``make test-versions`` makes
``.venvs/pyspark-3.5``): ``MICROBATCH_OLDER_PYSPARK_PYTHON`` names its interpreter. There,
both engines run the queries of ``upgrade_job.py`` over the first event files, each into
its own checkpoint; here both resume them over the next files. Both engines must agree
batch by batch, before and after the upgrade, and the upgraded run must continue the
older one (batch ids, state: no window counted twice, no duplicate let through).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from upgrade_job import FILES, QUERIES, run_all, write_events

pytestmark = pytest.mark.upgrade


def _older_python() -> str:
    python = os.environ.get("MICROBATCH_OLDER_PYSPARK_PYTHON")
    if not python:
        pytest.fail("MICROBATCH_OLDER_PYSPARK_PYTHON names the interpreter of an older PySpark's virtual "
                    "environment (make test-versions runs this test with .venvs/pyspark-3.5/bin/python)")
    return python


def _on_the_older_line(work: Path, stage: str) -> dict:
    python = _older_python()
    env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    done = subprocess.run([python, str(Path(__file__).with_name("upgrade_job.py")), str(work), stage],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_older_sparks_stateful_checkpoint_resumes_here_as_on_sparks_engine(spark, ss, tmp_path):
    before = _on_the_older_line(tmp_path, "first")
    assert before["failures"] == {"spark": {}, "microbatch": {}}
    assert before["version"].split(".")[:2] != spark.version.split(".")[:2], before["version"]
    for name in QUERIES:   # the older line's two engines agree, and there was state to carry
        assert before["microbatch"][name] == before["spark"][name], name
        assert [b for b, _ in before["spark"][name]][:2] == [0, 1]

    write_events(tmp_path / "events", range(2, 4))
    theirs = run_all(spark, tmp_path / "events", tmp_path / "spark")
    ours = run_all(ss, tmp_path / "events", tmp_path / "microbatch")
    for name in QUERIES:
        assert ours[name] == theirs[name], name
        last = before["spark"][name][-1][0]    # the older run's batches go on
        assert [b for b, _ in theirs[name]][:2] == [last + 1, last + 2], theirs[name]
    assert any(rows for _, rows in theirs["window-count"])
    # the upgraded runs carried the state: the duplicates of earlier rows are dropped, the
    # first window (counted before) is not emitted again
    emitted = [row for _, rows in before["spark"]["window-count"] + theirs["window-count"] for row in rows]
    assert len(emitted) == len(set(emitted))
    kept = [row for _, rows in before["spark"]["dedup"] + theirs["dedup"] for row in rows]
    assert len(kept) == len(set(kept)) == len({row for rows in FILES[:4] for row in rows})
    # the upgraded batches record the confs the older checkpoint fixed, as Spark's engine
    # does (each engine its own state store provider)
    provider = "spark.sql.streaming.stateStore.providerClass"
    for name in QUERIES:
        first = min(b for b, _ in theirs[name])
        ours_conf, their_conf = ({**json.loads((tmp_path / engine / f"ckpt-{name}" / "offsets" / str(first))
                                               .read_text().split("\n")[1])["conf"]}
                                 for engine in ("microbatch", "spark"))
        assert ours_conf.pop(provider) == "microbatch.state.map_provider.MapStateStoreProvider"
        their_conf.pop(provider)
        assert ours_conf == their_conf, name

    # back on the older line: Spark 3.5's engine runs on from the checkpoint 4.3 went on
    # with (these queries' logs and state have one format on both lines); so does microbatch
    back = _on_the_older_line(tmp_path, "back")
    assert back["failures"] == {"spark": {}, "microbatch": {}}
    for name in QUERIES:
        assert back["microbatch"][name] == back["spark"][name], name
        assert back["spark"][name][0][0] == max(b for b, _ in theirs[name]) + 1
