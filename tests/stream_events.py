"""Helpers shared by the tests that run a query next to Spark's own engine."""
from __future__ import annotations

import json
import os
import time

#: The events most of the differential tests read (the ``events`` fixture of conftest.py),
#: (id, time on 2026-01-01), one file per batch: late rows, duplicates inside a batch and
#: across batches. A null key equals a null key, as in Spark's grouping.
EVENTS = [
    [(1, "00:00:10"), (2, "00:00:20"), (1, "00:00:10"), (None, "00:00:12")],
    [(1, "00:00:10"), (3, "00:00:40"), (None, "00:00:12"), (None, "00:00:35")],
    [(2, "00:00:20"), (4, "00:00:05"), (5, "00:00:41"), (3, "00:00:45"), (None, "00:00:42"), (None, "00:00:42")],
    [(6, "00:01:40"), (3, "00:00:40")],
]

#: The state-operator fields both engines must agree on, batch by batch.
STATE_FIELDS = ("operatorName", "numRowsTotal", "numRowsUpdated", "numRowsRemoved",
                "numRowsDroppedByWatermark", "numShufflePartitions", "numStateStoreInstances")


def write_event_files(directory, batches, to_record) -> str:
    """One json file per batch, with increasing modification times (the file source's
    order); ``to_record`` turns an event tuple into a json object."""
    directory.mkdir()
    base = time.time() - 10_000
    for i, batch in enumerate(batches):
        path = directory / f"f{i}.json"
        path.write_text("".join(json.dumps(to_record(*event)) + "\n" for event in batch))
        os.utime(path, (base + i, base + i))
    return str(directory)


def id_and_time(k, t) -> dict:
    """An event ``(id, time of day)`` as the json record ``{"id", "ts"}`` on 2026-01-01."""
    return {"id": k, "ts": f"2026-01-01 {t}"}


def comparable(progress, custom: tuple[str, ...] = ()) -> list:
    """Per batch: id, eventTime, the state operators' common fields (and ``custom``
    metrics), input rows."""
    out = []
    for p in progress:
        ops = [{k: v for k, v in op.items() if k in STATE_FIELDS} for op in p["stateOperators"]]
        extra = [[op["customMetrics"].get(name) for name in custom] for op in p["stateOperators"]]
        out.append((p["batchId"], p.get("eventTime") or None, ops, extra, p["numInputRows"]))
    return out


def watermarks(ckpt) -> list:
    """The watermark of every ``offsets/N`` and ``commits/N`` of a checkpoint."""
    found = []
    for name, key in (("offsets", "batchWatermarkMs"), ("commits", "nextBatchWatermarkMs")):
        for batch in sorted((b for b in os.listdir(ckpt / name) if b.isdigit()), key=int):
            found.append((name, batch, json.loads((ckpt / name / batch).read_text().split("\n")[1])[key]))
    return found


def first_batches(session, events, ckpt, count: int, transform, mode: str = "update"):
    """Rows and progress of the first ``count`` batches of ``transform`` over the event
    files, with ``availableNow``. For queries that run a batch at every trigger (processing
    time timeouts, timers and TTL, as in Spark), which therefore never end."""
    from helpers import wait_for
    batches = []
    frame = session.readStream.schema("id INT, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(events)
    query = (transform(frame).writeStream.outputMode(mode)
             .foreachBatch(lambda df, i: batches.append((i, sorted(map(tuple, df.collect()), key=repr))))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    wait_for(lambda: len(query.recentProgress) >= count or query.exception() is not None, 240,
             f"{count} batches", every=0.1)
    query.stop()
    assert query.exception() is None
    return batches[:count], query.recentProgress[:count]
