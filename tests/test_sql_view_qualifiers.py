"""SQL over a temporary view of a file stream reads the view's template under Spark's own
``View`` (which hides the relation's ``_metadata``, as Spark's SQL does): the view's name
qualifies columns only where the query uses it, as an alias step of the stream's plan too.
An alias in the template alone made Spark's analysis qualify an aggregation's ``sum(v)``
as ``sum(events.v)``, which the batch's plan (without the alias) could not resolve
(commit 5ce38ca, reverted in 05e8fdd). Next to Spark's engine, batch by batch (issue 59)."""
from __future__ import annotations

import json

import pytest

from stream_events import comparable, watermarks, write_event_files
from test_sql_differential import EVENTS, run

#: name -> (SQL over the watermarked view ``events`` of a json stream, output mode)
CASES = {
    "no qualifier: an aggregation": (
        "SELECT id, sum(v) AS total, max(v) AS top FROM events WHERE id IS NOT NULL GROUP BY id", "update"),
    "unqualified and qualified columns in one aggregation": (
        "SELECT id, sum(v) AS total, max(events.v) AS top, count(events.ts) AS n FROM events "
        "WHERE events.id IS NOT NULL GROUP BY events.id", "update"),
    "an alias of the view, in a windowed aggregation": (
        "SELECT window(e.ts, '20 seconds') AS w, sum(e.v) AS total, avg(v) AS mean FROM events e "
        "GROUP BY window(e.ts, '20 seconds')", "append"),
}


@pytest.fixture
def events(tmp_path):
    return write_event_files(tmp_path / "events", EVENTS,
                             lambda k, t, v: {"id": k, "ts": f"2026-01-01 {t}", "v": v})


@pytest.mark.parametrize("case", list(CASES))
def test_qualified_columns_over_a_view_of_a_file_stream(spark, ss, events, tmp_path, case):
    text, mode = CASES[case]
    theirs, their_progress = run(spark, events, tmp_path / "spark", text, mode)
    ours, our_progress = run(ss, events, tmp_path / "microbatch", text, mode)
    assert ours == theirs and any(rows for _, (_, rows) in ours)
    assert comparable([json.loads(p.json) for p in our_progress]) == \
        comparable([json.loads(p.json) for p in their_progress])
    assert watermarks(tmp_path / "microbatch") == watermarks(tmp_path / "spark")

