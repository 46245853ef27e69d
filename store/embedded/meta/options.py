"""RocksDB options of the metadata database (`store.embedded.meta.store`): the explicit memory and thread limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, DBCompressionType, DBRecoveryMode, Options, Rdict


@dataclass(frozen=True, slots=True)
class MetaLimits:
    """RocksDB's memory and threads. Resident memory of the database is about write_buffer_bytes +
    block_cache_bytes (index and filter blocks are charged to the cache) plus a few MB of table readers."""

    write_buffer_bytes: int = 32 * 2**20  # every memtable together (two of half this size)
    block_cache_bytes: int = 64 * 2**20  # data, index and filter blocks (LRU)
    max_background_jobs: int = 2  # flush + compaction threads of RocksDB's own pool
    max_open_files: int = 512  # table files kept open (-1: all)
    max_wal_bytes: int = 128 * 2**20  # past this the oldest memtable is flushed: bounds WAL replay at open


DEFAULT_LIMITS = MetaLimits()


def options(limits: MetaLimits) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(max(64 * 1024, limits.write_buffer_bytes // 2))
    opts.set_max_write_buffer_number(2)
    opts.set_db_write_buffer_size(limits.write_buffer_bytes)
    opts.set_max_background_jobs(limits.max_background_jobs)
    opts.set_max_subcompactions(1)
    opts.set_max_open_files(limits.max_open_files)
    opts.set_max_total_wal_size(limits.max_wal_bytes)
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_compression_type(DBCompressionType.lz4())
    opts.set_bytes_per_sync(2**20)
    opts.set_wal_recovery_mode(DBRecoveryMode.point_in_time())  # a torn WAL tail: stop there, consistent
    opts.set_keep_log_file_num(2)
    opts.set_max_log_file_size(4 * 2**20)
    # Deleted index entries (expiry, online) pile up at the head of their ranges: compact files with many.
    opts.add_compact_on_deletion_collector_factory(32768, 16384, 0.0)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(limits.block_cache_bytes))
    # Index and filter blocks live in the block cache, partitioned into 4 KB blocks: a whole-file index or filter
    # (MBs for a large table) would not fit one cache shard, and be read from the file again at every lookup.
    table.set_cache_index_and_filter_blocks(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def open_db(path: Path, limits: MetaLimits) -> Rdict:
    """Open or create the database with these options. The options go in twice: given only the database's,
    rocksdict reopens an existing database with the column-family options read back from its OPTIONS file,
    which lose the filter policy and the block cache (an 8 MB cache of its own)."""
    opts = options(limits)
    return Rdict(str(path), opts, column_families={"default": opts})
