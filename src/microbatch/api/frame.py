"""StreamFrame: the streaming DataFrame users build queries with.

Each method records a step in the stream's logical plan and also applies it to
an empty *template* DataFrame, so a wrong column or a bad expression fails where
it is written, as in Spark, and ``schema``/``columns``/``explain`` are exact.

Columns: ``frame["x"]`` and ``frame.x`` give the frame's own column, as PySpark's do: Spark
resolves it by its attribute, not its name, so it means that frame's ``x`` (the left side's
of a join, the column before ``withWatermark``, which carries no watermark); each batch
binds it to the column in the same position (``plan.logical.rebound``). Over Spark Connect
they are ``F.col("x")``.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import sys
import weakref
from typing import Any, Callable

from pyspark.errors import AnalysisException as _PySparkAnalysisException, PySparkTypeError
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from microbatch import spark_internals
from microbatch.api.writer import DataStreamWriter
from microbatch.errors import AnalysisException, IllegalArgumentException, pyspark_error
from microbatch.planted_bugs import planted
from microbatch.plan.checks import check_source_names, not_yet, streaming_action
from microbatch.operators.aggregate.spec import Grouping, plan_aggregation
from microbatch.operators.aggregate.node import Aggregate
from microbatch.operators.dedup import Deduplicate
from microbatch.operators.group_state import FlatMapGroupsWithState
from microbatch.operators.join import StreamJoin, engine_event_times
from microbatch.operators.limit import StreamingLimit
from microbatch.operators.transform_with_state.node import TransformWithState
from microbatch.spark_internals.event_time import marked_in_batches
from microbatch.plan.logical import (WATERMARK_DELAY, Apply, Observe, PlanNode, StaticJoin, StreamingRelation,
                                     Transform, Union, Watermark)
from microbatch.util import interval_to_ms


#: Spark's rules for a join of a stream with a static DataFrame.
_STATIC_JOIN_TYPES = {
    "inner": "inner", "cross": "cross", "outer": "full", "full": "full", "fullouter": "full",
    "full_outer": "full", "left": "left", "leftouter": "left", "left_outer": "left",
    "right": "right", "rightouter": "right", "right_outer": "right", "semi": "semi",
    "leftsemi": "semi", "left_semi": "semi", "anti": "anti", "leftanti": "anti", "left_anti": "anti",
}


#: each stream-stream join's node -> how it was defined (its sides' frames, condition, type,
#: and its template), to define it again with a left semi join moved into a side
#: (``_semi_join_pushed_into_join``); nothing in a value refers to its key, so an entry goes
#: with the join's node
_STREAM_JOINS_DEFINED: "weakref.WeakKeyDictionary[StreamJoin, tuple]" = weakref.WeakKeyDictionary()
#: the stateless steps that may add a window function (``OVER (...)``) to a stream
_MAY_ADD_WINDOWS = ("select", "selectExpr", "withColumn", "withColumns", "filter", "where")


def _may_be_window_function(args: tuple, kwargs: dict) -> bool:
    """Whether a step's arguments may hold a window function (``row_number().over(w)``,
    ``"... OVER (...)"``): a look at their text, so that a step without one costs no walk
    of the analysed plan."""
    texts = [str(a) for a in args] + [str(v) for v in kwargs.values()]
    return any(" over " in t.lower() or "over(" in t.lower() or "windowspec" in t.lower() for t in texts)


def _marked_fields(plan: PlanNode, fields: list, spark: Any) -> list:
    """The fields that carry a watermark's mark (``spark.watermarkDelayMs``), in order."""
    marked = [f for f in fields if WATERMARK_DELAY in f.metadata]
    if planted(spark, "rename-drops-watermark"):   # (a test-only planted bug: microbatch.planted_bugs)
        named = {n.event_time.lower() for n in plan.nodes() if isinstance(n, Watermark)} | {"window", "session_window"}
        marked = [f for f in marked if f.name.lower() in named]
    return marked


def _positions(template: DataFrame, values: Any, below: bool = False) -> dict:
    """Where the Columns in ``values`` that are bound to a frame's attributes (``frame.ts``)
    find them in ``template``'s output: ``{attribute id: index}``; empty when none is. With
    ``below`` (a stateless step's, over its one input), one of an earlier frame that
    ``template`` no longer outputs (``w = df; df = df.withColumn("v", ...).filter(w.v > 2)``),
    which Spark's analysis finds below: where below (``spark_internals.attribute_positions``)."""
    ids = spark_internals.bound_attribute_ids(values)
    if not ids:
        return {}
    positions = {i: n for n, i in enumerate(spark_internals.output_attribute_ids(template)) if i in ids}
    if below and len(positions) < len(ids):
        positions = spark_internals.attribute_positions(template, ids)
    return positions


def _same(values: Any) -> Any:
    return values


class StreamFrame:
    def __init__(self, session: Any, plan: PlanNode, template: DataFrame, sides: dict | None = None,
                 aggregated: tuple | None = None):
        self._session = session
        self._plan = plan
        self._template = template
        #: a stream-stream join's frame: the attribute ids of its sides' frames -> their
        #: position in the join's output (Spark's analysis of a join may give a side's
        #: attributes new ids, where a source is read on both sides; Spark's engine keeps them)
        self._sides = sides or {}
        #: an aggregation's frame: how it was made (the GroupedStream, its ``apply`` and
        #: Columns), to make it again with the aggregates a filter above adds (``filter``)
        self._aggregated = aggregated

    @classmethod
    def from_relation(cls, session: Any, relation: StreamingRelation) -> "StreamFrame":
        return cls(session, relation, relation.empty_batch(session.spark))

    # -- description --------------------------------------------------------
    @property
    def isStreaming(self) -> bool:
        return True

    @property
    def schema(self) -> StructType:
        return self._template.schema

    @property
    def columns(self) -> list[str]:
        return self._template.columns

    @property
    def dtypes(self) -> list[tuple[str, str]]:
        return self._template.dtypes

    @property
    def sparkSession(self):
        return self._session.spark

    def printSchema(self, level: int | None = None) -> None:
        print(spark_internals.schema_tree(self._template, level))

    def explain(self, extended: bool | str | None = None, mode: str | None = None) -> None:
        print("== Stream Plan ==")
        print(self._plan.tree_string())
        print()
        print("== Plan of one batch (over empty input) ==")
        self._template.explain(extended=extended, mode=mode)

    def __repr__(self) -> str:
        return f"StreamFrame[{', '.join(f'{n}: {t}' for n, t in self.dtypes)}]"

    # -- columns --------------------------------------------------------------
    def __getitem__(self, item: Any):
        if isinstance(item, str):
            if item not in self.columns and "." not in item and item != "*":
                raise AnalysisException(
                    f"Cannot resolve column name \"{item}\" among ({', '.join(self.columns)})")
            return self._column(item)
        if isinstance(item, Column):
            return self.filter(item)
        if isinstance(item, (list, tuple)):
            return self.select(*item)
        raise TypeError(f"unexpected item type: {type(item).__name__}")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        template = self.__dict__.get("_template")
        if template is not None and name in template.columns:
            return self._column(name)
        raise AttributeError(f"'StreamFrame' object has no attribute '{name}'")

    def _own(self, values: Any) -> Any:
        """``values`` with a join side's Columns bound to the join's own columns (where
        Spark's analysis of the join gave the side's attributes new ids)."""
        if self._sides and spark_internals.bound_attribute_ids(values):
            return spark_internals.rebound(values, [(self._template, self._sides)])
        return values

    def _column(self, name: str) -> Column:
        """This frame's column ``name`` (bound to its attribute; by name over Connect, and for
        ``*`` and nested fields)."""
        if name == "*" or "." in name or spark_internals.is_connect(self._template):
            return F.col(name)
        return self._template[name]

    # -- stateless steps --------------------------------------------------------
    def _derive(self, method: str, *args: Any, **kwargs: Any) -> "StreamFrame":
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, (StreamFrame, DataFrame)):
                raise AnalysisException(f"{method}() does not take a DataFrame argument on a stream.")
        args, kwargs = self._own((args, kwargs))
        try:
            template = getattr(self._template, method)(*args, **kwargs)
        except _PySparkAnalysisException as e:
            raise self._hidden_column_refusal(e, method) from None
        if method in ("select", "selectExpr") and spark_internals.is_global_aggregation(template):
            # (an aggregate function in a projection: Spark's analysis makes it an aggregation
            # of the whole stream, ``select(count("*"))`` as ``agg(count("*"))``)
            return self.agg(*(F.expr(a) if method == "selectExpr" else a for a in args))
        if method in _MAY_ADD_WINDOWS and _may_be_window_function(args, kwargs):
            refused = spark_internals.window_function_error(template, self._template)
            if refused is not None:    # (as Spark's engine refuses it when the query starts)
                raise refused
        node = Transform(self._plan, method, args, kwargs, positions=_positions(self._template, (args, kwargs), below=True))
        return StreamFrame(self._session, node, template)

    def _hidden_column_refusal(self, error: Exception, method: str) -> Exception:
        """``error`` (a step's analysis failing over this frame's template), or Spark's own
        error where the step reads the file source's hidden ``_metadata`` above a Python
        stateful operator: Spark's analysis resolves it through the operator (its plan's
        hidden columns are its input's) and then finds it missing from the operator's
        output; microbatch's template of the operator is a relation of its output alone,
        which does not resolve it at all."""
        condition = getattr(error, "getCondition", lambda: None)() or ""
        if not (condition.startswith("UNRESOLVED_COLUMN") and "`_metadata`" in str(error)
                and self._plan.stateful and self._plan.template_hides_input):
            return error
        return spark_internals.spark_error(
            "AnalysisException", "MISSING_ATTRIBUTES.RESOLVED_ATTRIBUTE_MISSING_FROM_INPUT",
            missingAttributes='"_metadata"', input=", ".join(f'"{c}"' for c in self.columns),
            operator=f"!{method} over {self._plan.describe()}")

    def select(self, *cols: Any) -> "StreamFrame":
        return self._derive("select", *cols)

    def selectExpr(self, *expr: str) -> "StreamFrame":
        return self._derive("selectExpr", *expr)

    def filter(self, condition: Column | str) -> "StreamFrame":
        having = None
        if isinstance(condition, (str, Column)) and spark_internals.is_aggregation(self._template):
            having = spark_internals.having_condition(self._template.filter(self._own(condition)))
        if having is not None:
            # (an aggregate function in a filter right over an aggregation: Spark's analysis
            # resolves it to the aggregation's output, a HAVING; the step filters by that)
            resolved, hidden = having
            if hidden:
                return self._having_hidden_aggregates(condition)
            return self._derive("filter", resolved)
        return self._derive("filter", condition)

    def _having_hidden_aggregates(self, condition: Column | str) -> "StreamFrame":
        """A filter right over an aggregation by aggregate functions it does not output
        (``groupBy("k").count().where("sum(v) > 2")``), as Spark's analysis makes it
        (ResolveAggregateFunctions): the aggregation computes them too, as hidden columns
        (their buffers in its state), the filter reads them, and a projection drops them."""
        if self._aggregated is None:
            raise not_yet("A filter by an aggregate function its aggregation does not output "
                          "(a HAVING with a hidden aggregate) over this aggregation", "issue 57")
        grouped, apply, exprs = self._aggregated
        having = self._template.filter(self._own(condition))   # Project(Filter(Aggregate with them))

        def with_hidden(g: Any, rebind: Callable[[Any], Any] = _same) -> DataFrame:
            return spark_internals.hidden_aggregates_added(apply(g, rebind), having)

        # (its template is the aggregation Spark's analysis made, whose attributes the
        # condition and the frame's Columns are bound to; each batch's adds them afresh)
        extended = grouped._aggregate(with_hidden, exprs, spark_internals.having_aggregation(having))
        kept = spark_internals.output_columns(extended._template)[:len(self.columns)]
        return extended.filter(condition).select(*kept)

    where = filter

    def withColumn(self, colName: str, col: Column) -> "StreamFrame":
        return self._derive("withColumn", colName, col)

    def withColumns(self, *colsMap: dict) -> "StreamFrame":
        return self._derive("withColumns", *colsMap)

    def withColumnRenamed(self, existing: str, new: str) -> "StreamFrame":
        return self._derive("withColumnRenamed", existing, new)

    def withColumnsRenamed(self, colsMap: dict) -> "StreamFrame":
        return self._derive("withColumnsRenamed", colsMap)

    def withMetadata(self, columnName: str, metadata: dict) -> "StreamFrame":
        return self._derive("withMetadata", columnName, metadata)

    def drop(self, *cols: Any) -> "StreamFrame":
        return self._derive("drop", *cols)

    def toDF(self, *cols: str) -> "StreamFrame":
        return self._derive("toDF", *cols)

    def alias(self, alias: str) -> "StreamFrame":
        return self._derive("alias", alias)

    def repartition(self, numPartitions: Any, *cols: Any) -> "StreamFrame":
        return self._derive("repartition", numPartitions, *cols)

    def coalesce(self, numPartitions: int) -> "StreamFrame":
        return self._derive("coalesce", numPartitions)

    def hint(self, name: str, *parameters: Any) -> "StreamFrame":
        return self._derive("hint", name, *parameters)

    def dropna(self, how: str = "any", thresh: int | None = None, subset: Any = None) -> "StreamFrame":
        return self._derive("dropna", how, thresh, subset)

    def fillna(self, value: Any, subset: Any = None) -> "StreamFrame":
        return self._derive("fillna", value, subset)

    def replace(self, to_replace: Any, *args: Any, **kwargs: Any) -> "StreamFrame":
        return self._derive("replace", to_replace, *args, **kwargs)

    @property
    def na(self):
        """PySpark's ``DataFrameNaFunctions`` over this stream (``fill``, ``drop``, ``replace``)."""
        return spark_internals.na_functions(self)

    def sample(self, withReplacement: Any = None, fraction: Any = None, seed: int | None = None) -> "StreamFrame":
        """Refused, as Spark's engine refuses sampling a stream (PySpark's argument checks first)."""
        self._template.sample(withReplacement, fraction, seed)
        raise AnalysisException("Sampling is not supported on streaming DataFrames/Datasets;")

    def unpivot(self, ids: Any, values: Any, variableColumnName: str, valueColumnName: str) -> "StreamFrame":
        return self._derive("unpivot", ids, values, variableColumnName, valueColumnName)

    def melt(self, ids: Any, values: Any, variableColumnName: str, valueColumnName: str) -> "StreamFrame":
        return self._derive("melt", ids, values, variableColumnName, valueColumnName)

    def to(self, schema: StructType) -> "StreamFrame":
        """The rows in ``schema``'s columns (by name, cast), as ``DataFrame.to``."""
        return self._derive("to", schema)

    def colRegex(self, colName: str) -> Column:
        """The columns whose names match a back-quoted regex (a Column of this stream)."""
        return self._template.colRegex(colName)

    def metadataColumn(self, colName: str) -> Column:
        """The source's hidden column ``colName`` (the file source's ``_metadata``), as a
        Column of this stream; Spark's error if the stream has no such column."""
        spark_internals.require("metadataColumn")
        self._template.metadataColumn(colName)
        qualifiers = set() if spark_internals.is_connect(self._template) \
            else set(spark_internals.output_qualifiers(self._template))
        if len(qualifiers) == 1 and next(iter(qualifiers)):
            # (a frame whose columns all have one qualifier, a side aliased for a join: named
            # by it, so that over the join it is this side's, as Spark's resolves it)
            return spark_internals.metadata_column(f"{next(iter(qualifiers))[-1]}.{colName}")
        relations = self._plan.relations()
        if spark_internals.is_connect(self._template) or len(relations) != 1:
            return spark_internals.metadata_column(colName)
        # (a frame of one source whose columns have no one qualifier, an unaliased side of a
        # join: named by the plan id its template and every placeholder of the source's
        # batches are tagged with, as Spark Connect names a DataFrame's column)
        plan_id = relations[0].hidden_column_plan_id()
        spark_internals.with_plan_id(self._template, plan_id, in_place=True)
        return spark_internals.metadata_column(colName, plan_id)

    def transform(self, func: Callable[..., "StreamFrame"], *args: Any, **kwargs: Any) -> "StreamFrame":
        result = func(self, *args, **kwargs)
        if not isinstance(result, StreamFrame):
            raise AnalysisException(
                f"Func returned an instance of type {type(result).__name__}, should have been StreamFrame.")
        return result

    def mapInPandas(self, func: Callable, schema: Any, barrier: bool = False) -> "StreamFrame":
        template = self._template.mapInPandas(func, schema, barrier)
        node = Apply(self._plan, lambda df: df.mapInPandas(func, schema, barrier), "mapInPandas")
        return StreamFrame(self._session, node, template)

    def mapInArrow(self, func: Callable, schema: Any, barrier: bool = False) -> "StreamFrame":
        template = self._template.mapInArrow(func, schema, barrier)
        node = Apply(self._plan, lambda df: df.mapInArrow(func, schema, barrier), "mapInArrow")
        return StreamFrame(self._session, node, template)

    def observe(self, observation: Any, *exprs: Column) -> "StreamFrame":
        """Named metrics of every batch (``observe("name", F.count(F.lit(1)))``), in each
        batch's progress ``observedMetrics`` and listener events, as Spark reports them.
        An ``Observation`` object is refused, as Spark refuses it on a stream."""
        from pyspark.sql import Observation
        if isinstance(observation, Observation):
            raise IllegalArgumentException(
                "Observation does not support streaming Datasets.This is because there will "
                "be multiple observed metrics as microbatches are constructed. Please register "
                "a StreamingQueryListener and get the metric for each microbatch in "
                "QueryProgressEvent.progress, or use query.lastProgress or query.recentProgress.")
        template = self._template.observe(observation, *exprs)   # PySpark's argument checks
        node = Observe(self._plan, observation, tuple(exprs), positions=_positions(self._template, exprs))
        return StreamFrame(self._session, node, template)

    # -- combining --------------------------------------------------------------
    def _require_stream(self, other: Any, what: str) -> "StreamFrame":
        if isinstance(other, DataFrame):
            raise AnalysisException(
                f"{what} between streaming and batch DataFrames/Datasets is not supported")
        if not isinstance(other, StreamFrame):
            raise TypeError(f"{what} needs a StreamFrame, got {type(other).__name__}")
        return other

    def union(self, other: "StreamFrame") -> "StreamFrame":
        other = self._require_stream(other, "Union")
        template = self._template.union(other._template)
        node = Union(self._plan, other._plan)
        check_source_names(node)
        return StreamFrame(self._session, node, template)

    unionAll = union

    def unionByName(self, other: "StreamFrame", allowMissingColumns: bool = False) -> "StreamFrame":
        other = self._require_stream(other, "Union")
        template = self._template.unionByName(other._template, allowMissingColumns=allowMissingColumns)
        node = Union(self._plan, other._plan, by_name=True, allow_missing_columns=allowMissingColumns)
        check_source_names(node)
        return StreamFrame(self._session, node, template)

    def join(self, other: Any, on: Any = None, how: str | None = None) -> "StreamFrame":
        if isinstance(other, StreamFrame):
            return self._stream_join(other, on, how)
        if not isinstance(other, DataFrame):
            raise TypeError(f"join() needs a DataFrame, got {type(other).__name__}")
        if other.isStreaming:
            raise AnalysisException("Joining with a Spark streaming DataFrame is not supported: "
                                    "read both sides with microbatch's readStream.")
        how_key = (how or "inner").lower()
        if how_key not in _STATIC_JOIN_TYPES:
            raise IllegalArgumentException(f"Unsupported join type '{how}'.")
        template = self._template.join(other, on, how)
        node = StaticJoin(self._plan, other, on, how or "inner", "left", positions=_positions(self._template, on))
        return StreamFrame(self._session, node, template)

    def _joined_by_static(self, static: DataFrame, on: Any = None, how: str | None = None) -> "StreamFrame":
        """``static.join(stream, on, how)``: this stream on the right of a static DataFrame (SQL's
        ``FROM t JOIN stream``, which PySpark's DataFrame cannot be asked for), with Spark's
        rules for that side: inner and right outer joins."""
        kind = _STATIC_JOIN_TYPES.get((how or "inner").lower())
        if kind is None:
            raise IllegalArgumentException(f"Unsupported join type '{how}'.")
        on_the_left = " and a static DataFrame/Dataset on the left is not supported"
        refused = {   # (Spark's UnsupportedOperationChecker's words)
            "left": "LeftOuter join with a streaming DataFrame/Dataset on the right" + on_the_left,
            "full": "FullOuter joins with streaming DataFrames/Datasets on the right" + on_the_left,
            "semi": "LeftSemi join with a streaming DataFrame/Dataset on the right" + on_the_left,
            "anti": "LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported"}
        if kind in refused:
            raise AnalysisException(refused[kind])
        template = static.join(self._template, on, how or "inner")
        node = StaticJoin(self._plan, static, on, how or "inner", "right", positions=_positions(self._template, on))
        return StreamFrame(self._session, node, template)

    def _stream_join(self, other: "StreamFrame", on: Any, how: str | None) -> "StreamFrame":
        """A stream-stream join on column names both sides have, or on equal columns and time
        comparisons: inner, left, right and full outer, left semi."""
        kind = _STATIC_JOIN_TYPES.get((how or "inner").lower())
        if kind is None:
            raise IllegalArgumentException(f"Unsupported join type '{how}'.")
        if kind == "cross":
            raise not_yet(f"A stream-stream {kind} join", "more stream-stream join types")
        template = self._template.join(other._template, on, how or "inner")   # Spark's analysis
        if kind == "anti":
            # (defined as Spark defines it, after its analysis; refused when the query starts,
            # where Spark's checker refuses it, after the aggregations' output-mode rules)
            return StreamFrame(self._session, StreamJoin(self._plan, other._plan, (), kind), template)
        below_aggregation = None
        if kind == "semi" and spark_internals.semi_join_below_aggregation(template):
            # (Spark's engine then aggregates the joined rows: its stateful operators, their
            # order and numbers, and the state of each are not those of the query as written;
            # refused when the query starts, after the checks Spark's checker makes there)
            below_aggregation = not_yet("A stream-stream left semi join over an aggregation that Spark's optimizer moves "
                          "below the aggregation (PushDownLeftSemiAntiJoin: the condition reads only its "
                          "grouping columns; join the aggregation's input, or aggregate after the join)",
                          "a left semi join pushed below an aggregation")
        if kind == "semi":
            pushed = self._semi_join_pushed_into_join(other, on, template)
            if pushed is not None:
                return pushed
        names = [on] if isinstance(on, str) else list(on) if isinstance(on, (list, tuple)) else None
        columns = (tuple(self.columns), tuple(other.columns))
        qualifiers = (spark_internals.output_qualifiers(self._template),
                      spark_internals.output_qualifiers(other._template))
        if names is not None and all(isinstance(n, str) for n in names):
            left = {c.lower(): c for c in self.columns}
            keys = tuple(left[n.lower()] for n in names)
            times = (self._watermarked_column(keys), other._watermarked_column(keys))
            node = StreamJoin(self._plan, other._plan, keys, kind,
                              side_columns=columns, side_times=times, side_qualifiers=qualifiers,
                              engine_times=engine_event_times(template, columns, times),
                              side_marks=(self._event_time_marks(), other._event_time_marks()))
        else:
            others: list = []
            try:
                pairs, comparisons = spark_internals.join_condition(template, others)
            except ValueError as e:
                raise not_yet(f"A stream-stream join on this condition ({e}: only equal columns of the "
                              "two sides and time comparisons between them are planned so far)",
                              "more stream-stream join conditions") from None
            if not pairs:
                raise AnalysisException(
                    "Stream-stream join without equality predicate is not supported;")
            extra = self._join_condition_parts(other, template, others)
            keys = (tuple(columns[0][i] for i, _ in pairs), tuple(columns[1][j] for _, j in pairs))
            times = (self._watermarked_column(keys[0]), other._watermarked_column(keys[1]))
            node = StreamJoin(self._plan, other._plan, keys[0], kind, right_keys=keys[1],
                              comparisons=tuple(comparisons), condition=on, side_columns=columns,
                              side_times=times, side_qualifiers=qualifiers,
                              engine_times=engine_event_times(template, columns, times),
                              side_marks=(self._event_time_marks(), other._event_time_marks()),
                              positions=(_positions(self._template, on), _positions(other._template, on)),
                              **extra)
        node.deferred_refusal = below_aggregation
        check_source_names(node)
        sides = {}
        if not node.using and not spark_internals.is_connect(template):
            # (only the side attributes the join's output does not keep: a column kept is used as
            # it is, so Spark's analysis sees what it sees on its engine)
            own = set(spark_internals.output_attribute_ids(template))
            left = spark_internals.output_attribute_ids(self._template)
            sides = {i: n for n, i in enumerate(left) if i not in own}
            if kind != "semi":
                sides.update({i: len(left) + n for n, i in enumerate(spark_internals.output_attribute_ids(other._template))
                              if i not in own and i not in sides})
        _STREAM_JOINS_DEFINED[node] = (self, other, on, how, template)
        return StreamFrame(self._session, node, template, sides)

    def _semi_join_pushed_into_join(self, other: "StreamFrame", on: Any, template: DataFrame) -> "StreamFrame | None":
        """A left semi join of this frame, a stream-stream join under stateless steps, as
        Spark's optimizer plans it where it moves the semi join into a side of that join
        (``spark_internals.semi_join_pushed_into_join``): that side semi-joined with
        ``other``, joined with the join's other side as the join was, under the same steps.
        Spark's engine then runs those operators and keeps their state, which the query as
        written would not. None where the semi join stays above the join."""
        steps, node = [], self._plan
        while isinstance(node, Transform):
            steps.append(node)
            node = node.child
        defined = _STREAM_JOINS_DEFINED.get(node)   # (each stream-stream join defined here)
        if defined is None:
            return None
        side = spark_internals.semi_join_pushed_into_join(template)
        if side is None:
            return None
        refused = not_yet("A left semi join of a stream-stream join that Spark's optimizer moves into a side of "
                          "that join (PushLeftSemiLeftAntiThroughJoin), whose condition does not read back over "
                          "that side's columns (semi-join that side before the join, or name the side's own "
                          "columns in the condition)", "more stream-stream join shapes")
        left, right, lower_on, lower_how, lower = defined
        # (the join's type as Spark's optimizer leaves it: an outer join whose nullable side
        # the semi join's condition reads is an inner one, EliminateOuterJoin, before the
        # semi join moves and takes the filter it inferred along)
        narrowed = spark_internals.outer_joins_narrowed(template, [lower])[0] \
            if _STATIC_JOIN_TYPES.get((lower_how or "inner").lower()) in ("left", "right", "full") else None
        try:
            moved_side = (left, right)[side]
            try:
                semi = moved_side.join(other, on, "left_semi")
            except _PySparkAnalysisException:
                # (the condition reads a column a step between renames or computes: Spark's
                # optimizer reads it back through the step, which its condition then says)
                read_back = spark_internals.pushed_semi_join_condition(template)
                if read_back is None:
                    raise
                semi = moved_side.join(other, F.expr(read_back), "left_semi")
            if side == 0:
                joined = semi.join(right, lower_on, lower_how)
            else:
                joined = left.join(semi, lower_on, lower_how)
            plan = joined._plan
            if narrowed is not None:
                plan = dataclasses.replace(plan, exec_how=narrowed)
                _STREAM_JOINS_DEFINED[plan] = _STREAM_JOINS_DEFINED[joined._plan]
            for step in reversed(steps):
                plan = dataclasses.replace(step, child=plan)
            moved = StreamFrame(self._session, plan, functools.reduce(
                lambda df, step: getattr(df, step.method)(*step.args, **step.kwargs), reversed(steps), joined._template),
                None if steps else joined._sides)
        except _PySparkAnalysisException:
            raise refused from None
        if moved.schema != template.schema:
            raise refused
        return moved

    def _join_condition_parts(self, other: "StreamFrame", template: DataFrame, others: list) -> dict:
        """The parts of a stream-stream join's condition beside its keys and time comparisons
        (``a.num >= b.maxn``), as ``StreamJoin`` keeps them: a part reading one side's
        columns only as SQL text over that side (``side_conditions``), a part of both sides
        as the tree the join's task evaluates (``pair_conditions``), and the columns Spark
        infers "not null" for from them (``condition_nulls``). A part the task cannot
        evaluate is refused, named."""
        if not others:
            return {}
        parts, nulls = spark_internals.join_condition_parts(template, others)
        sides: tuple[list[str], list[str]] = ([], [])
        bounds: tuple[list, list] = ([], [])
        trees = []
        for part in parts:
            if part.side is not None:
                try:    # (read back over the side's columns, as the join's task gets them)
                    _ = (self, other)[part.side]._template.where(F.expr(part.sql)).schema
                except Exception:  # noqa: BLE001 - a part that does not read back alone: named below
                    raise not_yet(f"A stream-stream join on this condition ('{part.sql}' does not read back over "
                                  "its side's columns alone)", "more stream-stream join conditions") from None
                sides[part.side].append(part.sql)
                bounds[part.side].append(part.bound_ms)
            elif part.tree is None:
                raise not_yet(f"A stream-stream join on this condition ({part.refusal}: the parts that read both "
                              "sides are comparisons, AND, OR, NOT, IN, IS NULL over columns, literals, numeric "
                              "casts and +, -, * so far)", "more stream-stream join conditions")
            else:
                trees.append(part.tree)
        names = (self.columns, other.columns)
        return {"side_conditions": (tuple(sides[0]), tuple(sides[1])), "side_bounds": (tuple(bounds[0]), tuple(bounds[1])),
                "pair_conditions": tuple(trees),
                "condition_nulls": tuple(tuple(names[side][i] for i in nulls[side]) for side in (0, 1))}

    def _event_time_marks(self) -> tuple[tuple[str, int], ...]:
        """Each column of this stream that Spark's analysis marks with a watermark, as
        (name, delay ms): what Spark's join exec finds as the event times of a side (more
        than one: a join's output keeping both of its sides' event times)."""
        return tuple((f.name, int(f.metadata[WATERMARK_DELAY]))
                     for f in _marked_fields(self._plan, self._template.schema.fields, self._session.spark))

    def _watermarked_column(self, keys: tuple[str, ...] = ()) -> str | None:
        """The column of this stream that carries its watermark, as Spark's analysis marks
        it (``spark.watermarkDelayMs`` in the column's metadata, kept through aliases and
        renames, onto windows over the column and an aggregation's keys): one of ``keys``
        (a join's, which Spark looks at first), else a marked column that is no window,
        else a marked window."""
        marked = _marked_fields(self._plan, self._template.schema.fields, self._session.spark)
        lowered = [k.lower() for k in keys]
        for candidates in ([f for f in marked if f.name.lower() in lowered],
                           [f for f in marked if "spark.timeWindow" not in f.metadata
                            and "spark.sessionWindow" not in f.metadata], marked):
            if candidates:
                return candidates[0].name
        return None

    def crossJoin(self, other: Any) -> "StreamFrame":
        return self.join(other, how="cross")

    # -- event time ---------------------------------------------------------------
    def withWatermark(self, eventTime: str, delayThreshold: str) -> "StreamFrame":
        if not isinstance(eventTime, str) or not eventTime:
            raise IllegalArgumentException("eventTime should be provided as a column name")
        try:
            delay_ms = interval_to_ms(delayThreshold, "delay threshold")
        except ValueError as e:
            raise IllegalArgumentException(str(e)) from None
        # PySpark's and Spark's checks, Spark's analysis under the session's
        # "spark.sql.streaming.validateEventTimeWatermarkColumn" (a nested event time:
        # EVENT_TIME_MUST_BE_TOP_LEVEL_COLUMN, or Spark's failure without the check)
        template = self._template.withWatermark(eventTime, delayThreshold)
        # (a batch plan drops the watermark: the template marks the column as a stream's plan does)
        template = spark_internals.event_time_marked(template, eventTime, delay_ms)
        node = Watermark(self._plan, eventTime, delayThreshold, delay_ms)
        return StreamFrame(self._session, node, template)

    # -- stateful steps -------------------------------------------------------------
    def groupBy(self, *cols: Any) -> "GroupedStream":
        """Group for a streaming aggregation (``agg``, ``count``, ``sum``, ...)."""
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        cols = self._own(cols)
        self._template.groupBy(*cols).count()   # a wrong column fails here, as in Spark
        self._checked_as_on_a_stream(lambda frame: frame.groupBy(*cols).count(), cols)
        return GroupedStream(self, tuple(cols))

    groupby = groupBy

    def rollup(self, *cols: Any) -> "GroupedStream":
        """Group by each prefix of ``cols`` (and nothing): one aggregation over several
        grouping sets, each row of the result keyed by its set (nulls for the keys not in
        it; ``grouping()``/``grouping_id()`` tell them apart), as Spark runs it on a stream."""
        return self._grouped_sets(Grouping("rollup"), cols)

    def cube(self, *cols: Any) -> "GroupedStream":
        """Group by every subset of ``cols`` (see ``rollup``)."""
        return self._grouped_sets(Grouping("cube"), cols)

    def groupingSets(self, groupingSets: Any, *cols: Any) -> "GroupedStream":
        """Group by each of the given sets of ``cols`` (see ``rollup``)."""
        return self._grouped_sets(Grouping("groupingSets", tuple(tuple(s) for s in groupingSets)), cols)

    def _grouped_sets(self, grouping: Any, cols: tuple) -> "GroupedStream":
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        cols = self._own(cols)
        grouping.of(self._template, cols).count()   # PySpark's and Spark's checks, here
        self._checked_as_on_a_stream(lambda frame: grouping.of(frame, cols).count(), cols)
        return GroupedStream(self, tuple(cols), grouping)

    def _checked_as_on_a_stream(self, step: Callable[[Any], Any], cols: tuple) -> None:
        """Spark's ambiguous self-join check (``_LEGACY_ERROR_TEMP_1182``) of a grouping that
        names a frame's column (``df["k"]``, ``F.window(df.ts, ...)``) after a join, as the
        analysis of a stream's plan makes it: it refuses some the template's batch analysis
        accepts (``spark_internals.ambiguous_on_a_stream``)."""
        if spark_internals.bound_attribute_ids(cols):
            spark_internals.ambiguous_on_a_stream(self._template, step)

    def agg(self, *exprs: Any) -> "StreamFrame":
        """A global aggregation: one row over the whole stream."""
        return self.groupBy().agg(*exprs)

    def dropDuplicates(self, subset: Any = None) -> "StreamFrame":
        """Keep the first row of every key (all columns, or ``subset``) across batches.

        State grows with the keys; with a watermark on a key column, keys behind the
        watermark are evicted and late rows dropped, as in Spark.
        """
        if subset is not None and not isinstance(subset, (list, tuple)):
            raise IllegalArgumentException("subset should be a list or tuple of column names")
        template = self._template.dropDuplicates(list(subset) if subset is not None else None)
        by_lower = {c.lower(): c for c in self.columns}
        keys = tuple(by_lower[str(c).lower()] for c in subset) if subset is not None else tuple(self.columns)
        return StreamFrame(self._session, Deduplicate(self._plan, keys, marked_event_time=self._marked_event_time()),
                           template)

    drop_duplicates = dropDuplicates

    def dropDuplicatesWithinWatermark(self, subset: Any = None) -> "StreamFrame":
        """Drop rows whose key was seen within the watermark delay (Spark 3.5's operator):
        a key is kept until the watermark passes its first row's event time + delay."""
        if subset is not None and not isinstance(subset, (list, tuple)):
            raise IllegalArgumentException("subset should be a list or tuple of column names")
        template = self._template.dropDuplicatesWithinWatermark(list(subset) if subset is not None else None)
        by_lower = {c.lower(): c for c in self.columns}
        keys = tuple(by_lower[str(c).lower()] for c in subset) if subset is not None else tuple(self.columns)
        return StreamFrame(self._session, Deduplicate(self._plan, keys, within_watermark=True,
                                                      marked_event_time=self._marked_event_time()), template)

    def _marked_event_time(self) -> tuple[str, int] | None:
        """The first column carrying a watermark's mark, and its delay (Spark's
        WatermarkSupport.findEventTimeColumn)."""
        return next(((f.name, int(f.metadata[WATERMARK_DELAY]))
                     for f in _marked_fields(self._plan, self._template.schema.fields, self._session.spark)), None)

    def distinct(self) -> "StreamFrame":
        return self.dropDuplicates()

    def limit(self, num: int) -> "StreamFrame":
        """At most ``num`` rows. Over the stream's rows, or a deduplication's or a join's
        (appends): Spark's streaming limit, whose count of rows let through is state kept
        across batches and restarts. Over an aggregation: in complete mode the limit of
        each batch's result (e.g. the top rows after ``orderBy``), in append mode the
        streaming limit of the rows it emits (the planner decides, knowing the mode)."""
        template = self._template.limit(num)   # PySpark's argument checks
        if any(n.stateful and n.aggregation for n in self._plan.nodes()):
            return StreamFrame(self._session, Transform(self._plan, "limit", (num,)), template)
        return StreamFrame(self._session, StreamingLimit(self._plan, num), template)

    def orderBy(self, *cols: Any, **kwargs: Any) -> "StreamFrame":
        """Sorting works only on an aggregation in complete mode (checked at start)."""
        if not any(n.stateful and n.aggregation for n in self._plan.nodes()):
            raise AnalysisException(
                "Sorting is not supported on streaming DataFrames/Datasets, unless it is on "
                "aggregated DataFrame/Dataset in Complete output mode;")
        return self._derive("orderBy", *cols, **kwargs)

    sort = orderBy

    # -- actions: streams run with writeStream.start() --------------------------------
    def _action(name: str):  # noqa: N805 - builds methods
        def method(self, *args: Any, **kwargs: Any):
            # PySpark's own signature first: a wrong argument is Python's TypeError there,
            # before any streaming check (``df.count(1)``)
            import inspect

            from pyspark.sql import DataFrame
            try:
                inspect.signature(getattr(DataFrame, name)).bind(self, *args, **kwargs)
            except TypeError as e:
                raise TypeError(f"DataFrame.{name}() {e}") from None
            raise streaming_action(name)
        method.__name__ = name
        return method

    collect = _action("collect")
    count = _action("count")
    show = _action("show")
    take = _action("take")
    head = _action("head")
    first = _action("first")
    toPandas = _action("toPandas")
    foreach = _action("foreach")
    foreachPartition = _action("foreachPartition")
    toLocalIterator = _action("toLocalIterator")
    cache = _action("cache")
    persist = _action("persist")
    del _action

    @property
    def write(self):
        raise AnalysisException("'write' can not be called on streaming Dataset/DataFrame; "
                                "use writeStream.")

    def createOrReplaceTempView(self, name: str) -> None:
        """A temporary view over this stream: ``readStream.table(name)`` returns it."""
        self._session._register_stream_view(name, self, replace=True)

    def createTempView(self, name: str) -> None:
        self._session._register_stream_view(name, self, replace=False)

    def createOrReplaceGlobalTempView(self, name: str) -> None:
        """A global temporary view over this stream: ``global_temp.<name>`` in every session's
        ``sql`` and ``readStream.table``."""
        self._session._register_global_stream_view(name, self, replace=True)

    def createGlobalTempView(self, name: str) -> None:
        self._session._register_global_stream_view(name, self, replace=False)

    @property
    def writeStream(self) -> "DataStreamWriter":
        return DataStreamWriter(self, self._session, self._plan)


class GroupedStream:
    """``stream.groupBy(...)``: aggregations over a stream (PySpark's GroupedData)."""

    def __init__(self, frame: StreamFrame, keys: tuple, grouping: Grouping | None = None):
        self._frame = frame
        self._keys = keys
        self._grouping = grouping

    def _aggregate(self, apply: Callable[..., DataFrame], exprs: tuple = (),
                   template: DataFrame | None = None) -> StreamFrame:
        """``apply(grouped, rebind)``: the aggregation over a GroupedData, its Columns
        ``exprs`` (those that may be bound to the frame's attributes) through ``rebind``;
        ``template``: its template, where not ``apply`` over the frame's."""
        frame = self._frame
        grouping = self._grouping or Grouping()
        if template is None:
            template = apply(grouping.of(frame._template, self._keys))
        spec = plan_aggregation(template, frame._template, self._keys, "__microbatch_buffer_", grouping)
        session = self._session_key(template, spec.key_names)
        key_index, is_window = self._event_time_key(template, spec.key_names, session)
        node = Aggregate(frame._plan, self._keys, apply, spec, key_index, is_window,
                         grouping=self._grouping, positions=_positions(frame._template, (self._keys, exprs)))
        if session is not None:
            node.session_index, node.session_time_column = session
        return StreamFrame(frame._session, node, template, aggregated=(self, apply, exprs))

    def _session_key(self, template: DataFrame, key_names: tuple) -> tuple[int, str] | None:
        """(index, time column) of a ``session_window`` grouping key; its gap may be a
        duration or an expression over the row (Spark's dynamic gap)."""
        by_name = {f.name: f for f in template.schema.fields}
        for index, (name, key) in enumerate(zip(key_names, self._keys)):
            if "spark.sessionWindow" not in by_name[name].metadata:
                continue
            text = spark_internals.column_sql(key) if isinstance(key, Column) else ""
            match = re.match(r"session_?window\(\s*([^,]+?)\s*,", text)   # 3.5 writes sessionwindow(
            if match is None:
                raise not_yet(f"A session_window key written as {text!r}")
            return index, match.group(1).strip("`'")   # (' starts an unresolved name, as SQL's)
        return None

    def _event_time_key(self, template: DataFrame, key_names: tuple,
                        session: tuple | None) -> tuple[int | None, bool]:
        """The first grouping key that carries a watermark's event time, as Spark's
        analysis marks it (``spark.watermarkDelayMs`` on the key's output column): the
        watermarked column itself (renamed or aliased or not), or a window or session over
        it, or, over an earlier aggregation, its window or a window over its
        ``window_time``. An expression over the column carries no mark, as in Spark."""
        frame = self._frame
        marked = {f.name: f for f in _marked_fields(frame._plan, template.schema.fields, frame._session.spark)}
        for index, name in enumerate(key_names):
            field = marked.get(name)
            if field is not None:
                return index, "spark.timeWindow" in field.metadata or "spark.sessionWindow" in field.metadata
        return None, False

    def agg(self, *exprs: Any) -> StreamFrame:
        if not exprs:
            raise AnalysisException("agg() needs at least one aggregate expression")
        if len(exprs) == 1 and isinstance(exprs[0], dict):
            columns = tuple(F.expr(f"{fn}(`{c}`)") for c, fn in exprs[0].items())
            return self._aggregate(lambda g, rebind=_same: g.agg(*columns))
        exprs = self._frame._own(exprs)
        return self._aggregate(lambda g, rebind=_same: g.agg(*rebind(exprs)), exprs)

    def count(self) -> StreamFrame:
        return self._aggregate(lambda g, rebind=_same: g.count())

    def _key_columns(self, pyspark_method: Callable[[Any], Any]) -> tuple[StreamFrame, tuple[str, ...], int]:
        """The stream a function of keyed state reads, its grouping columns, and how many of
        its columns the function gets. A key that is a column of the stream (by name or as a
        Column) is that column. Any other key is first given to PySpark's own method over
        the template (``pyspark_method(grouped)``): Spark 4.3 refuses an expression there
        (UNRESOLVED_COLUMN, as on its own engine); one it takes becomes a column added after
        the stream's own, which the function does not get, as Spark projects grouping
        expressions beside the data attributes it hands to Python."""
        frame = self._frame
        data_columns = len(frame.columns)
        grouped = frame._template.groupBy(*self._keys)
        names = spark_internals.grouping_columns(grouped)
        columns = {c.lower(): c for c in frame.columns}
        if any(name is None or name.lower() not in columns for name in names):
            pyspark_method(grouped)   # Spark's analysis of the grouping, and its error
        keys = []
        for index, (key, name) in enumerate(zip(self._keys, names)):
            if name is not None and name.lower() in columns:
                keys.append(columns[name.lower()])
                continue
            hidden = f"__microbatch_grouping_key{index}"
            frame = frame.withColumn(hidden, key if isinstance(key, Column) else F.col(key))
            keys.append(hidden)
        return frame, tuple(keys), data_columns

    @staticmethod
    def _late_rows_column(frame: StreamFrame, keys: tuple[str, ...], data_columns: int) -> str | None:
        """The column of ``frame`` a keyed-state operator over it drops late rows by: Spark's
        WatermarkSupport.findEventTimeColumn over the operator's input (the grouping keys,
        then the columns the function gets), the first that carries a watermark's mark as
        Spark's engine runs a batch with data (``marked_in_batches``: a renamed event time
        does, and so does the column of the frame before ``withWatermark``)."""
        marked = {name.lower() for name in marked_in_batches(frame._template)}
        return next((c for c in (*keys, *frame.columns[:data_columns]) if c.lower() in marked), None)

    def applyInPandasWithState(self, func: Callable, outputStructType: Any, stateStructType: Any,
                               outputMode: str, timeoutConf: str) -> StreamFrame:
        """Per key, ``func(key, pandas DataFrames of the key's rows, GroupState)`` yielding
        pandas DataFrames of ``outputStructType``, with state of ``stateStructType`` kept
        across batches and timeouts (``GroupStateTimeout``), as PySpark's
        ``GroupedData.applyInPandasWithState`` on a stream."""
        from pyspark.sql.streaming.state import GroupStateTimeout
        from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DateType, MapType, NumericType,
                                       StringType, StructType, TimestampNTZType, TimestampType)

        frame = self._frame
        if self._grouping is not None:
            raise not_yet(f"applyInPandasWithState after {self._grouping.kind}")
        if not isinstance(outputMode, str) or not isinstance(timeoutConf, str):
            raise pyspark_error(PySparkTypeError, "NOT_STR", {
                "arg_name": "outputMode" if not isinstance(outputMode, str) else "timeoutConf",
                "arg_type": type(outputMode if not isinstance(outputMode, str) else timeoutConf).__name__})
        mode = outputMode.lower()
        if mode not in ("append", "update"):
            raise IllegalArgumentException(f"Unknown output mode {outputMode}. Accepted output modes are "
                                           "'append' and 'update'.")
        timeouts = (GroupStateTimeout.NoTimeout, GroupStateTimeout.ProcessingTimeTimeout,
                    GroupStateTimeout.EventTimeTimeout)
        if timeoutConf not in timeouts:
            raise IllegalArgumentException(f"Unknown timeout conf {timeoutConf}: use one of "
                                           f"{', '.join(timeouts)} (GroupStateTimeout).")
        output, state = (spark_internals.parse_schema_ddl(t) if isinstance(t, str) else t
                         for t in (outputStructType, stateStructType))
        frame, keys, data_columns = self._key_columns(lambda grouped: grouped.applyInPandasWithState(
            func, output, state, outputMode, timeoutConf))
        plain = (NumericType, StringType, BooleanType, BinaryType, DateType, TimestampType, TimestampNTZType)

        def supported(t: Any) -> bool:   # (structs, arrays and maps of those, at any depth)
            if isinstance(t, StructType):
                return all(supported(f.dataType) for f in t.fields)
            if isinstance(t, ArrayType):
                return supported(t.elementType)
            if isinstance(t, MapType):
                return supported(t.keyType) and supported(t.valueType)
            return isinstance(t, plain)
        by_name = {f.name.lower(): f for f in frame._template.schema.fields}
        for what, fields in (("grouping column", [by_name[k.lower()] for k in keys]), ("state field", state.fields)):
            for f in fields:
                if not supported(f.dataType):
                    raise not_yet(f"applyInPandasWithState with the {what} {f.name} of type "
                                  f"{f.dataType.simpleString()} (numbers, strings, booleans, binary, dates, "
                                  "timestamps, and structs, arrays and maps of them are supported so far)",
                                  "arbitrary stateful processing (issue 18)")
        node = FlatMapGroupsWithState(frame._plan, keys, func, output, state, mode, timeoutConf,
                                      data_columns=data_columns,
                                      late_rows_column=self._late_rows_column(frame, keys, data_columns),
                                      input_marked=any(WATERMARK_DELAY in f.metadata
                                                       for f in frame._template.schema.fields))
        template = spark_internals.empty_batch(frame._template.sparkSession, output)
        return StreamFrame(frame._session, node, template)

    def transformWithStateInPandas(self, statefulProcessor: Any, outputStructType: Any, outputMode: str,
                                   timeMode: str, initialState: Any = None,
                                   eventTimeColumnName: str = "") -> StreamFrame:
        """Per key, the user's ``StatefulProcessor`` over pandas DataFrames of the key's rows,
        with its state variables and timers kept across batches, as PySpark's
        ``GroupedData.transformWithStateInPandas`` on a stream."""
        return self._transform_with_state("transformWithStateInPandas", statefulProcessor, outputStructType,
                                          outputMode, timeMode, initialState, eventTimeColumnName)

    def transformWithState(self, statefulProcessor: Any, outputStructType: Any, outputMode: str,
                           timeMode: str, initialState: Any = None,
                           eventTimeColumnName: str = "") -> StreamFrame:
        """``transformWithStateInPandas`` with ``Row`` s in and out, as PySpark's
        ``GroupedData.transformWithState``."""
        return self._transform_with_state("transformWithState", statefulProcessor, outputStructType,
                                          outputMode, timeMode, initialState, eventTimeColumnName)

    def _transform_with_state(self, api: str, processor: Any, output_type: Any, output_mode: str,
                              time_mode: str, initial_state: Any, event_time_column: str) -> StreamFrame:
        spark_internals.require(api)
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        from microbatch.operators.transform_with_state.variables import declared_state_variables
        frame = self._frame
        if self._grouping is not None:
            raise not_yet(f"{api} after {self._grouping.kind}")
        if not isinstance(processor, StatefulProcessor):
            raise pyspark_error(PySparkTypeError, "NOT_EXPECTED_TYPE", {
                "arg_name": "statefulProcessor", "expected_type": "StatefulProcessor",
                "arg_type": type(processor).__name__})
        for name, value in (("outputMode", output_mode), ("timeMode", time_mode)):
            if not isinstance(value, str):
                raise pyspark_error(PySparkTypeError, "NOT_STR", {
                    "arg_name": name, "arg_type": type(value).__name__})
        mode = output_mode.lower()
        if mode not in ("append", "update"):
            raise IllegalArgumentException(f"Unknown output mode {output_mode}. Accepted output modes are "
                                           "'append' and 'update'.")
        time = time_mode.lower()
        if time not in ("none", "processingtime", "eventtime"):
            raise IllegalArgumentException(f"Unknown time mode {time_mode}. Accepted time modes are "
                                           "'none', 'processingTime', 'eventTime'.")
        initial_df, initial_keys = None, ()
        if initial_state is not None:
            if not spark_internals.is_grouped_data(initial_state):
                raise pyspark_error(PySparkTypeError, "NOT_EXPECTED_TYPE", {
                    "arg_name": "initialState", "expected_type": "GroupedData",
                    "arg_type": type(initial_state).__name__})
            initial_df = spark_internals.grouped_dataframe(initial_state)
            if initial_df.isStreaming:
                raise not_yet(f"{api} with a streaming initialState")
            initial_keys = tuple(spark_internals.grouping_column_names(initial_state))
            if len(initial_keys) != len(self._keys):
                raise AnalysisException(
                    f"The initial state is grouped by {len(initial_keys)} column(s) "
                    f"({', '.join(initial_keys)}) and the stream by {len(self._keys)}: group both "
                    "by the same key.")
        output = spark_internals.parse_schema_ddl(output_type) if isinstance(output_type, str) else output_type
        frame, keys, data_columns = self._key_columns(lambda grouped: getattr(grouped, api)(
            processor, output, output_mode, time_mode))
        event_time = self._output_event_time(output, event_time_column) if event_time_column else None
        node = TransformWithState(frame._plan, keys, processor, output, mode, time,
                                  declared_state_variables(processor, time), rows_api=api == "transformWithState",
                                  initial_state=initial_df, initial_keys=initial_keys, data_columns=data_columns,
                                  event_time_column=event_time,
                                  late_rows_column=self._late_rows_column(frame, keys, data_columns))
        if event_time is not None:   # the column carries the watermark's delay on, as in Spark
            from pyspark.sql.types import StructField
            delay = node.event_time_delay_ms()
            output = StructType([StructField(f.name, f.dataType, f.nullable, {**f.metadata, WATERMARK_DELAY: delay})
                                 if f.name == event_time else f for f in output.fields])
        template = spark_internals.empty_batch(frame._template.sparkSession, output)
        return StreamFrame(frame._session, node, template)

    def _output_event_time(self, output: StructType, column: str) -> str:
        """``eventTimeColumnName``: a column of the output, and a watermark below (Spark's
        UpdateEventTimeWatermarkColumn takes the nearest watermark's delay)."""
        if not any(isinstance(n, Watermark) for n in self._frame._plan.nodes()):
            raise spark_internals.spark_error("AnalysisException",
                                              "CANNOT_ASSIGN_EVENT_TIME_COLUMN_WITHOUT_WATERMARK")
        names = {f.name.lower(): f.name for f in output.fields}
        if column.lower() not in names:
            raise spark_internals.spark_error(
                "AnalysisException", "UNRESOLVED_COLUMN.WITH_SUGGESTION", objectName=f"`{column}`",
                proposal=", ".join(f"`{f.name}`" for f in output.fields))
        return names[column.lower()]

    def sum(self, *cols: str) -> StreamFrame:
        return self._aggregate(lambda g, rebind=_same: g.sum(*cols))

    def min(self, *cols: str) -> StreamFrame:
        return self._aggregate(lambda g, rebind=_same: g.min(*cols))

    def max(self, *cols: str) -> StreamFrame:
        return self._aggregate(lambda g, rebind=_same: g.max(*cols))

    def avg(self, *cols: str) -> StreamFrame:
        return self._aggregate(lambda g, rebind=_same: g.avg(*cols))

    mean = avg


def static_joins_take_streams() -> None:
    """``static_df.join(stream, on, how)``, as Spark's engine runs it: PySpark's
    ``DataFrame.join`` reaches into its argument's Spark-side DataFrame (over Connect, its
    plan), which a microbatch stream does not have. Each of PySpark's
    DataFrame classes that defines ``join`` gets it wrapped once, passing a microbatch stream
    to ``StreamFrame._joined_by_static`` (inner and right outer joins, Spark's rules for a
    static left side) and anything else to PySpark's own ``join`` unchanged.

    The classic classes at import; Connect's only once imported (a ``StreamingSession``
    over a Connect session calls this again): importing it here would import grpc,
    protobuf, pandas and ``pyspark.testing`` into every process that imports microbatch
    (about 2.5 s each: the drivers, the tests' subprocesses)."""
    import importlib
    for module, name in (("pyspark.sql.dataframe", "DataFrame"), ("pyspark.sql.classic.dataframe", "DataFrame"),
                         ("pyspark.sql.connect.dataframe", "DataFrame")):
        try:
            imported = sys.modules.get(module) if ".connect." in module else importlib.import_module(module)
        except ImportError:        # (an older PySpark: no pyspark.sql.classic)
            continue
        cls = getattr(imported, name, None)
        if cls is None:
            continue
        join = cls.__dict__.get("join")
        if join is None or getattr(join, "_takes_streams", False):
            continue

        def taking_streams(self, other, on=None, how=None, _join=join):
            if isinstance(other, StreamFrame):
                return other._joined_by_static(self, on, how)
            return _join(self, other, on, how)

        taking_streams._takes_streams = True
        taking_streams.__doc__ = join.__doc__
        taking_streams.__name__ = "join"
        taking_streams.__qualname__ = join.__qualname__
        cls.join = taking_streams


static_joins_take_streams()
