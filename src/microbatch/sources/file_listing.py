"""What a file stream reads: the listing of its path (a directory, a file or a glob
pattern with Hadoop's braces), as Spark 4.3's file index lists it for its file source:
the files directly in the directories named, every file below partition directories
(``k=v``, with Spark's errors for conflicting layouts) or with ``recursiveFileLookup``,
hidden names skipped (docs/design.md, section 7)."""
from __future__ import annotations

import fnmatch
import glob as globlib
import os
from dataclasses import dataclass

from microbatch import spark_internals

_GLOB_CHARS = set("{}[]*?\\")


def is_glob_path(path: str) -> bool:
    return any(c in _GLOB_CHARS for c in path)


@dataclass(frozen=True)
class ListedFile:
    path: str           # absolute local path
    size: int
    mtime_ms: int


def expand_braces(pattern: str) -> list[str]:
    """Hadoop glob braces: ``a{b,c}d`` -> ``abd``, ``acd`` (nested allowed)."""
    depth = 0
    start = -1
    for i, ch in enumerate(pattern):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                body, parts, level, last = pattern[start + 1:i], [], 0, 0
                for j, c in enumerate(body):
                    if c == "{":
                        level += 1
                    elif c == "}":
                        level -= 1
                    elif c == "," and level == 0:
                        parts.append(body[last:j])
                        last = j + 1
                parts.append(body[last:])
                head, tail = pattern[:start], pattern[i + 1:]
                return [x for p in parts for x in expand_braces(head + p + tail)]
    return [pattern]


def _to_python_glob(pattern: str) -> str:
    return pattern.replace("[^", "[!")


def is_hidden(name: str) -> bool:
    """Spark's rule for names a file index skips."""
    return ((name.startswith("_") and "=" not in name) or name.startswith(".")
            or name.endswith("._COPYING_"))


def _walk(directory: str, leaf_dirs: dict[str, list[ListedFile]]) -> None:
    """Every data file under ``directory``, grouped by the directory that holds it."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        if is_hidden(entry.name):
            continue
        try:
            if entry.is_dir():
                _walk(entry.path, leaf_dirs)
            else:
                st = entry.stat()
                leaf_dirs.setdefault(directory, []).append(
                    ListedFile(entry.path, st.st_size, st.st_mtime_ns // 1_000_000))
        except FileNotFoundError:
            continue  # removed while listing


def _partition_of(leaf_dir: str, base_paths: set[str]) -> tuple[list[str] | None, str]:
    """Spark's ``PartitioningUtils.parsePartition``: the partition columns of a leaf
    directory (``k=v`` names walking up from it) and the base path that walk found."""
    columns: list[str] = []
    current = leaf_dir
    finished = os.path.dirname(current) == current
    while not finished:
        if current in base_paths:
            break
        name = os.path.basename(current)
        key, sep, value = name.partition("=")
        column = key if sep and key and value else None
        if column is not None:
            columns.append(column)
        finished = (column is None and bool(columns)) or os.path.dirname(current) == current
        if not finished:
            current = os.path.dirname(current)
    if not columns:
        return None, leaf_dir
    return list(reversed(columns)), current


def _check_partitions(found: dict[str, tuple[list[str] | None, str]]) -> bool:
    """Whether the leaf directories are partitions; Spark's errors for layouts it refuses."""
    partitioned = {d: cols for d, (cols, _) in found.items() if cols is not None}
    if not partitioned:
        return False
    bases = sorted({base for _, base in found.values()})
    if len(bases) > 1:
        raise spark_internals.spark_error(
            "SparkRuntimeException", "CONFLICTING_DIRECTORY_STRUCTURES",
            discoveredBasePaths="\n\t" + "\n\t".join("file:" + b for b in bases) + "\n")
    names = []
    for cols in partitioned.values():
        lowered = [c.lower() for c in cols]
        if lowered not in names:
            names.append(lowered)
    if len(names) > 1:
        lists = "\n\t".join(f"Partition column name list #{i}: {', '.join(n)}"
                             for i, n in enumerate(names))
        paths = "\n\t".join("file:" + d for d in sorted(partitioned))
        raise spark_internals.spark_error(
            "SparkRuntimeException", "CONFLICTING_PARTITION_COLUMN_NAMES",
            distinctPartColLists="\n\t" + lists + "\n", suspiciousPaths="\n\t" + paths)
    return True


def list_input_files(path: str, path_glob_filter: str | None = None,
                     recursive: bool = False) -> list[ListedFile]:
    """The data files a stream over ``path`` (a directory, a file or a glob pattern) reads,
    as Spark's file index lists them for its file source:

    - the files directly in each directory the path names (files in plain
      subdirectories are not read);
    - every file below, when the subdirectories are partition directories (``k=v``;
      Spark's partition discovery, with its errors for conflicting layouts);
    - every file below, with ``recursiveFileLookup`` (no partition discovery then).
    """
    if is_glob_path(path):
        roots = sorted({m for p in expand_braces(path)
                        for m in globlib.glob(_to_python_glob(p))})
    else:
        roots = [path]
    leaf_dirs: dict[str, list[ListedFile]] = {}
    root_dirs: list[str] = []
    single_files: list[ListedFile] = []
    for root in roots:
        if os.path.isdir(root):
            root = os.path.normpath(root)
            root_dirs.append(root)
            _walk(root, leaf_dirs)
        elif os.path.isfile(root) and not is_hidden(os.path.basename(root)):
            st = os.stat(root)
            single_files.append(ListedFile(root, st.st_size, st.st_mtime_ns // 1_000_000))
    if path_glob_filter:
        patterns = [_to_python_glob(p) for p in expand_braces(path_glob_filter)]

        def matches(f: ListedFile) -> bool:
            return any(fnmatch.fnmatchcase(os.path.basename(f.path), p) for p in patterns)
        single_files = [f for f in single_files if matches(f)]
        leaf_dirs = {d: kept for d, files in leaf_dirs.items() if (kept := [f for f in files if matches(f)])}
    if recursive:
        return single_files + [f for files in leaf_dirs.values() for f in files]
    base_paths = set(root_dirs) | {os.path.dirname(f.path) for f in single_files}
    found = {d: _partition_of(d, base_paths) for d in leaf_dirs}
    if _check_partitions(found):
        return single_files + [f for files in leaf_dirs.values() for f in files]
    return single_files + [f for root in root_dirs for f in leaf_dirs.get(root, [])]
