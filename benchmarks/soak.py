"""Load held over time: a stateful pipeline run for long on each engine, batch time and the
memory of every process of the query sampled as it runs (issue 40).

``python -m benchmarks soak [--minutes 10] [--rows 50000] [--engines mb-map,mb-rocksdb,spark]
[--driver-memory 2g] [--sample 1.5] [--no-histograms] [--conf KEY=VALUE ...]``
(an hour: ``--minutes 60``; the control of RESULTS.md's "Soak": ``--conf
"spark.driver.extraJavaOptions=-Xms2g -XX:+AlwaysPreTouch" --conf spark.sql.ui.retainedExecutions=50``)

Pipeline (the same on every engine): ``rate-micro-batch`` (``rows`` rows a batch, event
time advancing 1 s a batch, so the watermark evicts as fast as state comes in) ->
``k = value % (rows / 2)`` (each key twice a batch) -> ``withWatermark(ts, 20 s)
.dropDuplicates([k, ts])`` -> ``groupBy(window(ts, 10 s), k % 1000).count()`` -> the
parquet file sink, append mode, ``processingTime=0``: as many batches as the query
sustains. State stays flat (about 21 batches of ``rows / 2`` dedup keys, plus 1000 groups
for each of ~3 open windows).

Engines, each in a child process of its own (``python -m benchmarks.soak --child ...``, a
local[2] SparkSession, its own JVM and Python workers), one after the other:
``mb-map`` microbatch with its default (map) provider, ``mb-rocksdb`` microbatch with
``spark.sql.streaming.stateStore.providerClass`` = Spark's RocksDB class name, ``spark``
Spark's own engine (HDFS-backed provider), ``spark-rocksdb`` Spark's engine on RocksDB.

Recorded: every batch's ``durationMs`` and state rows (the child polls ``lastProgress``);
every ``--sample`` seconds the resident memory (VmRSS, and PSS from smaps_rollup, which
shares a forked worker's pages fairly) and CPU time of every process under the child,
by role: ``driver`` (the child's Python), ``jvm``, ``daemon`` (pyspark.daemon) and
``workers`` (its forks); the JVM heap (used, committed, non-heap) through py4j's
MemoryMXBean every other second. Unless ``--no-histograms``: a class histogram of the
JVM's live heap (``jcmd GC.class_histogram``, a full GC) and a count of the driver's
Python objects by type at 5% of the run and just after it (the child runs 25 s past the
measured span, so that full GC falls outside it), and what grew most between the two.

Printed per engine: the median batch time and total memory in each tenth of the run,
last tenth / second tenth (the target: within 1.1), the same ratio per process role and
for the JVM heap; then microbatch against Spark. Written to ``benchmarks/results/soak.json``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SPARK_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
ENGINES = {  # name -> (microbatch?, state store provider class or None)
    "mb-map": (True, None),
    "mb-rocksdb": (True, SPARK_ROCKSDB),
    "spark": (False, None),
    "spark-rocksdb": (False, SPARK_ROCKSDB),
}
GRACE = 25.0   # seconds a child runs past the measured span
ROLES = ("driver", "jvm", "daemon", "workers", "other")
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


# -- the child: one engine, one query ----------------------------------------------------------
def build_query(session, rows: int, workdir: str):
    from pyspark.sql import functions as F
    frame = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
             .option("numPartitions", 2).option("advanceMillisPerBatch", 1000)
             .option("startTimestamp", 1_767_225_600_000).load())
    events = frame.select((F.col("value") % max(1, rows // 2)).alias("k"), F.col("timestamp").alias("ts"))
    deduped = events.withWatermark("ts", "20 seconds").dropDuplicates(["k", "ts"])
    counts = deduped.groupBy(F.window("ts", "10 seconds"), (F.col("k") % 1000).alias("g")).count()
    out = counts.select(F.col("window.start").alias("start"), F.col("window.end").alias("end"), "g", "count")
    return (out.writeStream.format("parquet").outputMode("append").option("path", f"{workdir}/out")
            .option("checkpointLocation", f"{workdir}/ckpt").trigger(processingTime="0 seconds").start())


def _batch_record(p) -> dict:
    ops = p["stateOperators"] or []
    d = p["durationMs"]
    return {"batchId": p["batchId"], "end": time.time(), "rows": p["numInputRows"],
            "triggerMs": d.get("triggerExecution", 0), "addBatchMs": d.get("addBatch", 0),
            "stateRows": [op["numRowsTotal"] for op in ops],
            "stateMemory": [op["memoryUsedBytes"] for op in ops]}


def _python_types() -> dict[str, int]:
    import gc
    gc.collect()
    return dict(collections.Counter(type(o).__qualname__ for o in gc.get_objects()))


def child(engine: str, seconds: float, rows: int, workdir: str, events_path: str, driver_memory: str,
          extra_conf: list[str]) -> int:
    is_microbatch, provider = ENGINES[engine]
    from microbatch import StreamingSession, embedded_spark
    conf = {"spark.driver.memory": driver_memory, **dict(c.split("=", 1) for c in extra_conf)}
    if provider:
        conf["spark.sql.streaming.stateStore.providerClass"] = provider
    spark = embedded_spark(conf=conf)
    session = StreamingSession(spark) if is_microbatch else spark
    events = open(events_path, "a", buffering=1)

    def emit(kind: str, **fields) -> None:
        events.write(json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")

    dump = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: dump.set())   # the parent asks for the driver's objects
    jvm = spark._jvm
    management = jvm.java.lang.management.ManagementFactory
    memory_bean = management.getMemoryMXBean()
    old_gen = next((pool for pool in management.getMemoryPoolMXBeans() if "Old Gen" in pool.getName()), None)
    sql_status = spark._jsparkSession.sharedState().statusStore()   # the SQL executions the UI keeps
    classes = management.getClassLoadingMXBean()
    nonheap_pools = [p for p in management.getMemoryPoolMXBeans() if str(p.getType().toString()) == "Non-heap memory"]
    compilations = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    emit("started", jvm_pid=int(jvm.java.lang.ProcessHandle.current().pid()), pid=os.getpid())
    query = build_query(session, rows, workdir)
    started = time.time()
    seen, next_heap = -1, 0.0
    try:
        while time.time() - started < seconds:
            if query.exception() is not None:
                emit("error", message=str(query.exception()))
                return 1
            last = query.lastProgress
            if last is not None and last["batchId"] > seen:
                missed = last["batchId"] > seen + 1 and seen >= 0
                for p in (query.recentProgress if missed else [last]):
                    if p["batchId"] > seen:
                        emit("batch", **_batch_record(p))
                        seen = p["batchId"]
            now = time.time()
            if now >= next_heap:
                heap, nonheap = memory_bean.getHeapMemoryUsage(), memory_bean.getNonHeapMemoryUsage()
                emit("heap", used=heap.getUsed(), committed=heap.getCommitted(), max=heap.getMax(),
                     nonheap=nonheap.getUsed(), old=old_gen.getUsage().getUsed() if old_gen else 0,
                     executions=sql_status.executionsCount(), classes_loaded=classes.getTotalLoadedClassCount(),
                     classes_unloaded=classes.getUnloadedClassCount(), codegen_compilations=compilations.getCount(),
                     pools={p.getName(): p.getUsage().getUsed() for p in nonheap_pools})
                next_heap = now + 2.0
            if dump.is_set():
                dump.clear()
                emit("pytypes", counts=_python_types())
            time.sleep(0.25)
    finally:
        query.stop()
        emit("stopped")
        spark.stop()
    return 0


# -- the parent: memory of the child's process tree ------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def process_tree(root: int) -> dict[int, dict]:
    """Every live process under ``root`` (included): its parent, command line and name."""
    parents, info = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        stat = _read(f"/proc/{pid}/stat")
        if stat is None:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, the last ')' ends it
        fields = stat[stat.rfind(")") + 2:].split()
        parents[int(pid)] = int(fields[1])
        info[int(pid)] = {"comm": stat[stat.find("(") + 1:stat.rfind(")")],
                          "cpu": (int(fields[11]) + int(fields[12])) / TICK}
    tree = {root} if root in parents else set()
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    out = {}
    for pid in tree:
        cmdline = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
        out[pid] = {**info[pid], "ppid": parents[pid], "cmdline": cmdline}
    return out


def role_of(pid: int, proc: dict, root: int, tree: dict[int, dict]) -> str:
    if pid == root:
        return "driver"
    if proc["comm"] == "java":
        return "jvm"
    if "pyspark.daemon" in proc["cmdline"]:
        parent = tree.get(proc["ppid"], {})
        return "workers" if "pyspark.daemon" in parent.get("cmdline", "") else "daemon"
    if "pyspark.worker" in proc["cmdline"]:
        return "workers"
    return "other"


def memory_of(pid: int) -> tuple[int, int]:
    """(RSS, PSS) bytes of one process; (0, 0) if it is gone."""
    rollup = _read(f"/proc/{pid}/smaps_rollup") or ""
    rss = pss = 0
    for line in rollup.splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
    return rss, pss


def sample(root: int) -> dict:
    tree = process_tree(root)
    roles = {r: {"rss": 0, "pss": 0, "cpu": 0.0, "n": 0} for r in ROLES}
    for pid, proc in tree.items():
        rss, pss = memory_of(pid)
        role = roles[role_of(pid, proc, root, tree)]
        role["rss"] += rss
        role["pss"] += pss
        role["cpu"] += proc["cpu"]
        role["n"] += 1
    return {"t": time.time(), "roles": roles, "rss": sum(r["rss"] for r in roles.values()),
            "pss": sum(r["pss"] for r in roles.values())}


def class_histogram(jvm_pid: int) -> tuple[dict[str, list[int]], int]:
    """The JVM's live objects by class (a full GC first): class -> [instances, bytes], and
    the total bytes."""
    try:
        text = subprocess.run(["jcmd", str(jvm_pid), "GC.class_histogram"], capture_output=True,
                              text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}, 0
    classes, total = {}, 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith(":") and parts[1].isdigit():
            classes[parts[3]] = [int(parts[1]), int(parts[2])]
        elif parts[:1] == ["Total"] and len(parts) >= 3:
            total = int(parts[2])
    return classes, total


def growth(before: dict, after: dict, index: int | None, top: int = 12) -> list[list]:
    """The ``top`` entries that grew most between two counts (``index`` picks a field of a
    list value)."""
    def value(d, k):
        v = d.get(k, 0 if index is None else [0, 0])
        return v if index is None else v[index]
    keys = set(before) | set(after)
    rows = sorted(((k, value(before, k), value(after, k)) for k in keys), key=lambda r: r[1] - r[2])
    return [[k, b, a] for k, b, a in rows[:top] if a > b]


def run_engine(engine: str, args, root_dir: str) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"{engine}-", dir=root_dir)
    events_path = f"{workdir}/events.jsonl"
    seconds = args.minutes * 60
    # the child runs on past the measured span, for the last histogram (a full GC) to fall outside it
    cmd = [sys.executable, "-m", "benchmarks.soak", "--child", engine, "--seconds", str(seconds + GRACE),
           "--rows", str(args.rows), "--workdir", workdir, "--events", events_path,
           "--driver-memory", args.driver_memory, *(f"--conf={c}" for c in args.conf)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(HERE), os.environ.get("PYTHONPATH")]))}
    print(f"\n== {engine}: {args.minutes:g} min, {args.rows:,} rows a batch", flush=True)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    samples: list[dict] = []
    histograms: dict[str, tuple] = {}
    jvm_pid, query_start = None, None
    marks_done: set[str] = set()
    try:
        while proc.poll() is None:
            s = sample(proc.pid)
            samples.append(s)
            if jvm_pid is None or query_start is None:
                for e in _events(events_path):
                    if e["kind"] == "started":
                        jvm_pid, query_start = e["jvm_pid"], e["t"]
            if not args.no_histograms and jvm_pid and query_start:
                elapsed = time.time() - query_start
                for mark, at in (("early", 0.05 * seconds), ("late", seconds + 1)):
                    if mark not in marks_done and elapsed >= at:
                        marks_done.add(mark)
                        os.kill(proc.pid, signal.SIGUSR1)
                        histograms[mark] = (time.time(), *class_histogram(jvm_pid))
            time.sleep(max(0.0, args.sample - (time.time() - s["t"])))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    events = list(_events(events_path))
    shutil.rmtree(workdir, ignore_errors=True)
    errors = [e["message"] for e in events if e["kind"] == "error"]
    if errors or proc.returncode:
        raise RuntimeError(f"{engine}: child exited {proc.returncode}: {errors}")
    start = next(e["t"] for e in events if e["kind"] == "started")
    batches = [e for e in events if e["kind"] == "batch" and e["end"] < start + seconds]
    heap_all = [e for e in events if e["kind"] == "heap"]
    heap = [e for e in heap_all if e["t"] < start + seconds]
    samples = [s for s in samples if s["t"] < start + seconds]
    pytypes = [e["counts"] for e in events if e["kind"] == "pytypes"]
    result = {"engine": engine, "start": start, "seconds": seconds, "batches": batches,
              "samples": samples, "heap": heap, "heap_after": [e for e in heap_all if e["t"] >= start + seconds]}
    if "early" in histograms and "late" in histograms:
        (t0, early, early_total), (t1, late, late_total) = histograms["early"], histograms["late"]
        result["jvm_live_heap"] = {"early": early_total, "late": late_total,
                                   "early_t": t0 - start, "late_t": t1 - start,
                                   "top_growth_bytes": growth(early, late, 1)}
    if len(pytypes) >= 2:
        result["driver_python_objects"] = {"early": sum(pytypes[0].values()), "late": sum(pytypes[-1].values()),
                                           "top_growth": growth(pytypes[0], pytypes[-1], None)}
    result["summary"] = summarize(result)
    report(result)
    return result


def _events(path: str):
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    yield json.loads(line)
    except FileNotFoundError:
        return


# -- summaries ---------------------------------------------------------------------------------
def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def tenths(start: float, seconds: float, items: list[dict], key, at="t", reduce=None) -> list[float]:
    """The median (or ``reduce``) of ``key(item)`` over the items whose time falls in each
    tenth of the run."""
    out = []
    for i in range(10):
        lo, hi = start + seconds * i / 10, start + seconds * (i + 1) / 10
        values = [key(x) for x in items if lo <= x[at] < hi]
        out.append((reduce or _median)(values) if values else float("nan"))
    return out


def _ratio(series: list[float]) -> float:
    return series[-1] / series[1] if series[1] else float("nan")


def summarize(r: dict) -> dict:
    start, seconds, batches, samples, heap = r["start"], r["seconds"], r["batches"], r["samples"], r["heap"]
    batch_ms = tenths(start, seconds, batches, lambda b: b["triggerMs"], at="end")
    rss = tenths(start, seconds, samples, lambda s: s["rss"] / 2**20)
    pss = tenths(start, seconds, samples, lambda s: s["pss"] / 2**20)
    by_role = {role: tenths(start, seconds, samples, lambda s, role=role: s["roles"][role]["rss"] / 2**20)
               for role in ROLES}
    heap_used = tenths(start, seconds, heap, lambda h: h["used"] / 2**20)
    heap_committed = tenths(start, seconds, heap, lambda h: h["committed"] / 2**20)
    old_gen = tenths(start, seconds, heap, lambda h: h["old"] / 2**20)
    # the lowest old-gen use in a tenth: about the live set after the tenth's mixed collections
    old_floor = tenths(start, seconds, heap, lambda h: h["old"] / 2**20, reduce=min)
    executions = tenths(start, seconds, heap, lambda h: h.get("executions", 0))
    metaspace = tenths(start, seconds, heap, lambda h: h.get("pools", {}).get("Metaspace", 0) / 2**20)
    # per batch after the first tenth: Spark's code generations, classes loaded and unloaded
    steady = [h for h in heap if h["t"] >= start + seconds / 10]
    per_batch = {}
    if len(steady) >= 2:
        n = sum(1 for b in batches if steady[0]["t"] <= b["end"] < steady[-1]["t"]) or 1
        per_batch = {k: (steady[-1].get(k, 0) - steady[0].get(k, 0)) / n
                     for k in ("codegen_compilations", "classes_loaded", "classes_unloaded", "executions")}
    state = tenths(start, seconds, batches, lambda b: sum(b["stateRows"]), at="end")
    workers = tenths(start, seconds, samples, lambda s: s["roles"]["workers"]["n"])
    after_first = [b for b in batches if b["end"] >= start + seconds / 10]
    cpu_end = samples[-1]["roles"] if samples else {}
    return {
        "batches": len(batches), "batches_per_s": len(batches) / seconds,
        "rows_per_s": sum(b["rows"] for b in batches) / seconds,
        "batch_ms_tenths": batch_ms, "batch_ms_ratio": _ratio(batch_ms),
        "batch_ms_median": _median(b["triggerMs"] for b in after_first),
        "rss_mib_tenths": rss, "rss_ratio": _ratio(rss),
        "pss_mib_tenths": pss, "pss_ratio": _ratio(pss),
        "rss_mib_median": _median(s["rss"] / 2**20 for s in samples if s["t"] >= start + seconds / 10),
        "rss_mib_by_role_tenths": by_role,
        "rss_ratio_by_role": {role: _ratio(v) for role, v in by_role.items() if any(x == x and x for x in v)},
        "heap_used_mib_tenths": heap_used, "heap_committed_mib_tenths": heap_committed,
        "old_gen_mib_tenths": old_gen, "old_gen_floor_mib_tenths": old_floor, "heap_used_ratio": _ratio(heap_used), "heap_committed_ratio": _ratio(heap_committed),
        "state_rows_tenths": state, "executions_tenths": executions, "metaspace_mib_tenths": metaspace,
        "jvm_per_batch": per_batch, "workers_tenths": workers,
        "cpu_s_by_role": {role: v["cpu"] for role, v in cpu_end.items()},
    }


def _row(label: str, values: list[float], fmt: str) -> str:
    return f"  {label:22}" + "".join(f"{v:>8{fmt}}" for v in values)


def report(r: dict) -> None:
    s = r["summary"]
    print(f"{r['engine']}: {s['batches']} batches, {s['batches_per_s']:.2f} batches/s, "
          f"{s['rows_per_s']:,.0f} rows/s; median batch {s['batch_ms_median']:.0f} ms after the first tenth")
    print("  per tenth of the run   " + "".join(f"{i + 1:>8}" for i in range(10)) + "   last/2nd")
    print(_row("batch ms", s["batch_ms_tenths"], ".0f") + f"   {s['batch_ms_ratio']:.2f}")
    print(_row("RSS MiB, all", s["rss_mib_tenths"], ".0f") + f"   {s['rss_ratio']:.2f}")
    print(_row("PSS MiB, all", s["pss_mib_tenths"], ".0f") + f"   {s['pss_ratio']:.2f}")
    for role, values in s["rss_mib_by_role_tenths"].items():
        if role in s["rss_ratio_by_role"]:
            print(_row(f"RSS MiB, {role}", values, ".0f") + f"   {s['rss_ratio_by_role'][role]:.2f}")
    print(_row("JVM heap used MiB", s["heap_used_mib_tenths"], ".0f") + f"   {s['heap_used_ratio']:.2f}")
    print(_row("JVM heap committed MiB", s["heap_committed_mib_tenths"], ".0f") + f"   {s['heap_committed_ratio']:.2f}")
    print(_row("JVM old gen used MiB", s["old_gen_mib_tenths"], ".0f") + f"   {_ratio(s['old_gen_mib_tenths']):.2f}")
    print(_row("JVM old gen lowest MiB", s["old_gen_floor_mib_tenths"], ".0f")
          + f"   {_ratio(s['old_gen_floor_mib_tenths']):.2f}")
    print(_row("JVM metaspace MiB", s["metaspace_mib_tenths"], ".0f") + f"   {_ratio(s['metaspace_mib_tenths']):.2f}")
    print(_row("SQL executions kept", s["executions_tenths"], ".0f"))
    print(_row("state rows (k)", [v / 1000 for v in s["state_rows_tenths"]], ".0f"))
    print(_row("Python workers", s["workers_tenths"], ".1f"))
    state = s["state_rows_tenths"]
    if not state[1] >= 0.95 * state[-1]:    # (nan too: no batch ended in the second tenth)
        print("  the state was still filling in the second tenth: last/2nd measures that, run longer")
    if s["jvm_per_batch"]:
        print("  JVM per batch after the first tenth: " + ", ".join(f"{k} {v:.2f}" for k, v in s["jvm_per_batch"].items()))
    print("  CPU s by role: " + ", ".join(f"{k} {v:.0f}" for k, v in s["cpu_s_by_role"].items() if v))
    live = r.get("jvm_live_heap")
    if live:
        print(f"  JVM live heap after full GC: {live['early'] / 2**20:.0f} MiB at {live['early_t']:.0f} s, "
              f"{live['late'] / 2**20:.0f} MiB at {live['late_t']:.0f} s; grew most: "
              + ", ".join(f"{k} +{(a - b) / 2**20:.1f} MiB" for k, b, a in live["top_growth_bytes"][:5]))
    objects = r.get("driver_python_objects")
    if objects:
        print(f"  driver Python objects (gc-tracked): {objects['early']:,} -> {objects['late']:,}; grew most: "
              + ", ".join(f"{k} {b}->{a}" for k, b, a in objects["top_growth"][:6]))


def compare(results: dict[str, dict]) -> dict:
    out = {}
    for mb in ("mb-map", "mb-rocksdb"):
        anchor = "spark-rocksdb" if mb == "mb-rocksdb" and "spark-rocksdb" in results else "spark"
        if mb in results and anchor in results:
            a, b = results[mb]["summary"], results[anchor]["summary"]
            out[f"{mb} / {anchor}"] = {
                "batch_ms": a["batch_ms_median"] / b["batch_ms_median"],
                "rows_per_s": a["rows_per_s"] / b["rows_per_s"],
                "rss": a["rss_mib_median"] / b["rss_mib_median"]}
    if out:
        print("\nmicrobatch / Spark (medians after the first tenth):")
        for pair, v in out.items():
            print(f"  {pair:24} batch time {v['batch_ms']:.2f}   rows/s {v['rows_per_s']:.2f}   total RSS {v['rss']:.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="per engine")
    parser.add_argument("--rows", type=int, default=50_000, help="rows a batch")
    parser.add_argument("--engines", default="mb-map,mb-rocksdb,spark", help=f"of {', '.join(ENGINES)}")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--sample", type=float, default=1.5, help="seconds between memory samples")
    parser.add_argument("--no-histograms", action="store_true",
                        help="no jcmd class histogram (a full GC) nor driver object count at 10%% and the end")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark conf for every engine's session (repeatable), e.g. "
                             "spark.driver.extraJavaOptions='-Xms2g -XX:+AlwaysPreTouch'")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "soak.json"))
    # the child's own arguments
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--events", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if args.child:
        return child(args.child, args.seconds, args.rows, args.workdir, args.events, args.driver_memory, args.conf)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {list(ENGINES)}")
    results: dict[str, dict] = {}
    root = tempfile.mkdtemp(prefix="microbatch-soak-")
    try:
        for engine in engines:
            results[engine] = run_engine(engine, args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = compare(results)
    load = open("/proc/loadavg").read().split()[:3]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "machine": f"{os.cpu_count()} cores, local[2], driver memory {args.driver_memory}",
                   "load_at_end": load, "conf": args.conf, "minutes_per_engine": args.minutes, "rows_per_batch": args.rows,
                   "ratios": ratios, "engines": results}, f)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
