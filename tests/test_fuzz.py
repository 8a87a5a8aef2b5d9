"""The differential query fuzzer (microbatch.testing.fuzz): generated queries on Spark's
engine and on microbatch, batch by batch, for a bounded time (MICROBATCH_FUZZ_SECONDS,
default 180: seeds 1, 2, ... in order, so a run is reproducible); and the fuzzer finds
each bug planted in microbatch by its test-only hooks (microbatch.testing.plants)."""
from __future__ import annotations

import itertools
import os
import re

import pytest

from microbatch.testing import fuzz

SECONDS = float(os.environ.get("MICROBATCH_FUZZ_SECONDS", "180"))


@pytest.mark.timeout(SECONDS + 300)
def test_generated_queries_run_on_microbatch_as_on_spark(spark, capsys):
    """Four fifths of the budget run seeds, the rest minimises what differs."""
    summary = fuzz.run_seeds(spark, itertools.count(1), seconds=0.8 * SECONDS, minimise_seconds=0, log=None)
    fuzz.minimise_failures(spark, summary, seconds=0.2 * SECONDS)
    with capsys.disabled():
        print("\n" + summary.report())
    assert len(summary.results) >= 5, "the budget ran fewer than 5 queries"
    assert not summary.failures, "\n\n".join(r.report() for r in summary.failures)


#: what a seed's query must contain for a planted bug to show in it
def _joins_with_watermarks(text: str) -> bool:
    return ".join(right" in text and "right.withWatermark" in text and \
        re.search(r"^df = df\.withWatermark", text, re.MULTILINE) is not None


def _stateful_without_join(text: str) -> bool:
    return ("groupBy(" in text or "dropDuplicates" in text) and ".join(" not in text


def _renames_a_watermarked_column(text: str) -> bool:
    lines = text.split("\n")
    marked = [i for i, line in enumerate(lines) if ".withWatermark(" in line]
    return bool(marked) and any(re.search(r'withColumnRenamed\("t|\.alias\("t_', line) for line in lines[marked[0]:]) \
        and ("groupBy(F.window" in text or "session_window" in text or ".join(" in text)


FEATURES = {"join-no-evict": _joins_with_watermarks, "partition-shift": _stateful_without_join,
            "rename-drops-watermark": _renames_a_watermarked_column}


def seeds_for(plant: str, count: int = 8) -> list[int]:
    """The first ``count`` seeds (from 1) whose query has the plant's feature and runs in
    append mode: a fixed list for a fixed grammar."""
    found = []
    for seed in range(1, 5000):
        query = fuzz.generate(seed).query
        if query.mode == "append" and FEATURES[plant](query.text):
            found.append(seed)
            if len(found) == count:
                break
    return found


@pytest.mark.fuzz_plants
@pytest.mark.timeout(600)
@pytest.mark.parametrize("plant", list(FEATURES))
def test_the_fuzzer_finds_a_planted_bug(spark, plant):
    """A seed's query differs with the bug planted in microbatch's runs, and not without it."""
    plants = pytest.importorskip("microbatch.testing.plants",
                                 reason="microbatch has no planted-bug hooks (microbatch.testing.plants)")
    if plant not in plants.PLANTS:
        pytest.skip(f"microbatch has no planted bug {plant!r} (it has {plants.PLANTS})")
    tried = []
    for seed in seeds_for(plant):
        planted = fuzz.run_seeds(spark, [seed], plant=plant, minimise_seconds=0, log=None).results[0]
        tried.append(f"seed {seed}: {planted.status} {planted.aspect}")
        if not planted.failed:
            continue
        clean = fuzz.run_seeds(spark, [seed], minimise_seconds=0, log=None).results[0]
        if not clean.failed:
            print(planted.report())
            return
        tried[-1] += f" (differs without the plant too: {clean.aspect})"
    pytest.fail(f"no seed showed the planted bug {plant!r}:\n" + "\n".join(tried))
