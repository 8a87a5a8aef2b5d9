"""The differential fuzzer's seeds where Spark's engine itself was in question (issue 57),
each decided against Spark's engine here:

- Nexmark q5's shape (a windowed count, a second aggregation over it, joined back) behind a
  projection or a filter (seeds 191, 420): Spark's optimizer reuses the first branch's
  exchange in the second (ReuseExchange), and Spark propagates the next batch's watermarks
  over that executed plan, where the reused exchange is a leaf: the second branch's
  aggregations get no watermark and never evict or emit. Results that depend on an
  optimizer's exchange reuse are Spark's defect, not its semantics: with
  ``spark.sql.exchange.reuse=false`` Spark's engine gives microbatch's rows and state. The
  fuzzer reports it as a known difference (``fuzz.EXCHANGE_REUSE``).
- A grouping that names a frame's column after a join (seed 586): Spark's engine refuses
  it (``_LEGACY_ERROR_TEMP_1182``, its ambiguous self-join check) where a batch plan's
  analysis accepts it; microbatch now makes the check as the analysis of a stream's plan
  makes it, and refuses alike.
- A left semi join (with a time range) of a union (seed 1166): Spark's optimizer pushes the
  join into the union's inputs, one join each; in a batch where one input has no data it
  drops that input with its join (PropagateEmptyRelation) and numbers the survivor 0, the
  dropped join's number, which then writes its rows into that join's state. Spark numbers
  its stateful operators in each batch's plan, and an operator's state is its number's:
  that is Spark's defect. With the rule excluded Spark's engine gives microbatch's rows and
  state; the fuzzer reports it as a known difference (``fuzz.OPERATORS_RENUMBERED``).
- A left semi join of a union of two watermarked streams (seed 690): Spark's optimizer
  fails on it (``PLAN_VALIDATION_FAILED_RULE_IN_BATCH``, SQLSTATE XXKD0, an internal
  error: PushDownLeftSemiAntiJoin made an unresolved plan); the fuzzer reports Spark's
  internal error apart, not as a difference of microbatch's.
"""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from microbatch.testing import fuzz

# -- seeds 191 and 420: Spark's exchange reuse takes the second branch's watermark ------------

#: seed 420's query: q5's shape over a renamed event time
Q5_BEHIND_A_PROJECTION = fuzz.Query([
    "df = src",
    'df = df.select(df["ts"].alias("t_1"), "k", "v", "s")',
    'df = df.withWatermark("t_1", "3 seconds")',
    'df = df.withColumnRenamed("k", "k_2")',
    'counts = df.groupBy(F.window("t_1", "10 seconds", "2 seconds"), "k_2").count()',
    'm = counts.groupBy("window").agg(F.max("count").alias("mx")).withColumnRenamed("window", "mwindow")',
    'df = counts.join(m, F.expr("window = mwindow AND count = mx"))',
], "append")


def _rows(*rows: tuple) -> list[dict]:
    return [{"ts": fuzz._stamp(t), "k": k, "v": v, "s": s} for t, k, v, s in rows]


#: seed 420's input: (second, k, v, s) per file
Q5_FILES = [_rows((6, 0, None, "b"), (9, None, 2, "c"), (7, 2, 2, "c")),
            _rows((8, 3, None, "c"), (7, 1, 4, "a"), (0, 3, 0, "c"), (9, 3, 3, "c")),
            _rows((15, 1, 7, "b"), (2, 2, 2, "c"))]

#: a plan as Spark's ``explain()`` prints it (seed 420's, cut down)
REUSING_PLAN = """== Physical Plan ==
StreamingSymmetricHashJoin [window#18-T3000ms, count#12L], [mwindow#24-T3000ms, mx#19L], Inner
:- Exchange hashpartitioning(window#18-T3000ms, count#12L, 2), REQUIRED_BY_STATEFUL_OPERATOR, [plan_id=1466]
:  +- StateStoreSave [window#18-T3000ms, k_2#11], state info [ opId = 1 ], Append, 1767225606000, 1767225612000, 2
:     +- Exchange hashpartitioning(window#18-T3000ms, k_2#11, 2), REQUIRED_BY_STATEFUL_OPERATOR, [plan_id=1453]
:        +- *(1) HashAggregate(keys=[window#18-T3000ms, k_2#11], functions=[partial_count(1)])
:           +- EventTimeWatermark c262d075, t_1#9: timestamp, 3 seconds
:              +- LocalTableScan <empty>, [t_1#9, k#3]
+- Exchange hashpartitioning(mwindow#24-T3000ms, mx#19L, 2), REQUIRED_BY_STATEFUL_OPERATOR, [plan_id=1604]
   +- *(11) HashAggregate(keys=[window#18-T3000ms], functions=[max(count#12L)])
      +- StateStoreSave [window#18-T3000ms], state info [ opId = 2 ], Append, 0, 0, 2
         +- StateStoreSave [window#18-T3000ms, k_2#11], state info [ opId = 3 ], Append, 0, 0, 2
            +- *(6) HashAggregate(keys=[window#18-T3000ms, k_2#11], functions=[merge_count(1)])
               +- ReusedExchange [window#18-T3000ms, k_2#11, count#37L], Exchange hashpartitioning(...), [plan_id=1453]
"""


def test_the_detector_sees_a_reused_exchange_below_a_stateful_operator_only():
    assert fuzz._reuses_an_exchange(REUSING_PLAN)
    # the same plan without the reuse, and a batch plan's reuse under no stateful operator
    assert not fuzz._reuses_an_exchange(REUSING_PLAN.replace("ReusedExchange", "Exchange"))
    assert not fuzz._reuses_an_exchange("""== Physical Plan ==
*(5) SortMergeJoin [k#1], [k#9], Inner
:- *(2) Sort [k#1 ASC NULLS FIRST], false, 0
:  +- Exchange hashpartitioning(k#1, 2), ENSURE_REQUIREMENTS, [plan_id=10]
:     +- *(1) Scan ExistingRDD[k#1]
+- *(4) Sort [k#9 ASC NULLS FIRST], false, 0
   +- ReusedExchange [k#9], Exchange hashpartitioning(k#1, 2), ENSURE_REQUIREMENTS, [plan_id=10]
""")
    # a stateful operator beside the reuse (in the other branch) is not above it
    assert not fuzz._reuses_an_exchange("""== Physical Plan ==
Union
:- StateStoreSave [k#1], state info [ opId = 0 ], Append, 0, 0, 2
:  +- Exchange hashpartitioning(k#1, 2), [plan_id=10]
+- Project [k#9]
   +- ReusedExchange [k#9], Exchange hashpartitioning(k#1, 2), [plan_id=10]
""")


@pytest.mark.timeout(600)
def test_q5_behind_a_projection_differs_only_by_sparks_exchange_reuse(spark):
    """Spark's engine emits no window of the second branch (its aggregations never evict),
    microbatch emits them; Spark's engine without exchange reuse emits microbatch's rows
    and keeps its state, so the fuzzer reports a known difference, not a failure."""
    result = fuzz.run_case(spark, fuzz.Case(420, Q5_BEHIND_A_PROJECTION, Q5_FILES, []))
    assert result.status == "known-difference", result.report()
    assert result.aspect in ("rows", "state rows") and not result.failed
    assert result.kind.startswith("Spark's engine reused an exchange") and result.state_compared > 0
    summary = fuzz.Summary([result])
    assert "known differences (Spark's engine is not the reference):" in summary.report()
    assert not summary.failures

# -- seed 586: Spark's ambiguous self-join check on a stream's plan ---------------------------

SLIDING = 'F.window("ts", "10 seconds", "5 seconds")'

#: seed 586's query (minimised) with its grouping varied; Spark's engine refuses the first
#: five, and a batch plan's analysis (microbatch's template) only the last two of them
GROUPINGS = {
    "rollup: a sliding window and the join's df['k'] (seed 586)": f'df.rollup({SLIDING}, df["k"], "s_1")',
    "cube: a sliding window and df['k']": f'df.cube({SLIDING}, df["k"], "s_1")',
    "rollup: a sliding window over the join's df.ts": 'df.rollup(F.window(df.ts, "10 seconds", "5 seconds"), "k")',
    "rollup: df['k'] alone": 'df.rollup(df["k"], "s_1")',
    "rollup: a tumbling window and df['k']": 'df.rollup(F.window("ts", "10 seconds"), df["k"])',
    "rollup by names": f'df.rollup({SLIDING}, "k", "s_1")',
    "groupBy: a sliding window and df['k']": f'df.groupBy({SLIDING}, df["k"], "s_1")',
}

QUERY_586 = """
df = src.select("ts", "k", "v", src.s.alias("s_1")).withWatermark("ts", "3 seconds")
right = src2.withWatermark("ts2", "10 seconds")
df = df.join(right, (df.k == right.k2) & (right.ts2 >= df.ts) & (right.ts2 <= df.ts + F.expr("INTERVAL 10 SECONDS")),
             "left_semi")
df = GROUPING.agg(F.sum(df["v"]).alias("su"))
"""


def _defined(session, tmp_path, grouping: str) -> str:
    """The query defined on ``session``'s streams: "runs", or the refusal's error class."""
    for name in ("src", "src2"):
        (tmp_path / name).mkdir(exist_ok=True)
    names = {"F": F,
             "src": session.readStream.schema(fuzz.SCHEMA1).json(str(tmp_path / "src")),
             "src2": session.readStream.schema(fuzz.SCHEMA2).json(str(tmp_path / "src2"))}
    try:
        exec(QUERY_586.replace("GROUPING", grouping), names)   # noqa: S102 - the test's own query
    except Exception as e:   # noqa: BLE001 - the refusal is the result
        return fuzz._error_kind(e)
    return "runs"


@pytest.mark.parametrize("shape", list(GROUPINGS))
def test_a_grouping_of_a_joins_column_is_refused_as_on_sparks_engine(spark, ss, tmp_path, shape):
    theirs = _defined(spark, tmp_path, GROUPINGS[shape])
    ours = _defined(ss, tmp_path, GROUPINGS[shape])
    assert ours == theirs
    refused = list(GROUPINGS).index(shape) < 5
    assert theirs == ("AnalysisException: _LEGACY_ERROR_TEMP_1182" if refused else "runs")


# -- seed 1166: Spark's engine renumbers its stateful operators ------------------------------

def _run(*operator_counts: int) -> fuzz.EngineRun:
    run = fuzz.EngineRun(checkpoint="")
    run.batches = {bid: fuzz.Batch(operators=(("symmetricHashJoin", 1),) * n) for bid, n in enumerate(operator_counts)}
    return run


def test_the_renumbering_detector_needs_sparks_count_to_change_and_microbatchs_to_hold():
    assert fuzz._renumbers_operators(_run(2, 2, 1, 1), _run(2, 2, 2, 2))
    assert not fuzz._renumbers_operators(_run(2, 2, 2), _run(2, 2, 2))
    assert not fuzz._renumbers_operators(_run(2, 1), _run(2, 1))      # both changed: judged as they are
    assert not fuzz._renumbers_operators(_run(2, 2), _run(1, 1))      # a different count, every batch


@pytest.mark.timeout(600)
def test_a_semi_join_of_a_union_with_an_input_run_dry_differs_only_by_sparks_renumbering(spark):
    """Seed 1166: from batch 3 the union's first input has no data; Spark's engine runs one
    join where it ran two, microbatch keeps both. With PropagateEmptyRelation excluded Spark
    keeps both too and equals microbatch in rows and state."""
    result = fuzz.run_case(spark, fuzz.generate(1166, composed=False))
    assert result.status == "known-difference", result.report()
    assert result.kind == "Spark's engine renumbered its stateful operators in a batch with an empty input"
    assert result.aspect == "state operators" and result.batch == 3 and result.state_compared > 0
    report = fuzz.Summary([result]).report()
    assert fuzz.OPERATORS_RENUMBERED in report and not fuzz.Summary([result]).failures


@pytest.mark.timeout(600)
def test_a_planted_join_bug_in_the_same_query_is_still_a_difference(spark):
    """The detector forgives Spark's renumbering only: with microbatch's state tasks on
    shifted partitions (a planted bug) the rerun no longer equals microbatch, and the seed
    differs."""
    result = fuzz.run_case(spark, fuzz.generate(1166, composed=False), plant="partition-shift")
    assert result.status == "differs", result.report()


# -- seed 690: Spark's internal error ----------------------------------------------------------

#: seed 690's query: a left semi join of a union of two watermarked streams
SEMI_JOIN_OF_A_UNION = fuzz.Query([
    "df = src",
    'df = df.withWatermark("ts", "10 seconds").unionByName(src2.withWatermark("ts2", "10 seconds")'
    '.select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), F.col("v2").alias("v"), F.lit("u").alias("s")))',
    "right = src2",
    'right = right.withWatermark("ts2", "5 seconds")',
    'right = right.select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), "v2")',
    "left = df",
    'df = left.join(right, ["k", "ts"], "left_semi").drop(left.ts)',
    'df = df.where("k IS NOT NULL")',
], "append")


@pytest.mark.timeout(600)
def test_sparks_optimizer_failing_on_a_semi_join_of_a_union_is_sparks_internal_error(spark):
    files1 = [_rows((4, 1, 4, "c"), (2, 3, 9, "b")), _rows((23, 3, 0, "c"))]
    files2 = [[{"ts2": fuzz._stamp(4), "k2": 1, "v2": 7}, {"ts2": fuzz._stamp(2), "k2": 3, "v2": 1}]]
    result = fuzz.run_case(spark, fuzz.Case(690, SEMI_JOIN_OF_A_UNION, files1, files2))
    assert result.status == "spark-internal-error", result.report()
    assert result.kind == "PLAN_VALIDATION_FAILED_RULE_IN_BATCH" and not result.failed
    assert "Spark's internal errors (microbatch runs the query):" in fuzz.Summary([result]).report()


class _Failed(Exception):
    """A failed run of Spark's engine, as PySpark's StreamingQueryException reads."""

    def getCondition(self):   # noqa: N802 - PySpark's name
        return "STREAM_FAILED"


def _failed(cause: str) -> _Failed:
    return _Failed(f"[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: {cause}\n"
                   "=== Streaming Query ===\nIdentifier: [id = 1, runId = 2]")


def test_an_internal_error_is_told_by_its_sqlstate_class():
    internal = _failed("[PLAN_VALIDATION_FAILED_RULE_IN_BATCH] Rule PushDownLeftSemiAntiJoin in batch Operator "
                       "Optimization generated an invalid plan: ... SQLSTATE: XXKD0 SQLSTATE: XXKST")
    assert fuzz._spark_internal_error(internal) == "PLAN_VALIDATION_FAILED_RULE_IN_BATCH"
    assert fuzz._spark_internal_error(_failed("[INTERNAL_ERROR] Hit a bug. SQLSTATE: XX000 SQLSTATE: XXKST")) \
        == "INTERNAL_ERROR"
    # a user's error, and an error with no SQLSTATE of its own (only STREAM_FAILED's XXKST)
    assert fuzz._spark_internal_error(_failed("[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012 "
                                              "SQLSTATE: XXKST")) is None
    assert fuzz._spark_internal_error(_failed("[_LEGACY_ERROR_TEMP_3102] Something. SQLSTATE: XXKST")) is None


def test_a_null_dereference_in_sparks_tasks_is_sparks_internal_error():
    """Seed 3960: ``rollup(session_window(...), ...)`` fails in Spark's first batch with a
    NullPointerException in its session merge (the session is null in a grouping set), while
    microbatch goes on to refuse the query's second watermark. A JVM null dereference is
    Spark's bug, not a refusal: no reference for microbatch's error, listed apart."""
    npe = _failed("[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
                  "foreach batch sink. ... java.lang.NullPointerException: Cannot invoke \"org.apache.spark."
                  "sql.catalyst.expressions.UnsafeRow.getLong(int)\" because \"sessionRow\" is null "
                  "SQLSTATE: 39000 SQLSTATE: XXKST")
    assert fuzz._spark_internal_error(npe) == "java.lang.NullPointerException"
    theirs, ours = fuzz.EngineRun(checkpoint="a"), fuzz.EngineRun(checkpoint="b")
    theirs.error, theirs.stage = npe, "run"
    ours.error, ours.stage = _failed("Redefining watermark is disallowed. SQLSTATE: XXKST"), "run"
    result = fuzz._judge(None, None, 3960, SEMI_JOIN_OF_A_UNION, theirs, ours, compare_state=False)
    assert result.status == "spark-internal-error" and not result.failed, result.report()
    assert "Redefining watermark" in result.detail


def test_a_column_is_spelt_as_an_attribute_only_where_python_reads_it_so():
    """Seed 3947: the column ``count(1)`` of ``SELECT count(*)`` was spelt ``df.count(1)``, a
    call of DataFrame.count (a TypeError on Spark's side) instead of a column."""
    assert not fuzz._attribute_spelling("count(1)") and not fuzz._attribute_spelling("count")
    assert fuzz._attribute_spelling("k") and fuzz._attr("df", "count(1)") == 'df["count(1)"]'
    rendered = fuzz.generate(3947).query.lines
    assert not any("df.count(" in line for line in rendered), rendered
