"""Tunables of the ``rocksdb`` storage engine, validated once when the host parses its options."""

from __future__ import annotations

import dataclasses

from ledgerstore.api import option

__all__ = ["COMPRESSIONS", "RocksDBConfig"]

MiB = 1024 * 1024

#: Compression names accepted by the ``compression`` option. ``auto`` means lz4 when the RocksDB
#: build links it, else none.
COMPRESSIONS = ("auto", "none", "snappy", "lz4", "lz4hc", "zstd", "zlib", "bz2")


@dataclasses.dataclass(frozen=True, slots=True)
class RocksDBConfig:
    """Options of :class:`ledgerstore_rocksdb.RocksDBStorage` (its ``Options``: the host parses the
    ``storage_options`` table into one, and checks each value's type and range when it does).

    Attributes:
        block_cache_size: bytes of the LRU cache of uncompressed data blocks shared by reads.
        write_buffer_size: bytes of one memtable; a full memtable is flushed to an SST file.
        max_write_buffer_number: memtables kept in memory (one active, the rest being flushed)
            before writes stall.
        compression: SST compression, one of :data:`COMPRESSIONS`.
        bloom_bits_per_key: bloom filter bits per key in each SST (0 disables filters); filters
            spare a disk read for most lookups of absent entries.
        max_background_jobs: threads RocksDB uses for flushes and compactions.
        wal: False (the default) writes with RocksDB's write-ahead log disabled and makes
            ``flush()`` durable by flushing memtables to SST files; True writes the WAL and makes
            ``flush()`` sync it instead. Either way ``flush()`` meets the checkpoint contract;
            the bookie journal is the write-ahead log of every add, so the WAL is redundant.
        bytes_per_sync: RocksDB syncs SST files in the background every this many bytes written
            (0 = only when a file is finished), so dirty pages never pile up into a writeback
            burst that stalls the bookie journal's fdatasync.
        wal_bytes_per_sync: the same for RocksDB's WAL files (only used with ``wal=True``).
    """

    block_cache_size: int = option(64 * MiB, "bytes of the block cache shared by reads", minimum=0)
    write_buffer_size: int = option(64 * MiB, "bytes of one memtable (at least 1 MiB)", minimum=MiB)
    max_write_buffer_number: int = option(4, "memtables kept in memory before writes stall", minimum=1)
    compression: str = option("auto", "SST compression", choices=COMPRESSIONS)
    bloom_bits_per_key: int = option(10, "bloom filter bits per key (0: no filters)", minimum=0)
    max_background_jobs: int = option(2, "threads for flushes and compactions", minimum=1)
    wal: bool = option(False, "write RocksDB's WAL (the journal already logs every add)")
    bytes_per_sync: int = option(1 * MiB, "background sync of SST files every this many bytes", minimum=0)
    wal_bytes_per_sync: int = option(1 * MiB, "the same for WAL files (with wal = true)", minimum=0)
