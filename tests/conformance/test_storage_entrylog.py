"""The StorageEngine conformance suite against the ``entrylog`` engine on real files: once with
the defaults, once with tiny limits so that log rolling, buffer writes and cache eviction happen
inside every test."""

import pytest

from ledgerstore.testing import StorageEngineConformance
from ledgerstore_entrylog import EntryLogStorage

TINY = {
    "write_buffer_size": 4096,
    "entry_log_size_limit": 64 * 1024,
    "page_size": 256,
    "page_limit_bytes": 4096,
}


class TestEntryLogStorageDefaults(StorageEngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return lambda d: EntryLogStorage([d])


class TestEntryLogStorageTinyLimits(StorageEngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return lambda d: EntryLogStorage([d], **TINY)
