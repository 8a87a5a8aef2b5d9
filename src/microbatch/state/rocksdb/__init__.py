"""State beyond memory: a provider whose working copy of a store is a RocksDB database on
the executor's local disk (through ``rocksdict``), as Spark's RocksDBStateStoreProvider.

Chosen by ``spark.sql.streaming.stateStore.providerClass`` set to this class or to
Spark's ``...state.RocksDBStateStoreProvider`` (a ported job keeps its conf).

The checkpoint holds what every provider writes (``state.files``), so the state reader,
the toolkit, repartition and a change of provider between runs read it alike:

- A commit writes the version's delta file first (the changelog: Spark's changelog
  checkpointing), then applies the same changes to the local database in one write
  batch. A delta costs the keys the batch touched, however large the state.
- Every ``minDeltasForSnapshot`` versions a background thread of the Python worker
  writes an Arrow snapshot from a RocksDB checkpoint of the committed version (hard
  links to its files, so the database may close and change meanwhile), chunk by chunk,
  then deletes the files no retained version needs. A batch does not wait for it (unless the previous
  snapshot is still being written when the next one is due).
- Loading a version: the one the database holds (a hit); an earlier one within
  ``maxBatchesToRetainInMemory`` by undo records (a re-run of a batch); a later one
  by applying the deltas other executors committed since; anything else rebuilds the
  database from the newest snapshot and the deltas after it.

The database lives in ``<SPARK_LOCAL_DIRS>/microbatch-rocksdb/<store digest>``, one per
store and executor, like Spark's. RocksDB lets one process open a database, and Spark
may run a partition's next task in any Python worker process of the executor: a worker
keeps the database open after its task, and another that needs it creates
``<db>.release`` and retries; the holder's watcher thread closes it between tasks. The
database keeps its own record (version, keys, a token of the last write) in the write
batch of every version, so whoever opens it knows what it holds; undo records are
trusted only if the token is the one this provider wrote. A task that cannot get the
database (another task of the partition holds it: a speculative or retried one) builds
a private copy from the files. The database is a working copy, never the checkpoint;
Spark deletes its local directories at the end.

In the database a key or value is the tuple ``state.files`` defines, encoded with
``marshal`` format 0 (no interning flags or back-references, so equal keys are equal
bytes); dates, times, decimals and durations become numbers or text first. The
memory a worker spends is RocksDB's: its memtables (``writeBufferSizeMB`` times
``maxWriteBufferNumber`` a store), one block cache shared by the worker's stores
(``blockCacheSizeMB``), and the open batch's changes.
"""
from microbatch.state.rocksdb.codec import TupleCodec
from microbatch.state.rocksdb.provider import RocksDBStateStoreProvider
from microbatch.state.rocksdb.store import RocksDBStateStore

__all__ = ["RocksDBStateStore", "RocksDBStateStoreProvider", "TupleCodec"]
