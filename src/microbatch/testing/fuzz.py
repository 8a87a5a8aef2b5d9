"""A seeded differential query fuzzer: generated streaming queries on Spark's engine and on
microbatch over the same generated input, batch by batch (issue 57).

    python -m microbatch.testing.fuzz --seeds 50 --start 1 [--plant NAME] [--seconds 600]
                                      [--no-minimise] [--verbose]

A seed makes one query and its input (``generate(seed)``). The query is PySpark code, a
list of lines over a source frame ``src`` (and a second stream ``src2``, a static
DataFrame ``static``, the session as ``session``), ending with the frame ``df``::

    df = src
    w = df
    df = df.withWatermark("ts", "10 seconds")
    df = df.withColumnRenamed("ts", "t2")
    df = df.groupBy(F.window("t2", "10 seconds")).count()

The same text is exec'd with ``src`` bound to Spark's file stream (``spark.readStream``)
and to microbatch's (``StreamingSession(spark).readStream``), in one Spark session; each
runs into ``foreachBatch`` with ``trigger(availableNow=True)`` and ``maxFilesPerTrigger``
1, in the output mode the seed chose (Spark decides whether the shape allows it). A
restart in the middle is part of a query: the first run sees only the first files, the
rest are written after it ends and the same text runs again on the same checkpoint.

Compared, per batch: the batch ids, the rows (as multisets) and columns, the watermark,
``numInputRows``, the state operators (names and ``numRowsTotal``, in Spark's order); at
the end, the state rows per operator and partition as each engine's ``statestore`` reader
reads them. A query Spark refuses (when defined, at ``start()`` or when its run fails)
must be refused by microbatch with the same error class; a query microbatch refuses and
Spark runs is a refusal, listed by kind (the first line of microbatch's message).

A failing query is minimised (its lines dropped one at a time while the same difference
remains) and printed as code, with its seed and the first batch that differs.

Where Spark's engine is not the reference, a result says so, counted and listed apart from
the failures: ``known-difference`` where Spark's results depend on its optimizer reusing an
exchange (``EXCHANGE_REUSE``: the query differs as it runs, and Spark's engine with
``spark.sql.exchange.reuse`` off gives microbatch's results) or on its numbering of stateful
operators in each batch's plan (``OPERATORS_RENUMBERED``: Spark runs fewer of them in a batch
where a union's input is empty, and with PropagateEmptyRelation excluded gives microbatch's
results; ``LIMIT_ELIMINATED``: Spark drops a limit's operator in a batch where the limit's
input is empty, and with the rules that drop it excluded gives microbatch's results), and
``spark-internal-error``
where Spark's engine fails with an internal error (SQLSTATE class ``XX``, e.g. its
optimizer's plan validation, or a JVM ``NullPointerException`` in a task) and microbatch runs
the query or fails otherwise (with no reference, its error is listed, not judged).

``--plant NAME`` sets ``spark.microbatch.testing.plant`` on the session for microbatch's
runs only: a test-only hook of the engine that plants a known bug, which the fuzzer must
find.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor

PLANT_CONF = "spark.microbatch.testing.plant"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SCHEMA1 = "ts TIMESTAMP, k INT, v INT, s STRING"
SCHEMA2 = "ts2 TIMESTAMP, k2 INT, v2 INT"
VIEW = "fuzz_v"
#: a run of one engine longer than this has hung
RUN_TIMEOUT = 120.0

# -- the fixed user functions the grammar calls (importable by Spark's Python workers) --------


def fuzz_running_count(key_name: str):
    """applyInPandasWithState, no timeout: the rows of each key so far, once a batch (the
    output's key column named ``key_name``)."""
    def running_count(key, frames, state):
        n = state.get[0] if state.exists else 0
        for frame in frames:
            n += len(frame)
        state.update((n,))
        yield pd.DataFrame({key_name: [key[0]], "n": [n]})
    return running_count


def fuzz_until_quiet(key_name: str):
    """applyInPandasWithState, event-time timeout: the rows of each key, reported (and
    forgotten) once the watermark passes 5 s beyond the watermark of its last rows."""
    def until_quiet(key, frames, state):
        if state.hasTimedOut:
            (n,) = state.get
            state.remove()
            yield pd.DataFrame({key_name: [key[0]], "n": [n], "done": [True]})
            return
        n = state.get[0] if state.exists else 0
        for frame in frames:
            n += len(frame)
        state.update((n,))
        state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 5000)
        yield pd.DataFrame({key_name: [key[0]], "n": [n], "done": [False]})
    return until_quiet


class FuzzRunningCount(StatefulProcessor):
    """transformWithStateInPandas, no time mode: a running count per key; a key that
    reached 4 rows is reported and cleared."""

    def __init__(self, key_name: str):
        self.key_name = key_name

    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        n += sum(len(frame) for frame in rows)
        if n >= 4:
            self.count.clear()
        else:
            self.count.update((n,))
        yield pd.DataFrame({self.key_name: [key[0]], "n": [n]})

    def close(self):
        pass


class FuzzTimers(StatefulProcessor):
    """transformWithStateInPandas, event time: a count per key; a timer 5 s of event time
    after each batch's latest row of the key reports the count and clears it."""

    def __init__(self, key_name: str, time_name: str):
        self.key_name, self.time_name = key_name, time_name

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        latest = None
        for frame in rows:
            n += len(frame)
            high = frame[self.time_name].max()
            latest = high if latest is None or high > latest else latest
        self.count.update((n,))
        if latest is not None and not pd.isna(latest):
            self.handle.registerTimer(int(pd.Timestamp(latest).value // 1_000_000) + 5000)
        yield pd.DataFrame({self.key_name: [key[0]], "n": [n], "fired": [False]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n = self.count.get()[0] if self.count.exists() else -1
        self.count.clear()
        yield pd.DataFrame({self.key_name: [key[0]], "n": [n], "fired": [True]})

    def close(self):
        pass


# -- a query and its input ---------------------------------------------------------------


@dataclass
class Query:
    """Code lines over ``src`` ending with ``df``, the output mode, and after how many
    files of each stream the query stops and restarts (None: one run)."""
    lines: list[str]
    mode: str
    restart_after: int | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def code(self) -> str:
        """The query as code to paste: its lines and the writer."""
        restart = "" if self.restart_after is None else \
            f"\n# stopped after file {self.restart_after} of each stream, then restarted on the same checkpoint"
        return (self.text + f'\nquery = (df.writeStream.outputMode("{self.mode}").foreachBatch(sink)'
                ".option(\"checkpointLocation\", ckpt).trigger(availableNow=True).start())" + restart)


@dataclass
class Case:
    seed: int
    query: Query
    files1: list[list[dict]]     # the rows of each file of ``src`` (ts, k, v, s)
    files2: list[list[dict]]     # ... and of ``src2`` (ts2, k2, v2)


def _stamp(second: int) -> str:
    return f"2026-01-01 00:{second // 60:02d}:{second % 60:02d}"


def _input_files(rng: random.Random, count: int, second: bool) -> list[list[dict]]:
    """``count`` files of a few rows: event times moving forward out of order, late rows
    (behind any watermark), null keys and values now and then, an empty file sometimes."""
    files, frontier = [], rng.randint(0, 5)
    for i in range(count):
        if i > 0 and rng.random() < 0.15:
            files.append([])
            continue
        rows = []
        for _ in range(rng.randint(1, 6)):
            t = frontier + rng.randint(-3, 8)
            if rng.random() < 0.15:
                t = frontier - rng.randint(10, 30)     # late
            k = None if rng.random() < 0.05 else rng.randint(0, 3)
            v = None if rng.random() < 0.05 else rng.randint(0, 9)
            if second:
                rows.append({"ts2": _stamp(max(t, 0)), "k2": k, "v2": v})
            else:
                rows.append({"ts": _stamp(max(t, 0)), "k": k, "v": v, "s": rng.choice("abc")})
        files.append(rows)
        frontier += rng.randint(3, 12)
    return files


def generate(seed: int, composed: bool = True) -> Case:
    """The query and input of ``seed`` (the same on every machine). ``composed=False``: the
    query as the grammar made it before it composed joins with a limit below and a left
    semi join above (``COMPOSED``), which the tests of queries found by then pin."""
    rng = random.Random(seed)
    count = rng.randint(3, 6)
    files1 = _input_files(rng, count, second=False)
    files2 = _input_files(rng, rng.randint(3, 6), second=True)
    query = _Grammar(rng, random.Random(f"composed-{seed}") if composed else None).query()
    if rng.random() < 0.35:
        query.restart_after = rng.randint(1, count - 1)
    return Case(seed, query, files1, files2)


# -- the grammar -----------------------------------------------------------------------------

#: how often a join's query composes it with a limit below or a left semi join above
COMPOSED = {"limit": 0.12, "semi": 0.2}
_DELAYS = ("0 seconds", "3 seconds", "5 seconds", "10 seconds")
#: column names ``df.<name>`` cannot spell (``df.count`` is the method)
_FRAME_ATTRIBUTES = frozenset(n for n in dir(__import__("pyspark.sql").sql.DataFrame) if not n.startswith("_"))


@dataclass
class _Frame:
    """What the generator knows of a frame: its columns (name -> kind: ts, int, str, long,
    double, window, bool), the roles of some (et: the event time, key, val, str), whether
    the event time has a watermark, and an earlier frame's variable whose columns may be
    referenced (``w.ts``)."""
    cols: dict[str, str]
    roles: dict[str, str | None]
    wm: bool = False
    old: tuple[str, frozenset] | None = None

    def copy(self) -> "_Frame":
        return _Frame(dict(self.cols), dict(self.roles), self.wm, self.old)

    def role(self, name: str) -> str | None:
        found = self.roles.get(name)
        return found if found in self.cols else None


def _attribute_spelling(name: str) -> bool:
    """Whether ``df.<name>`` reads column ``name``: a Python identifier that is no attribute
    of PySpark's DataFrame (``df.count(1)`` calls DataFrame.count, for the column ``count(1)``
    of ``SELECT count(*)``)."""
    return name.isidentifier() and name not in _FRAME_ATTRIBUTES


def _attr(var: str, name: str) -> str:
    """Column ``name`` of the frame ``var``, as an attribute where PySpark allows it."""
    return f"{var}.{name}" if _attribute_spelling(name) else f'{var}["{name}"]'


class _Grammar:
    def __init__(self, rng: random.Random, more: random.Random | None = None):
        self.rng = rng
        #: the draws of shapes composed later (a join of a limit, a left semi join of a join),
        #: from their own generator, so every seed's query is the same up to them; None:
        #: none composed
        self.more = more
        self.lines: list[str] = []
        self.names = 0
        self.shape = ""
        self.aggregated = False   # an aggregation in the query (complete mode is more likely to run)

    # -- helpers
    def emit(self, line: str) -> None:
        self.lines.append(line)

    def fresh(self, base: str) -> str:
        self.names += 1
        return f"{base}_{self.names}"

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, weighted: dict[str, float]) -> str:
        return self.rng.choices(list(weighted), weights=list(weighted.values()))[0]

    def col(self, f: _Frame, name: str, var: str = "df", old: bool = True) -> str:
        """A reference to column ``name`` of frame ``var``, in one of PySpark's spellings
        (through the earlier frame ``f.old`` now and then)."""
        if old and f.old is not None and name in f.old[1] and self.chance(0.3):
            var = f.old[0]
            return f'{var}["{name}"]' if not _attribute_spelling(name) or self.chance(0.5) else f"{var}.{name}"
        spellings = [f'F.col("{name}")', f'{var}["{name}"]'] + ([f"{var}.{name}"] if _attribute_spelling(name) else [])
        return self.rng.choice(spellings)

    def name_or_col(self, f: _Frame, name: str, var: str = "df") -> str:
        return f'"{name}"' if self.chance(0.5) else self.col(f, name, var)

    # -- the query
    def query(self) -> Query:
        f = _Frame({"ts": "ts", "k": "int", "v": "int", "s": "str"},
                   {"et": "ts", "key": "k", "val": "v", "str": "s"})
        self.emit("df = src")
        self.shape = self.pick({"agg": 0.28, "dedup": 0.1, "join": 0.2, "static": 0.06, "limit": 0.04,
                                "pandas_state": 0.06, "tws": 0.05, "sql": 0.06, "branch": 0.09,
                                "stateless": 0.06})
        if self.chance(0.12):
            f = self.union(f)
        want_wm = 0.2 if self.shape in ("stateless", "static", "limit", "sql") else 0.8
        f = self.stateless(f, self.rng.randint(0, 2), want_wm)
        f = getattr(self, "shape_" + self.shape)(f)
        for _ in range(self.rng.choice([0, 0, 0, 1])):
            f = self.post(f)
        if self.aggregated:
            mode = self.pick({"append": 0.45, "update": 0.35, "complete": 0.2})
        else:
            mode = self.pick({"append": 0.7, "update": 0.22, "complete": 0.08})
        return Query(self.lines, mode)

    def union(self, f: _Frame) -> _Frame:
        other = 'src2.select(F.col("ts2").alias("ts"), F.col("k2").alias("k"), F.col("v2").alias("v"), ' \
                'F.lit("u").alias("s"))'
        if self.chance(0.5):   # each side its own watermark: the query's is the smaller
            other = other.replace("src2.", f'src2.withWatermark("ts2", "{self.rng.choice(_DELAYS)}").')
            self.emit(f'df = df.withWatermark("ts", "{self.rng.choice(_DELAYS)}").unionByName({other})')
            f = f.copy()
            f.wm = True
            return f
        self.emit(f"df = df.union({other})")
        return f

    def watermark(self, f: _Frame, column: str | None = None) -> _Frame:
        column = column or f.role("et")
        if column is None:
            return f
        f = f.copy()
        if self.chance(0.5):
            self.emit("w = df")
            f.old = ("w", frozenset(f.cols))
        self.emit(f'df = df.withWatermark("{column}", "{self.rng.choice(_DELAYS)}")')
        f.roles["et"], f.wm = column, True
        return f

    def stateless(self, f: _Frame, steps: int, want_wm: float) -> _Frame:
        """``steps`` projections and filters, with a watermark among them (``want_wm``)."""
        wm_at = self.rng.randint(0, steps) if not f.wm and self.chance(want_wm) else -1
        for i in range(steps + 1):
            if i == wm_at:
                f = self.watermark(f)
                if self.chance(0.08):   # a second watermark, on the same or a derived column
                    if self.chance(0.5) and f.role("et"):
                        derived = self.fresh("t")
                        self.emit(f'df = df.withColumn("{derived}", {self.col(f, f.roles["et"])} '
                                  f'+ F.expr("INTERVAL 2 SECONDS"))')
                        f.cols[derived] = "ts"
                        f = self.watermark(f, derived)
                    else:
                        f = self.watermark(f)
            if i < steps:
                f = self.step(f)
        return f

    def step(self, f: _Frame) -> _Frame:
        kind = self.pick({"rename": 0.2, "alias": 0.15, "selectExpr": 0.1, "et_expr": 0.1, "val_expr": 0.1,
                          "drop": 0.1, "filter": 0.25})
        f = f.copy()
        et, key, val, st = (f.role(r) for r in ("et", "key", "val", "str"))
        if kind == "rename":
            target = et if et and self.chance(0.5) else self.rng.choice(list(f.cols))
            new = self.fresh("t" if f.cols[target] == "ts" else target[:1])
            self.emit(f'df = df.withColumnRenamed("{target}", "{new}")')
            self.renamed(f, target, new)
        elif kind == "alias":
            target = et if et and self.chance(0.6) else self.rng.choice(list(f.cols))
            new = self.fresh("t" if f.cols[target] == "ts" else target[:1])
            parts = [f'{self.col(f, c)}.alias("{new}")' if c == target else f'"{c}"' for c in f.cols]
            self.emit(f"df = df.select({', '.join(parts)})")
            self.renamed(f, target, new)
        elif kind == "selectExpr":
            parts = []
            for c in f.cols:
                if c == val and self.chance(0.5):
                    parts.append(f"{c} * 2 AS {c}")
                elif c == et and f.cols[c] == "ts" and self.chance(0.25):
                    parts.append(f"{c} + INTERVAL 1 SECOND AS {c}")
                else:
                    parts.append(c)
            self.emit("df = df.selectExpr(" + ", ".join(f'"{p}"' for p in parts) + ")")
        elif kind == "et_expr" and et and f.cols[et] == "ts":
            if self.chance(0.5):
                self.emit(f'df = df.withColumn("{et}", {self.col(f, et)} + F.expr("INTERVAL 2 SECONDS"))')
            else:
                new = self.fresh("t")
                self.emit(f'df = df.withColumn("{new}", {self.col(f, et)} - F.expr("INTERVAL 1 SECOND"))')
                f.cols[new] = "ts"
                if self.chance(0.3):
                    f.roles["et"] = new
        elif kind == "val_expr" and val:
            expr = self.rng.choice([f"{self.col(f, val)} * 2 + 1", f"F.coalesce({self.col(f, val)}, F.lit(0))",
                                    f"{self.col(f, val)} % 4"])
            target = val if self.chance(0.6) else self.fresh("v")
            self.emit(f'df = df.withColumn("{target}", {expr})')
            f.cols[target] = "int"
        elif kind == "drop" and (st or val):
            target = st if st and self.chance(0.7) else (val or st)
            spelled = self.rng.choice([f'"{target}"', self.col(f, target)])
            self.emit(f"df = df.drop({spelled})")
            del f.cols[target]
        else:
            f = self.filter(f)
        return f

    def renamed(self, f: _Frame, old: str, new: str) -> None:
        f.cols = {(new if c == old else c): t for c, t in f.cols.items()}
        for role, name in f.roles.items():
            if name == old:
                f.roles[role] = new

    def filter(self, f: _Frame) -> _Frame:
        et, key, val, st = (f.role(r) for r in ("et", "key", "val", "str"))
        options = []
        if val:
            options += [f"df = df.filter({self.col(f, val)} > 2)",
                        f'df = df.where("{val} IS NOT NULL AND {val} % 3 != 0")']
        if key:
            options += [f"df = df.filter({self.col(f, key)} != 1)", f'df = df.where("{key} IS NOT NULL")']
        if et and f.cols[et] == "ts":
            options.append(f'df = df.filter({self.col(f, et)} >= F.lit("2026-01-01 00:00:04").cast("timestamp"))')
        if st:
            options.append(f'df = df.where({self.col(f, st)}.isin("a", "b"))')
        if options:
            self.emit(self.rng.choice(options))
        return f

    def post(self, f: _Frame) -> _Frame:
        ints = [c for c, t in f.cols.items() if t in ("int", "long")]
        if ints and self.chance(0.6):
            c = self.rng.choice(ints)
            self.emit(self.rng.choice([f"df = df.filter({self.col(f, c, old=False)} >= 1)",
                                       f'df = df.where("{c} IS NOT NULL")']))
        elif len(f.cols) > 1:
            keep = self.rng.sample(list(f.cols), self.rng.randint(1, len(f.cols)))
            keep = [c for c in f.cols if c in keep]
            self.emit("df = df.select(" + ", ".join(f'"{c}"' for c in keep) + ")")
            f = f.copy()
            f.cols = {c: f.cols[c] for c in keep}
        return f

    # -- stateful shapes
    def window_of(self, f: _Frame, et: str) -> tuple[str, str]:
        """A window grouping over the event time ``et``: (the expression, its column)."""
        ref = self.name_or_col(f, et)
        if f.cols.get(et) == "window":
            ref = f'F.window_time({self.name_or_col(f, et)})'
        kind = self.pick({"tumbling": 0.5, "sliding": 0.3, "session": 0.2})
        if kind == "tumbling":
            expr, name = f'F.window({ref}, "{self.rng.choice(["5 seconds", "10 seconds"])}")', "window"
        elif kind == "sliding":
            expr, name = f'F.window({ref}, "10 seconds", "{self.rng.choice(["2 seconds", "5 seconds"])}")', "window"
        else:
            expr, name = f'F.session_window({ref}, "{self.rng.choice(["3 seconds", "5 seconds"])}")', \
                "session_window"
        if self.chance(0.25):
            name = self.fresh("win")
            expr = f'{expr}.alias("{name}")'
        return expr, name

    def aggregation(self, f: _Frame, windowed: float = 0.75) -> _Frame:
        et, key, val, st = (f.role(r) for r in ("et", "key", "val", "str"))
        keys, out = [], {}
        new_et = None
        if et and self.chance(windowed):
            expr, name = self.window_of(f, et)
            keys.append(expr)
            out[name] = "window"
            new_et = name
        if key and (not keys or self.chance(0.5)):
            keys.append(self.name_or_col(f, key))
            out[key] = "int"
        if st and self.chance(0.25):
            keys.append(f'"{st}"')
            out[st] = "str"
        if not keys and self.chance(0.5):
            keys.append(f"({self.col(f, val or et)}.isNull()).alias(\"nothing\")")
            out["nothing"] = "bool"
        self.aggregated = True
        method = self.pick({"groupBy": 0.8, "rollup": 0.1, "cube": 0.1})
        grouped = f"df.{method}({', '.join(keys)})"
        if self.chance(0.35) or not (val or et):
            self.emit(f"df = {grouped}.count()")
            out["count"] = "long"
        else:
            calls = []
            choices = ["count"] + (["sum", "min", "max", "avg", "sum2"] if val else []) + \
                (["last"] if et and f.cols[et] == "ts" else [])
            for what in self.rng.sample(choices, self.rng.randint(1, min(3, len(choices)))):
                name = self.fresh(what[:2])
                if what == "count":
                    calls.append(f'F.count("*").alias("{name}")')
                elif what == "sum2":
                    calls.append(f'F.sum({self.col(f, val)} * 2).alias("{name}")')
                elif what == "last":
                    calls.append(f'F.max({self.name_or_col(f, et)}).alias("{name}")')
                else:
                    calls.append(f'F.{what}({self.name_or_col(f, val)}).alias("{name}")')
                out[name] = "double" if what == "avg" else "ts" if what == "last" else "long"
            self.emit(f"df = {grouped}.agg({', '.join(calls)})")
        counts = [c for c, t in out.items() if t == "long"]
        return _Frame(out, {"et": new_et, "key": key if key in out else None, "val": counts[0] if counts else None,
                            "str": st if st in out else None}, wm=f.wm and new_et is not None)

    def shape_stateless(self, f: _Frame) -> _Frame:
        return self.stateless(f, self.rng.randint(1, 2), 0)

    def shape_agg(self, f: _Frame) -> _Frame:
        f = self.aggregation(f)
        if f.role("et") and self.chance(0.3):   # an aggregation over the first one's windows
            f = self.aggregation(f, windowed=0.9)
        elif f.role("et") and self.chance(0.15):
            f = self.shape_join(f)
        return f

    def shape_dedup(self, f: _Frame) -> _Frame:
        et, key, st = f.role("et"), f.role("key"), f.role("str")
        columns = [c for c in (key, et if self.chance(0.6) else None, st if self.chance(0.2) else None) if c]
        listed = ", ".join(f'"{c}"' for c in columns)
        kind = self.pick({"dropDuplicates": 0.7, "dropDuplicatesWithinWatermark": 0.3})
        if kind == "dropDuplicatesWithinWatermark":
            listed = ", ".join(f'"{c}"' for c in columns if c != et) or f'"{self.rng.choice(list(f.cols))}"'
        self.emit(f"df = df.{kind}([{listed}])" if columns and self.chance(0.85) else f"df = df.{kind}()")
        if self.chance(0.4):
            f = self.aggregation(f)
        return f

    def right_side(self, windowed: bool, using: tuple[str, str] | None) -> _Frame:
        """``right``: the second stream, with a watermark (mostly), renamed now and then."""
        r = _Frame({"ts2": "ts", "k2": "int", "v2": "int"}, {"et": "ts2", "key": "k2", "val": "v2"})
        self.emit("right = src2")
        wm_first = self.chance(0.7)
        if wm_first and self.chance(0.8):
            self.emit(f'right = right.withWatermark("ts2", "{self.rng.choice(_DELAYS)}")')
            r.wm = True
        if using is not None:   # the same names as the left side's key and event time
            self.emit(f'right = right.select(F.col("ts2").alias("{using[1]}"), F.col("k2").alias("{using[0]}"), "v2")')
            r = _Frame({using[1]: "ts", using[0]: "int", "v2": "int"},
                       {"et": using[1], "key": using[0], "val": "v2"}, r.wm)
        elif self.chance(0.15):
            self.emit('right = right.withColumnRenamed("ts2", "rt")')
            self.renamed(r, "ts2", "rt")
        if not wm_first and self.chance(0.8):
            self.emit(f'right = right.withWatermark("{r.roles["et"]}", "{self.rng.choice(_DELAYS)}")')
            r.wm = True
        if windowed:
            size = "10 seconds"
            if self.chance(0.25):   # an aggregation before the join
                self.emit(f'right = right.groupBy(F.window("{r.roles["et"]}", "{size}").alias("rw"), "k2")'
                          f'.agg(F.sum("v2").alias("sv2"))')
                return _Frame({"rw": "window", "k2": "int", "sv2": "long"}, {"et": "rw", "key": "k2", "val": "sv2"},
                              r.wm)
            self.emit(f'right = right.select(F.window("{r.roles["et"]}", "{size}").alias("rw"), "k2", "v2")')
            return _Frame({"rw": "window", "k2": "int", "v2": "int"}, {"et": "rw", "key": "k2", "val": "v2"}, r.wm)
        return r

    def shape_join(self, f: _Frame) -> _Frame:
        if self.more and self.more.random() < COMPOSED["limit"]:      # a join of a streaming limit
            self.emit(f"df = df.limit({self.more.randint(3, 8)})")
        et, key = f.role("et"), f.role("key")
        if key is None:
            self.emit('df = df.withColumn("k", F.lit(1))')
            f = f.copy()
            f.cols["k"], f.roles["key"] = "int", "k"
            key = "k"
        kind = self.pick({"range": 0.45, "window": 0.25, "key": 0.15, "using": 0.15})
        if et is None or (kind == "range" and f.cols[et] != "ts"):
            kind = "key"
        if kind == "window" and f.cols[et] == "ts":
            f = f.copy()
            rest = [c for c in f.cols if c not in (et, key)]
            self.emit(f'df = df.select(F.window({self.name_or_col(f, et)}, "10 seconds").alias("lw"), '
                      + ", ".join(f'"{c}"' for c in [key, *rest]) + ")")
            f.cols = {"lw": "window", key: "int", **{c: f.cols[c] for c in rest}}
            f.roles["et"] = et = "lw"
        r = self.right_side(kind == "window", (key, et) if kind == "using" else None)
        left = "df"
        if self.chance(0.4):
            self.emit("left = df")
            left = "left"
        rk, ret = r.roles["key"], r.roles["et"]
        if kind == "range":
            lo, hi = self.rng.choice([(5, 5), (3, 0), (0, 10)])
            if self.chance(0.6):
                cond = (f'F.expr("{key} = {rk} AND {ret} BETWEEN {et} - INTERVAL {lo} SECONDS '
                        f'AND {et} + INTERVAL {hi} SECONDS")')
            else:
                cond = (f'({_attr(left, key)} == {_attr("right", rk)}) & ({_attr("right", ret)} >= '
                        f'{_attr(left, et)} - F.expr("INTERVAL {lo} SECONDS")) '
                        f'& ({_attr("right", ret)} <= {_attr(left, et)} + F.expr("INTERVAL {hi} SECONDS"))')
        elif kind == "window":
            cond = self.rng.choice([f'F.expr("{key} = {rk} AND {et} = {ret}")',
                                    f'[{_attr(left, et)} == {_attr("right", ret)}, {_attr(left, key)} == {_attr("right", rk)}]'])
        elif kind == "key":
            cond = self.rng.choice([f'{_attr(left, key)} == {_attr("right", rk)}', f'F.expr("{key} = {rk}")'])
        else:
            cond = f'["{key}", "{et}"]'
        how = self.pick({"inner": 0.4, "left_outer": 0.15, "right_outer": 0.15, "full_outer": 0.1,
                         "left_semi": 0.15, "left_anti": 0.05})
        line = f'df = {left}.join(right, {cond}, "{how}")'
        out = dict(f.cols)
        if how not in ("left_semi", "left_anti"):
            out.update({c: t for c, t in r.cols.items() if c not in out})
        if left == "left" and self.chance(0.5):   # a column of one side dropped by reference
            side, cols = ("left", f.cols) if self.chance(0.6) else ("right", r.cols)
            if side == "right" and how in ("left_semi", "left_anti"):
                side, cols = "left", f.cols
            target = self.rng.choice(list(cols))
            line += f".drop({_attr(side, target)})"
            if kind != "using" or target not in (key, et):
                out.pop(target, None)
        self.emit(line)
        if how not in ("left_semi", "left_anti") and key in out and et in out and f.cols.get(et) == "ts" \
                and self.more and self.more.random() < COMPOSED["semi"]:
            # a left semi join of the join, on the left side's key and event time against a
            # second read of src: Spark's optimizer moves it into the join's side where it can
            delay = self.more.choice(_DELAYS)
            self.emit(f'third = src.select(F.col("ts").alias("ts3"), F.col("k").alias("k3"))'
                      f'.withWatermark("ts3", "{delay}")')
            self.emit(f'df = df.join(third, F.expr("{key} = k3 AND {et} BETWEEN ts3 - INTERVAL 5 SECONDS '
                      f'AND ts3 + INTERVAL 5 SECONDS"), "left_semi")')
        joined = _Frame(out, {"et": et, "key": key, "val": f.role("val"), "str": f.role("str")}, f.wm)
        if self.chance(0.3):
            joined = self.aggregation(joined)
        return joined

    def shape_static(self, f: _Frame) -> _Frame:
        key = f.role("key")
        how = self.pick({"inner": 0.5, "left_outer": 0.25, "left_semi": 0.1, "left_anti": 0.05,
                         "right_outer": 0.1})
        if key == "k":
            self.emit(f'df = df.join(static, "k", "{how}")')
        elif key:
            self.emit(f'df = df.join(static, {self.col(f, key)} == static.k, "{how}")')
        else:
            self.emit('df = df.crossJoin(static.select("name"))')
        f = f.copy()
        if how not in ("left_semi", "left_anti"):
            f.cols["name"] = "str"
        if self.chance(0.5):
            f = self.aggregation(f)
        return f

    def shape_limit(self, f: _Frame) -> _Frame:
        self.emit(f"df = df.limit({self.rng.randint(2, 8)})")
        if self.chance(0.2):
            f = self.aggregation(f, windowed=0.3)
        return f

    def shape_pandas_state(self, f: _Frame) -> _Frame:
        key, key_type = (f.role("key"), "INT") if f.role("key") and self.chance(0.8) else (f.role("str"), "STRING")
        key = key or "k"
        mode = self.rng.choice(["update", "append"])
        if self.chance(0.5):
            self.emit(f'df = df.groupBy("{key}").applyInPandasWithState(fuzz_running_count("{key}"), "{key} {key_type}, '
                      f'n LONG", "n LONG", "{mode}", GroupStateTimeout.NoTimeout)')
            return _Frame({key: "int", "n": "long"}, {"key": key, "val": "n"})
        self.emit(f'df = df.groupBy("{key}").applyInPandasWithState(fuzz_until_quiet("{key}"), "{key} {key_type}, n LONG, '
                  f'done BOOLEAN", "n LONG", "{mode}", GroupStateTimeout.EventTimeTimeout)')
        return _Frame({key: "int", "n": "long", "done": "bool"}, {"key": key, "val": "n"})

    def shape_tws(self, f: _Frame) -> _Frame:
        key, et = f.role("key") or "k", f.role("et")
        self.emit(f'df = df.where("{key} IS NOT NULL")')   # (Spark calls a null key twice in a batch)
        mode = self.rng.choice(["update", "append"])
        if et and f.cols[et] == "ts" and self.chance(0.6):
            self.emit(f'df = df.groupBy("{key}").transformWithStateInPandas(FuzzTimers("{key}", "{et}"), '
                      f'"{key} INT, n LONG, fired BOOLEAN", "{mode}", "EventTime")')
            return _Frame({key: "int", "n": "long", "fired": "bool"}, {"key": key, "val": "n"})
        self.emit(f'df = df.groupBy("{key}").transformWithStateInPandas(FuzzRunningCount("{key}"), '
                  f'"{key} INT, n LONG", "{mode}", "None")')
        return _Frame({key: "int", "n": "long"}, {"key": key, "val": "n"})

    def shape_sql(self, f: _Frame) -> _Frame:
        et, key, val = f.role("et"), f.role("key"), f.role("val")
        self.emit(f'df.createOrReplaceTempView("{VIEW}")')
        options = [(f"SELECT count(*) FROM {VIEW}", {"count(1)": "long"}),
                   (f"SELECT count(*) AS n FROM {VIEW}", {"n": "long"})]
        if key:
            options.append((f"SELECT DISTINCT {key} FROM {VIEW}", {key: "int"}))
            if val:
                options.append((f"SELECT {key}, count(*) AS n, sum({val}) AS sv FROM {VIEW} GROUP BY {key}",
                                {key: "int", "n": "long", "sv": "long"}))
        if et and f.cols[et] == "ts":
            options.append((f"SELECT window({et}, '10 seconds') AS win, count(*) AS n FROM {VIEW} "
                            f"GROUP BY window({et}, '10 seconds')", {"win": "window", "n": "long"}))
            if val:
                options.append((f"SELECT {et}, {val} FROM {VIEW} WHERE {val} > 3", {et: "ts", val: "int"}))
        text, cols = self.rng.choice(options)
        self.aggregated = "GROUP BY" in text or "count(*)" in text
        self.emit(f'df = session.sql("{text}")')
        return _Frame(cols, {"et": "win" if "win" in cols else None, "key": key if key in cols else None,
                             "val": "n" if "n" in cols else None}, f.wm and "win" in cols)

    def shape_branch(self, f: _Frame) -> _Frame:
        """One stream in two stateful paths that meet again."""
        et, key, val = f.role("et"), f.role("key") or "k", f.role("val")
        if et is None or f.cols[et] != "ts":
            return self.shape_agg(f)
        if not f.wm:
            f = self.watermark(f)
        kind = self.pick({"max of counts": 0.4, "aggregation joined to its input": 0.35, "self join": 0.25})
        if kind == "max of counts":
            self.emit(f'counts = df.groupBy(F.window("{et}", "10 seconds", "{self.rng.choice(["2", "5"])} seconds"), '
                      f'"{key}").count()')
            self.emit('m = counts.groupBy("window").agg(F.max("count").alias("mx")).withColumnRenamed("window", "mwindow")')
            self.emit('df = counts.join(m, F.expr("window = mwindow AND count = mx"))')
            self.aggregated = True
            return _Frame({"window": "window", key: "int", "count": "long", "mwindow": "window", "mx": "long"},
                          {"et": "window", "key": key, "val": "count"}, True)
        if kind == "aggregation joined to its input":
            agg = f'F.max("{val}").alias("mv")' if val else 'F.count("*").alias("mv")'
            self.emit(f'a = df.groupBy(F.window("{et}", "10 seconds").alias("aw")).agg({agg})')
            value = f'F.col("{val}")' if val else "F.lit(1)"
            self.emit(f'b = df.select(F.window("{et}", "10 seconds").alias("bw"), "{key}", {value}.alias("bv"))')
            cond = "bw = aw AND bv = mv" if val and self.chance(0.6) else "bw = aw"
            self.emit(f'df = b.join(a, F.expr("{cond}"))')
            self.aggregated = True
            return _Frame({"bw": "window", key: "int", "bv": "int", "aw": "window", "mv": "long"},
                          {"et": "bw", "key": key, "val": "bv"}, True)
        self.emit(f'other = df.select(F.col("{et}").alias("ot"), F.col("{key}").alias("ok"))')
        self.emit(f'df = df.join(other, F.expr("{key} = ok AND ot BETWEEN {et} - INTERVAL 3 SECONDS AND {et}"))')
        out = dict(f.cols)
        out.update({"ot": "ts", "ok": "int"})
        return _Frame(out, {"et": et, "key": key, "val": val}, True)


# -- running a query on one engine -----------------------------------------------------------


@dataclass
class Batch:
    """One batch as an engine ran it: the sink's columns and rows, and its progress."""
    columns: tuple | None = None
    rows: list | None = None
    watermark: str | None = None
    input_rows: int | None = None
    operators: tuple = ()      # (operatorName, numRowsTotal) per state operator, in order
    progress: bool = False


@dataclass
class EngineRun:
    batches: dict[int, Batch] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)    # batch ids as the sink saw them
    error: BaseException | None = None
    stage: str = ""           # where it failed: define, start, run, timeout
    checkpoint: str = ""
    operators: list[str] = field(default_factory=list)
    plan: str = ""            # Spark's engine: the last batch's physical plan (``explain()``)

    @property
    def refused_early(self) -> bool:
        return self.error is not None and self.stage in ("define", "start")


def _write_files(directory: Path, files: list[list[dict]], first: int, last: int) -> None:
    base = time.time() - 10_000
    for i in range(first, last):
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in files[i]))
        os.utime(path, (base + i, base + i))


def _namespace(session, src_dir: Path, src2_dir: Path, static) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    def stream(path, schema):
        return session.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(path))
    return {"F": F, "src": stream(src_dir, SCHEMA1), "src2": stream(src2_dir, SCHEMA2), "static": static,
            "session": session, "GroupStateTimeout": GroupStateTimeout, "fuzz_running_count": fuzz_running_count,
            "fuzz_until_quiet": fuzz_until_quiet, "FuzzRunningCount": FuzzRunningCount, "FuzzTimers": FuzzTimers}


def _run_once(session, query: Query, dirs: tuple[Path, Path], static, ckpt: str, out: EngineRun) -> None:
    """Defines the query on ``session`` (Spark's or microbatch's), runs it with
    ``availableNow`` to the end, and adds its batches and progress to ``out``."""
    def sink(df, batch_id):
        batch = out.batches.setdefault(batch_id, Batch())
        batch.columns, batch.rows = tuple(df.columns), sorted(map(tuple, df.collect()), key=repr)
        out.order.append(batch_id)

    names = _namespace(session, dirs[0], dirs[1], static)
    try:
        exec(compile(query.text, "<fuzz query>", "exec"), names)   # noqa: S102 - the generated query
        writer = names["df"].writeStream.outputMode(query.mode).foreachBatch(sink) \
            .option("checkpointLocation", ckpt).trigger(availableNow=True)
    except Exception as e:     # noqa: BLE001 - a refusal is a result
        out.error, out.stage = e, "define"
        return
    try:
        running = writer.start()
    except Exception as e:     # noqa: BLE001
        out.error, out.stage = e, "start"
        return
    try:
        finished = running.awaitTermination(RUN_TIMEOUT)
    except Exception as e:     # noqa: BLE001 - the query failed
        out.error, out.stage = e, "run"
        finished = True
    if not finished:
        running.stop()
        out.error, out.stage = TimeoutError(f"the run did not end in {RUN_TIMEOUT:.0f} s"), "timeout"
    for p in running.recentProgress:
        batch = out.batches.setdefault(p.batchId, Batch())
        batch.progress = True
        batch.watermark = (p.eventTime or {}).get("watermark")
        batch.input_rows = p.numInputRows
        batch.operators = tuple((op.operatorName, op.numRowsTotal) for op in p.stateOperators)
        out.operators = [op.operatorName for op in p.stateOperators]
    if out.error is None and isinstance(session, SparkSession):   # (Spark's plan, for EXCHANGE_REUSE)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                running.explain()
        except Exception:   # noqa: BLE001 - no plan to read: not a difference of its own
            printed = io.StringIO()
        out.plan = printed.getvalue()


def _error_kind(error: BaseException) -> str:
    """The error's class as the comparison sees it: Spark's error condition where it has
    one, else PySpark's exception class."""
    condition = None
    method = getattr(error, "getCondition", None) or getattr(error, "getErrorClass", None)   # (3.5: no getCondition)
    if method is not None:
        try:
            condition = method()
        except Exception:   # noqa: BLE001
            condition = None
    base = next((c.__name__ for c in type(error).__mro__ if c.__module__.startswith("pyspark.errors")),
                type(error).__name__)
    if condition == "STREAM_FAILED":   # the failed run's cause decides
        cause = str(error).split("terminated with exception:", 1)[-1].strip().split("\n")[0]
        return f"{base}/STREAM_FAILED: {_condition_in(cause) or _clause(cause)}"
    return f"{base}: {condition}" if condition else base


def _condition_in(text: str) -> str | None:
    import re
    found = re.findall(r"\[([A-Z][A-Z0-9_.]+)\]", text)
    return found[0] if found else None


def _clause(text: str) -> str:
    """A message's first clause, without Spark's condition and the plan after it."""
    import re
    text = re.sub(r"^\s*\[[A-Z][A-Z0-9_.]+\]\s*", "", text.strip()).split("\n")[0]
    text = re.sub(r"#\d+(-T\d+ms)?", "", text)                 # expression ids differ run to run
    text = re.sub(r"[^\s;]*fuzz-\d+-[^/\s;]+[^\s;]*", "<path>", text)   # ... and the temporary directory
    return re.split(r"[;:]", text, maxsplit=1)[0][:200]


def _same_refusal(theirs: BaseException, ours: BaseException) -> tuple[bool, str]:
    """Whether microbatch refused as Spark did, and the refusal's kind. Spark's error
    condition must match; where Spark's is ``_LEGACY_ERROR_TEMP_*`` (a message-only
    error) and microbatch's has none, the class and the message's first clause must."""
    a, b = _error_kind(theirs), _error_kind(ours)
    if a == b:
        return True, a
    base_a, _, condition = a.partition(": ")
    if condition.startswith("_LEGACY_ERROR_TEMP_") and b == base_a and \
            _clause(str(theirs)) == _clause(str(ours)):
        return True, f"{a} (microbatch: the same message, no condition)"
    return False, a


def _first_line(error: BaseException) -> str:
    """The error in a line: its class and message; for a failed run, its cause (the
    last exception line of a Python traceback in it, else the cause's first line)."""
    import re
    text = str(error).strip()
    if "terminated with exception:" in text:
        cause = text.split("terminated with exception:", 1)[1]
        raised = re.findall(r"^\s*((?:\w+\.)*\w*(?:Error|Exception)\b.*)$", cause, re.MULTILINE)
        line = raised[-1].strip() if raised else cause.strip().split("\n")[0]
        return f"{type(error).__name__} (a failed run): {line[:300]}"
    return f"{type(error).__name__}: {text.split(chr(10))[0][:300]}"


# -- comparing the engines --------------------------------------------------------------------


@dataclass
class Result:
    """What one query did. ``status``: ok, differs, both-refused, microbatch-refuses,
    spark-refuses-microbatch-runs (a failure, as differs is), known-difference and
    spark-internal-error (where Spark's engine is no reference: listed, not failures), or
    skipped (Spark's own run did not end)."""
    seed: int
    query: Query
    status: str
    aspect: str = ""              # what differed first: rows, columns, batches, watermark, ...
    batch: int | None = None      # the first batch that differs
    detail: str = ""
    kind: str = ""                # a refusal's kind
    errors: tuple = ()            # the error classes of a failure that is an error
    state_compared: int = 0       # operators whose state rows per partition were compared
    state_skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    minimal: Query | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("differs", "spark-refuses-microbatch-runs")

    def report(self) -> str:
        shown = self.minimal or self.query
        where = "" if self.batch is None else f" at batch {self.batch}"
        head = f"seed {self.seed}: {self.status} ({self.aspect}{where})"
        note = "minimised query" if self.minimal is not None else "query"
        return f"{head}\n  {self.detail}\n  {note}:\n" + "\n".join("    " + line for line in shown.code().split("\n"))


def _diff_batches(theirs: EngineRun, ours: EngineRun) -> tuple[str, int | None, str] | None:
    """The first batch where the runs differ: (aspect, batch id, detail), or None."""
    if theirs.order != ours.order:
        first = next((i for i, (a, b) in enumerate(zip(theirs.order, ours.order)) if a != b),
                     min(len(theirs.order), len(ours.order)))
        bid = (theirs.order + ours.order)[first] if first < len(theirs.order + ours.order) else None
        return "batches", bid, f"Spark's sink saw batches {theirs.order}, microbatch's {ours.order}"
    for bid in sorted(set(theirs.batches) | set(ours.batches)):
        a, b = theirs.batches.get(bid, Batch()), ours.batches.get(bid, Batch())
        if a.progress != b.progress:
            return "progress", bid, f"a progress for batch {bid}: Spark {a.progress}, microbatch {b.progress}"
        if a.columns != b.columns:
            return "columns", bid, f"Spark {a.columns}, microbatch {b.columns}"
        if a.rows != b.rows:
            missing = [r for r in a.rows or [] if r not in (b.rows or [])]
            extra = [r for r in b.rows or [] if r not in (a.rows or [])]
            return "rows", bid, (f"Spark {len(a.rows or [])} rows, microbatch {len(b.rows or [])}; only Spark's: "
                                 f"{missing[:4]}; only microbatch's: {extra[:4]}")
        if a.watermark != b.watermark:
            return "watermark", bid, f"Spark {a.watermark}, microbatch {b.watermark}"
        if a.input_rows != b.input_rows:
            return "numInputRows", bid, f"Spark {a.input_rows}, microbatch {b.input_rows}"
        if [n for n, _ in a.operators] != [n for n, _ in b.operators]:
            return "state operators", bid, f"Spark {[n for n, _ in a.operators]}, microbatch {[n for n, _ in b.operators]}"
        if a.operators != b.operators:
            return "state rows", bid, f"numRowsTotal: Spark {list(a.operators)}, microbatch {list(b.operators)}"
    return None


def _state_partitions(reader, checkpoint: str, operator: int, join_side: str | None) -> list:
    r = reader.format("statestore").option("operatorId", operator)
    if join_side is not None:
        r = r.option("joinSide", join_side)
    return sorted((row[0], row[1]) for row in r.load(checkpoint).groupBy("partition_id").count().collect())



def _compare_state(spark, ss, theirs: EngineRun, ours: EngineRun, result: Result) -> tuple[str, str] | None:
    """The state rows per operator and partition, as Spark's reader reads Spark's checkpoint
    and microbatch's reader microbatch's; an operator either cannot read is skipped."""
    from microbatch.operators.base import state_layout
    for i, name in enumerate(theirs.operators):
        layout = state_layout(name)
        if layout.in_column_families:
            result.state_skipped.append(f"{name} (state variables, not rows)")
            continue
        sides = layout.sides or (None,)
        for side in sides:
            what = f"operator {i} ({name}{', ' + side if side else ''})"
            try:
                expected = _state_partitions(spark.read, theirs.checkpoint, i, side)
            except Exception as e:   # noqa: BLE001 - Spark's reader does not read it
                result.state_skipped.append(f"{name}: Spark's reader: {_first_line(e)[:120]}")
                continue
            try:
                got = _state_partitions(ss.read, ours.checkpoint, i, side)
            except Exception as e:   # noqa: BLE001
                result.state_skipped.append(f"{name}: microbatch's reader: {_first_line(e)[:120]}")
                continue
            result.state_compared += 1
            if expected != got:
                return "state per partition", (f"{what}: (partition, rows) Spark {expected}, "
                                               f"microbatch {got}")
    return None


def _static(spark):
    return spark.createDataFrame([(0, "zero"), (1, "one"), (2, "two"), (5, "five")], "k INT, name STRING")


def run_case(spark, case: Case, plant: str | None = None, query: Query | None = None,
             static=None, compare_state: bool = True) -> Result:
    """``case`` (with ``query`` instead of its own when given) on Spark's engine and on
    microbatch, in the session ``spark``; its inputs and checkpoints removed afterwards."""
    from microbatch import StreamingSession
    query = query or case.query
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"fuzz-{case.seed}-"))
    dirs = (work / "src", work / "src2")
    for d in dirs:
        d.mkdir()
    static = static if static is not None else _static(spark)
    theirs = EngineRun(checkpoint=str(work / "spark"))
    ours = EngineRun(checkpoint=str(work / "microbatch"))
    ss = StreamingSession(spark)
    try:
        _run_parts(spark, case, query, dirs, static, (("spark", spark, theirs), ("microbatch", ss, ours)), plant)
        result = _judge(spark, ss, case.seed, query, theirs, ours, compare_state)
        if result.failed and theirs.error is None and ours.error is None and _reuses_an_exchange(theirs.plan):
            result = _as_without_exchange_reuse(spark, ss, case, query, static, work, (theirs, ours), result,
                                                compare_state)
        renumbers = result.failed and theirs.error is None and ours.error is None and _renumbers_operators(theirs, ours)
        if renumbers:
            result = _as_without_empty_relations(spark, ss, case, query, static, work, (theirs, ours), result,
                                                 compare_state)
        if result.failed and renumbers:   # (the last batch's plan may have lost the reused exchange with the input)
            result = _as_without_both(spark, ss, case, query, static, work, (theirs, ours), result, compare_state)
        if result.failed and renumbers and "limit(" in query.text:
            result = _as_without_limit_elimination(spark, ss, case, query, static, work, (theirs, ours), result,
                                                   compare_state)
    finally:
        for q in ss.streams.active:
            q.stop()
        for q in spark.streams.active:
            q.stop()
        shutil.rmtree(work, ignore_errors=True)
    result.seconds = time.monotonic() - started
    return result


def _run_parts(spark, case: Case, query: Query, dirs: tuple[Path, Path], static, runs: tuple, plant: str | None) -> None:
    """The case's files written part by part (the restart in the middle), each of ``runs``
    (engine, session, EngineRun) run on them after each part, in order."""
    tws = "transformWithState" in query.text
    parts = [query.restart_after, None] if query.restart_after is not None else [None]
    done1 = done2 = 0
    for part in parts:
        end1 = len(case.files1) if part is None else min(part, len(case.files1))
        end2 = len(case.files2) if part is None else min(part, len(case.files2))
        _write_files(dirs[0], case.files1, done1, end1)
        _write_files(dirs[1], case.files2, done2, end2)
        done1, done2 = end1, end2
        for engine, session, run in runs:
            if run.error is not None:
                continue
            if engine == "spark":
                spark.conf.unset(PLANT_CONF)
                if tws:   # Spark's transformWithState runs on its RocksDB store only
                    spark.conf.set(PROVIDER_CONF, ROCKSDB)
            elif plant:
                spark.conf.set(PLANT_CONF, plant)
            try:
                _run_once(session, query, dirs, static, run.checkpoint, run)
            finally:
                spark.conf.unset(PLANT_CONF)
                spark.conf.unset(PROVIDER_CONF)
                spark.catalog.dropTempView(VIEW)


# -- where Spark's engine is not the reference ------------------------------------------------

REUSE_CONF = "spark.sql.exchange.reuse"
#: the kind of a known difference: Spark's results depend on its optimizer reusing an exchange
EXCHANGE_REUSE = ("Spark's engine reused an exchange below a stateful operator: the operators above the "
                  "reused exchange get no watermark and never evict (Spark propagates a batch's watermarks over "
                  "the previous batch's executed plan, where a reused exchange is a leaf); with "
                  "spark.sql.exchange.reuse=false Spark's engine gives microbatch's results")
#: Spark's physical operators that keep state (the names ``explain()`` prints)
_STATEFUL_EXECS = ("StateStoreSave", "SessionWindowStateStoreSave", "StreamingSymmetricHashJoin",
                   "StreamingDeduplicate", "FlatMapGroupsWithState", "FlatMapGroupsInPandasWithState",
                   "TransformWithState", "StreamingGlobalLimit")


def _reuses_an_exchange(plan: str) -> bool:
    """Whether Spark's physical plan (``explain()``'s text) reads a reused exchange
    (``ReusedExchange``) below a stateful operator."""
    import re
    lines = [line for line in plan.split("\n") if line.strip()]

    def indent(line: str) -> int:
        return len(re.match(r"[\s:+|-]*", line).group(0))
    for i, line in enumerate(lines):
        if "ReusedExchange" not in line:
            continue
        depth = indent(line)
        for above in reversed(lines[:i]):   # its ancestors: each line less indented than the last
            if indent(above) < depth:
                depth = indent(above)
                if above[depth:].lstrip("*()0123456789 ").startswith(_STATEFUL_EXECS):
                    return True
    return False


def _as_without_exchange_reuse(spark, ss, case: Case, query: Query, static, work: Path, runs: tuple,
                               result: Result, compare_state: bool) -> Result:
    """``result`` (a difference, Spark's plan reusing an exchange below a stateful operator)
    as the known difference ``EXCHANGE_REUSE`` where Spark's engine run again with exchange
    reuse off gives microbatch's results: batch ids, rows, columns, watermarks, operators,
    state rows and the state per partition (``numInputRows`` the first run's: without the
    reuse Spark counts each scan of a source two branches read); else ``result``."""
    return _as_known_difference(spark, ss, case, query, static, work, runs, result, compare_state,
                                ((REUSE_CONF, "false"),), "Spark's engine reused an exchange below a stateful operator",
                                EXCHANGE_REUSE)


EXCLUDED_RULES_CONF = "spark.sql.optimizer.excludedRules"
EMPTY_RELATIONS_RULE = "org.apache.spark.sql.catalyst.optimizer.PropagateEmptyRelation"
#: the kind of a known difference: Spark's stateful operators numbered anew when an input is empty
OPERATORS_RENUMBERED = ("Spark's engine numbers its stateful operators in each batch's optimized plan: in a batch "
                        "where a union's input has no data its optimizer drops that input (PropagateEmptyRelation) "
                        "with the stateful operator Spark had pushed into it, and the operators after it take "
                        "that one's number and its state; with PropagateEmptyRelation excluded Spark's engine "
                        "gives microbatch's results")


def _renumbers_operators(theirs: EngineRun, ours: EngineRun) -> bool:
    """Whether Spark's engine ran a different number of stateful operators from batch to
    batch where microbatch ran the same number in every batch (a stateful operator's state
    is its number's: Spark's numbering changed under it)."""
    spark_counts = {len(b.operators) for b in theirs.batches.values()}
    our_counts = {len(b.operators) for b in ours.batches.values()}
    return len(spark_counts) > 1 and len(our_counts) == 1


def _as_without_empty_relations(spark, ss, case: Case, query: Query, static, work: Path, runs: tuple,
                                result: Result, compare_state: bool) -> Result:
    """``result`` (a difference, Spark's engine running more stateful operators in some
    batches than in others) as the known difference ``OPERATORS_RENUMBERED`` where Spark's
    engine run again with its optimizer's PropagateEmptyRelation excluded gives microbatch's
    results (``numInputRows`` the first run's: with empty inputs kept Spark scans a source
    once more in each batch it reads it twice); else ``result``."""
    return _as_known_difference(spark, ss, case, query, static, work, runs, result, compare_state,
                                ((EXCLUDED_RULES_CONF, EMPTY_RELATIONS_RULE),),
                                "Spark's engine renumbered its stateful operators in a batch with an empty input",
                                OPERATORS_RENUMBERED)


#: the rules that drop a limit over an empty relation: each does when the other is excluded
LIMIT_RULES = ("org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation,"
               "org.apache.spark.sql.catalyst.optimizer.EliminateLimits")
#: the kind of a known difference: Spark's streaming limit dropped in a batch its input has no data
LIMIT_ELIMINATED = ("Spark's engine drops a stream's limit in a batch where its input has no data (its optimizer's "
                    "ConvertToLocalRelation or EliminateLimits: an empty relation has fewer rows than the "
                    "limit), so the limit's operator writes no state version in that batch, and the next batch "
                    "whose input has data fails to load it (CANNOT_LOAD_STATE_STORE); microbatch runs the limit "
                    "in every batch; with both rules excluded Spark's engine gives microbatch's results")


def _as_without_limit_elimination(spark, ss, case: Case, query: Query, static, work: Path, runs: tuple,
                                  result: Result, compare_state: bool) -> Result:
    """``result`` (a difference, Spark's engine running fewer stateful operators in some
    batches, seed 7339: a limit below a left semi join, its stream run dry) as the known
    difference ``LIMIT_ELIMINATED`` where Spark's engine run again with its optimizer's
    ConvertToLocalRelation and EliminateLimits excluded gives microbatch's results; else
    ``result``."""
    return _as_known_difference(spark, ss, case, query, static, work, runs, result, compare_state,
                                ((EXCLUDED_RULES_CONF, LIMIT_RULES),),
                                "Spark's engine dropped a limit's operator in a batch with an empty input",
                                LIMIT_ELIMINATED)


#: the kind of a known difference: both of the above in one query
RENUMBERED_AND_REUSED = ("Spark's engine renumbered its stateful operators in a batch where a union's input had "
                         "no data, and reused an exchange below a stateful operator (whose operators above then "
                         "get no watermark); with PropagateEmptyRelation excluded and spark.sql.exchange.reuse=false "
                         "Spark's engine gives microbatch's results (either alone does not)")


def _as_without_both(spark, ss, case: Case, query: Query, static, work: Path, runs: tuple,
                     result: Result, compare_state: bool) -> Result:
    """``result`` (a difference neither ``_as_without_exchange_reuse`` nor
    ``_as_without_empty_relations`` explains alone, Spark's engine doing both: seed 6409,
    a left semi join pushed into a union's inputs, the joins' other side read once through
    a reused exchange) as the known difference ``RENUMBERED_AND_REUSED`` where Spark's
    engine run again with both confs gives microbatch's results; else ``result``."""
    return _as_known_difference(spark, ss, case, query, static, work, runs, result, compare_state,
                                ((EXCLUDED_RULES_CONF, EMPTY_RELATIONS_RULE), (REUSE_CONF, "false")),
                                "Spark's engine renumbered its stateful operators and reused an exchange",
                                RENUMBERED_AND_REUSED)


#: each known difference's kind, by what the fuzzer's summary calls it
KNOWN_DIFFERENCES = {
    "Spark's engine reused an exchange below a stateful operator": EXCHANGE_REUSE,
    "Spark's engine renumbered its stateful operators in a batch with an empty input": OPERATORS_RENUMBERED,
    "Spark's engine renumbered its stateful operators and reused an exchange": RENUMBERED_AND_REUSED,
    "Spark's engine dropped a limit's operator in a batch with an empty input": LIMIT_ELIMINATED,
}


def _as_known_difference(spark, ss, case: Case, query: Query, static, work: Path, runs: tuple, result: Result,
                         compare_state: bool, confs: tuple[tuple[str, str], ...], kind: str, why: str) -> Result:
    """``result`` as the known difference ``kind`` where Spark's engine, run again on fresh
    inputs and checkpoint with ``confs`` set, gives microbatch's results (with the first
    run's ``numInputRows``, which the confs change and microbatch must match); else
    ``result``."""
    theirs, ours = runs
    name = "-".join(f"{conf[0].rpartition('.')[2]}-{conf[1].rpartition('.')[2]}" for conf in confs)
    again = EngineRun(checkpoint=str(work / f"spark-{name}"))
    dirs = (work / name / "src", work / name / "src2")
    for d in dirs:
        d.mkdir(parents=True)
    for conf in confs:
        spark.conf.set(*conf)
    try:
        _run_parts(spark, case, query, dirs, static, (("spark", spark, again),), None)
    finally:
        for conf in confs:
            spark.conf.unset(conf[0])
    again.batches = {bid: dataclasses.replace(b, input_rows=theirs.batches[bid].input_rows)
                     if bid in theirs.batches else b for bid, b in again.batches.items()}
    judged = _judge(spark, ss, case.seed, query, again, ours, compare_state)
    if judged.status != "ok":
        return result
    where = "" if result.batch is None else f" at batch {result.batch}"
    return Result(case.seed, query, "known-difference", aspect=result.aspect, batch=result.batch, kind=kind,
                  detail=f"{result.detail}\n  known difference ({result.aspect}{where}): {why}",
                  state_compared=judged.state_compared, state_skipped=judged.state_skipped)


def _spark_internal_error(error: BaseException) -> str | None:
    """Spark's error condition where ``error`` (for a failed run, its cause) is one of Spark's
    internal errors, SQLSTATE class ``XX`` (``INTERNAL_ERROR``, the optimizer's
    ``PLAN_VALIDATION_FAILED_RULE_IN_BATCH``, ...), or a JVM ``NullPointerException`` (seed
    3960: a session window under ``rollup``, null in a grouping set, dereferenced by Spark's
    session merge): a bug of Spark's, not its refusal of the query; else None."""
    import re
    if "java.lang.NullPointerException" in str(error):   # (a JVM null dereference refuses nothing)
        return "java.lang.NullPointerException"
    kind = _error_kind(error)
    if ": " not in kind:
        return None
    condition = kind.rpartition(": ")[2]
    if "/STREAM_FAILED: " in kind:
        cause = str(error).split("terminated with exception:", 1)[-1].strip().split("\n")[0]
        states = re.findall(r"SQLSTATE: (\w{5})", cause)
        if states and states[-1] == "XXKST":   # (STREAM_FAILED's own, after its cause's)
            states.pop()
        state = states[0] if states else None
    else:
        getter = getattr(error, "getSqlState", None)
        try:
            state = getter() if getter is not None else None
        except Exception:   # noqa: BLE001
            state = None
    return condition if state and state.startswith("XX") else None


def _judge(spark, ss, seed: int, query: Query, theirs: EngineRun, ours: EngineRun, compare_state: bool) -> Result:
    if theirs.stage == "timeout":   # nothing to compare with (not a refusal)
        return Result(seed, query, "skipped", detail=f"Spark's engine: {theirs.error}")
    if theirs.error is not None and ours.error is not None:
        same, kind = _same_refusal(theirs.error, ours.error)
        if same:
            return Result(seed, query, "both-refused", kind=kind, detail=_first_line(theirs.error))
        a, b = kind, _error_kind(ours.error)
        internal = _spark_internal_error(theirs.error)
        if internal is not None:   # (Spark's bug came first: no reference for microbatch's error)
            return Result(seed, query, "spark-internal-error", kind=internal,
                          detail=f"Spark ({theirs.stage}): {_first_line(theirs.error)}; microbatch ({ours.stage}) "
                                 f"[{b}]: {_first_line(ours.error)}")
        return Result(seed, query, "differs", aspect="refusal", errors=(a, b),
                      detail=f"Spark ({theirs.stage}) [{a}]: {_first_line(theirs.error)}\n  "
                             f"microbatch ({ours.stage}) [{b}]: {_first_line(ours.error)}")
    if theirs.error is not None:
        internal = _spark_internal_error(theirs.error)
        if internal is not None:   # (no reference: counted and listed, not a difference)
            return Result(seed, query, "spark-internal-error", kind=internal,
                          detail=f"Spark ({theirs.stage}): {_first_line(theirs.error)}; microbatch runs the query")
        return Result(seed, query, "spark-refuses-microbatch-runs", aspect="refusal",
                      errors=(_error_kind(theirs.error),), detail=f"Spark ({theirs.stage}) [{_error_kind(theirs.error)}]: {_first_line(theirs.error)}")
    if ours.error is not None:
        if ours.refused_early:
            return Result(seed, query, "microbatch-refuses", kind=_first_line(ours.error),
                          detail=_first_line(ours.error))
        return Result(seed, query, "differs", aspect=f"microbatch's run failed ({ours.stage})",
                      errors=(_error_kind(ours.error),), batch=max(ours.batches, default=None), detail=_first_line(ours.error))
    found = _diff_batches(theirs, ours)
    result = Result(seed, query, "ok")
    if found is not None:
        result.status, (result.aspect, result.batch, result.detail) = "differs", found
        return result
    if compare_state:
        state = _compare_state(spark, ss, theirs, ours, result)
        if state is not None:
            result.status, (result.aspect, result.detail) = "differs", state
    return result


# -- minimising ----------------------------------------------------------------------------


def _same_failure(a: Result, b: Result) -> bool:
    """Whether ``b`` fails as ``a`` does: the same status, the same first difference, and
    for an error the same classes (a smaller query both engines refuse for another reason
    is not the same failure)."""
    return b.status == a.status and b.aspect == a.aspect and b.errors == a.errors


def minimise(spark, case: Case, failed: Result, plant: str | None = None, seconds: float = 120.0,
             log: Callable[[str], None] | None = None) -> Result:
    """Drops the query's lines one at a time (and its restart) while the same difference
    remains; a line whose removal makes the query not run (both engines refuse it) is kept.
    Returns the smallest failing result, with ``minimal`` set."""
    deadline = time.monotonic() + seconds
    best, query = failed, failed.query
    static = _static(spark)

    def attempt(candidate: Query) -> Result | None:
        result = run_case(spark, case, plant, candidate, static)
        return result if _same_failure(failed, result) else None

    if query.restart_after is not None and time.monotonic() < deadline:
        candidate = Query(list(query.lines), query.mode, None)
        found = attempt(candidate)
        if found is not None:
            best, query = found, candidate
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for i in range(len(query.lines) - 1, 0, -1):
            if time.monotonic() >= deadline:
                break
            if i >= len(query.lines):
                continue
            candidate = Query(query.lines[:i] + query.lines[i + 1:], query.mode, query.restart_after)
            found = attempt(candidate)
            if found is not None:
                if log:
                    log(f"    dropped: {query.lines[i]}")
                best, query, changed = found, candidate, True
    best.minimal = query
    best.seconds = failed.seconds
    return best


# -- many seeds ---------------------------------------------------------------------------


@dataclass
class Summary:
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.failed]

    def refusals(self) -> dict[str, list[int]]:
        """Microbatch's refusals of queries Spark runs, by kind: the seeds."""
        found: dict[str, list[int]] = collections.defaultdict(list)
        for r in self.results:
            if r.status == "microbatch-refuses":
                found[r.kind].append(r.seed)
        return dict(found)

    def report(self) -> str:
        statuses = collections.Counter(r.status for r in self.results)
        compared = sum(r.state_compared for r in self.results)
        skipped = collections.Counter(s for r in self.results for s in r.state_skipped)
        lines = [f"{len(self.results)} queries in {self.seconds:.0f} s: "
                 + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())),
                 f"state per partition: {compared} operators compared, {sum(skipped.values())} skipped"]
        lines += [f"  skipped {n}x: {s}" for s, n in skipped.most_common()]
        refusals = self.refusals()
        if refusals:
            lines.append("microbatch refuses what Spark runs:")
            lines += [f"  {len(seeds)}x (seeds {seeds[:8]}): {kind}" for kind, seeds in
                      sorted(refusals.items(), key=lambda kv: -len(kv[1]))]
        both = collections.Counter(r.kind for r in self.results if r.status == "both-refused")
        if both:
            lines.append("both refuse:")
            lines += [f"  {n}x: {kind}" for kind, n in both.most_common()]
        for status, title in (("known-difference", "known differences (Spark's engine is not the reference):"),
                              ("spark-internal-error", "Spark's internal errors (microbatch runs the query):")):
            seeds: dict[str, list[int]] = collections.defaultdict(list)
            for r in self.results:
                if r.status == status:
                    seeds[r.kind].append(r.seed)
            if seeds:
                lines.append(title)
                lines += [f"  {len(found)}x (seeds {found[:8]}): {kind}" for kind, found in seeds.items()]
                if status == "known-difference":
                    lines += [f"    ({KNOWN_DIFFERENCES[kind]})" for kind in seeds if kind in KNOWN_DIFFERENCES]
        for r in self.failures:
            lines.append(r.report())
        return "\n".join(lines)


def run_seeds(spark, seeds: Iterable[int], plant: str | None = None, seconds: float | None = None,
              minimise_seconds: float = 120.0, log: Callable[[str], None] | None = print) -> Summary:
    """Each seed's query on both engines, until ``seconds`` have passed (None: all seeds);
    failures minimised (each for at most ``minimise_seconds``; 0: not minimised)."""
    from microbatch import spark_internals
    with spark_internals.refusals_not_logged():   # the refusals are results, not logged each
        return _run_seeds(spark, seeds, plant, seconds, minimise_seconds, log)


def _run_seeds(spark, seeds: Iterable[int], plant: str | None, seconds: float | None, minimise_seconds: float,
               log: Callable[[str], None] | None) -> Summary:
    started = time.monotonic()
    summary = Summary()
    static = _static(spark)
    for seed in seeds:
        if seconds is not None and time.monotonic() - started >= seconds:
            break
        case = generate(seed)
        try:
            result = run_case(spark, case, plant, static=static)
        except Exception as e:   # noqa: BLE001 - the fuzzer's own failure is a result too
            result = Result(seed, case.query, "differs", aspect="fuzzer error",
                            detail=_first_line(e) + "\n" + traceback.format_exc(limit=3))
        if log:
            extra = result.kind if result.status in ("both-refused", "microbatch-refuses", "known-difference",
                                                     "spark-internal-error") else \
                f"{result.aspect} {result.detail[:160]}" if result.failed else ""
            log(f"seed {seed}: {result.status} {result.seconds:.1f} s {extra}")
        if result.failed and minimise_seconds > 0 and result.aspect != "fuzzer error":
            budget = minimise_seconds if seconds is None else \
                max(0.0, min(minimise_seconds, seconds - (time.monotonic() - started)))
            if budget > 0:
                result = minimise(spark, case, result, plant, budget, log)
        summary.results.append(result)
    summary.seconds = time.monotonic() - started
    return summary


def minimise_failures(spark, summary: Summary, seconds: float, plant: str | None = None,
                      each: float = 120.0, log: Callable[[str], None] | None = None) -> None:
    """Minimises ``summary``'s failures in place, within ``seconds`` in all (at most
    ``each`` for one): first one failure of each kind (status and aspect), then the rest."""
    deadline = time.monotonic() + seconds
    failures = summary.failures
    kinds: dict[tuple[str, str], Result] = {}
    for r in failures:
        kinds.setdefault((r.status, r.aspect), r)
    firsts = {id(r) for r in kinds.values()}
    ordered = list(kinds.values()) + [r for r in failures if id(r) not in firsts]
    for r in ordered:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if r.aspect == "fuzzer error" or r.minimal is not None:
            continue
        if log:
            log(f"minimising seed {r.seed} ({r.status}, {r.aspect})")
        smaller = minimise(spark, generate(r.seed), r, plant, min(each, left), log)
        summary.results = [smaller if x is r else x for x in summary.results]


def session(conf: dict[str, str] | None = None):
    """A local session as the tests make theirs: two cores, two shuffle partitions, no UI."""
    from microbatch import embedded_spark
    return embedded_spark(conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                "spark.ui.enabled": "false", **(conf or {})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m microbatch.testing.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    parser.add_argument("--start", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--plant", default=None, help="a planted bug of microbatch's test hooks, for its runs only")
    parser.add_argument("--seconds", type=float, default=None, help="stop starting seeds after this many seconds")
    parser.add_argument("--no-minimise", action="store_true", help="report failing queries as generated")
    parser.add_argument("--show", action="store_true", help="print each seed's query and exit (no Spark)")
    args = parser.parse_args(argv)
    seeds = range(args.start, args.start + args.seeds)
    if args.show:
        for seed in seeds:
            case = generate(seed)
            print(f"# seed {seed}\n{case.query.code()}\n")
        return 0
    spark = session()
    try:
        summary = run_seeds(spark, seeds, args.plant, args.seconds, minimise_seconds=0)
        if not args.no_minimise:
            minimise_failures(spark, summary, float("inf"), args.plant, log=print)
    finally:
        spark.stop()
    print(summary.report())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
