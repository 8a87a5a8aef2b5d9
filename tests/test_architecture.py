"""The shape of the code, checked as the suite runs (docs/design.md, section 2): the ruff
rules and the import-linter contracts of ``pyproject.toml`` (the layers, the api's
modules, py4j only in ``spark_internals``), and the seam: no module outside
``spark_internals/`` reaches into PySpark's JVM handles. A violation fails with the rule
it broke."""
from __future__ import annotations

import ast
import re
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
                          "benchmarks", "pyspark_suites", "pyspark_connect_suites"], cwd=ROOT, capture_output=True, text=True)
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


# -- operators own their policy (docs/design.md, section 2) ----------------------------------
def stateful_kinds() -> dict[str, pathlib.Path]:
    """Every kind of stateful operator (``plan.logical.StatefulNode``'s subclasses, each
    operator's home imported) -> its home: its package, or its module if it is one file."""
    import importlib
    import pkgutil

    import microbatch.operators as operators
    from microbatch.plan.logical import StatefulNode
    for module in pkgutil.walk_packages(operators.__path__, "microbatch.operators."):
        importlib.import_module(module.name)
    homes = {}
    stack = list(StatefulNode.__subclasses__())
    while stack:
        kind = stack.pop()
        stack += kind.__subclasses__()
        if not kind.__module__.startswith("microbatch."):
            continue
        path = pathlib.Path(sys.modules[kind.__module__].__file__)
        homes[kind.__name__] = path.parent if path.parent != SOURCE / "operators" else path
    return homes


def type_checks(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each ``isinstance(x, <name>)`` (or of a tuple naming it) in ``source``
    (a name of a module's, ``proto.Aggregate``, is another class)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            for kind in kinds:
                if isinstance(kind, ast.Name) and kind.id in names:
                    found.append((node.lineno, kind.id))
    return found


def test_no_type_switch_on_an_operator_outside_its_home():
    """The runtime, the checks and the api ask an operator (its ``StatefulNode`` policy);
    only the operator's own home may look at its type."""
    homes = stateful_kinds()
    assert {"Aggregate", "Deduplicate", "StreamJoin", "StreamingLimit", "FlatMapGroupsWithState",
            "TransformWithState"} <= set(homes)
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for line, name in type_checks(path.read_text(), set(homes)):
            home = homes[name]
            if not (path == home or home in path.parents):
                found.append(f"{path.relative_to(ROOT)}:{line}: isinstance(..., {name}) outside "
                             f"{home.relative_to(ROOT)}")
    assert not found, ("Type switches on an operator outside its home (ask the operator instead: "
                       "plan.logical.StatefulNode.POLICY):\n" + "\n".join(found))


def test_the_type_switch_check_sees_names_in_tuples():
    source = ("def f(n, P):\n    return isinstance(n, (Aggregate, int)) or isinstance(n, StreamJoin) "
              "or isinstance(n, P.Deduplicate)\n")
    assert type_checks(source, {"Aggregate", "StreamJoin", "Deduplicate"}) == [(2, "Aggregate"), (2, "StreamJoin")]


def schema_file_names() -> dict[str, pathlib.Path]:
    """Every operator's name in its schema file (``operators.base.StateLayout.names``, each
    operator's home imported) -> its home: its package, or its module if it is one file."""
    from microbatch.operators.base import state_layouts
    homes = {}
    for name, layout in state_layouts().items():
        path = pathlib.Path(sys.modules[layout.__module__].__file__)
        homes[name] = path.parent if path.parent != SOURCE / "operators" else path
    return homes


def name_switches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each string in ``source`` (a docstring aside) that is one of
    ``names``, and of each ``.startswith(<prefix>)`` of one of them (a name in a comparison,
    a tuple, a dict, or a prefix of one)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                and id(node) not in docstrings:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith" \
                and node.args:
            prefixes = node.args[0].elts if isinstance(node.args[0], ast.Tuple) else [node.args[0]]
            for prefix in prefixes:
                if isinstance(prefix, ast.Constant) and isinstance(prefix.value, str) and prefix.value \
                        and prefix.value not in names and any(n.startswith(prefix.value) for n in names):
                    found.append((node.lineno, f"{prefix.value}..."))
    return sorted(found)


def test_no_switch_on_an_operator_schema_file_name_outside_its_home():
    """What reads a checkpoint without the query (the conversions, the state reader, the
    checkpoint toolkit, progress) asks the operator's ``StateLayout``
    (``operators.base.state_layout(name)``); only the operator's own home names it."""
    homes = schema_file_names()
    assert {"stateStoreSave", "sessionWindowStateStoreSaveExec", "dedupe", "dedupeWithinWatermark",
            "globalLimit", "symmetricHashJoin", "applyInPandasWithState", "transformWithStateInPandasExec",
            "transformWithStateInPySparkExec"} <= set(homes)
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for line, name in name_switches(path.read_text(), set(homes)):
            named = [n for n in homes if n == name or (name.endswith("...") and n.startswith(name[:-3]))]
            outside = [n for n in named if not (path == homes[n] or homes[n] in path.parents)]
            if outside:
                found.append(f"{path.relative_to(ROOT)}:{line}: {name!r} outside "
                             f"{', '.join(sorted({str(homes[n].relative_to(ROOT)) for n in outside}))}")
    assert not found, ("Switches on an operator's schema-file name outside its home (ask its layout instead: "
                       "operators.base.StateLayout):\n" + "\n".join(found))


def test_the_name_switch_check_sees_names_and_prefixes():
    source = ('"""globalLimit, in a docstring."""\n'
              "def f(doc, name):\n    return doc['operatorName'] in ('dedupe', 'x') or name == \"globalLimit\" \\\n"
              "        or name.startswith('transformWithState') or name.startswith('spark.')\n")
    assert name_switches(source, {"dedupe", "globalLimit", "transformWithStateInPandasExec"}) == [
        (3, "dedupe"), (3, "globalLimit"), (4, "transformWithState...")]


def test_an_operator_that_does_not_answer_for_its_policy_fails_when_defined():
    import pytest

    from microbatch.plan.logical import StatefulNode
    with pytest.raises(TypeError, match="does not answer for .*evicts_with"):
        class Unfinished(StatefulNode):  # defined to fail
            def make_step(self, operator_id, state_root, shuffle_partitions):
                return None


def test_every_top_level_module_is_in_a_layer():
    """A new top-level module or package takes a place in the layers of ``pyproject.toml``
    (or import-linter would not hold it to one)."""
    import tomllib
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["name"].startswith("Layers: the api above the runtime"))["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    modules = {f"microbatch.{p.stem if p.is_file() else p.name}" for p in SOURCE.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert modules - placed == set(), f"modules in no layer of pyproject.toml: {sorted(modules - placed)}"


#: packages that are gone, with where their modules went (a docstring naming one is stale)
GONE = {"execution": "runtime"}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _top_level() -> set[str]:
    return {p.stem if p.is_file() else p.name for p in SOURCE.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}


def _resolves(parts: list[str]) -> bool:
    """Whether ``microbatch.<parts>`` is a module, or a name a module defines."""
    import importlib
    name, module = "microbatch", importlib.import_module("microbatch")
    for part in parts:
        try:
            module, name = importlib.import_module(f"{name}.{part}"), f"{name}.{part}"
        except ModuleNotFoundError:
            return hasattr(module, part)
    return True


def test_every_module_a_docstring_names_exists():
    """``runtime.incremental``-style names in the docstrings: a module of ours that exists
    (or a name it defines); none under a package that is gone."""
    top, found = _top_level(), []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                for named in re.findall(r"``([a-z_]+(?:\.[a-z_]+)+)``", ast.get_docstring(node) or ""):
                    parts = named.split(".")[1:] if named.startswith("microbatch.") else named.split(".")
                    if (parts[0] in top and not _resolves(parts)) or parts[0] in GONE:
                        found.append(f"{path.relative_to(ROOT)}: ``{named}``")
    assert not found, "docstrings name modules that do not exist:\n" + "\n".join(found)


def test_every_path_the_docs_name_exists():
    """Paths in README.md and docs/ that start at a package of ours or a folder of the
    repository (``operators/join/node.py``, ``tests/test_fuzz.py``) exist."""
    top, found = _top_level(), []
    for doc in DOCS:
        for match in re.finditer(r"`([.\w][\w./-]*)`|\]\(([\w./-]+)\)", doc.read_text()):
            named = (match.group(1) or match.group(2)).rstrip("/")
            path = named.removeprefix("microbatch/")
            first = path.split("/")[0]
            if "/" not in path or named.startswith("http"):
                continue
            base = SOURCE if first in top else ROOT if first in REPOSITORY_FOLDERS else None
            if base is not None and not (base / path).exists():
                found.append(f"{doc.relative_to(ROOT)}: {named}")
    assert not found, "the docs name paths that do not exist:\n" + "\n".join(found)


REPOSITORY_FOLDERS = {"tests", "benchmarks", "docs", "pyspark_suites", "src", ".ci"}
