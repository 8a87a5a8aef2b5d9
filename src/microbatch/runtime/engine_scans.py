"""How many times Spark's engine scans each file source in a batch of a query that reads a
file source in more than one place (a stream branched into two paths that join again:
Nexmark q5's ``counts.join(counts.groupBy("window").agg(max("count")))``).

Spark's engine reports a source's ``numInputRows`` as the sum of ``numOutputRows`` over the
scans of the source in its executed plan of the batch (``spark_internals.engine_plan``): a
source scanned in two branches counts twice, a branch whose exchange Spark's optimizer
reused from the other (``ReusedExchange``) not at all. microbatch's batch plan is not
Spark's: its branches are the same batch plan, and Spark's optimizer reuses the exchange
there, where in Spark's engine's plan a v1 source's per-batch projection can keep the
branches apart (q5 straight over a file source: two scans, every batch with rows counted
twice) or not (q5 behind a renaming projection, seed 420: one scan). So the query is built
as Spark's engine builds a batch (every read of a source one stand-in: the source's empty
file relation as a stream's, under the aliasing projection for a v1 source, or for a
source without data in the batch an empty stream's relation; every watermark a
``withWatermark``; a step that occurs in two paths one DataFrame, as the user's code made
it), and Spark's planner gives the number of scans of each source in its plan, once per
run and set of sources without data. ``spark_internals.ScanRowCounter`` counts a source's
rows that many times where microbatch's plan scans it another number of times.

Only where every source is a file source (no other source has a stand-in) and the query
built so reads each source where microbatch's plan does (a step whose template does not
read its input, as an ``applyInPandasWithState``'s, is not Spark's plan): otherwise, and
where Spark's planner refuses the plan, nothing is known and each scan of microbatch's plan
counts once, as before. A source without data in a batch counts no rows, as in Spark's
engine; a batch in which no source has data (a batch for the watermark) reports 0.
"""
from __future__ import annotations

import collections
import logging
from typing import Mapping

from pyspark.sql import DataFrame

from microbatch import spark_internals
from microbatch.plan.logical import PlanNode, StreamingRelation, Watermark, children_replaced
from microbatch.runtime.segments import Placeholder

log = logging.getLogger(__name__)


def _as_stream(plan: PlanNode, stand_ins: Mapping[StreamingRelation, DataFrame]) -> DataFrame:
    """``plan`` as a stream's DataFrame over ``stand_ins``: each node built once (a step that
    occurs in two paths is one DataFrame, with the same attributes in both, as the user's
    code made it), each watermark a ``withWatermark``."""
    built: dict[int, DataFrame] = {}

    def build(node: PlanNode) -> DataFrame:
        if id(node) not in built:
            if isinstance(node, StreamingRelation):
                df = stand_ins[node]
            elif isinstance(node, Watermark):
                df = build(node.child).withWatermark(node.event_time, node.delay)
            else:
                df = children_replaced(node, [Placeholder(build(child)) for child in node.children]).build({})
            built[id(node)] = df
        return built[id(node)]
    return build(plan)


class EngineScans:
    """Spark's engine's scans of the sources of one query run (``of``), for a ``plan`` (the
    user's, before the planner's rewrites) that reads a file source in more than one place."""

    def __init__(self, plan: PlanNode, relations: list[StreamingRelation],
                 empty_inputs: Mapping[StreamingRelation, DataFrame]):
        self._plan = plan
        self._relations = relations
        self._empty_inputs = empty_inputs
        self._reads = collections.Counter(id(n) for n in plan.nodes() if isinstance(n, StreamingRelation))
        self.applies = (any(self._reads[id(r)] > 1 for r in relations)
                        and all(spark_internals.reads_only_files(empty_inputs[r]) for r in relations))
        self._found: dict[frozenset[int], dict[int, int]] = {}

    def of(self, without_data: frozenset[int]) -> dict[int, int]:
        """Per index of a source with data in a batch whose sources ``without_data`` (their
        indexes) have none, how many times Spark's engine's plan of the batch scans it;
        empty where nothing is known."""
        if not self.applies or len(without_data) == len(self._relations):
            return {}
        if without_data not in self._found:
            self._found[without_data] = self._scans(without_data)
        return self._found[without_data]

    def _scans(self, without_data: frozenset[int]) -> dict[int, int]:
        with_data = [i for i in range(len(self._relations)) if i not in without_data]
        try:
            stand_ins = {}
            for i, r in enumerate(self._relations):
                empty = self._empty_inputs[r]
                stand_ins[r] = (spark_internals.empty_stream_stand_in(empty) if i in without_data else
                                spark_internals.streaming_file_stand_in(
                                    empty, aliased=bool(r.provider is not None and r.provider.spark_v1_source)))
            if any(s is None for s in stand_ins.values()):
                return {}
            found = spark_internals.engine_file_scans(_as_stream(self._plan, stand_ins),
                                                      [stand_ins[self._relations[i]] for i in with_data])
        except Exception:  # a plan Spark's planner refuses as a stream's: nothing known
            log.debug("Spark's engine's scans of the sources are not known", exc_info=True)
            return {}
        if found is None or any(read != self._reads[id(self._relations[i])] for (read, _), i in zip(found, with_data)):
            log.debug("Spark's engine's plan of the query does not read its sources as microbatch's does: %s", found)
            return {}
        scans = {i: n for i, (_, n) in zip(with_data, found)}
        log.debug("Spark's engine scans the sources with data %s times a batch (sources %s without)",
                  scans, sorted(without_data))
        return scans
