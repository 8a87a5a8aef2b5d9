"""``console``: print each batch, as Spark's console sink.

Options ``numRows`` (default 20) and ``truncate`` (default true). No delivery
guarantee: a batch re-run after a crash is printed again.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from microbatch.sinks.base import READS_SQL, Sink, SinkContext, SinkProvider


class ConsoleSink(Sink):
    reads_batch_through = READS_SQL

    def __init__(self, num_rows: int, truncate: bool):
        self.num_rows = num_rows
        self.truncate = truncate

    def add_batch(self, batch_id: int, df: DataFrame) -> None:
        print("-------------------------------------------")
        print(f"Batch: {batch_id}")
        print("-------------------------------------------")
        df.show(self.num_rows, self.truncate)

    def __str__(self) -> str:
        return f"ConsoleSink[numRows={self.num_rows}, truncate={str(self.truncate).lower()}]"


class ConsoleSinkProvider(SinkProvider):
    short_name = "console"
    allows_temporary_checkpoint = True

    def create(self, context: SinkContext) -> Sink:
        num_rows = context.options.get_int("numRows", 20)
        if num_rows <= 0:
            raise ValueError(f"Invalid value '{num_rows}' for option 'numRows': it must be positive.")
        return ConsoleSink(num_rows, context.options.get_bool("truncate", True))
