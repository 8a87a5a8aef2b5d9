"""How a test class of PySpark's runs on microbatch: its session wrapped, as a user ports a job.

``OnMicrobatch`` goes first in a test class's bases, before PySpark's own test class. After
PySpark's ``setUpClass`` made the class's SparkSession with the class's own ``conf()``, the
session becomes ``StreamingSession(spark)``: ``readStream`` and ``streams`` are
microbatch's, everything else (``createDataFrame``, ``read``, ``conf``, ``dataSource``, ...)
is the wrapped SparkSession's. Each test then checks the engine that ran it: Spark's own
query manager must have started no query, and a test that started queries started
microbatch's.
"""
from __future__ import annotations

import os

ENGINE = os.environ.get("MICROBATCH_PYSPARK_ENGINE", "microbatch")


def tests_from_the_wheel() -> None:
    """Make ``pyspark.sql.tests`` importable from the installed wheel, unmodified: the wheel
    ships its tests in ``pyspark/python/lib/pyspark.zip`` (Spark puts that zip on its Python
    workers' path, so the tests' processors and functions unpickle there); and make
    PySpark's workers use this interpreter."""
    import sys

    import pyspark
    import pyspark.sql
    zipped = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip")
    if not os.path.exists(zipped):   # pragma: no cover - every pyspark wheel has it
        raise RuntimeError(f"{zipped} is missing: PySpark's own tests come from the installed wheel")
    if zipped + "/pyspark/sql" not in pyspark.sql.__path__:
        pyspark.sql.__path__.append(zipped + "/pyspark/sql")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


class _Starts:
    """The queries an engine's query manager starts (a listener of either engine), by id."""

    def __init__(self) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        starts = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                starts.ids.append(str(event.id))

            def onQueryProgress(self, event):
                pass

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        self.ids: list[str] = []
        self.listener = Listener()

    @property
    def count(self) -> int:
        return len(self.ids)


class OnMicrobatch:
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.spark_starts = _Starts()
        cls.spark.streams.addListener(cls.spark_starts.listener)
        cls.microbatch_starts = _Starts()
        if ENGINE == "microbatch":
            from microbatch import StreamingSession
            cls.spark = StreamingSession(cls.spark)
            cls.spark.streams.addListener(cls.microbatch_starts.listener)

    def setUp(self):
        super().setUp()
        self._spark_before = self.spark_starts.count
        self._microbatch_before = self.microbatch_starts.count

    def tearDown(self):
        try:
            if ENGINE == "microbatch":
                for query in self.spark.streams.active:
                    query.stop()
                # (Spark posts a QueryStartedEvent to the session's listeners synchronously;
                # microbatch posts its own queries' there too, for Spark's UI and listeners)
                on_spark = set(self.spark_starts.ids[self._spark_before:]) - set(self.microbatch_starts.ids)
                assert not on_spark, f"{self.id()} started {len(on_spark)} query(ies) on Spark's own engine"
                started = self.microbatch_starts.count - self._microbatch_before
                STARTED_QUERIES[self.id()] = started
        finally:
            super().tearDown()


#: test id -> queries it started on microbatch (printed at the end of the run)
STARTED_QUERIES: dict[str, int] = {}
