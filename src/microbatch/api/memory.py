"""MemoryStream: a stream fed from the driver, for tests and examples (Spark's MemoryStream)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from microbatch.plan.logical import StreamingRelation
from microbatch.sources.memory import MemoryStreamSource
from microbatch.util import CaseInsensitiveOptions

if TYPE_CHECKING:
    from microbatch.api.frame import StreamFrame
    from microbatch.api.session import StreamingSession


class MemoryStream(MemoryStreamSource):
    """``ms = MemoryStream(ss, "a INT, b STRING"); ms.add_data([(1, "x")]); ms.toDF()``."""

    def __init__(self, session: "StreamingSession", schema: StructType | str):
        super().__init__(session.spark, schema)
        self._session = session
        self._relation = StreamingRelation("memory", CaseInsensitiveOptions(), self.schema, None,
                                           provider=None, source_instance=self)

    def toDF(self) -> "StreamFrame":
        from microbatch.api.frame import StreamFrame
        return StreamFrame.from_relation(self._session, self._relation)
