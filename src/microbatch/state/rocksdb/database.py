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
#: and retries for this long; the holder's watcher thread closes it between tasks.
RELEASE_REQUEST = ".release"
RELEASE_WAIT_S = 5.0
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


def _options(conf: StateStoreConf):
    from rocksdict import BlockBasedOptions, Cache, Options
    cache = SHARED.get("cache")
    if cache is None:   # one block cache for every store of this worker process
        cache = SHARED["cache"] = Cache(conf.rocksdb_block_cache_mb << 20)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)   # a new key (most of a dedup's) is decided in memory
    table.set_block_cache(cache)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(conf.rocksdb_write_buffer_mb << 20)
    options.set_max_write_buffer_number(conf.rocksdb_max_write_buffers)
    options.set_compression_type(_compression(conf.compression))
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


def _compression(codec: str):
    from rocksdict import DBCompressionType
    return DBCompressionType.zstd() if codec == "zstd" else DBCompressionType.lz4()
