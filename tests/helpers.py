"""What the tests share: running a query to the end and collecting its batches, recording
listener events, waiting for a condition with a deadline, and setting Spark confs for a
block."""
from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any, Callable

from pyspark.sql.streaming import StreamingQueryListener


def sorted_rows(df) -> list[tuple]:
    """A batch's rows as tuples, in a fixed order (engines emit them in any order)."""
    return sorted(map(tuple, df.collect()), key=repr)


def plain(value, *, lists_ordered: bool = False):
    """A row's value made comparable across engines: floats rounded (merge order differs
    in the last bits; NaN as the text "NaN", equal to itself and apart from null), structs
    as tuples, lists sorted unless ``lists_ordered`` (an aggregate whose list order is its
    answer)."""
    import math
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else round(value, 9)
    if isinstance(value, list):
        values = [plain(v, lists_ordered=lists_ordered) for v in value]
        return values if lists_ordered else sorted(values, key=repr)
    if hasattr(value, "asDict"):
        return tuple(plain(v, lists_ordered=lists_ordered) for v in value)
    return value


def plain_rows(df, *, lists_ordered: bool = False) -> list:
    """A batch's rows as ``plain`` tuples, in a fixed order."""
    return sorted((plain(r, lists_ordered=lists_ordered) for r in df.collect()), key=repr)


def json_stream(session, path, schema: str, files_per_trigger: int | None = 1):
    """A JSON file stream of ``session`` (a SparkSession: Spark's engine; a
    StreamingSession: microbatch), ``files_per_trigger`` files a batch."""
    reader = session.readStream.schema(schema)
    if files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", files_per_trigger)
    return reader.json(str(path))


def collect_batches(frame, ckpt, mode: str | None = None, rows: Callable = sorted_rows,
                    timeout: float = 300, on_batch: Callable | None = None,
                    fail_on_error: bool = True, queries: list | None = None) -> tuple[list, list]:
    """Runs ``frame`` into a ``foreachBatch`` sink with ``availableNow`` to the end; the
    batches ``(batch id, rows(df))`` and the progress. ``on_batch(df, batch_id, batches)``
    runs first for each batch (and may raise, to fail the query); the query is added to
    ``queries`` when given."""
    batches: list = []

    def sink(df, batch_id):
        if on_batch is not None:
            on_batch(df, batch_id, batches)
        batches.append((batch_id, rows(df)))

    writer = frame.writeStream
    if mode is not None:
        writer = writer.outputMode(mode)
    query = (writer.foreachBatch(sink).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    if queries is not None:
        queries.append(query)
    if fail_on_error:
        query.awaitTermination(timeout)
        assert query.exception() is None, query.exception()
    else:
        try:
            query.awaitTermination(timeout)
        except Exception:   # noqa: BLE001 - the caller expects the query may fail
            pass
    return batches, query.recentProgress


class EventRecorder(StreamingQueryListener):
    """Every listener event, as (kind, event), kind one of started, progress, idle, terminated."""

    def __init__(self):
        self.events: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _add(self, kind: str, event) -> None:
        with self._lock:
            self.events.append((kind, event))

    def onQueryStarted(self, event):
        self._add("started", event)

    def onQueryProgress(self, event):
        self._add("progress", event)

    def onQueryIdle(self, event):
        self._add("idle", event)

    def onQueryTerminated(self, event):
        self._add("terminated", event)

    def of(self, query) -> list[tuple[str, Any]]:
        """The events of ``query`` (by its id)."""
        wanted = uuid.UUID(query.id)
        with self._lock:
            return [(kind, e) for kind, e in self.events
                    if getattr(e, "id", None) == wanted or getattr(getattr(e, "progress", None), "id", None) == wanted]


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str | Callable[[], str] = "the condition",
             every: float = 0.05) -> Any:
    """``condition()``'s first true value, polled every ``every`` seconds; an
    AssertionError naming ``what`` (or ``what()``, told then: a log's tail) after
    ``timeout`` seconds. ``condition`` may raise (an assertion that the query still runs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(every)


@contextlib.contextmanager
def confs(spark, settings: dict[str, Any] | None = None, /, **more: Any):
    """Sets Spark confs for the block: ``confs(spark, {"spark.sql.x": "1"})`` (or as
    keywords, ``**{...}``), on ``spark`` (a SparkSession, a Connect session or a
    StreamingSession: its ``conf`` is its SparkSession's); a value None unsets the key for
    the block. On exit each key is back to its value before (unset if it was unset), so a
    conf the session was started with (``MICROBATCH_TEST_STATE_STORE``) survives."""
    wanted = {**(settings or {}), **more}
    before = {key: spark.conf.get(key, None) for key in wanted}
    try:
        for key, value in wanted.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


@contextlib.contextmanager
def s3_lake(spark, bucket: str = "lake"):
    """A real S3 endpoint (moto's server) with ``bucket``, its endpoint and keys set as
    the session's ``spark.hadoop.fs.s3a.*`` (as a job gives them) for the block; yields
    delta-rs's storage options for the same endpoint, for the test's own readers."""
    import boto3

    from microbatch.testing.s3_server import s3_server
    with s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="moto", aws_secret_access_key="moto-secret",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        settings = {"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.access.key": "moto",
                    "spark.hadoop.fs.s3a.secret.key": "moto-secret",
                    "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
        with confs(spark, settings):
            yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "moto", "AWS_SECRET_ACCESS_KEY": "moto-secret",
                   "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def state_rows_per_partition(reader, ckpt, operators: dict[int, tuple]) -> list:
    """(operator, join side, partition, rows) of the state of each operator (with its join
    sides, or ``(None,)``), as ``reader`` (Spark's or microbatch's ``read``) reads it."""
    found = []
    for op, sides in operators.items():
        for side in sides:
            frame = reader.format("statestore").option("operatorId", op)
            if side is not None:
                frame = frame.option("joinSide", side)
            found.extend((op, side, row[0], row[1])
                         for row in frame.load(str(ckpt)).groupBy("partition_id").count().collect())
    return sorted(found, key=repr)


def ci_share(cases, every: int = 2) -> list:
    """``cases`` for ``pytest.mark.parametrize``, every ``every``-th (the first, then
    each ``every`` on) in CI's run and the others marked ``extended``: a sweep over many
    shapes or seeds of one comparison keeps each family in ``make test`` and the rest runs
    in ``make test-extended`` (README, "What runs where"). A case that is already a
    ``pytest.param`` keeps its own marks and id."""
    import pytest
    shared = []
    for i, case in enumerate(cases):
        if i % every == 0:
            shared.append(case)
        elif hasattr(case, "values") and hasattr(case, "marks"):
            shared.append(pytest.param(*case.values, marks=[*case.marks, pytest.mark.extended], id=case.id))
        else:
            values = case if isinstance(case, tuple) else (case,)
            shared.append(pytest.param(*values, marks=pytest.mark.extended))
    return shared
