"""Spark's own state files (``HDFSBackedStateStoreProvider``, Spark 4.3), read and written
without Spark: so a checkpoint Spark's engine wrote can be resumed by microbatch, and one
microbatch wrote by Spark; and those of Spark's ``RocksDBStateStoreProvider``, read and
written.

- ``unsafe_row``: Spark's UnsafeRow bytes <-> microbatch's state tuples, for a schema
  given as pyarrow storage types.
- ``compression``: Spark's lz4 (lz4-java block framing) and zstd file compression.
- ``hdfs_files``: the ``<v>.delta`` / ``<v>.snapshot`` files of one store: list, read,
  load a version, write.
- ``rocksdb_files``: the ``<v>.zip`` snapshots (with the SST files they list in ``SSTs/``,
  read with ``rocksdict``) and ``<v>.changelog`` files of one RocksDB-provider store, with
  changelog checkpointing on or off: list, load a version. Stores with column families
  (transformWithState: ``rocksdb_families``) and checkpoint format version 2 are refused.
- ``rocksdb_families``: the column families of a transformWithState store (value, list and
  map states, timers, TTL indexes; RocksDB's SST files read directly, for the merged list
  values rocksdict cannot read), and the operator's v3 schema files and metadata v2.
- ``rocksdb_writer``: a RocksDB-provider store's ``<v>.zip`` snapshot and its SST files,
  written (with column families for a transformWithState), and a transformWithState's v3
  schema file and operator metadata v2.
- ``schema_file``: Spark's ``state/<op>/0/_metadata/schema`` files and Spark's JSON types as
  pyarrow storage types.
- ``checksums``: xxHash32 and CRC-32C in Python.

Nothing here imports PySpark's session machinery or runs a JVM.
"""
from microbatch.state.spark_format.compression import codec_name, compress, decompress
from microbatch.state.spark_format.hdfs_files import (
    SparkStateStoreFiles, hadoop_checksum_file, offset_log_conf, store_options_from_conf, store_path,
)
from microbatch.state.spark_format.rocksdb_files import (
    SparkRocksDBStoreFiles, rocksdb_store_options_from_conf,
)
from microbatch.state.spark_format.rocksdb_families import (
    SparkRocksDBFamilies, families_options_from_conf, parse_state_schema_v3, read_operator_metadata_v2,
    read_state_schema_v3, read_state_schemas_v3,
)
from microbatch.state.spark_format.schema_file import (
    StateSchema, all_nullable, arrow_schema, arrow_type, parse_state_schema, read_state_schema, state_schema_path,
    state_schema_v2,
)
from microbatch.state.spark_format.unsafe_row import (
    SparkStateFormatError, decode_row, encode_row, encode_rows, fixed_size, row_decoder, row_encoder,
)

__all__ = [
    "SparkRocksDBFamilies", "families_options_from_conf", "parse_state_schema_v3",
    "read_operator_metadata_v2", "read_state_schema_v3", "read_state_schemas_v3",
    "SparkRocksDBStoreFiles", "SparkStateFormatError", "SparkStateStoreFiles", "StateSchema",
    "all_nullable", "arrow_schema", "arrow_type", "codec_name", "compress", "decode_row", "decompress", "encode_row",
    "encode_rows", "fixed_size", "hadoop_checksum_file", "offset_log_conf", "parse_state_schema",
    "read_state_schema", "rocksdb_store_options_from_conf", "row_decoder", "row_encoder",
    "state_schema_path", "state_schema_v2", "store_options_from_conf", "store_path",
]
