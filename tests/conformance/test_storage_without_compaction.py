"""An engine that does not declare ``supports_compaction`` keeps the interface's default
``compact`` (which does nothing) and still passes the conformance suite: run over the real
entrylog engine with its compaction taken away, as a third-party engine without it would be."""

import pytest

from ledgerstore.api import StorageEngine
from ledgerstore.testing import StorageEngineConformance
from ledgerstore_entrylog import EntryLogStorage


class _EntryLogWithoutCompaction(EntryLogStorage):
    supports_compaction = False
    compact = StorageEngine.compact


def test_the_compaction_is_really_taken_away() -> None:
    assert _EntryLogWithoutCompaction.compact is StorageEngine.compact


class TestEngineWithoutCompaction(StorageEngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return lambda d: _EntryLogWithoutCompaction([d])
