"""The shape of the code, checked as the suite runs (docs/design.md, section 2): ruff's
Pyflakes rules, the import-linter contracts of ``pyproject.toml`` (the layers, the api's
modules, py4j only in ``spark_internals``), and the seam: no module outside
``spark_internals/`` reaches into PySpark's JVM handles. A violation fails with the rule
it broke."""
from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "microbatch"
#: PySpark's handles on JVM objects (a DataFrame's ``_jdf``, a Column's ``_jc``, the
#: session's ``_jsparkSession``, the context's ``_jsc``/``_jvm``/``_gateway``, ...)
JVM_HANDLES = frozenset({"_jvm", "_jdf", "_jc", "_jsparkSession", "_gateway", "_jsc", "_jgd", "_jwrite",
                         "_jreader", "_jconf", "_jseq", "_jmap", "_jrdd", "_jschema"})


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(pathlib.Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def test_ruff_finds_nothing():
    run = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "src", "tests",
                          "benchmarks", "pyspark_suites"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_import_contracts_hold():
    run = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr


def jvm_calls(source: str, name: str) -> list[str]:
    """Where a module's source reads a JVM handle or imports py4j."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in JVM_HANDLES:
            found.append(f"{where} reads .{node.attr}")
        elif isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] == "py4j"]
        elif isinstance(node, ast.ImportFrom) and ((node.module or "").split(".")[0] == "py4j"
                                                   or node.module == "pyspark.java_gateway"):
            found.append(f"{where} imports from {node.module}")
    return found


def test_only_spark_internals_touches_the_jvm():
    """Every call into Spark's JVM goes through ``spark_internals``: the seam where another
    Spark version or Spark Connect plugs in."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        if (SOURCE / "spark_internals") not in path.parents:
            found += jvm_calls(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "JVM calls outside spark_internals/ (move them behind the seam):\n" + "\n".join(found)


def test_the_seam_check_sees_jvm_handles_and_py4j():
    source = ("from py4j.protocol import Py4JJavaError\nimport py4j.java_gateway\n"
              "def plan(df, spark):\n    return df._jdf.queryExecution(), spark.sparkContext._jsc\n")
    assert sorted(f.split(" ", 1)[1] for f in jvm_calls(source, "sample.py")) == [
        "imports from py4j.protocol", "imports py4j.java_gateway", "reads ._jdf", "reads ._jsc"]
