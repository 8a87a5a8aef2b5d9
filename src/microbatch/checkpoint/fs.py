"""The one file-system layer all checkpoint I/O goes through.

Every log file is written to a hidden temporary file first and then renamed, so
a reader never sees a partial file. Log entries use ``create`` (create-if-absent):
the final rename is a hard link, which fails atomically when the name is taken,
so two runs writing the same batch cannot both win.

``FailingFileSystem`` wraps any file system and fails chosen writes; tests use it
to break the batch protocol at each of its steps.
"""
from __future__ import annotations

import errno
import os
import shutil
import uuid
from typing import Callable
from urllib.parse import urlparse

from microbatch.errors import CheckpointError


class CheckpointFileSystem:
    """Local-disk implementation; the base class other file systems follow."""

    def resolve(self, path: str) -> str:
        """Return the absolute form of ``path`` (``file:`` URIs accepted)."""
        parsed = urlparse(path)
        if parsed.scheme == "file":
            path = parsed.path
        elif parsed.scheme and len(parsed.scheme) > 1:
            raise CheckpointError(
                f"Checkpoint location '{path}' uses the scheme '{parsed.scheme}://', "
                "which microbatch cannot write yet. Use a local path or a file: URI.")
        return os.path.abspath(os.path.expanduser(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def list(self, path: str) -> list[str]:
        """Names (not paths) in a directory; empty when it does not exist."""
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def read_text(self, path: str) -> str:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()

    def _write_temp(self, path: str, text: str) -> str:
        directory, name = os.path.split(path)
        self.mkdirs(directory)
        tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
        return tmp

    def write(self, path: str, text: str) -> None:
        """Atomically write ``path``, replacing it if it exists."""
        tmp = self._write_temp(path, text)
        try:
            os.replace(tmp, path)
        except BaseException:
            self._remove_quietly(tmp)
            raise

    def create(self, path: str, text: str) -> bool:
        """Atomically create ``path``; return False (writing nothing) if it exists."""
        if os.path.exists(path):
            return False
        tmp = self._write_temp(path, text)
        try:
            os.link(tmp, path)
        except OSError as e:
            if e.errno == errno.EEXIST:
                return False
            raise
        finally:
            self._remove_quietly(tmp)
        return True

    def delete(self, path: str) -> None:
        self._remove_quietly(path)

    def delete_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _remove_quietly(path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


class InjectedFailure(OSError):
    """The failure a ``FailingFileSystem`` raises."""


class FailingFileSystem(CheckpointFileSystem):
    """A file system that fails the writes ``should_fail(operation, path)`` picks.

    ``operation`` is ``"write"``, ``"create"`` or ``"delete"``. Used by tests to
    break each step of the batch protocol and check nothing is lost.
    """

    def __init__(self, should_fail: Callable[[str, str], bool]):
        self.should_fail = should_fail

    def _check(self, operation: str, path: str) -> None:
        if self.should_fail(operation, path):
            raise InjectedFailure(f"injected failure: {operation} {path}")

    def write(self, path: str, text: str) -> None:
        self._check("write", path)
        super().write(path, text)

    def create(self, path: str, text: str) -> bool:
        self._check("create", path)
        return super().create(path, text)

    def delete(self, path: str) -> None:
        self._check("delete", path)
        super().delete(path)


LOCAL = CheckpointFileSystem()
