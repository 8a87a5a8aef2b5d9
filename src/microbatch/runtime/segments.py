"""Prepared segments: the stateless steps of a query, analysed by Spark once per run and
bound to each batch's inputs (Spark's binding of a batch into its analysed query).

Each largest run of stateless steps (select, filter, withColumn, unions, static joins,
mapInPandas, ...) becomes a ``PreparedSegment``. Its children (``holes``) are what the
segment reads, in the template's order: sources, watermarks, observations and stateful
operators, each built per batch. The segment is analysed over one empty placeholder per
hole the first time it is bound, and again only if a hole's columns change; every batch
after that replaces the placeholders in the analysed plan by the batch's plans
(``spark_internals.BindablePlan``) instead of replaying the steps through PySpark, each of
which Spark analyses: a batch makes as many DataFrames for a query of 40 steps as for one
of 1.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.plan.logical import (Apply, NullFilter, PlanNode, ScanFilter, StaticJoin, StreamingRelation, Transform,
                                     Union, Watermark, children_replaced)


#: The steps a prepared segment is made of: stateless, and the same in every batch.
SEGMENT_STEPS = (Transform, Apply, Union, StaticJoin)

#: The hidden column of a file source's relation (Spark's ``FileFormat.METADATA_NAME``)
HIDDEN_COLUMN = "_metadata"
#: No source whose batches carry their hidden columns in a column of their own
_NO_CARRIERS: Mapping[StreamingRelation, Any] = {}


@dataclass(eq=False)
class Placeholder(PlanNode):
    """A leaf standing for a segment's input while the segment is analysed."""

    df: DataFrame

    def build(self, inputs):
        return self.df

    def describe(self) -> str:
        return "Placeholder"


@dataclass(eq=False)
class PreparedSegment(PlanNode):
    """Stateless steps of the user's query (``template``) over ``holes``, analysed once per
    run and bound to each batch's inputs."""

    template: PlanNode
    holes: tuple[PlanNode, ...]
    _prepared: dict = field(default_factory=dict, repr=False)
    _columns_keys: spark_internals.ColumnsKeys = field(default_factory=spark_internals.ColumnsKeys,
                                                       repr=False)
    analyses: int = 0          # how often the steps were analysed (one per run, normally)
    _choosers: list | None = field(default=None, init=False, repr=False)
    _hole_qualifiers: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def children(self):
        return self.holes

    def nodes(self):
        yield self
        yield from self.template.nodes()

    def build(self, inputs):
        built = [hole.build(inputs) for hole in self.holes]
        return self.built_over(tuple(built), lambda: self.bind(built))

    def bind(self, built: list[DataFrame], empty: frozenset = frozenset()) -> DataFrame:
        """The segment over its holes' DataFrames of a batch whose sources ``empty`` have
        no data (a scan filter of the template is chosen by them: ``ScanFilter.chosen``)."""
        chosen = {node: node.chosen(empty) for node in self._choosing()}
        if built and not spark_internals.binds_plans(built[0]):   # Spark Connect: rebuilt, no RPC
            return _template_over(self.template, iter(built), chosen, Placeholder).build({})
        given = [spark_internals.BatchInput(df) for df in built]
        key = (self._columns_keys.key(given), tuple(id(c) for c in chosen.values()))
        if key not in self._prepared:
            self._prepared[key] = self._prepare([g.df for g in given], chosen)
        return self._prepared[key].bind(given)

    def _choosing(self) -> list[ScanFilter]:
        """The template's scan filters chosen per batch (the query reads more than one
        source), found once."""
        if self._choosers is None:
            self._choosers = [n for n in _template_nodes(self.template) if isinstance(n, ScanFilter) and n.choose is not None]
        return self._choosers

    def _prepare(self, built: list[DataFrame], chosen: dict) -> spark_internals.BindablePlan:
        """The steps analysed over empty placeholders with the columns of ``built``: a
        source read directly (or under its watermark, which a batch's plan does not show)
        stands as its own empty batch, so its hidden columns (``_metadata``) resolve (under
        the filter Spark's engine gives its scan too, ``ScanFilter``)."""
        empties = []
        # (steps that cannot read a hidden column, a cascaded join's null filters, pass a
        # hole's carried ones as its other columns: ``_passes_columns``)
        reads_hidden = _steps_may_name_hidden(self.template)
        for index, (hole, df) in enumerate(zip(self.holes, built)):
            source = hole
            while isinstance(source, (Watermark, ScanFilter)):
                source = source.child
            empty = source.empty_batch(df.sparkSession) if isinstance(source, StreamingRelation) else None
            join = _hidden_join(hole)
            if reads_hidden and join is not None and spark_internals.CARRIED_METADATA in df.columns:
                # (a join whose sides carry their sources' _metadata, or a watermark or a
                # deduplication over one: a join of stand-ins)
                empties.append(_joined_placeholder(join, df, df.sparkSession, self._qualifiers(index, df))[0])
                continue
            if reads_hidden and df.columns[-1:] == [spark_internals.CARRIED_METADATA]:
                # (a hole that carries its source's _metadata, ``hidden_columns_carried``: a
                # relation of the source's format with the columns before it, which has the
                # hidden column the binding gives the carried one as)
                empty = _hidden_placeholder(hole, StructType(df.schema.fields[:-1]), df.sparkSession)
                if empty is not None:
                    empties.append(empty)
                    continue
            if empty is None or empty.schema != df.schema:
                # (with the columns' qualifiers: a stream-stream join's ``l.id`` and ``r.id``)
                empty = spark_internals.requalified(spark_internals.empty_dataframe(df.sparkSession, df.schema),
                                                    self._qualifiers(index, df))
            empties.append(empty)
        self.analyses += 1
        try:
            analyzed = spark_internals.analyzed_plan(
                _template_over(self.template, iter(empties), chosen, Placeholder).build({}))
        except AnalysisException as e:
            refused = hidden_column_not_carried(e)
            if refused is e:
                raise
            raise refused from e
        return spark_internals.BindablePlan(analyzed, [spark_internals.analyzed_plan(df) for df in empties])

    def _qualifiers(self, index: int, df: DataFrame) -> tuple:
        """The qualifiers of hole ``index``'s columns in ``df``, its batch: as the hole's
        plan gives them (the first batch it was prepared over, the run's empty one; a
        stateful operator's batch output may have lost the ones of its input, which Spark's
        operator keeps: a deduplication's of a join's ``a.id``)."""
        qualifiers = spark_internals.output_qualifiers(df)
        known = self._hole_qualifiers.setdefault(index, qualifiers)
        return qualifiers if any(qualifiers) or len(known) != len(qualifiers) else known

    def describe(self) -> str:
        return self.template.describe()

    def under_null_filters(self, column: str) -> PlanNode:
        """The hole right under the template's null filters on ``column``, if the template
        is only those; else the segment itself."""
        inner = self.template.under_null_filters(column)
        return inner if inner is not self.template and any(inner is hole for hole in self.holes) else self

    def tree_string(self, indent: int = 0, annotate=None) -> str:
        return self.template.tree_string(indent, annotate)


def hidden_column_not_carried(error: AnalysisException) -> AnalysisException:
    """``error``, Spark's analysis of a query's steps over a batch's inputs (which Spark's
    analysis of the query as written resolved), or where it names the file source's hidden
    ``_metadata``, the way out: microbatch does not carry it up to the step that reads it."""
    if HIDDEN_COLUMN not in str(error):
        return error
    return AnalysisException(
        "The file source's hidden column _metadata is read here through a step that microbatch "
        "does not carry it through (a stream-stream join's side whose columns have no one "
        "qualifier to name it by and that is no join itself; an aggregation's keys or aggregates "
        "over such a side): select it "
        "right after the source, e.g. readStream...load().select('*', '_metadata'), and use that "
        f"column afterwards. ({error})")


def segments_prepared(node: PlanNode) -> PlanNode:
    """``node`` with each largest run of stateless steps (at least one, or a scan filter)
    made a ``PreparedSegment``."""
    if not _in_template(node):
        return children_replaced(node, [segments_prepared(c) for c in node.children])
    holes: list[PlanNode] = []

    def over_holes(step: PlanNode) -> PlanNode:
        if _in_template(step):
            return children_replaced(step, [over_holes(c) for c in step.children])
        hole = segments_prepared(step)
        holes.append(hole)
        return hole

    template = over_holes(node)
    return PreparedSegment(template, tuple(holes))


def _in_template(node: PlanNode) -> bool:
    """Whether ``node``, reached from a segment's steps, is part of the segment's template:
    a stateless step, or the scan filter of a source's read (analysed with the steps, not
    once a batch over the source's batch; the source itself is the hole). A scan filter
    that the sources without data choose is analysed once per choice."""
    return isinstance(node, (*SEGMENT_STEPS, ScanFilter))


def _template_nodes(template: PlanNode):
    """The nodes of a segment's template, not those of its holes."""
    yield template
    for child in template.children:
        if _in_template(child):
            yield from _template_nodes(child)


def _template_over(template: PlanNode, holes, chosen: dict, leaf) -> PlanNode:
    """The template with each hole ``leaf`` of the next of ``holes`` (DataFrames), and each
    scan filter of ``chosen`` the filter chosen for the batch (none: the source's rows as
    they are)."""
    def over(node: PlanNode) -> PlanNode:
        if not _in_template(node):
            return leaf(next(holes))
        children = [over(c) for c in node.children]
        if node in chosen:
            condition = chosen[node]
            return children[0] if condition is None else dataclasses.replace(
                node, child=children[0], condition=condition, choose=None)
        return children_replaced(node, children)
    return over(template)


def _direct(hole: PlanNode, carriers: Mapping[StreamingRelation, Any] = _NO_CARRIERS) -> bool:
    """Whether ``hole`` is a source read directly (under its watermark or scan filter)
    whose batch is the source's relation, whose hidden columns a segment's binding exposes
    (not one of ``carriers``, the sources whose batches carry them in a column when asked)."""
    while isinstance(hole, (Watermark, ScanFilter)):
        hole = hole.child
    return isinstance(hole, StreamingRelation) and hole not in carriers


def _hidden_sides(node: PlanNode) -> tuple[tuple[int, int | None], ...]:
    """The children whose hidden columns a step above may read through ``node`` (Spark's
    ``metadataOutput`` of a watermark, a deduplication, a join), each with the number of
    ``node``'s output columns that are that child's (None: all)."""
    if isinstance(node, (Watermark, ScanFilter)):
        return ((0, None),)
    return node.hidden_column_children() if node.stateful else ()


def _hidden_join(node: PlanNode) -> PlanNode | None:
    """The node of several children whose hidden columns a step above ``node`` may read (a
    join), ``node`` itself or one whose output rows ``node`` passes whole (through
    watermarks, scan filters, deduplications, semi joins), or None."""
    sides = _hidden_sides(node)
    if len(sides) > 1:
        return node
    if len(sides) == 1 and sides[0][1] is None:
        return _hidden_join(node.children[sides[0][0]])
    return None


def _passes_hidden(node: PlanNode) -> bool:
    """Whether ``node``'s output rows carry a child's, hidden columns included."""
    return bool(_hidden_sides(node))


def _may_carry(hole: PlanNode) -> bool:
    """Whether ``hole``, not read directly, could carry a source's hidden columns up: it
    passes them, down to a stateless step or a source."""
    sides = _hidden_sides(hole)
    if sides:
        return any(_may_carry(hole.children[i]) for i, _ in sides)
    return isinstance(hole, (StreamingRelation,) + SEGMENT_STEPS)


def _steps_may_name_hidden(run: PlanNode) -> bool:
    """Whether a step of the run of stateless steps rooted at ``run`` may read a hidden
    column: its arguments name ``_metadata`` (in any case, as Spark resolves names), or it
    is a function of the batch (``Apply``), whose arguments say nothing. Spark's analysis
    of the run over placeholders, which answers exactly, is asked only then."""
    if not isinstance(run, SEGMENT_STEPS):
        return False
    if isinstance(run, Apply) or HIDDEN_COLUMN in _arguments_text(run).lower():
        return True
    return any(_steps_may_name_hidden(child) for child in run.children)


def _arguments_text(step: PlanNode) -> str:
    """The text of a step's arguments: names, SQL text and its Columns' expressions."""
    def text(value) -> str:
        if isinstance(value, (list, tuple, set, frozenset)):
            return " ".join(text(v) for v in value)
        if isinstance(value, dict):
            return " ".join(text(k) + " " + text(v) for k, v in value.items())
        return str(value)
    if isinstance(step, Transform):
        return text((step.args, step.kwargs))
    if isinstance(step, StaticJoin):
        return text(step.on)
    return ""


def _hidden_placeholder(hole: PlanNode, schema: StructType, spark) -> DataFrame | None:
    """A relation of no rows with ``schema``'s columns and the hidden columns of the file
    source read under ``hole`` (its format over no files; through a node that passes its
    children's, the first of those), or None."""
    sides = _hidden_sides(hole)
    if sides:
        return _hidden_placeholder(hole.children[sides[0][0]], schema, spark)
    for node in hole.nodes():
        if isinstance(node, StreamingRelation) and node.provider is not None:
            try:
                empty = node.empty_batch(spark, schema)
            except Exception:   # noqa: BLE001 - a format that cannot hold these columns: none
                continue
            if spark_internals.has_hidden_columns(empty):
                return empty
    return None


def _joined_placeholder(hole: PlanNode, built: DataFrame, spark, qualifiers: tuple | None = None
                        ) -> tuple[DataFrame, list[DataFrame | None], list[str | None], list[tuple[int, ...]]]:
    """A stand-in for the output ``built`` of ``hole``, a join whose sides' hidden columns a
    step above may read: per side a relation of its source's format with the side's columns
    (``_hidden_placeholder``; an empty DataFrame for a side without one), named by the
    side's qualifier where all its columns have the same (``a`` of ``a._metadata``), the
    two cross-joined: the join's columns in its order, and each side's hidden columns as
    Spark's Join gives them. A side with no one name that is itself a join (under the outer
    join's null filters: a cascaded join's left side) stands as its own sides, cross-joined
    alike. A side's column ``CARRIED_METADATA`` after its own (a batch's) is its carried
    ``_metadata``, which the stand-in has hidden. Also, per side that stands as one relation
    (in the stand-in's order), that relation (None: none), the name it has (None: none) and
    its path from ``hole`` (the child indexes down to it: ``(0, 1)``, the right side of the
    left side's join). ``qualifiers``: ``built``'s columns' (None: its own)."""
    fields = built.schema.fields
    qualifiers = qualifiers or spark_internals.output_qualifiers(built)
    joined, sides, _ = _stand_in(hole, fields, qualifiers, 0, spark)
    return joined, [r for _, r, _ in sides], [n for _, _, n in sides], [p for p, _, _ in sides]


def _stand_in(join: PlanNode, fields: list, qualifiers: tuple, start: int, spark
              ) -> tuple[DataFrame, list[tuple[tuple[int, ...], DataFrame | None, str | None]], int]:
    """``_joined_placeholder``'s stand-in for ``join``'s output at ``fields[start:]``, its
    sides (path, relation, name), and where its columns end in ``fields``."""
    frames, sides = [], []
    for child, width in _hidden_sides(join):
        end = len(fields) if width is None else _side_end(fields, start, width)
        own = [i for i in range(start, end) if fields[i].name != spark_internals.CARRIED_METADATA]
        named = {qualifiers[i] for i in own}
        if named == {()}:   # (lost by a binding: a cascaded join's left side's, under its null filters)
            named = set(join.child_column_qualifiers(child)) or named
        name = next(iter(named))[-1] if len(named) == 1 and next(iter(named)) else None
        inner = _join_of_side(join.children[child]) if name is None else None
        if inner is not None:
            frame, inner_sides, end = _stand_in(inner, fields, qualifiers, start, spark)
            sides.extend(((child, *path), relation, side_name) for path, relation, side_name in inner_sides)
        else:
            schema = StructType([fields[i] for i in own])
            relation = _hidden_placeholder(join.children[child], schema, spark)
            frame = relation if relation is not None else spark_internals.empty_dataframe(spark, schema)
            frame = frame if name is None else frame.alias(name)
            sides.append(((child,), relation, name))
            end += 1 if end < len(fields) and fields[end].name == spark_internals.CARRIED_METADATA else 0
        frames.append(frame)
        start = end
    joined = frames[0]
    for frame in frames[1:]:
        joined = joined.crossJoin(frame)
    return joined, sides, start


def _side_end(fields: list, start: int, width: int) -> int:
    """Where a join side's ``width`` columns from ``fields[start]`` end, past the carried
    hidden columns among them (a cascaded join's inner sides')."""
    end, seen = start, 0
    while seen < width and end < len(fields):
        seen += fields[end].name != spark_internals.CARRIED_METADATA
        end += 1
    return end


def _join_of_side(side: PlanNode) -> PlanNode | None:
    """The join whose output a join's side is, under the outer join's own null filters
    (``NullFilter``; a prepared segment of only those: a cascaded join's left side), whose
    sides may stand for it; or None."""
    if isinstance(side, PreparedSegment) and len(side.holes) == 1:
        inner = side.template
        while isinstance(inner, NullFilter):
            inner = inner.child
        side = inner
    while isinstance(side, NullFilter):
        side = side.child
    return _hidden_join(side)


def _passes_columns(run: PlanNode) -> bool:
    """Whether the run of stateless steps rooted at ``run`` is only a join's null filters
    over one hole, which pass the hole's columns as they are (carried hidden ones too)."""
    while isinstance(run, NullFilter):
        run = run.child
    return not isinstance(run, SEGMENT_STEPS)


def _run_holes(node: PlanNode) -> list[PlanNode]:
    """The holes of the run of stateless steps rooted at ``node``, in the template's order."""
    if isinstance(node, SEGMENT_STEPS):
        return [hole for child in node.children for hole in _run_holes(child)]
    return [node]


def _run_over(node: PlanNode, holes: list[PlanNode]) -> PlanNode:
    remaining = iter(holes)

    def over(step: PlanNode) -> PlanNode:
        if isinstance(step, SEGMENT_STEPS):
            return children_replaced(step, [over(c) for c in step.children])
        return next(remaining)
    return over(node)


def _hidden_columns_exposed_for(node: PlanNode, empty_inputs, spark) -> tuple | None:
    """Where the expressions of ``node``, a stateful operator of one child (an
    aggregation's keys and aggregates), read the hidden columns of a join's sides that
    its child passes (Spark's analysis of its template over the join's stand-in): those
    columns, each named by its side's qualifier (``a._metadata``), for a projection
    below it to select; None where it reads none, or a side it reads has no name."""
    child = node.children[0] if len(node.children) == 1 else None
    join = _hidden_join(child) if child is not None and not isinstance(child, SEGMENT_STEPS) else None
    if join is None or not _may_carry(child):
        return None
    try:
        stand_in, relations, names, _ = _joined_placeholder(join, child.build(empty_inputs), spark)
        if all(r is None for r in relations):
            return None
        analyzed = spark_internals.analyzed_plan(children_replaced(node, [Placeholder(stand_in)]).build({}))
    except Exception:   # noqa: BLE001 - a probe: where the operator's template cannot be built over
        return None         # the stand-in, none is exposed, and its first batch says why (hidden_column_not_carried)
    read = iter(spark_internals.hidden_columns_read(
        analyzed, [spark_internals.analyzed_plan(r) for r in relations if r is not None]))
    sides = [name for name, relation in zip(names, relations) if relation is not None and next(read)]
    if sides == [None] and sum(r is not None for r in relations) == 1:   # (the only one: by its name)
        return (F.col(HIDDEN_COLUMN),)
    if not sides or None in sides:
        return None
    return tuple(F.col(f"`{name}`.`{HIDDEN_COLUMN}`") for name in sides)


def hidden_columns_carried(plan: PlanNode, empty_inputs, spark,
                           carriers: Mapping[StreamingRelation, Any] = _NO_CARRIERS) -> PlanNode:
    """A rewrite the planner makes once per run, before the segments: where stateless steps
    read a file source's hidden ``_metadata`` through a watermark that follows other steps
    or through a deduplication (both pass their input's rows, and Spark's analysis reads a
    relation's hidden columns through them: AddMetadataColumns), the steps below put it in
    a column of their own (``spark_internals.CARRIED_METADATA``, last) that the watermark or
    deduplication passes on, and the segment above reads it as the hidden column (its
    placeholder a relation of the source's format with the hole's other columns, which has
    the hidden column). Which reads need it is Spark's analysis of the steps over such
    placeholders; a source read directly needs none (the binding exposes its relation's),
    unless its batches are not relations that have them (``carriers``: a file source
    reading in Python tasks), which then carries them in that column itself. An
    aggregation whose own keys or aggregates read a join's sides' hidden columns gets a
    projection below it that selects them by the sides' names, carried up to it alike."""

    def carried(node: PlanNode, needed: bool | tuple[tuple[int, ...], ...]) -> PlanNode:
        """``node`` carrying its hidden columns up where ``needed`` (for a node of several
        children that pass theirs, a join's: the paths down to the sides whose columns are
        read, ``_joined_placeholder``'s)."""
        sides = _hidden_sides(node)
        if needed and not isinstance(node, SEGMENT_STEPS) and not _direct(node, carriers) and sides:
            if isinstance(needed, tuple) and len(sides) == 1:    # (over a join: its sides)
                return children_replaced(node, [carried(c, needed if i == sides[0][0] else False)
                                                for i, c in enumerate(node.children)])
            if needed is True:
                return children_replaced(node, [carried(c, i == sides[0][0]) for i, c in enumerate(node.children)])
            return children_replaced(node, [carried(c, _below(needed, i)) for i, c in enumerate(node.children)])
        if isinstance(needed, tuple) and isinstance(node, SEGMENT_STEPS) and _passes_columns(node):
            # (a cascaded join's side: its null filters over the inner join, whose sides carry)
            return _run_over(node, [carried(hole, needed) for hole in _run_holes(node)])
        if needed and node in carriers:    # (its batches carry the column themselves from now on)
            carriers[node].carry_hidden_columns()
            return node
        if needed:    # (a source read directly, or stateless steps: they select it)
            node = Transform(node, "select", ("*", F.col(HIDDEN_COLUMN).alias(spark_internals.CARRIED_METADATA)))
        if not isinstance(node, SEGMENT_STEPS):
            exposed = _hidden_columns_exposed_for(node, empty_inputs, spark) if node.stateful else None
            if exposed:   # (a step of its own below it selects them: carried up to that step)
                node = children_replaced(node, [Transform(node.children[0], "select", ("*", *exposed))])
            return children_replaced(node, [carried(c, False) for c in node.children])
        holes = _run_holes(node)
        reads = _holes_read_for_hidden(node, holes)
        return _run_over(node, [carried(hole, read) for hole, read in zip(holes, reads)])

    def _below(needed: tuple[tuple[int, ...], ...], child: int) -> bool | tuple[tuple[int, ...], ...]:
        """What of ``needed`` (paths from a join) its child ``child`` carries: all of its
        hidden columns (True), its own sides' (the paths on from it), or none."""
        rest = tuple(path[1:] for path in needed if path[0] == child)
        return True if () in rest else rest or False

    def _holes_read_for_hidden(run: PlanNode, holes: list[PlanNode]) -> list[bool | tuple[tuple[int, ...], ...]]:
        """Per hole of the run, whether the run's steps read its hidden columns (for a join:
        the sides whose columns they read, or False)."""
        asked = [not _direct(h, carriers) and _may_carry(h) for h in holes]
        if not any(asked) or not _steps_may_name_hidden(run):
            return [False] * len(holes)
        try:
            placeholders, relations = [], []
            for hole, ask in zip(holes, asked):
                built = hole.build(empty_inputs)
                join = _hidden_join(hole) if ask else None
                if join is not None:
                    stand_in, sides, _, paths = _joined_placeholder(join, built, spark)
                else:
                    stand_in = _hidden_placeholder(hole, built.schema, spark) if ask else None
                    sides, paths = [stand_in], []
                placeholders.append(stand_in if stand_in is not None else built)
                relations.append((sides, paths))
            analyzed = spark_internals.analyzed_plan(_run_over(run, [Placeholder(p) for p in placeholders]).build({}))
        except AnalysisException:    # (read through a step that does not carry it: the segment says so)
            return [False] * len(holes)
        read = iter(spark_internals.hidden_columns_read(
            analyzed, [spark_internals.analyzed_plan(r) for sides, _ in relations for r in sides if r is not None]))
        answers: list[bool | tuple[tuple[int, ...], ...]] = []
        for ask, (sides, paths) in zip(asked, relations):
            got = [r is not None and next(read) for r in sides]
            if paths:
                picked = tuple(path for path, g in zip(paths, got) if g)
                answers.append(picked if ask and picked else False)
            else:
                answers.append(ask and got[0])
        return answers

    return carried(plan, False)
