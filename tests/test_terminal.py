"""The console sink and ``microbatch watch``: a live line per query (rich) in a terminal,
Spark's plain output in logs."""
from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from microbatch import terminal
from microbatch.sinks import console as console_sink


def rate_to_console(ss, ckpt, name):
    frame = ss.readStream.format("rate-micro-batch").option("rowsPerBatch", 3).load()
    query = (frame.writeStream.format("console").queryName(name).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_in_a_terminal_the_console_sink_keeps_a_live_line_per_query(ss, tmp_path, monkeypatch):
    screen = io.StringIO()
    lines = terminal.LiveLines(Console(file=screen, force_terminal=True, width=160, color_system=None))
    monkeypatch.setattr(terminal, "_shared", lines)
    monkeypatch.setattr(console_sink, "is_terminal", lambda stream=None: True)
    rate_to_console(ss, tmp_path / "ckpt", "live-line")
    shown = screen.getvalue()
    assert "input rows/s" in shown and "processed rows/s" in shown and "state rows" in shown
    assert any(line.split()[:3] == ["live-line", "FINISHED", "0"] for line in shown.splitlines()), shown
    assert lines._live is None and lines._lines == {}   # the footer goes with the query


def test_in_a_log_the_console_sink_prints_sparks_plain_output(ss, tmp_path, capsys):
    rate_to_console(ss, tmp_path / "ckpt", "plain")
    out = capsys.readouterr().out
    assert "-------------------------------------------\nBatch: 0\n-------------------------------------------\n" in out
    assert "timestamp|value|" in out and "\x1b[" not in out and "input rows/s" not in out


def test_watch_prints_a_line_per_new_batch_when_not_in_a_terminal(ss, tmp_path):
    rate_to_console(ss, tmp_path / "ckpt", "watched")
    done = subprocess.run([sys.executable, "-m", "microbatch.cli.main", "watch", str(tmp_path / "ckpt"),
                           "--count", "2", "--interval", "0.1"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, lines   # the second read found nothing new: no second line
    assert lines[0].startswith("watched: finished, batch 0, ") and "watermark -, state rows 0" in lines[0], lines
