"""What a file stream reads: the listing of its path (a directory, a file or a glob
pattern with Hadoop's braces), as Spark 4.3's file index lists it for its file source:
the files directly in the directories named, every file below partition directories
(``k=v``, with Spark's errors for conflicting layouts) or with ``recursiveFileLookup``,
hidden names skipped (docs/design.md, section 7)."""
from __future__ import annotations

import fnmatch
import glob as globlib
import os
import posixpath
import stat
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from microbatch import spark_internals
from microbatch.errors import UnsupportedOperationError

_GLOB_CHARS = set("{}[]*?\\")


def is_glob_path(path: str) -> bool:
    return any(c in _GLOB_CHARS for c in path)


@dataclass(frozen=True)
class ListedFile:
    path: str           # absolute local path, or ``<scheme>://bucket/key`` on an object store
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


class _LocalFiles:
    """The listing's primitives on local disk (``os.scandir``: one ``stat`` per file)."""

    def glob(self, pattern: str) -> list[str]:
        return globlib.glob(_to_python_glob(pattern))

    def kind(self, path: str) -> tuple[str, int, int] | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ("directory" if stat.S_ISDIR(st.st_mode) else "file"), st.st_size, st.st_mtime_ns // 1_000_000

    def entries(self, directory: str) -> Iterator[tuple[str, bool, int, int]]:
        try:
            found = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in found:
            if is_hidden(entry.name):
                continue
            try:
                if entry.is_dir():
                    yield entry.path, True, 0, 0
                else:
                    st = entry.stat()
                    yield entry.path, False, st.st_size, st.st_mtime_ns // 1_000_000
            except FileNotFoundError:
                continue  # removed while listing

    def root(self, path: str) -> str:
        return os.path.normpath(path)

    def path(self, key: str) -> str:
        return key

    def shown(self, key: str) -> str:
        return "file:" + key


class StoreFiles:
    """The listing's primitives on an object store (``ObjectStoreFileSystem``, fsspec's
    s3fs): one LIST (``/`` as delimiter) per directory, no request per file. Keys are
    ``bucket/key``; listed files are named ``<scheme>://bucket/key``."""

    def __init__(self, storage: Any):
        self.storage = storage
        self.scheme = storage.scheme

    def glob(self, pattern: str) -> list[str]:
        wanted = pattern.strip("/").split("/")
        # as Python's glob: a wildcard does not match a name starting with "."
        return [m for m in self.storage.glob(pattern)
                if not any(got.startswith(".") and not want.startswith(".")
                           for want, got in zip(wanted, m.strip("/").split("/")))]

    def kind(self, key: str) -> tuple[str, int, int] | None:
        return self.storage.kind(key)

    def entries(self, directory: str) -> Iterator[tuple[str, bool, int, int]]:
        for key, is_dir, size, ms in self.storage.entries(directory):
            if not is_hidden(posixpath.basename(key)):
                yield key, is_dir, size, ms

    def root(self, path: str) -> str:
        return path.rstrip("/")

    def key(self, uri: str) -> str:
        """``bucket/key`` of ``<scheme>://bucket/key`` (not urlparse: a glob's ``?`` and
        ``#`` are part of the pattern, not a query or a fragment)."""
        _, sep, rest = uri.partition("://")
        return rest if sep else uri

    def path(self, key: str) -> str:
        return f"{self.scheme}://{key}"

    def shown(self, key: str) -> str:
        return self.path(key)


LOCAL_FILES = _LocalFiles()


def _walk(files: Any, directory: str, leaf_dirs: dict[str, list[ListedFile]]) -> None:
    """Every data file under ``directory``, grouped by the directory that holds it."""
    for path, is_dir, size, mtime_ms in files.entries(directory):
        if is_dir:
            _walk(files, path, leaf_dirs)
        else:
            leaf_dirs.setdefault(directory, []).append(ListedFile(path, size, mtime_ms))


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


def _check_partitions(found: dict[str, tuple[list[str] | None, str]], files: Any = None) -> bool:
    """Whether the leaf directories are partitions; Spark's errors for layouts it refuses."""
    partitioned = {d: cols for d, (cols, _) in found.items() if cols is not None}
    if not partitioned:
        return False
    shown = (files or LOCAL_FILES).shown
    bases = sorted({base for _, base in found.values()})
    if len(bases) > 1:
        raise spark_internals.spark_error(
            "SparkRuntimeException", "CONFLICTING_DIRECTORY_STRUCTURES",
            discoveredBasePaths="\n\t" + "\n\t".join(shown(b) for b in bases) + "\n")
    names = []
    for cols in partitioned.values():
        lowered = [c.lower() for c in cols]
        if lowered not in names:
            names.append(lowered)
    if len(names) > 1:
        lists = "\n\t".join(f"Partition column name list #{i}: {', '.join(n)}"
                             for i, n in enumerate(names))
        paths = "\n\t".join(shown(d) for d in sorted(partitioned))
        raise spark_internals.spark_error(
            "SparkRuntimeException", "CONFLICTING_PARTITION_COLUMN_NAMES",
            distinctPartColLists="\n\t" + lists + "\n", suspiciousPaths="\n\t" + paths)
    return True


def list_input_files(path: str, path_glob_filter: str | None = None,
                     recursive: bool = False, files: Any = LOCAL_FILES) -> list[ListedFile]:
    """The data files a stream over ``path`` (a directory, a file or a glob pattern) reads,
    as Spark's file index lists them for its file source:

    - the files directly in each directory the path names (files in plain
      subdirectories are not read);
    - every file below, when the subdirectories are partition directories (``k=v``;
      Spark's partition discovery, with its errors for conflicting layouts);
    - every file below, with ``recursiveFileLookup`` (no partition discovery then).

    ``files``: where to list: local disk (``LOCAL_FILES``) or an object store
    (``StoreFiles``); the rules above are the same code for both.
    """
    if isinstance(files, StoreFiles):
        path = files.key(path)
    if is_glob_path(path):
        roots = sorted({m for p in expand_braces(path) for m in files.glob(p)})
    else:
        roots = [path]
    leaf_dirs: dict[str, list[ListedFile]] = {}
    root_dirs: list[str] = []
    single_files: list[ListedFile] = []
    for root in roots:
        found = files.kind(root)
        if found is None:
            continue
        kind, size, mtime_ms = found
        if kind == "directory":
            root = files.root(root)
            root_dirs.append(root)
            _walk(files, root, leaf_dirs)
        elif not is_hidden(posixpath.basename(root)):
            single_files.append(ListedFile(root, size, mtime_ms))
    if path_glob_filter:
        patterns = [_to_python_glob(p) for p in expand_braces(path_glob_filter)]

        def matches(f: ListedFile) -> bool:
            return any(fnmatch.fnmatchcase(posixpath.basename(f.path), p) for p in patterns)
        single_files = [f for f in single_files if matches(f)]
        leaf_dirs = {d: kept for d, listed in leaf_dirs.items() if (kept := [f for f in listed if matches(f)])}
    if recursive:
        chosen = single_files + [f for listed in leaf_dirs.values() for f in listed]
    else:
        base_paths = set(root_dirs) | {posixpath.dirname(f.path) for f in single_files}
        found_partitions = {d: _partition_of(d, base_paths) for d in leaf_dirs}
        if _check_partitions(found_partitions, files):
            chosen = single_files + [f for listed in leaf_dirs.values() for f in listed]
        else:
            chosen = single_files + [f for root in root_dirs for f in leaf_dirs.get(root, [])]
    if isinstance(files, StoreFiles):
        chosen = [ListedFile(files.path(f.path), f.size, f.mtime_ms) for f in chosen]
    return chosen


def partition_values(path: str) -> list[tuple[str, str | None]]:
    """The ``k=v`` directories a file sits under, outermost first, walking up from its
    directory to the first name that is not one (Spark's partition values, unescaped;
    ``__HIVE_DEFAULT_PARTITION__`` is null)."""
    from urllib.parse import unquote
    values: list[tuple[str, str | None]] = []
    current = posixpath.dirname(path)
    while True:
        key, sep, value = posixpath.basename(current).partition("=")
        if not (sep and key and value):
            break
        values.append((unquote(key), None if value == "__HIVE_DEFAULT_PARTITION__" else unquote(value)))
        parent = posixpath.dirname(current)
        if parent == current:
            break
        current = parent
    return list(reversed(values))


#: The option that turns incremental listing on (microbatch's own, as Auto Loader's
#: ``cloudFiles.useIncrementalListing``; Spark's file source lists the whole directory).
INCREMENTAL_LISTING = "useIncrementalListing"
_INCREMENTAL_SCHEMES = ("s3", "s3a", "s3n", "gs")


class IncrementalListing:
    """The directory's objects listed from the last key the stream consumed on, not from
    the start: for a directory whose object names sort in the order they arrive (a
    timestamp or a sequence number first), where Spark's file source lists every object
    every trigger. Each listing asks the store for the keys after the start key only (S3's
    ``StartAfter``, GCS's ``startOffset``); the start moves past the keys the stream took
    into its log (or skipped: hidden, filtered out, older than ``maxFileAge``), in key
    order, up to the first key still new, so a file ``maxFilesPerTrigger`` left for later is
    listed again. A file that lands with a key before the start is never read: the
    option's contract, said in the error and in docs. After a restart the start is the
    greatest key of the source's log."""

    def __init__(self, files: Any, path: str, logged: list[str], path_glob_filter: str | None,
                 recursive: bool):
        scheme = path.partition("://")[0].lower() if "://" in path else ""
        if not isinstance(files, StoreFiles) or scheme not in _INCREMENTAL_SCHEMES or is_glob_path(path) \
                or recursive:
            raise UnsupportedOperationError(
                f"The file source option {INCREMENTAL_LISTING} lists a directory on S3 (s3://, s3a://) or "
                f"Google Cloud Storage (gs://) from the last key read on; '{path}' is "
                + ("a glob pattern" if is_glob_path(path) else "read with recursiveFileLookup" if recursive
                   else "not on such a store")
                + ". Remove the option, or give a directory there whose files' names sort in the "
                  "order they arrive.")
        self.files = files
        self.directory = files.key(path).rstrip("/")
        own = [files.key(p) for p in logged if files.key(p).startswith(self.directory + "/")]
        self.after: str | None = max(own) if own else None
        self._patterns = [_to_python_glob(p) for p in expand_braces(path_glob_filter)] if path_glob_filter else None
        self._found: list[tuple[str, ListedFile | None]] = []    # every key listed, a candidate or None
        self.listed = 0           # the objects the last listing returned

    def list(self) -> list[ListedFile]:
        found, subdirectories = self.files.storage.files_after(self.directory, self.after)
        if subdirectories and self.after is None:
            raise UnsupportedOperationError(
                f"The file source option {INCREMENTAL_LISTING} lists the files directly in "
                f"'{self.files.path(self.directory)}', which has subdirectories (partition directories "
                "are read by the full listing only). Remove the option, or give a directory of files.")
        self.listed = len(found)
        self._found = []
        for key, size, mtime_ms in found:
            name = posixpath.basename(key)
            wanted = not is_hidden(name) and (self._patterns is None
                                              or any(fnmatch.fnmatchcase(name, p) for p in self._patterns))
            self._found.append((key, ListedFile(self.files.path(key), size, mtime_ms) if wanted else None))
        return [f for _, f in self._found if f is not None]

    def consumed(self, is_new: Callable[[ListedFile], bool]) -> None:
        """Move the start past the listed keys the stream no longer needs (class docstring)."""
        for key, listed in self._found:
            if listed is not None and is_new(listed):
                break
            self.after = key
