"""Tunables of the ``rocksdb`` storage engine, validated once when the engine is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ledgerstore.errors import ConfigError

__all__ = ["COMPRESSIONS", "RocksDBConfig"]

MiB = 1024 * 1024

#: Compression names accepted by the ``compression`` option. ``auto`` means lz4 when the RocksDB
#: build links it, else none.
COMPRESSIONS = ("auto", "none", "snappy", "lz4", "lz4hc", "zstd", "zlib", "bz2")


@dataclasses.dataclass(frozen=True, slots=True)
class RocksDBConfig:
    """Options of :class:`ledgerstore_rocksdb.RocksDBStorage` (keyword arguments of its constructor).

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

    block_cache_size: int = 64 * MiB
    write_buffer_size: int = 64 * MiB
    max_write_buffer_number: int = 4
    compression: str = "auto"
    bloom_bits_per_key: int = 10
    max_background_jobs: int = 2
    wal: bool = False
    bytes_per_sync: int = 1 * MiB
    wal_bytes_per_sync: int = 1 * MiB

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RocksDBConfig:
        """Build from the engine's keyword options; ConfigError names any unknown or bad one."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(unknown)} for the rocksdb storage engine; "
                f"known options: {', '.join(fields)}"
            )
        values: dict[str, Any] = {}
        for name, value in options.items():
            default = fields[name].default
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"rocksdb storage option {name} must be true or false, got {value!r}")
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(
                        f"rocksdb storage option {name} must be a non-negative integer, got {value!r}"
                    )
            elif not isinstance(value, str):
                raise ConfigError(f"rocksdb storage option {name} must be a string, got {value!r}")
            values[name] = value
        config = cls(**values)
        if config.compression not in COMPRESSIONS:
            raise ConfigError(
                f"rocksdb storage option compression is {config.compression!r}; "
                f"use one of {', '.join(COMPRESSIONS)}"
            )
        for name in ("write_buffer_size", "max_write_buffer_number", "max_background_jobs"):
            if getattr(config, name) < 1:
                raise ConfigError(f"rocksdb storage option {name} must be at least 1")
        if config.write_buffer_size < MiB:
            raise ConfigError(
                f"rocksdb storage option write_buffer_size is {config.write_buffer_size} bytes; "
                "use at least 1 MiB (1048576)"
            )
        return config
