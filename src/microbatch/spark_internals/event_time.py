"""Which columns carry a watermark's event-time mark where Spark's engine runs a batch.

Spark's analysis of a stream marks a column as its event time (``spark.watermarkDelayMs``
in its metadata) where it comes out of ``withWatermark``, and carries the mark through
aliases and renames; a column of the frame *before* ``withWatermark`` (``w["ts"]`` of
``w.withWatermark("ts", ...)``) is the same attribute without the mark, and its analysis
leaves it so. Spark's engine does not run the analysed plan, though: in a batch with data
it puts the batch's relation under an alias of each source attribute, and its optimizer
(RemoveRedundantAliases, CollapseProject) rewrites every reference to an attribute with the
attribute its child gives, which EventTimeWatermark gives marked. So there the column of
the frame before the watermark carries the mark (as the programming guide's
``groupBy(window(words.timestamp, ...))`` reads it), and the operators that find their
event time in their input's columns at run time (transformWithState's and
applyInPandasWithState's late rows, WatermarkSupport.findEventTimeColumn) find it.
A column whose alias sets its metadata (a time window's) keeps what the alias says.
"""
from __future__ import annotations

from typing import Any

WATERMARK_DELAY = "spark.watermarkDelayMs"


def _scala_list(values: Any) -> list:
    iterator = values.iterator()
    found = []
    while iterator.hasNext():
        found.append(iterator.next())
    return found


def _marked(attribute: Any) -> bool:
    return attribute.metadata().contains(WATERMARK_DELAY)


def newly_marked(project: Any, child: Any) -> Any:
    """The attribute a projection made by ``analysis.event_time_marked`` (the
    EventTimeWatermark a stream's template stands for) marks as the event time, or None
    when ``project`` (a Project over ``child``) is not such a projection: each of the
    child's attributes in its order and nothing else, exactly one of them marked where the
    child's is not."""
    listed = _scala_list(project.projectList())
    below = _scala_list(child.output())
    if len(listed) != len(below) or not all(
            a.getClass().getSimpleName() == "AttributeReference" and a.exprId().id() == b.exprId().id()
            for a, b in zip(listed, below)):
        return None
    marked = [a for a, b in zip(listed, below) if _marked(a) and not _marked(b)]
    return marked[0] if len(marked) == 1 else None


def _marked_ids(node: Any) -> set[int]:
    """The expression ids of ``node``'s output attributes that carry the mark once every
    reference takes its child's attribute (as Spark's optimized plan of a batch with data)."""
    below: set[int] = set()
    for child in _scala_list(node.children()):
        below |= _marked_ids(child)

    def carries(attribute: Any) -> bool:
        return attribute.exprId().id() in below or _marked(attribute)

    kind = node.getClass().getSimpleName()
    if kind == "Project" and newly_marked(node, node.child()) is not None:
        # (an EventTimeWatermark's output: its column marked, the marks it removes gone)
        return {a.exprId().id() for a in _scala_list(node.output()) if _marked(a)}
    if kind not in ("Project", "Aggregate"):
        return {a.exprId().id() for a in _scala_list(node.output()) if carries(a)}
    found = set()
    listed = node.projectList() if kind == "Project" else node.aggregateExpressions()
    for named in _scala_list(listed):
        if named.getClass().getSimpleName() == "Alias":
            child = named.child()
            if named.explicitMetadata().isDefined():   # (a window's alias says its own)
                mark = named.explicitMetadata().get().contains(WATERMARK_DELAY)
            elif child.getClass().getSimpleName() == "AttributeReference":
                mark = carries(child)
            else:
                mark = _marked(named)
        else:
            mark = named.getClass().getSimpleName() == "AttributeReference" and carries(named)
        if mark:
            found.add(named.exprId().id())
    return found


def marked_in_batches(df: Any) -> tuple[str, ...]:
    """The names of ``df``'s columns (a stream's template: a batch plan whose watermarks are
    marking projections) that carry an event-time mark in Spark's plan of a batch with data,
    in their order. Over Spark Connect (no analysed plan to read): the columns its schema
    marks."""
    from microbatch.spark_internals.connect import is_connect
    if is_connect(df):
        return tuple(f.name for f in df.schema.fields if WATERMARK_DELAY in f.metadata)
    plan = df._jdf.queryExecution().analyzed()
    marked = _marked_ids(plan)
    return tuple(a.name() for a in _scala_list(plan.output()) if a.exprId().id() in marked)
