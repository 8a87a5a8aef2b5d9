"""The state data source's options on microbatch's own checkpoints, next to Spark's state
data source reading the checkpoint Spark's engine wrote for the same query over the same
files (issue 59): ``readChangeFeed`` with ``changeStartBatchId``/``changeEndBatchId``,
``snapshotStartBatchId``/``snapshotPartitionId``, ``joinSide``, and every refusal of a
wrong option or combination with Spark's own error condition; ``state-metadata``'s rows.
Options Spark's source does not know it ignores, and so does microbatch's."""
from __future__ import annotations

import json
import os
import sys

import pytest
from pyspark import cloudpickle
from pyspark.errors import PySparkException
from pyspark.sql.streaming import StatefulProcessor

from helpers import collect_batches, confs, json_stream, wait_for

# the processor below runs in Spark's Python workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k STRING, v INT, ts TIMESTAMP"
#: (k, v, seconds) per file: windows of 10 s close as the watermark (5 s behind) passes
FILES = [
    [("a", 1, 0), ("b", 2, 5)],
    [("a", 3, 12), ("c", 1, 14)],
    [("b", 5, 31)],
    [("a", 1, 45), ("c", 2, 47)],
]


def write_events(base, files: list) -> object:
    """``files`` ((k, v, seconds) rows each) as JSON files in ``base / "events"``, their
    modification times in order (the file source reads them so); the directory."""
    events = base / "events"
    events.mkdir()
    for i, rows in enumerate(files):
        (events / f"{i}.json").write_text("".join(
            json.dumps({"k": k, "v": v, "ts": f"2026-01-01T00:00:{s:02d}Z"}) + "\n" for k, v, s in rows))
        os.utime(events / f"{i}.json", (1_700_000_000 + i, 1_700_000_000 + i))
    return events


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory):
    """The windowed count run by both engines (Spark's map provider and microbatch's,
    snapshots every other version): the checkpoints, Spark's and microbatch's."""
    from microbatch import StreamingSession
    ss = StreamingSession(spark)
    base = tmp_path_factory.mktemp("state-source")
    events = write_events(base, FILES)

    def count(frame):
        from pyspark.sql import functions as F
        return frame.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "k").count()

    ckpts = {}
    with confs(spark, {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "1"}):
        for name, session in (("spark", spark), ("microbatch", ss)):
            ckpts[name] = base / name
            batches, _ = collect_batches(count(json_stream(session, events, SCHEMA)), ckpts[name], "append")
            assert len(batches) == len(FILES) + 1   # (a last batch without data evicts)
    return ckpts


def rows(df) -> list:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def read(session, ckpt, **options):
    reader = session.read.format("statestore")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(ckpt))


def test_the_change_feed_is_sparks_batch_by_batch(spark, ss, checkpoints):
    theirs = read(spark, checkpoints["spark"], readChangeFeed=True, changeStartBatchId=0)
    ours = read(ss, checkpoints["microbatch"], readChangeFeed=True, changeStartBatchId=0)
    assert ours.schema == theirs.schema
    assert ours.columns == ["batch_id", "change_type", "key", "value", "partition_id"]
    found = rows(ours)
    assert found == rows(theirs)
    assert {r[1] for r in found} == {"update", "delete"}   # windows counted, then evicted
    assert all(r[3] is None for r in found if r[1] == "delete")
    some = dict(readChangeFeed="true", changeStartBatchId=1, changeEndBatchId=2)
    assert rows(read(ss, checkpoints["microbatch"], **some)) == rows(read(spark, checkpoints["spark"], **some))
    assert {r[0] for r in rows(read(ss, checkpoints["microbatch"], **some))} <= {1, 2}


def test_a_snapshot_read_gives_the_partitions_state_after_the_batch(spark, ss, checkpoints):
    store = checkpoints["microbatch"] / "state" / "0" / "0"
    snapshots = sorted(int(p.name.split(".")[0]) for p in store.glob("*.snapshot.arrow"))
    assert snapshots, "minDeltasForSnapshot=1: a snapshot every other version"
    last = max(int(p.name) for p in (checkpoints["microbatch"] / "commits").iterdir() if p.name.isdigit())
    start = snapshots[0] - 1
    for batch in range(start, last + 1):
        ours = read(ss, checkpoints["microbatch"], snapshotStartBatchId=start, snapshotPartitionId=0,
                    batchId=batch)
        theirs = read(spark, checkpoints["spark"], batchId=batch).where("partition_id = 0")
        assert rows(ours) == rows(theirs), batch
    # a batch after which no snapshot was written: Spark's error
    missing = next(v for v in range(1, last + 2) if v not in snapshots) - 1
    with pytest.raises(PySparkException) as error:
        read(ss, checkpoints["microbatch"], snapshotStartBatchId=missing, snapshotPartitionId=0).collect()
    assert error.value.getCondition() == "CANNOT_LOAD_STATE_STORE.CANNOT_READ_MISSING_SNAPSHOT_FILE"
    with pytest.raises(PySparkException) as error:
        read(ss, checkpoints["microbatch"], snapshotStartBatchId=start, snapshotPartitionId=7).collect()
    assert error.value.getCondition() == "CANNOT_LOAD_STATE_STORE.SNAPSHOT_PARTITION_ID_NOT_FOUND"


#: (k, v, seconds) per file for session windows of 5 s: a's two sessions merged into one by
#: its next row, a session put unchanged and evicted in one batch, evictions with no input
SESSION_FILES = [
    [("a", 1, 0), ("a", 2, 7), ("b", 1, 1)],
    [("a", 3, 4), ("c", 1, 20)],
    [("a", 1, 30), ("b", 2, 31)],
    [("a", 1, 50)],
]


@pytest.fixture(scope="module")
def session_checkpoints(spark, tmp_path_factory):
    """A session window count and sum run by both engines: the checkpoints."""
    from microbatch import StreamingSession
    ss = StreamingSession(spark)
    base = tmp_path_factory.mktemp("state-source-sessions")
    events = write_events(base, SESSION_FILES)

    def sessions(frame):
        from pyspark.sql import functions as F
        return frame.withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "5 seconds"), "k") \
            .agg(F.count("*").alias("n"), F.sum("v").alias("s"))

    ckpts = {}
    for name, session in (("spark", spark), ("microbatch", ss)):
        ckpts[name] = base / name
        batches, _ = collect_batches(sessions(json_stream(session, events, SCHEMA)), ckpts[name], "append")
        assert len(batches) == len(SESSION_FILES) + 1
    return ckpts


def test_a_session_windows_change_feed_is_sparks_batch_by_batch(spark, ss, session_checkpoints):
    """Spark's store has a row per session: a key with input has each of its sessions put,
    changed or not, and the sessions merged away removed; each evicted session is removed,
    one put in the same batch too. microbatch keeps a key's sessions in one row, so its
    session task logs these changes beside its state files."""
    theirs = read(spark, session_checkpoints["spark"], readChangeFeed=True, changeStartBatchId=0)
    ours = read(ss, session_checkpoints["microbatch"], readChangeFeed=True, changeStartBatchId=0)
    assert ours.schema.json() == theirs.schema.json()
    found = rows(ours)
    assert found == rows(theirs)
    changes = {(r[0], r[1], r[2][0], r[2][1].second) for r in found}
    assert (1, "delete", "a", 7) in changes                                  # merged away
    assert {(2, "update", "a", 0), (2, "delete", "a", 0)} <= changes         # put unchanged, evicted
    assert (4, "delete", "b", 31) in changes and not any(r[0] == 4 and r[1] == "update" for r in found)
    some = dict(readChangeFeed=True, changeStartBatchId=1, changeEndBatchId=2)
    assert rows(read(ss, session_checkpoints["microbatch"], **some)) == \
        rows(read(spark, session_checkpoints["spark"], **some))
    # the checkpoint toolkit knows the change files: not damage
    from microbatch.ops.verify import Verifier
    verifier = Verifier(str(session_checkpoints["microbatch"]))
    verifier.run()
    assert not verifier.damaged, verifier.findings
    assert list((session_checkpoints["microbatch"] / "state" / "0").glob("*/*.changes.arrow"))


def test_a_session_change_feed_of_a_checkpoint_that_did_not_log_it_is_refused(ss, session_checkpoints, tmp_path):
    import shutil

    from microbatch.errors import UnsupportedOperationError
    older = tmp_path / "older"
    shutil.copytree(session_checkpoints["microbatch"], older)
    schema = older / "state" / "0" / "_metadata" / "schema"
    doc = json.loads(schema.read_text())
    del doc["changesLogged"]
    schema.write_text(json.dumps(doc))
    with pytest.raises(UnsupportedOperationError, match="'readChangeFeed' cannot read the changes"):
        read(ss, older, readChangeFeed=True, changeStartBatchId=0)
    assert rows(read(ss, older, batchId=2)) == rows(read(ss, session_checkpoints["microbatch"], batchId=2))


#: options Spark's reader refuses, each with its condition (both engines' readers are asked)
REFUSED = {
    "joinSide with storeName": dict(joinSide="left", storeName="left-keyToNumValues"),
    "joinSide not a side": dict(joinSide="LEFT"),
    "negative operatorId": dict(operatorId=-1),
    "empty storeName": dict(storeName="  "),
    "negative batchId": dict(batchId=-1),
    "change feed with batchId": dict(readChangeFeed=True, batchId=1, changeStartBatchId=0),
    "change feed with joinSide": dict(readChangeFeed=True, joinSide="left", changeStartBatchId=0),
    "change feed with a snapshot": dict(readChangeFeed=True, snapshotStartBatchId=0, changeStartBatchId=0),
    "change feed with a snapshot partition": dict(readChangeFeed=True, snapshotPartitionId=0, changeStartBatchId=0),
    "change feed without its start": dict(readChangeFeed=True),
    "change feed from a negative batch": dict(readChangeFeed=True, changeStartBatchId=-1),
    "change feed ending before it starts": dict(readChangeFeed=True, changeStartBatchId=2, changeEndBatchId=1),
    "change start without the change feed": dict(changeStartBatchId=0),
    "change end without the change feed": dict(changeEndBatchId=1),
    "snapshot start without a partition": dict(snapshotStartBatchId=0),
    "snapshot partition without a start": dict(snapshotPartitionId=0),
    "negative snapshot start": dict(snapshotStartBatchId=-1, snapshotPartitionId=0),
    "snapshot start after the batch": dict(snapshotStartBatchId=3, snapshotPartitionId=0, batchId=1),
    "negative snapshot partition": dict(snapshotStartBatchId=0, snapshotPartitionId=-1),
    "timers and a state variable": dict(readRegisteredTimers=True, stateVarName="x"),
    "timers not a boolean": dict(readRegisteredTimers="yes"),
    "flattening not a boolean": dict(flattenCollectionTypes="no"),
    "a state variable of an aggregation": dict(stateVarName="x"),
    "timers of an aggregation": dict(readRegisteredTimers=True),
    "a batch not committed": dict(batchId=99),
    "a change feed ending after the last batch": dict(readChangeFeed=True, changeStartBatchId=0, changeEndBatchId=99),
}


def condition_of(session, ckpt, options) -> str | None:
    try:
        read(session, ckpt, **options).collect()
    except PySparkException as e:
        return e.getCondition()
    return None


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_wrong_option_is_refused_with_sparks_error(spark, ss, checkpoints, case):
    theirs = condition_of(spark, checkpoints["spark"], REFUSED[case])
    assert theirs is not None and theirs.startswith(("STDS_", "CANNOT_LOAD")), theirs
    assert condition_of(ss, checkpoints["microbatch"], REFUSED[case]) == theirs


def test_a_checkpoint_without_a_committed_batch_is_refused_as_spark_refuses_it(spark, ss, tmp_path):
    (tmp_path / "commits").mkdir()
    with pytest.raises(PySparkException) as theirs:
        read(spark, tmp_path).collect()
    with pytest.raises(PySparkException) as ours:
        read(ss, tmp_path).collect()
    assert ours.value.getCondition() == theirs.value.getCondition() == "STDS_COMMITTED_BATCH_UNAVAILABLE"


def test_an_option_spark_does_not_know_is_ignored_as_spark_ignores_it(spark, ss, checkpoints):
    assert rows(read(ss, checkpoints["microbatch"], noSuchOption="1")) == \
        rows(read(spark, checkpoints["spark"], noSuchOption="1"))


def test_state_metadata_has_sparks_rows(spark, ss, checkpoints):
    theirs = spark.read.format("state-metadata").load(str(checkpoints["spark"]))
    ours = ss.read.format("state-metadata").load(str(checkpoints["microbatch"]))
    assert ours.schema == theirs.schema
    assert rows(ours) == rows(theirs) and rows(ours)


class Counts(StatefulProcessor):
    """transformWithStateInPandas without a time mode: a running count per key."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG")

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802, N803 - PySpark's StatefulProcessor
        import pandas as pd
        n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(f) for f in rows)
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self):
        pass


@pytest.fixture(scope="module")
def tws_checkpoints(spark, checkpoints):
    """The running count as a transformWithState, run by both engines (Spark's on its
    RocksDB store, as Spark runs it only there)."""
    from microbatch import StreamingSession
    ss = StreamingSession(spark)
    events = checkpoints["spark"].parent / "events"
    ckpts = {}
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    for name, session in (("spark", spark), ("microbatch", ss)):
        ckpts[name] = checkpoints["spark"].parent / f"tws-{name}"
        frame = json_stream(session, events, SCHEMA).groupBy("k").transformWithStateInPandas(
            Counts(), "k STRING, n LONG", "update", "None")
        with confs(spark, {"spark.sql.streaming.stateStore.providerClass": rocksdb if name == "spark" else None}):
            collect_batches(frame, ckpts[name], "update")
    return ckpts


TWS_REFUSED = {
    "no state variable": {},
    "a state variable it does not have": {"stateVarName": "nope"},
    "timers without a time mode": {"readRegisteredTimers": "true"},
}


@pytest.mark.parametrize("case", list(TWS_REFUSED))
def test_a_transform_with_states_options_are_checked_as_spark_checks_them(spark, ss, tws_checkpoints, case):
    theirs = condition_of(spark, tws_checkpoints["spark"], TWS_REFUSED[case])
    assert theirs is not None and theirs.startswith("STDS_"), theirs
    assert condition_of(ss, tws_checkpoints["microbatch"], TWS_REFUSED[case]) == theirs


def test_a_transform_with_states_state_and_metadata_read_as_sparks(spark, ss, tws_checkpoints):
    assert rows(read(ss, tws_checkpoints["microbatch"], stateVarName="count")) == \
        rows(read(spark, tws_checkpoints["spark"], stateVarName="count"))
    theirs = spark.read.format("state-metadata").load(str(tws_checkpoints["spark"]))
    ours = ss.read.format("state-metadata").load(str(tws_checkpoints["microbatch"]))
    assert ours.schema == theirs.schema
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in ours.collect()] == \
        [(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in theirs.collect()]


class Changes(StatefulProcessor):
    """Each operation on each kind of state variable, chosen by the row's ``v``: 1 updates a
    value twice, appends to a list, puts a map entry; 2 appends a list of two and updates
    two entries; 3 puts a list and removes an entry and one that is not there; 4 clears all,
    the value twice; 5 updates the value."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG")
        self.seen = handle.getListState("seen", "v INT")
        self.sums = handle.getMapState("sums", "v INT", "s LONG")

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802, N803 - PySpark's StatefulProcessor
        import pandas as pd
        vs = [int(v) for frame in rows for v in frame["v"]]
        for v in vs:
            if v == 1:
                self.count.update((1,))
                self.count.update((2,))
                self.seen.appendValue((1,))
                self.sums.updateValue((1,), (1,))
            elif v == 2:
                self.seen.appendList([(20,), (21,)])
                self.sums.updateValue((2,), (2,))
                self.sums.updateValue((1,), (11,))
            elif v == 3:
                self.seen.put([(30,), (31,)])
                self.sums.removeKey((1,))
                self.sums.removeKey((9,))
            elif v == 4:
                self.seen.clear()
                self.sums.clear()
                self.count.clear()
                self.count.clear()
            else:
                self.count.update((5,))
        yield pd.DataFrame({"k": [key[0]], "n": [len(vs)]})

    def close(self):
        pass


#: (k, v, seconds) per file: the operations of ``Changes``
CHANGE_FILES = [[("a", 1, 0), ("b", 1, 1)], [("a", 2, 4), ("b", 2, 20)], [("a", 3, 31)], [("a", 4, 50), ("b", 5, 51)]]


@pytest.fixture(scope="module")
def tws_change_checkpoints(spark, tmp_path_factory):
    """``Changes`` run by both engines, Spark's on its RocksDB store with changelog
    checkpointing (its change feed reads the changelog)."""
    from microbatch import StreamingSession
    ss = StreamingSession(spark)
    base = tmp_path_factory.mktemp("state-source-tws-changes")
    events = write_events(base, CHANGE_FILES)
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ckpts = {}
    for name, session in (("spark", spark), ("microbatch", ss)):
        ckpts[name] = base / name
        frame = json_stream(session, events, SCHEMA).groupBy("k").transformWithStateInPandas(
            Changes(), "k STRING, n LONG", "update", "None")
        with confs(spark, {"spark.sql.streaming.stateStore.providerClass": rocksdb if name == "spark" else None,
                           "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}):
            collect_batches(frame, ckpts[name], "update")
    return ckpts


@pytest.mark.parametrize("variable,flatten", [("count", True), ("seen", True), ("sums", True), ("seen", False)])
def test_a_transform_with_states_change_feed_is_sparks_batch_by_batch(spark, ss, tws_change_checkpoints,
                                                                     variable, flatten):
    """Spark's store logs each operation: every update and clear of a value (a clear of no
    value too), each appended element of a list (a put: the first element an update, the
    others appends), each map entry updated or removed (one never there too, and each entry a
    clear removes)."""
    options = dict(stateVarName=variable, readChangeFeed=True, changeStartBatchId=0,
                   flattenCollectionTypes=str(flatten).lower())
    theirs = read(spark, tws_change_checkpoints["spark"], **options)
    ours = read(ss, tws_change_checkpoints["microbatch"], **options)
    assert ours.schema == theirs.schema
    found = rows(ours)
    assert found == rows(theirs) and found
    assert {r[1] for r in found} >= ({"update", "delete"} if variable != "seen" else {"append", "update", "delete"})


class ExpiringChanges(StatefulProcessor):
    """State variables with a TTL (processing time): ``short``, ``seen`` and ``sums`` expire
    by the next batch (1 ms), ``long`` lives an hour. ``v`` 1 sets each, 2 appends two
    elements and puts an entry (a list and map then partly expired), 3 sets the value."""

    def init(self, handle):
        self.short = handle.getValueState("short", "n LONG", 1)
        self.long = handle.getValueState("long", "n LONG", 3_600_000)
        self.seen = handle.getListState("seen", "v INT", 1)
        self.sums = handle.getMapState("sums", "v INT", "s LONG", 1)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802, N803 - PySpark's StatefulProcessor
        import pandas as pd
        vs = [int(v) for frame in rows for v in frame["v"]]
        for v in vs:
            if v == 1:
                self.short.update((1,))
                self.long.update((1,))
                self.seen.appendValue((1,))
                self.seen.appendValue((2,))
                self.sums.updateValue((1,), (1,))
                self.sums.updateValue((2,), (2,))
            elif v == 2:
                self.seen.appendList([(3,), (4,)])
                self.sums.updateValue((3,), (3,))
                self.long.update((2,))
            else:
                self.short.update((5,))
        yield pd.DataFrame({"k": [key[0]], "n": [len(vs)]})

    def close(self):
        pass


EXPIRING_FILES = [[("a", 1, 0), ("b", 1, 1)], [("a", 2, 4)], [("b", 3, 31)], [("a", 3, 50)]]


@pytest.fixture(scope="module")
def ttl_change_checkpoints(spark, tmp_path_factory):
    """``ExpiringChanges`` run by both engines for 7 batches, a file each then batches
    without data (a processing-time transformWithState runs one at every trigger)."""
    from microbatch import StreamingSession
    ss = StreamingSession(spark)
    base = tmp_path_factory.mktemp("state-source-ttl-changes")
    events = write_events(base, EXPIRING_FILES)
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ckpts = {}
    for name, session in (("spark", spark), ("microbatch", ss)):
        ckpts[name] = base / name
        frame = session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(events)) \
            .groupBy("k").transformWithStateInPandas(ExpiringChanges(), "k STRING, n LONG", "update", "ProcessingTime")
        with confs(spark, {"spark.sql.streaming.stateStore.providerClass": rocksdb if name == "spark" else None,
                           "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}):
            query = frame.writeStream.outputMode("update").foreachBatch(lambda df, i: df.collect()) \
                .option("checkpointLocation", str(ckpts[name])).trigger(availableNow=True).start()
            wait_for(lambda q=query: len(q.recentProgress) >= 7 or q.exception() is not None, 240, "7 batches",
                     every=0.1)
            query.stop()
            assert query.exception() is None
    return ckpts


def _expiry_after_batch(ckpt, row) -> str:
    """A change feed's row as text, each ``ttlExpirationMs`` made the time after its batch's
    timestamp (the two engines' batches ran at other times)."""
    line = (ckpt / "offsets" / str(row["batch_id"])).read_text().split("\n")[1]
    stamp = json.loads(line)["batchTimestampMs"]

    def relative(value):
        if isinstance(value, dict):
            return {k: v - stamp if k == "ttlExpirationMs" and v is not None else relative(v) for k, v in value.items()}
        return value
    return repr(relative(row.asDict(recursive=True)))


@pytest.mark.parametrize("variable", ["short", "long", "seen", "sums"])
def test_a_transform_with_states_change_feed_of_ttl_variables_is_sparks(spark, ss, ttl_change_checkpoints, variable):
    """Values with a TTL, as Spark's store logs them: each with its expiry (the batch's
    timestamp and the TTL), and the TTL's evictions at the end of a batch: a value's delete,
    a list's delete and its live elements put back, a delete per expired map entry."""
    options = dict(stateVarName=variable, readChangeFeed=True, changeStartBatchId=0, changeEndBatchId=5)
    theirs = read(spark, ttl_change_checkpoints["spark"], **options)
    ours = read(ss, ttl_change_checkpoints["microbatch"], **options)
    assert ours.schema == theirs.schema
    found = sorted(_expiry_after_batch(ttl_change_checkpoints["microbatch"], r) for r in ours.collect())
    assert found == sorted(_expiry_after_batch(ttl_change_checkpoints["spark"], r) for r in theirs.collect())
    assert any("'delete'" in r for r in found) == (variable != "long"), found   # (the evictions)


def test_a_transform_with_states_change_feed_refusals(spark, ss, tws_change_checkpoints, tmp_path):
    """A map's change feed unflattened fails in Spark 4.3's reader (it looks for the column
    it did not make), and so in microbatch's, with its condition. The changes of timers
    (Spark's reader fails on them) are refused by name, and so are a TTL variable's in a
    checkpoint an earlier microbatch started (its tasks did not log the evictions)."""
    import shutil

    from microbatch.errors import UnsupportedOperationError
    unflattened = dict(stateVarName="sums", readChangeFeed=True, changeStartBatchId=0, flattenCollectionTypes="false")
    theirs = condition_of(spark, tws_change_checkpoints["spark"], unflattened)
    assert theirs == "STDS_INTERNAL_ERROR"
    assert condition_of(ss, tws_change_checkpoints["microbatch"], unflattened) == theirs
    with_ttl = tmp_path / "ttl"
    shutil.copytree(tws_change_checkpoints["microbatch"], with_ttl)
    schema = with_ttl / "state" / "0" / "_metadata" / "schema"
    doc = json.loads(schema.read_text())
    doc["stateVariables"] = [{**v, "ttl": True} if v["name"] == "count" else v for v in doc["stateVariables"]]
    del doc["ttlEvictionsLogged"]   # (a checkpoint an earlier microbatch started)
    schema.write_text(json.dumps(doc))
    with pytest.raises(UnsupportedOperationError, match="'readChangeFeed'.*TTL.*did not log"):
        read(ss, with_ttl, stateVarName="count", readChangeFeed=True, changeStartBatchId=0)
