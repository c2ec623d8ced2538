"""The rocksdb storage engine passes the StorageEngine conformance suite on real RocksDB files."""

import pytest

from ledgerstore.testing import StorageEngineConformance
from ledgerstore_rocksdb import RocksDBStorage


class TestRocksDBStorage(StorageEngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return lambda d: RocksDBStorage([d])


class TestRocksDBStorageWithWal(StorageEngineConformance):
    """The same contract holds when RocksDB's own WAL is kept and ``flush()`` syncs it."""

    @pytest.fixture
    def engine_factory(self):
        return lambda d: RocksDBStorage([d], wal=True)
