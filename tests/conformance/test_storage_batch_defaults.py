"""The default ``StorageEngine.add_entries`` / ``get_entries`` (one ``add_entry`` / ``get_entry``
per entry, as a third-party engine without overrides gets them) pass the conformance suite, run
over the real entrylog and rocksdb engines with their batch overrides taken away."""

import pytest

from ledgerstore.api import StorageEngine
from ledgerstore.testing import StorageEngineConformance
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_rocksdb import RocksDBStorage

# Small logs, buffers and cache, so rolls, buffer writes and evictions happen inside the tests.
TINY = {
    "write_buffer_size": 4096,
    "entry_log_size_limit": 64 * 1024,
    "page_size": 256,
    "page_limit_bytes": 4096,
}


class _EntryLogWithDefaultBatches(EntryLogStorage):
    supports_batch_add = False
    add_entries = StorageEngine.add_entries
    get_entries = StorageEngine.get_entries


class _RocksDBWithDefaultBatches(RocksDBStorage):
    supports_batch_add = False
    add_entries = StorageEngine.add_entries
    get_entries = StorageEngine.get_entries


def test_the_overrides_are_really_taken_away(tmp_path) -> None:
    for cls in (_EntryLogWithDefaultBatches, _RocksDBWithDefaultBatches):
        assert cls.add_entries is StorageEngine.add_entries
        assert cls.get_entries is StorageEngine.get_entries
    # The entrylog engine binds its add and read paths to its parts per instance, except where a
    # subclass overrides them.
    engine = _EntryLogWithDefaultBatches([tmp_path])
    assert engine.add_entries.__func__ is StorageEngine.add_entries
    assert engine.get_entries.__func__ is StorageEngine.get_entries


class TestDefaultBatchesOverEntryLog(StorageEngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return lambda d: _EntryLogWithDefaultBatches([d], **TINY)


class TestDefaultBatchesOverRocksDB(StorageEngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return lambda d: _RocksDBWithDefaultBatches([d])
