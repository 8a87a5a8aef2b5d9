"""A live line per query in the terminal (rich), plain lines in logs.

Attached to a terminal, ``LiveLines`` keeps a footer with one line per query (batch,
input and processed rows per second, watermark, state rows) that rich redraws in place
while the batches' own output (the console sink's tables) scrolls above it. Not attached
to a terminal (a log file, a pipe, CI), nothing is drawn: the caller prints plain text.
"""
from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # (rich is imported where a live footer is drawn: importing the console
    # sink, as every query's registry does, does not import it)
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table


def progress_line(name: str, progress: dict[str, Any] | None, status: str = "RUNNING") -> dict[str, str]:
    """The fields of a query's line, from its last progress JSON (a dict)."""
    progress = progress or {}
    state_rows = sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators", []))
    watermark = (progress.get("eventTime") or {}).get("watermark", "")
    return {"query": name, "status": status,
            "batch": "" if progress.get("batchId") is None else str(progress["batchId"]),
            "input rows/s": f"{progress.get('inputRowsPerSecond', 0.0):,.1f}" if progress else "",
            "processed rows/s": f"{progress.get('processedRowsPerSecond', 0.0):,.1f}" if progress else "",
            "watermark": watermark, "state rows": f"{state_rows:,}" if progress else ""}


def plain_line(fields: dict[str, str]) -> str:
    return (f"{fields['query']}: {fields['status'].lower()}, batch {fields['batch'] or '-'}, "
            f"{fields['input rows/s'] or '0'} input rows/s, {fields['processed rows/s'] or '0'} "
            f"processed rows/s, watermark {fields['watermark'] or '-'}, state rows "
            f"{fields['state rows'] or '0'}")


def is_terminal(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


class LiveLines:
    """The footer of live lines, one per key, drawn while at least one key is tracked."""

    def __init__(self, console: Console | None = None):
        from rich.console import Console
        self._console = console or Console()
        self._lines: dict[str, dict[str, str]] = {}
        self._live: Live | None = None
        self._lock = threading.Lock()

    def _table(self) -> Table:
        from rich.table import Table
        from rich.text import Text
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for column in ("query", "status", "batch", "input rows/s", "processed rows/s", "watermark",
                       "state rows"):
            table.add_column(column, justify="right" if "rows" in column or column == "batch" else "left")
        for fields in self._lines.values():
            table.add_row(*[Text(value) for value in fields.values()])
        return table

    def update(self, key: str, fields: dict[str, str]) -> None:
        with self._lock:
            self._lines[key] = fields
            if self._live is None:
                from rich.live import Live
                self._live = Live(self._table(), console=self._console, refresh_per_second=4,
                                  redirect_stdout=True, redirect_stderr=False, transient=False)
                self._live.start()
            else:
                self._live.update(self._table(), refresh=True)

    def remove(self, key: str, status: str = "FINISHED") -> None:
        """Drop a query's line; the last one is left on the screen with ``status``."""
        with self._lock:
            if self._live is None:
                return
            if key in self._lines and len(self._lines) == 1:
                self._lines[key] = {**self._lines[key], "status": status}
                self._live.update(self._table(), refresh=True)
                self._lines.clear()
                self._live.stop()
                self._live = None
                return
            self._lines.pop(key, None)
            self._live.update(self._table(), refresh=True)


_shared: LiveLines | None = None


def shared_live_lines() -> LiveLines:
    """The process's footer (console sinks of several queries share it)."""
    global _shared
    if _shared is None:
        _shared = LiveLines()
    return _shared
