"""The executor's side of the RocksDB provider: where a store's database lives, how it is
opened (RocksDB's options), and how Python worker processes hand an open database over.

RocksDB lets one process open a database, and Spark may run a partition's next task in
any Python worker process of the executor: a worker keeps the database open after its
task, and another that needs it creates ``<db>.release`` and retries; the holder's
watcher thread (``watch``) closes it between tasks.
"""
from __future__ import annotations

import itertools
import os
import tempfile
import threading
import time

from microbatch.state.store import StateStoreConf

#: What this worker process shares among its stores: the block cache, the local root, the watcher thread
SHARED: dict = {}
INSTANCES = itertools.count()
#: The database's own record, in the write batch of every version: (version, number of
#: keys, token of the write). It sorts before every encoded tuple (marshal's tuples start
#: with "("), so reading from ``FIRST_KEY`` skips it.
META = b"\x00microbatch"
FIRST_KEY = b"\x01"
#: A process that wants a database another process keeps open creates ``<path>.release``
#: and retries (for ``lockAcquireTimeoutMs`` when set, else 5 s: ``RocksDBConfs.lock_wait_ms``);
#: the holder's watcher thread closes it between tasks.
RELEASE_REQUEST = ".release"
KEPT_OPEN: set = set()       # providers of this process keeping their database open
#: One snapshot at a time in a worker process: each holds a chunk of rows and its whole
#: compressed file in memory until the write (a worker killed at 50M keys under a 1 GB
#: address-space cap when its four partitions snapshotted together).
ONE_SNAPSHOT = threading.Semaphore(1)


def watch(provider) -> None:
    """Watch for requests to release ``provider``'s database (one daemon thread a process)."""
    KEPT_OPEN.add(provider)
    if SHARED.get("watcher") is None or not SHARED["watcher"].is_alive():
        def run():
            while True:
                time.sleep(0.005)
                for kept in list(KEPT_OPEN):
                    if kept.db is None:
                        KEPT_OPEN.discard(kept)
                    else:
                        kept._release_if_asked()
        SHARED["watcher"] = threading.Thread(target=run, name="rocksdb-release-watcher", daemon=True)
        SHARED["watcher"].start()


def forget_request(path: str) -> None:
    try:
        os.remove(path + RELEASE_REQUEST)
    except FileNotFoundError:
        pass


def local_root() -> str:
    """``<first of SPARK_LOCAL_DIRS, or the temp dir>/microbatch-rocksdb``."""
    root = SHARED.get("root")
    if root is None:
        base = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or tempfile.gettempdir()
        root = os.path.join(base, "microbatch-rocksdb")
        os.makedirs(root, exist_ok=True)
        SHARED["root"] = root
    return root


def _shared_memory(conf: StateStoreConf):
    """The block cache this worker process's stores share, and the write buffer manager
    that charges their memtables to it under ``boundedMemoryUsage`` (else None), as Spark's
    RocksDBMemoryManager: one cache of ``maxMemoryUsageMB`` for every store of the
    executor, memtables capped at ``writeBufferCacheRatio`` of it; without the bound, a
    cache of ``blockCacheSizeMB`` and memtables sized each by their own confs. Kept per
    setting, so a query with other settings in the same worker gets its own."""
    from rocksdict import Cache, WriteBufferManager
    rocks = conf.rocksdb
    if rocks.bounded_memory:
        key = ("bounded", rocks.max_memory_mb, rocks.write_buffer_cache_ratio)
        if key not in SHARED:
            total = rocks.max_memory_mb << 20
            cache = Cache(total)
            SHARED[key] = (cache, WriteBufferManager.new_write_buffer_manager_with_cache(
                int(total * rocks.write_buffer_cache_ratio), False, cache))
        return SHARED[key]
    key = ("cache", conf.rocksdb_block_cache_mb)
    if key not in SHARED:   # one block cache for every store of this worker process
        SHARED[key] = (Cache(conf.rocksdb_block_cache_mb << 20), None)
    return SHARED[key]


def _base_options():
    from rocksdict import Options
    return Options(raw_mode=True)


def _options_without_fallocate(cache):
    """Options with ``allow_fallocate`` off (``allowFAllocate=false``): rocksdict has no
    setter for it, so they are loaded from an options file of this worker's that says so
    (RocksDB's own format; everything else is set after, as for the other options)."""
    from rocksdict import Env, Options
    template = os.path.join(local_root(), "options-no-fallocate")
    if not os.path.exists(os.path.join(template, "OPTIONS-000001")):
        os.makedirs(template, exist_ok=True)
        # (written beside the directory, then renamed in: RocksDB's load_latest takes any
        # OPTIONS-* file in it, a half-written one of another worker's too)
        part = f"{template}.{os.getpid()}.part"
        with open(part, "w") as out:
            out.write("[Version]\n  rocksdb_version=9.8.4\n  options_file_version=1.1\n\n"
                      "[DBOptions]\n  allow_fallocate=false\n\n[CFOptions \"default\"]\n\n"
                      "[TableOptions/BlockBasedTable \"default\"]\n")
        os.replace(part, os.path.join(template, "OPTIONS-000001"))
    options, _ = Options.load_latest(template, Env(), False, cache)
    return options


def _options(conf: StateStoreConf):
    """The database's options: microbatch's tuning, then Spark's RocksDB confs as its
    RocksDB instance takes them (``blockSizeKB``, ``maxOpenFiles``, ``compression``,
    ``allowFAllocate``, the bounded memory's shared cache and write buffer manager, with
    index and filter blocks in the cache and level 0's pinned there)."""
    from rocksdict import BlockBasedOptions
    rocks = conf.rocksdb
    cache, manager = _shared_memory(conf)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)   # a new key (most of a dedup's) is decided in memory
    table.set_block_cache(cache)
    table.set_block_size(rocks.block_size_kb << 10)
    if manager is not None:
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    options = _base_options() if rocks.allow_fallocate else _options_without_fallocate(cache)
    options.create_if_missing(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(conf.rocksdb_write_buffer_mb << 20)
    options.set_max_write_buffer_number(conf.rocksdb_max_write_buffers)
    if manager is not None:
        options.set_write_buffer_manager(manager)
    options.set_max_open_files(rocks.max_open_files)
    options.set_compression_type(compression_type(rocks.compression))
    options.increase_parallelism(2)
    # Level 1 of half a memtable (RocksDB's default is 256 MB): a partition's database
    # is tens to hundreds of MB, so with the default all of it sat in level 1 and every
    # compaction of level 0 (every few memtables, and each hand-over flushes one)
    # rewrote the whole database, a cost growing with the state. With a small level 1
    # the data moves down levels and a compaction rewrites a bounded slice: the 50M-key
    # deduplication's last tenth went from 1.3-2.1 to 1.13-1.14 times its second.
    level_base = max(1, conf.rocksdb_write_buffer_mb // 2)
    options.set_max_bytes_for_level_base(level_base << 20)
    options.set_target_file_size_base(max(1, level_base // 4) << 20)
    return options


def open_database(path: str, conf: StateStoreConf):
    """The database at ``path``, made or opened with ``_options``. The default column
    family's options are named too: rocksdict opens the families of an existing database
    with the options its OPTIONS file records, which lose the table settings, so a
    database opened again (handed over by another worker) had no bloom filter, and every
    lookup of an absent key read blocks from disk: 3-4x slower, for as long as it lived."""
    from rocksdict import Rdict
    return Rdict(path, _options(conf), column_families={"default": _options(conf)})


#: ``spark.sql.streaming.stateStore.rocksdb.compression``'s names, as RocksDB's Java
#: CompressionType.getCompressionType reads them (its library names); any other name is no
#: compression there too
_COMPRESSIONS = {"snappy": "snappy", "z": "zlib", "bzip2": "bz2", "lz4": "lz4", "lz4hc": "lz4hc", "zstd": "zstd"}


def compression_type(name: str):
    from rocksdict import DBCompressionType
    return getattr(DBCompressionType, _COMPRESSIONS.get(name, "none"))()
