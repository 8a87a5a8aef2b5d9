"""Spark's engine's own plan of a stream's batch, read where microbatch's numbers must follow
it: how many times that plan scans each file source (``numInputRows``).

Spark's engine (4.3, ``ProgressContext.extractSourceToNumInputRows``) sums a source's
``numOutputRows`` over the nodes of the batch's executed plan that read it (the
``StreamSourceAwareSparkPlan``s whose stream is the source; ``collect`` does not look under a
``ReusedExchange``, a leaf): a source its plan scans twice counts twice, a scan whose exchange
Spark reused elsewhere once. Whether Spark reuses the exchange of a stream read in two places
(Nexmark q5's shape: counts joined with an aggregation of the same counts) is its optimizer's
doing: MicroBatchExecution puts a v1 source's batch (a file source's) under a projection that
aliases each column of the batch's relation to the stream's, the same projection object
wherever the plan reads the source, and RemoveRedundantAliases drops such an alias on a
join's left side but keeps it on the right side where the left side's output holds the
relation's attribute: the two branches then differ, and each scans the source. microbatch's
batch plan reads its sources as a batch does (no such projection, the reads deduplicated by
the analysis), so Spark's optimizer reuses its exchange there in both cases.

``engine_file_scans`` asks Spark's planner, not a run: the query built over stand-ins of the
sources as Spark's engine builds a batch (``streaming_file_stand_in``), planned as Spark plans
a stream's DataFrame it explains (``IncrementalExecution``), and its file scans counted.
Nothing runs and no query starts."""
from __future__ import annotations

import re
from typing import Any

from microbatch.spark_internals.analysis import analyzed_plan
from microbatch.spark_internals.event_time import newly_marked
from microbatch.spark_internals.jvm import jvm_class
from microbatch.spark_internals.versions import dataframe_of_plan

#: A file scan in a printed physical plan, and the attributes it outputs
_FILE_SCAN = re.compile(r"\bFileScan \S+ \[([^\]]*)\]")
#: A JSON or CSV scan handed a filter that is false (Spark's optimizer folded a filter it
#: knows drops every row, ``lit("u").isin("a", "b")``, into the scan): it returns no row
_NOTHING_SCANNED = re.compile(r"\bFileScan (json|csv) .*\bPushedFilters: \[AlwaysFalse\(\)\]")


def streaming_file_stand_in(df: Any, aliased: bool) -> Any:
    """What stands for a file source in Spark's engine's plan of a batch: the file relation
    of ``df`` (a batch of no files) as a stream's relation, under, where ``aliased`` (a v1
    source's), the projection MicroBatchExecution puts over a batch's relation: each column
    aliased by its own name. One stand-in serves every read of the source, as that projection
    does. None: ``df`` is not a file relation."""
    plan = analyzed_plan(df)
    if plan.getClass().getSimpleName() != "LogicalRelation":
        return None
    relation = jvm_class("org.apache.spark.sql.execution.datasources.LogicalRelation$").apply(plan.relation(), True)
    stream = dataframe_of_plan(df.sparkSession, relation)
    return stream.toDF(*stream.columns) if aliased else stream


def empty_stream_stand_in(df: Any) -> Any:
    """What stands for a source without data in Spark's engine's plan of a batch: an empty
    relation of ``df``'s columns marked as a stream's (MicroBatchExecution's
    ``LocalRelation(output, isStreaming = true)``), one for every read of the source."""
    output = analyzed_plan(df).output()
    name = "org.apache.spark.sql.catalyst.plans.logical.LocalRelation"
    cls = jvm_class(name)
    arity = max(len(c.getParameterTypes()) for c in jvm_class("java.lang.Class").forName(name).getConstructors())
    extra = [jvm_class("scala.None$")] * (arity - 3)   # (4.1+: the stream, an Option)
    relation = cls(output, jvm_class("org.apache.spark.api.python.PythonUtils").toSeq([]), True, *extra)
    return dataframe_of_plan(df.sparkSession, relation.newInstance())


def _relation_ids(stand_in: Any) -> frozenset[int]:
    """The attribute ids of a stand-in's relation (under its projection, if any)."""
    node = analyzed_plan(stand_in)
    while node.children().size() == 1:
        node = node.children().apply(0)
    output = node.output()
    return frozenset(output.apply(i).exprId().id() for i in range(output.size()))


def engine_file_scans(query: Any, stand_ins: list[Any]) -> list[tuple[int, int]] | None:
    """Per stand-in (``streaming_file_stand_in``), in order: how many times ``query`` (a
    stream's DataFrame over them) reads its relation, and how many file scans of it the
    executed plan Spark's engine makes of ``query`` has (its physical plan as ``explain``
    prints a stream's: planned by ``IncrementalExecution``, exchanges reused), but for a
    JSON or CSV scan whose pushed filter is false, which returns no row (a union's input
    whose every row a filter above drops, seed 2100: microbatch's batch plan has no such
    scan, and Spark's engine counts none of its rows). None where a
    scan of the plan cannot be told apart (one that outputs no column, with several
    stand-ins)."""
    ids = [_relation_ids(s) for s in stand_ins]
    reads = [0] * len(stand_ins)
    leaves = analyzed_plan(query).collectLeaves()
    for j in range(leaves.size()):
        output = leaves.apply(j).output()
        found = {output.apply(i).exprId().id() for i in range(output.size())}
        for k, own in enumerate(ids):
            if found and found == own:
                reads[k] += 1
    text = jvm_class("org.apache.spark.sql.api.python.PythonSQLUtils").explainString(
        query._jdf.queryExecution(), "simple")
    scans = [0] * len(stand_ins)
    for line in text.splitlines():
        scan = _FILE_SCAN.search(line)
        if scan is None or _NOTHING_SCANNED.search(line):
            continue   # (a scan that returns no row adds none to Spark's count: not counted)
        found = {int(i) for i in re.findall(r"#(\d+)", scan.group(1))}
        owners = [k for k, own in enumerate(ids) if found & own]
        if not found and "(0 paths)" in line:   # (a scan of no column: a stand-in's, if one only)
            if len(stand_ins) != 1:
                return None
            owners = [0]
        for k in owners:
            scans[k] += 1
    return list(zip(reads, scans))


_DELAY_KEY = "spark.watermarkDelayMs"


def _children(node: Any) -> list:
    children = node.children()
    return [children.apply(i) for i in range(children.size())]


def _attributes(seq: Any) -> list:
    return [seq.apply(i) for i in range(seq.size())]


def _as_engine_batch(node: Any) -> Any:
    """``node`` (a stream's template, analysed as a batch) as Spark's engine has it in a
    batch: each projection that marks an event time (``event_time_marked``) the
    EventTimeWatermark it stands for, each file relation (a v1 source's batch) a new
    instance of it under MicroBatchExecution's projection aliasing each of its columns to
    the stream's attribute (the same id)."""
    to_seq = jvm_class("org.apache.spark.api.python.PythonUtils").toSeq
    name = node.getClass().getSimpleName()
    if name == "LogicalRelation" and node.relation().getClass().getSimpleName() == "HadoopFsRelation":
        fresh = node.newInstance()
        nothing = jvm_class("scala.None$")
        aliases = [jvm_class("org.apache.spark.sql.catalyst.expressions.Alias")(
            new, old.name(), old.exprId(), to_seq([]), nothing, to_seq([]))
            for old, new in zip(_attributes(node.output()), _attributes(fresh.output()))]
        return jvm_class("org.apache.spark.sql.catalyst.plans.logical.Project")(to_seq(aliases), fresh)
    children = [_as_engine_batch(c) for c in _children(node)]
    marked = newly_marked(node, children[0]) if name == "Project" and len(children) == 1 else None
    if marked is not None:
        below = {a.exprId().id(): a for a in _attributes(children[0].output())}
        delay_us = marked.metadata().getLong(_DELAY_KEY) * 1000
        interval = jvm_class("org.apache.spark.unsafe.types.CalendarInterval")(0, 0, delay_us)
        return jvm_class("org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark")(
            jvm_class("java.util.UUID").randomUUID(), below[marked.exprId().id()], interval, children[0])
    return node.withNewChildren(to_seq(children))


def engine_join_event_times(df: Any) -> tuple[str | None, str | None] | None:
    """The watermarked column of each side of the stream-stream join that ``df`` (a join's
    template) ends in, as Spark's engine's join exec finds it in its input (the first
    column marked with a watermark's delay), or None for a side without one; None where
    the join is not found.

    It is not always the mark Spark's analysis shows: MicroBatchExecution puts a v1 source's
    batch under a projection aliasing each column of the batch's relation to the stream's
    attribute, and RemoveRedundantAliases drops those aliases, giving every reference above
    the relation's attribute instead — through an EventTimeWatermark, the attribute it marks.
    A column of the frame before ``withWatermark`` (``w = df; df.withWatermark("ts", ..)
    .select(w.ts.alias("t"))``: the unmarked ``ts`` in analysis) so becomes the marked one in
    the plan Spark's engine runs, and its join drops the side's late rows by it. Spark's
    optimizer is asked, on the template made as Spark's engine makes a batch
    (``_as_engine_batch``); nothing runs."""
    session = df.sparkSession._jsparkSession
    plan = _as_engine_batch(analyzed_plan(df))
    optimized = session.sessionState().optimizer().execute(plan)
    pending = [optimized]
    while pending:
        node = pending.pop(0)
        if node.getClass().getSimpleName() == "Join":
            found = []
            for child in _children(node):
                marked = [a.name() for a in _attributes(child.output()) if a.metadata().contains(_DELAY_KEY)]
                found.append(marked[0] if marked else None)
            return tuple(found)
        pending.extend(_children(node))
    return None
