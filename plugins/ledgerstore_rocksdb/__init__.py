"""``rocksdb`` storage engine: a bookie's ledger storage in RocksDB (through rocksdict).

Select it with ``storage = "rocksdb"``; install ledgerstore with its ``rocksdb`` extra (docs/install.md).
The on-disk format is described in ``docs/storage-rocksdb.md`` and :mod:`ledgerstore_rocksdb.format`.
"""

from __future__ import annotations

from ledgerstore_rocksdb.config import RocksDBConfig
from ledgerstore_rocksdb.engine import RocksDBStorage

__all__ = ["RocksDBConfig", "RocksDBStorage"]
