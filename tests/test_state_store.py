"""The versioned state store: commit, abort, recovery from files, step back, snapshots, clean-up."""
from __future__ import annotations

import itertools
import os
import sys

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from microbatch.errors import CheckpointError
from microbatch.state.map_provider import MapStateStoreProvider
from microbatch.state.rocksdb import RocksDBStateStoreProvider
from microbatch.state.store import StateStoreConf, StateStoreId, load_provider, unload_all

KEY = pa.schema([pa.field("word", pa.string())])
VALUE = pa.schema([pa.field("count", pa.int64())])


#: Both of microbatch's providers keep the contract; the tests marked ``kind`` run on each.
PROVIDERS = [MapStateStoreProvider, RocksDBStateStoreProvider]
each_provider = pytest.mark.parametrize("kind", PROVIDERS, ids=["map", "rocksdb"])


def provider(tmp_path, conf=StateStoreConf(), partition=0, kind=MapStateStoreProvider):
    return kind(StateStoreId(str(tmp_path / "state"), 0, partition), KEY, VALUE, conf)


def settle(p) -> None:
    """Wait for a provider's background maintenance (the RocksDB provider snapshots in a thread)."""
    getattr(p, "_wait_for_maintenance", lambda: None)()


def commit_counts(p: MapStateStoreProvider, version: int, words: list[str]) -> int:
    store = p.get_store(version)
    for w in words:
        current = store.get((w,))
        store.put((w,), ((current[0] if current else 0) + 1,))
    return store.commit()


def contents(p: MapStateStoreProvider, version: int) -> dict:
    store = p.get_store(version)
    found = dict(store.iterator())
    store.abort()      # a read-only use ends too (RocksDB: another provider may then open the database)
    return found


@each_provider
def test_commit_get_remove_iterate_and_files_are_arrow(tmp_path, kind):
    p = provider(tmp_path, kind=kind)
    store = p.get_store(0)
    assert store.get(("a",)) is None and list(store.iterator()) == []
    store.put(("a",), (1,))
    store.put(("b",), (2,))
    store.remove(("b",))
    store.put(("c",), (3,))
    assert store.get(("a",)) == (1,) and store.get(("b",)) is None
    assert dict(store.iterator()) == {("a",): (1,), ("c",): (3,)}
    assert store.commit() == 1 and store.has_committed
    m = store.metrics()
    assert (m.num_keys, m.num_updated, m.num_removed) == (2, 2, 1) and m.memory_used_bytes > 0
    with pytest.raises(RuntimeError, match="already committed"):
        store.put(("x",), (0,))
    path = tmp_path / "state" / "0" / "0" / "1.delta.arrow"
    with pa.OSFile(str(path), "rb") as f:
        table = ipc.open_stream(f).read_all()
    assert table.schema.names == ["key", "value"]
    assert table.column("key").to_pylist() == [{"word": "a"}, {"word": "b"}, {"word": "c"}]
    assert table.column("value").to_pylist() == [{"count": 1}, None, {"count": 3}]


@each_provider
def test_abort_forgets_changes(tmp_path, kind):
    p = provider(tmp_path, kind=kind)
    commit_counts(p, 0, ["a"])
    store = p.get_store(1)
    store.put(("a",), (100,))
    store.abort()
    assert contents(p, 1) == {("a",): (1,)}
    assert not os.path.exists(tmp_path / "state" / "0" / "0" / "2.delta.arrow")


@each_provider
def test_recovery_from_files_and_stepping_back_for_a_rerun(tmp_path, kind):
    p = provider(tmp_path, kind=kind)
    v = 0
    for words in (["a", "b"], ["a"], ["c", "a"]):
        v = commit_counts(p, v, words)
    assert contents(p, 3) == {("a",): (3,), ("b",): (1,), ("c",): (1,)}
    # A re-run of batch 2 asks for version 2 again: the provider steps back in memory.
    assert contents(p, 2) == {("a",): (2,), ("b",): (1,)}
    assert commit_counts(p, 2, ["c", "a"]) == 3
    # A new process (or another worker) reads every version from the files.
    fresh = provider(tmp_path, kind=kind)
    assert contents(fresh, 1) == {("a",): (1,), ("b",): (1,)}
    assert contents(fresh, 3) == {("a",): (3,), ("b",): (1,), ("c",): (1,)}
    # A stale cache at version 1 catches up by replaying only the newer deltas.
    stale = provider(tmp_path, kind=kind)
    contents(stale, 1)
    assert contents(stale, 3) == contents(fresh, 3)


def test_a_commit_costs_the_keys_it_touches(tmp_path):
    p = provider(tmp_path)
    store = p.get_store(0)
    for i in range(20_000):
        store.put((f"k{i}",), (i,))
    store.commit()
    store = p.get_store(1)
    store.put(("k7",), (-1,))
    store.remove(("k8",))
    store.commit()
    with pa.OSFile(str(tmp_path / "state" / "0" / "0" / "2.delta.arrow"), "rb") as f:
        assert ipc.open_stream(f).read_all().num_rows == 2
    assert len(p._undo[2]) == 2, "the undo record holds only the touched keys"
    assert len(p.map) == 19_999


@each_provider
def test_snapshots_and_cleanup_keep_every_retained_version_loadable(tmp_path, kind):
    conf = StateStoreConf(min_deltas_for_snapshot=2, min_versions_to_retain=4)
    p = provider(tmp_path, conf, kind=kind)
    v = 0
    expected = {}
    for batch in range(12):
        words = [f"w{batch % 5}", "all"]
        v = commit_counts(p, v, words)
        expected[v] = contents(p, v)
    settle(p)
    names = sorted(os.listdir(tmp_path / "state" / "0" / "0"), key=lambda n: (int(n.split(".")[0]), n))
    if kind is MapStateStoreProvider:    # (RocksDB's snapshots also wait for as many delta rows as keys)
        assert "9.snapshot.arrow" in names and "3.snapshot.arrow" not in names, names
        # Version 8 (the oldest retained) loads from snapshot 6 plus deltas 7 and 8: older files go.
        assert names[0] == "6.snapshot.arrow" and "6.delta.arrow" not in names, names
    else:
        assert names[0].endswith(".snapshot.arrow") and not names[0].startswith("1."), names
    for version in range(12 - 4, 13):
        unload_all()
        assert contents(provider(tmp_path, conf, kind=kind), version) == expected[version], version


@each_provider
def test_missing_and_damaged_files_are_clear_errors(tmp_path, kind):
    p = provider(tmp_path, kind=kind)
    v = 0
    for words in (["a"], ["b"], ["c"]):
        v = commit_counts(p, v, words)
    p.close()     # as a new executor: nothing local (RocksDB's database on this executor goes)
    other = kind(StateStoreId(str(tmp_path / "state"), 0, 0), KEY,
                                  pa.schema([pa.field("count", pa.string())]), StateStoreConf())
    with pytest.raises(CheckpointError, match="operator's state has"):
        other.get_store(3).get(("a",))   # a store loads at its first call
    directory = tmp_path / "state" / "0" / "0"
    os.remove(directory / "2.delta.arrow")
    reader = provider(tmp_path, kind=kind)
    with pytest.raises(CheckpointError, match=r"2\.delta\.arrow.*does not exist.*version 3 needs it"):
        reader.get_store(3).get(("a",))
    reader.close()
    (directory / "1.delta.arrow").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"Error reading state file .*1\.delta\.arrow"):
        provider(tmp_path, kind=kind).get_store(1).get(("a",))


# -- inside Spark tasks -------------------------------------------------------------
def count_words_in_state(state_root: str, version: int, conf: StateStoreConf):
    """A mapInArrow function: each task counts its partition's words into its store."""
    def run(batches):
        from pyspark import TaskContext

        store = load_provider(StateStoreId(state_root, 0, TaskContext.get().partitionId()),
                             KEY, VALUE, conf).get_store(version)
        for batch in batches:
            for word in batch.column(0).to_pylist():
                current = store.get((word,))
                store.put((word,), ((current[0] if current else 0) + 1,))
        store.commit()
        yield pa.RecordBatch.from_pylist([{"keys": store.metrics().num_keys}])
    return run


@each_provider
def test_stores_live_in_spark_tasks_and_reruns_do_not_double_count(spark, tmp_path, kind):
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    state_root = str(tmp_path / "state")
    batches = [["a", "b", "a"], ["b", "c"], ["a", "d", "d"]]

    def run_batch(version, words):
        df = spark.createDataFrame([(w,) for w in words], "word STRING").repartition(2, "word")
        conf = StateStoreConf(provider_class=f"{kind.__module__}.{kind.__name__}", run_id=str(tmp_path))
        return df.mapInArrow(count_words_in_state(state_root, version, conf), "keys LONG").collect()

    for version, words in enumerate(batches):
        run_batch(version, words)
    run_batch(2, batches[2])  # batch 2 again, as after a failure before commits/2
    unload_all()
    merged = {}
    for partition in (0, 1):
        merged.update(contents(kind(StateStoreId(state_root, 0, partition), KEY, VALUE, StateStoreConf()), 3))
    assert merged == {("a",): (3,), ("b",): (2,), ("c",): (1,), ("d",): (2,)}
    assert sorted(os.listdir(state_root + "/0")) == ["0", "1"]


@each_provider
def test_put_absent_marks_new_keys_once_and_sees_removed_keys_as_absent(tmp_path, kind):
    provider = kind(StateStoreId(str(tmp_path), 0, 0), pa.schema([("k", pa.int64())]),
                                     pa.schema([]), StateStoreConf())
    store = provider.get_store(0)
    assert list(store.put_absent([(1,), (2,), (1,)])) == [True, True, False]
    store.commit()
    store = provider.get_store(1)
    store.remove((2,))
    assert list(store.put_absent([(1,), (2,), (3,), (2,)], [(), (), (), ()])) == [False, True, True, False]
    store.commit()
    assert sorted(k for k, _ in provider.get_store(2).iterator()) == [(1,), (2,), (3,)]


@each_provider
def test_bulk_operations_agree_with_the_contracts_key_by_key_versions(tmp_path, kind):
    """The stores' own put_absent / keys_at_or_below / remove_many give what the
    contract's plain loops give, with nulls, removed keys and keys changed in the
    open version, and what they commit reads back from the files."""
    from microbatch.state.store import StateStore
    key_schema = pa.schema([("id", pa.string()), ("t", pa.int64())])
    value_schema = pa.schema([("expires", pa.int64())])
    provider = kind(StateStoreId(str(tmp_path), 0, 0), key_schema, value_schema,
                                     StateStoreConf())
    store = provider.get_store(0)
    first = [("a", 1), ("b", 5), ("c", None), ("a", 1), ("d", 9)]
    assert list(store.put_absent(first, [(10,), (50,), (None,), (11,), (90,)])) == \
        [True, True, True, False, True]
    store.commit()
    store = provider.get_store(1)
    store.put(("b", 5), (5,))            # changed in the open version: its new value decides
    store.remove(("d", 9))
    batch = [("d", 9), ("e", 2), ("a", 1), ("e", 2)]
    values = [(1,), (20,), (0,), (21,)]
    # d was removed in this version (absent again), e is new once, a is held
    assert list(store.put_absent(batch, values)) == [True, True, False, False]
    for kwargs in ({"key_field": 1}, {"value_field": 0}):
        assert sorted(store.keys_at_or_below(5, **kwargs)) == \
            sorted(StateStore.keys_at_or_below(store, 5, **kwargs)), kwargs
    assert sorted(store.keys_at_or_below(5, value_field=0)) == [("b", 5), ("d", 9)]
    assert sorted(store.keys_at_or_below(5, key_field=1)) == [("a", 1), ("b", 5), ("e", 2)]
    store.remove_many([("a", 1), ("zz", 0), ("e", 2)])
    store.commit()
    expected = {("b", 5): (5,), ("c", None): (None,), ("d", 9): (1,)}
    assert contents(provider, 2) == expected
    unload_all()
    reloaded = kind(StateStoreId(str(tmp_path), 0, 0), key_schema, value_schema, StateStoreConf())
    assert contents(reloaded, 2) == expected
    assert contents(reloaded, 1) == \
        {("a", 1): (10,), ("b", 5): (50,), ("c", None): (None,), ("d", 9): (90,)}

@each_provider
def test_get_many_put_many_and_keys_agree_with_get_put_and_iterator(tmp_path, kind):
    """The aggregation's batch-at-a-time calls: get_many/put_many give what get/put give,
    with keys changed and removed in the open version, and keys() is the iterator's keys
    in the iterator's order."""
    from microbatch.state.store import StateStore
    p = provider(tmp_path, kind=kind)
    store = p.get_store(0)
    store.put_many([("a",), ("b",), ("c",)], [(1,), (2,), (3,)])
    assert store.get_many([("a",), ("z",), ("c",)]) == [(1,), None, (3,)]
    store.commit()
    store = p.get_store(1)
    assert store.get_many([("c",), ("b",), ("q",)]) == [(3,), (2,), None]   # nothing changed yet
    store.put(("b",), (20,))
    store.remove(("c",))
    store.put_many([("d",), ("a",)], [(4,), (10,)])
    wanted = [("a",), ("b",), ("c",), ("d",), ("e",)]
    assert store.get_many(wanted) == [store.get(k) for k in wanted] == [(10,), (20,), None, (4,), None]
    assert store.keys() == [k for k, _ in store.iterator()] == StateStore.keys(store)
    assert sorted(store.keys()) == [("a",), ("b",), ("d",)]
    store.commit()
    settle(p)
    assert contents(p, 2) == {("a",): (10,), ("b",): (20,), ("d",): (4,)}


def bulk_commit(provider, version, ids, times, expiries, remove_below=None):
    """One version changed a batch at a time: insert rows, then remove keys whose
    time is at or below ``remove_below``; the store's answers and metrics."""
    store = provider.get_store(version)
    keys = pa.table({"id": pa.array(ids, pa.string()), "t": pa.array(times, pa.int64())})
    new = store.insert_new(keys, pa.table({"expires": pa.array(expiries, pa.int64())}))
    removed = store.remove_at_or_below(remove_below, key_field=1) if remove_below is not None else 0
    store.commit()
    return list(new), removed, store.metrics()


def test_bulk_changes_keep_arrow_tables_with_the_same_files_as_the_map(tmp_path):
    """Joinable keys changed a batch at a time live as Arrow tables: the same files as
    the map (each form reads the other's), a reload from snapshot + deltas gives the
    same keys, null keys included, a provider behind reads only the newer deltas, and
    a re-run of a version starts from the kept table."""
    key_schema = pa.schema([("id", pa.string()), ("t", pa.int64())])
    value_schema = pa.schema([("expires", pa.int64())])
    conf = StateStoreConf(min_deltas_for_snapshot=2)
    store_id = StateStoreId(str(tmp_path), 0, 0)
    provider = MapStateStoreProvider(store_id, key_schema, value_schema, conf)
    expected: dict = {}
    for version in range(6):
        ids = [f"k{version}", f"k{version - 1}", None if version % 2 else "x", f"k{version}"]
        times = [version, version - 1, version, version]
        expiries = [version * 10, None, version, 99]
        new, removed, metrics = bulk_commit(provider, version, ids, times, expiries, remove_below=version - 3)
        assert not new[3]    # the same key twice in a batch: new once
        assert provider.tables.tables and not provider.map     # the table form holds it
        for key, value, is_new in zip(zip(ids, times), expiries, new):
            if is_new:
                expected[key] = (value,)
        gone = [k for k in expected if k[1] <= version - 3]
        for key in gone:
            del expected[key]
        assert removed == len(gone) and metrics.num_keys == len(expected)
    assert any(name.endswith(".snapshot.arrow") for name in os.listdir(store_id.path))
    # a re-run of batch 5 starts from version 5 as it was, from memory
    hit, changes = provider.load_table(5)
    assert hit and changes.num_keys() == \
        len(dict(MapStateStoreProvider(store_id, key_schema, value_schema, conf).get_store(5).iterator()))

    def read(p, version):
        return dict(p.get_store(version).iterator())
    assert read(provider, 6) == expected and (None, 5) in expected
    assert read(MapStateStoreProvider(store_id, key_schema, value_schema, conf), 6) == expected
    # a provider that last saw version 3 in tables reads only the deltas after it
    behind = MapStateStoreProvider(store_id, key_schema, value_schema, conf)
    behind.load_table(3)
    os.rename(os.path.join(store_id.path, "6.snapshot.arrow"), os.path.join(str(tmp_path), "aside"))
    hit, changes = behind.load_table(6)
    assert not hit and changes.num_keys() == len(expected)
    os.rename(os.path.join(str(tmp_path), "aside"), os.path.join(store_id.path, "6.snapshot.arrow"))
    # the map form's files read back in the table form too
    other = StateStoreId(str(tmp_path / "map"), 0, 0)
    map_store = MapStateStoreProvider(other, key_schema, value_schema, conf).get_store(0)
    map_store.put(("a", 1), (7,))
    map_store.put((None, 2), (None,))
    map_store.commit()
    again = MapStateStoreProvider(other, key_schema, value_schema, conf)
    assert list(bulk_commit(again, 1, ["a", None, "b"], [1, 2, 3], [0, 0, 0])[0]) == [False, False, True]
    assert not again.map


def test_keys_arrow_cannot_join_take_the_bulk_calls_on_the_map(tmp_path):
    """Keys holding a list: insert_new and remove_at_or_below work through the map (the
    contract's default versions over the one key encoding)."""
    key_schema = pa.schema([("s", pa.struct([("a", pa.list_(pa.int64()))])), ("t", pa.int64())])
    provider = MapStateStoreProvider(StateStoreId(str(tmp_path), 0, 0), key_schema, pa.schema([]),
                                     StateStoreConf())
    assert not provider.tables_fit
    store = provider.get_store(0)
    assert not store.in_tables()
    keys = pa.table({"s": pa.array([{"a": [1]}, {"a": [2]}, {"a": [1]}], key_schema.field("s").type),
                     "t": pa.array([1, 5, 1], pa.int64())})
    assert list(store.insert_new(keys)) == [True, True, False]
    assert store.num_keys() == 2 and store.remove_at_or_below(3, key_field=1) == 1
    store.commit()
    assert dict(provider.get_store(1).iterator()) == {(((2,),), 5): ()}
    with pytest.raises(RuntimeError, match="cannot also be changed"):
        store = MapStateStoreProvider(StateStoreId(str(tmp_path / "t"), 0, 0), pa.schema([("k", pa.int64())]),
                                      pa.schema([]), StateStoreConf()).get_store(0)
        store.insert_new(pa.table({"k": pa.array([1], pa.int64())}))
        store.put((2,), ())


def test_window_keys_take_the_row_table_calls_and_their_files_read_back_in_both_forms(tmp_path):
    """A window (a struct of two int64) and a string as the key: the aggregation's calls
    on row tables (matching, put, take at or below a window's end, all rows) give what
    the map form holds after the same changes, version by version, and the files each
    version writes read back the same in either form."""
    window = pa.struct([("start", pa.int64()), ("end", pa.int64())])
    key_schema = pa.schema([("window", window), ("k", pa.string())])
    value_schema = pa.schema([("count", pa.int64())])
    store_id = StateStoreId(str(tmp_path / "state"), 0, 0)
    provider = MapStateStoreProvider(store_id, key_schema, value_schema, StateStoreConf())
    assert provider.tables_fit

    def rows(windows, ks, counts):
        return pa.table({"k0": pa.array([{"start": w, "end": w + 10} for w in windows], window),
                         "k1": pa.array(ks, pa.string()), "v0": pa.array(counts, pa.int64())})

    def as_dict(table):
        return {((w["start"], w["end"]), k): c for w, k, c in
                zip(table.column("k0").to_pylist(), table.column("k1").to_pylist(), table.column("v0").to_pylist())}

    expected: dict = {}
    changes = [  # (rows put this version, eviction bound on the window's end)
        (rows([0, 0, 10, 20], ["a", "b", "a", None], [1, 2, 3, 4]), None),
        (rows([0, 10, 30], ["a", "a", "a"], [5, 6, 7]), 10),        # window 0 goes, a put one too
        (rows([20, 40], [None, "b"], [8, 9]), 30),
    ]
    for version, (put, bound) in enumerate(changes):
        store = provider.get_store(version)
        assert store.in_tables()
        held = store.matching_rows(put.select(["k0", "k1"]))
        assert as_dict(held) == {k: v for k, v in expected.items() if k in as_dict(put)}
        store.put_rows(put)
        expected.update(as_dict(put))
        if bound is not None:
            taken = store.take_rows_at_or_below(bound, key_field=0, struct_field=1)
            due = {k: v for k, v in expected.items() if k[0][1] <= bound}
            assert as_dict(taken) == due
            expected = {k: v for k, v in expected.items() if k not in due}
        assert as_dict(store.rows()) == expected and store.num_keys() == len(expected)
        store.commit()
        for form in ("map", "table"):   # a new worker reads the files in either form
            reader = MapStateStoreProvider(store_id, key_schema, value_schema, StateStoreConf()).get_store(version + 1)
            if form == "map":
                assert {k: v[0] for k, v in reader.iterator()} == expected
            else:
                assert as_dict(reader.rows()) == expected
    # a re-run of version 2 starts from the table in memory, not from version 3's
    store = provider.get_store(2)
    assert as_dict(store.rows()) == {k: v for k, v in as_dict(changes[0][0]).items() if k[0][1] > 10} | \
        {k: v for k, v in as_dict(changes[1][0]).items() if k[0][1] > 10}


def test_window_keys_deduplicate_in_tables(tmp_path):
    """insert_new and remove_at_or_below with a struct among the keys take the table
    form: the first row of each new key, a null window equal to a null window."""
    window = pa.struct([("start", pa.int64()), ("end", pa.int64())])
    key_schema = pa.schema([("window", window), ("t", pa.int64())])
    provider = MapStateStoreProvider(StateStoreId(str(tmp_path), 0, 0), key_schema, pa.schema([]),
                                     StateStoreConf())
    store = provider.get_store(0)
    keys = pa.table({"w": pa.array([{"start": 0, "end": 10}, None, {"start": 0, "end": 10}, None,
                                    {"start": 0, "end": 20}], window),
                     "t": pa.array([1, 1, 1, 1, 5], pa.int64())})
    assert list(store.insert_new(keys)) == [True, True, False, False, True]
    assert store._form == "table"
    assert store.remove_at_or_below(3, key_field=1) == 2
    store.commit()
    assert dict(provider.get_store(1).iterator()) == {((0, 20), 5): ()}


@each_provider
def test_a_new_run_does_not_trust_the_state_an_earlier_run_left_in_memory(tmp_path, kind):
    """Executors cache providers per query run (Spark keys them by run id). A checkpoint
    deleted and made again at the same path: another worker commits the new run's
    version 1, and this worker, which still holds the old run's version 1 (in either
    form), must read the new one from the files."""
    import shutil
    key_schema, value_schema = pa.schema([("id", pa.int64())]), pa.schema([])
    store_id = StateStoreId(str(tmp_path / "state"), 0, 0)

    def commit_bulk(provider, version, ids):
        store = provider.get_store(version)
        store.insert_new(pa.table({"id": pa.array(ids, pa.int64())}))
        store.commit()

    def commit_rows(provider, version, ids):
        store = provider.get_store(version)
        store.put_absent([(i,) for i in ids])
        store.commit()

    def read(p, v):
        return sorted(k[0] for k in contents(p, v))

    for commit in (commit_bulk, commit_rows):
        path = f"{kind.__module__}.{kind.__name__}"
        first = StateStoreConf(run_id="first", provider_class=path)
        second = StateStoreConf(run_id="second", provider_class=path)
        commit(load_provider(store_id, key_schema, value_schema, first), 0, [1, 2])   # this worker, run 1
        assert read(load_provider(store_id, key_schema, value_schema, first), 1) == [1, 2]
        shutil.rmtree(tmp_path / "state")                 # the checkpoint is deleted and made again
        commit(kind(store_id, key_schema, value_schema, second), 0, [5])   # another worker
        assert read(load_provider(store_id, key_schema, value_schema, second), 1) == [5], commit
        shutil.rmtree(tmp_path / "state")
        unload_all()


@each_provider
def test_a_partition_moving_between_executors_gets_the_same_answers(tmp_path, kind):
    """A partition's task runs on executor A for batch 0, on B for 1, on A again for 2
    (whose memory still holds version 1), is retried on B (committing version 3 a second
    time), then runs on A for 3, and on B again for 4. Each executor is a provider of its
    own, as in another process. In both memory forms the stores answer as one provider
    that saw every batch, and the files read back to the same state; the map provider's
    snapshots are at the versions one provider would choose (a checkpoint's shape does
    not depend on where its tasks ran)."""
    key_schema, value_schema = pa.schema([("id", pa.int64())]), pa.schema([("n", pa.int64())])
    batches = [[1, 2, 2], [2, 3], [3, 4, 1], [5, 1], [6, 2]]
    # (executor, batch) in the order the tasks run; in the first, batch 2 runs twice (a
    # retried task); in the second, A catches up past the snapshot B wrote at version 3
    schedules = [[("A", 0), ("B", 1), ("A", 2), ("B", 2), ("A", 3), ("B", 4)],
                 [("A", 0), ("B", 1), ("B", 2), ("A", 3), ("B", 4)]]

    def run_rows(provider, version, ids):
        """Count per id, key by key; the emitted counts."""
        store = provider.get_store(version)
        out = []
        for i in ids:
            current = store.get((i,))
            store.put((i,), ((current[0] if current else 0) + 1,))
            out.append(store.get((i,))[0])
        store.commit()
        return out

    def run_bulk(provider, version, ids):
        """Keep the first row of each id never seen; drop ids <= version - 2."""
        store = provider.get_store(version)
        new = store.insert_new(pa.table({"id": pa.array(ids, pa.int64())}),
                               pa.table({"n": pa.array([version] * len(ids), pa.int64())}))
        store.remove_at_or_below(version - 2, key_field=0)
        store.commit()
        return [i for i, keep in zip(ids, new) if keep]

    for run, (n, schedule) in itertools.product((run_rows, run_bulk), enumerate(schedules)):
        conf = StateStoreConf(run_id="run", min_deltas_for_snapshot=2)
        reference = MapStateStoreProvider(StateStoreId(str(tmp_path / run.__name__ / f"ref{n}"), 0, 0),
                                          key_schema, value_schema, conf)
        store_id = StateStoreId(str(tmp_path / run.__name__ / f"moving{n}"), 0, 0)
        executors = {name: kind(store_id, key_schema, value_schema, conf) for name in "AB"}
        expected = {}
        for executor, batch in schedule:
            answer = run(executors[executor], batch, batches[batch])
            if batch not in expected:
                expected[batch] = run(reference, batch, batches[batch])
            assert answer == expected[batch], (run.__name__, executor, batch)
        settle(executors["A"]), settle(executors["B"])
        if kind is MapStateStoreProvider:
            # snapshots land where one provider would put them: the newest version is a
            # delta on top of an older snapshot, whoever committed which version
            assert sorted(os.listdir(store_id.path)) == sorted(os.listdir(reference.id.path)), run.__name__
        final = contents(reference, 5)
        for provider in (*executors.values(), kind(store_id, key_schema, value_schema, conf)):
            assert contents(provider, 5) == final, run.__name__


def test_end_task_freezes_what_a_task_leaves_and_collects_the_whole_heap_every_so_often(monkeypatch):
    """After a state task the worker's heap is frozen, so PySpark's collection after the
    task walks only what came later; a cycle that becomes garbage while frozen is still
    reclaimed by the next whole collection (every FULL_COLLECTION_EVERY tasks)."""
    import gc
    import weakref
    from pyspark import TaskContext
    from microbatch.state import worker_heap

    class Metrics:
        added: list = []

        def add(self, value):
            self.added.append(value)

    class Node:
        pass

    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: object()))   # as inside a Spark task
    metrics = Metrics()
    try:
        worker_heap._unfreeze_worker_heap()
        cycle = Node()
        cycle.itself = cycle
        alive = weakref.ref(cycle)
        worker_heap.end_task(metrics, {"numRowsUpdated": 1})
        assert gc.get_freeze_count() > 0 and metrics.added == [{"numRowsUpdated": 1}]
        del cycle
        gc.collect()
        assert alive() is not None          # frozen: the collection after the task skips it
        for _ in range(worker_heap.FULL_COLLECTION_EVERY):
            worker_heap.end_task(metrics, {})
        assert alive() is None              # the whole collection found it
    finally:
        gc.unfreeze()


def test_a_state_task_in_a_python_worker_leaves_its_heap_frozen(spark):
    import gc
    from microbatch.operators.base import DictSum
    from microbatch.state.worker_heap import end_task
    accumulator = spark.sparkContext.accumulator({}, DictSum())

    def task(batches):
        for _ in batches:
            pass
        end_task(accumulator, {"tasks": 1})
        yield pa.RecordBatch.from_pydict({"frozen": [gc.get_freeze_count()]})

    frozen = [row.frozen for row in spark.range(0, 2, 1, 2).mapInArrow(task, "frozen LONG").collect()]
    assert len(frozen) == 2 and all(count > 10_000 for count in frozen), frozen   # pyarrow, pandas, pyspark
    assert accumulator.value == {"tasks": 2}


def test_a_state_file_holds_values_read_back_beside_values_a_task_built():
    """A session window's value is a list of sessions (structs). Read back from a state
    file they are dicts; a task builds them as tuples; a snapshot writes both into one
    file (pyarrow refuses a column mixing them: found by Nexmark's q11 after ten batches,
    when a partition's provider reloaded in another Python worker)."""
    from microbatch.state.files import from_struct_array, to_struct_array
    session = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("n", pa.int64())])
    schema = pa.schema([pa.field("sessions", pa.list_(session))])
    written = to_struct_array([([(1, 5, 2)],)], schema)
    read_back = from_struct_array(written)
    assert isinstance(read_back[0][0][0], dict)
    mixed = to_struct_array(read_back + [([(7, 9, 1), (10, 12, 3)],), None], schema)
    assert mixed.to_pylist() == [{"sessions": [{"start": 1, "end": 5, "n": 2}]},
                                 {"sessions": [{"start": 7, "end": 9, "n": 1}, {"start": 10, "end": 12, "n": 3}]},
                                 None]


def test_struct_keys_zipped_from_their_fields_equal_the_value_by_value_conversion():
    """``state_values`` of a struct key whose fields are flat (a window) zips the fields;
    the tuples equal ``hashable`` of each value, for a sliced array, null fields, strings
    and a null struct (which takes the value-by-value path)."""
    from microbatch.state.files import hashable, state_values
    window = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("tag", pa.string())])
    values = [{"start": i, "end": i + 10 if i % 3 else None, "tag": f"t{i}" if i % 2 else None} for i in range(9)]
    array = pa.array(values, window).slice(2, 6)
    assert state_values(array, window, as_key=True) == [hashable(v) for v in values[2:8]]
    assert all(type(k) is tuple for k in state_values(array, window, as_key=True))
    with_null = pa.array(values[:3] + [None], window)
    assert state_values(with_null, window, as_key=True) == [hashable(v) for v in values[:3]] + [None]
