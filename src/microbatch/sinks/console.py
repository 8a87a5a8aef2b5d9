"""``console``: print each batch, as Spark's console sink.

Options ``numRows`` (default 20) and ``truncate`` (default true). No delivery
guarantee: a batch re-run after a crash is printed again.

Attached to a terminal, the sink also keeps a live line per query below the batches
(``microbatch.terminal``: batch, rows per second, watermark, state rows), updated from each
batch's progress; in a log or a pipe its output is Spark's, plain.
"""
from __future__ import annotations

import json

from pyspark.sql import DataFrame

from microbatch.terminal import is_terminal, progress_line, shared_live_lines
from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider


class ConsoleSink(Sink):
    reads_batch_through = READS_SQL

    def __init__(self, num_rows: int, truncate: bool, query_name: str | None = None,
                 live: bool | None = None):
        self.num_rows = num_rows
        self.truncate = truncate
        self.query_name = query_name
        self.live = is_terminal() if live is None else live
        self._live_key = f"console sink {id(self)}"

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        # As Spark's console sink: every row comes to the driver (and is counted), the first
        # numRows are shown
        rows = df.collect()
        self.last_num_output_rows = len(rows)
        print("-------------------------------------------")
        print(f"Batch: {batch_id}")
        print("-------------------------------------------")
        shown = df.sparkSession.createDataFrame(rows[:self.num_rows], df.schema, verifySchema=False)
        shown.show(self.num_rows, self.truncate)

    def report_progress(self, progress) -> None:
        if self.live:
            shared_live_lines().update(self._live_key, progress_line(
                self.query_name or str(progress.id), json.loads(progress.json)))

    def stop(self) -> None:
        if self.live:
            shared_live_lines().remove(self._live_key)

    def __str__(self) -> str:
        return f"ConsoleSink[numRows={self.num_rows}, truncate={str(self.truncate).lower()}]"


class ConsoleSinkProvider(SinkProvider):
    short_name = "console"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        num_rows = context.options.get_int("numRows", 20)
        if num_rows <= 0:
            raise ValueError(f"Invalid value '{num_rows}' for option 'numRows': it must be positive.")
        return ConsoleSink(num_rows, context.options.get_bool("truncate", True), context.query_name)
