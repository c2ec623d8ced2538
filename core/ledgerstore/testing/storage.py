"""Conformance suite for :class:`ledgerstore.api.StorageEngine` backends (on real files)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from ledgerstore.api import StorageEngine
from ledgerstore.errors import NoSuchEntryError, NoSuchLedgerError

EngineFactory = Callable[[Path], StorageEngine]


class StorageEngineConformance:
    """Subclass and provide an ``engine_factory`` fixture: a callable that, given a directory,
    returns an unopened engine storing its data there. Calling it twice on one directory must
    give two engines over the same data (used to test reopening)."""

    @pytest.fixture
    def engine_factory(self) -> EngineFactory:  # pragma: no cover - must be overridden
        raise NotImplementedError("conformance suites need an engine_factory fixture")

    @pytest.fixture
    def engine(self, engine_factory: EngineFactory, tmp_path: Path):  # type: ignore[no-untyped-def]
        e = engine_factory(tmp_path / "data")
        e.open()
        yield e
        e.close()

    def _reopen(self, engine: StorageEngine, factory: EngineFactory, tmp_path: Path) -> StorageEngine:
        engine.close()
        e = factory(tmp_path / "data")
        e.open()
        return e

    def test_add_and_get(self, engine: StorageEngine) -> None:
        engine.set_master_key(1, b"k" * 20)
        for i in range(100):
            engine.add_entry(1, i, b"entry-%d" % i)
        assert engine.get_entry(1, 0) == b"entry-0"
        assert engine.get_entry(1, 99) == b"entry-99"
        assert engine.last_entry_id(1) == 99
        assert engine.has_ledger(1)

    def test_missing_entry_and_ledger(self, engine: StorageEngine) -> None:
        engine.set_master_key(2, b"k")
        engine.add_entry(2, 0, b"x")
        with pytest.raises(NoSuchEntryError):
            engine.get_entry(2, 5)
        with pytest.raises(NoSuchLedgerError):
            engine.get_entry(999, 0)
        with pytest.raises(NoSuchLedgerError):
            engine.last_entry_id(999)
        assert not engine.has_ledger(999)
        assert engine.get_master_key(999) is None

    def test_master_key_and_fence_survive_reopen(
        self, engine: StorageEngine, engine_factory: EngineFactory, tmp_path: Path
    ) -> None:
        engine.set_master_key(3, b"master")
        assert not engine.is_fenced(3)
        assert engine.set_fenced(3) is True
        assert engine.set_fenced(3) is False
        engine.flush()
        e2 = self._reopen(engine, engine_factory, tmp_path)
        try:
            assert e2.get_master_key(3) == b"master"
            assert e2.is_fenced(3)
        finally:
            e2.close()

    def test_flushed_entries_survive_reopen(
        self, engine: StorageEngine, engine_factory: EngineFactory, tmp_path: Path
    ) -> None:
        rnd = random.Random(7)
        expected: dict[tuple[int, int], bytes] = {}
        for lid in (10, 11, 12):
            engine.set_master_key(lid, b"mk")
        for i in range(300):  # interleaved ledgers, as a bookie sees them
            lid = 10 + i % 3
            data = os.urandom(rnd.randint(0, 3000))
            engine.add_entry(lid, i // 3, data)
            expected[(lid, i // 3)] = data
        engine.flush()
        e2 = self._reopen(engine, engine_factory, tmp_path)
        try:
            for (lid, eid), data in expected.items():
                assert e2.get_entry(lid, eid) == data
            assert sorted(e2.list_ledgers()) == [10, 11, 12]
            assert e2.last_entry_id(11) == 99
        finally:
            e2.close()

    def test_readd_is_idempotent(self, engine: StorageEngine) -> None:
        engine.set_master_key(4, b"mk")
        engine.set_master_key(4, b"mk")
        engine.add_entry(4, 0, b"a")
        engine.add_entry(4, 0, b"a")
        assert engine.get_entry(4, 0) == b"a"
        assert engine.last_entry_id(4) == 0

    def test_delete_ledger(self, engine: StorageEngine) -> None:
        for lid in (20, 21):
            engine.set_master_key(lid, b"mk")
            engine.add_entry(lid, 0, b"x" * 100)
        engine.delete_ledger(20)
        assert not engine.has_ledger(20)
        with pytest.raises(NoSuchLedgerError):
            engine.get_entry(20, 0)
        assert list(engine.list_ledgers()) == [21]
        assert engine.get_entry(21, 0) == b"x" * 100
        engine.flush()
        engine.gc()

    def test_large_entry_and_sparse_ids(self, engine: StorageEngine) -> None:
        engine.set_master_key(30, b"mk")
        big = os.urandom(1024 * 1024)
        engine.add_entry(30, 0, big)
        engine.add_entry(30, 5000, b"far")
        assert engine.get_entry(30, 0) == big
        assert engine.get_entry(30, 5000) == b"far"
        with pytest.raises(NoSuchEntryError):
            engine.get_entry(30, 2500)
        assert engine.last_entry_id(30) == 5000

    def test_ledger_without_entries(self, engine: StorageEngine) -> None:
        engine.set_master_key(40, b"mk")
        assert engine.has_ledger(40)
        assert engine.last_entry_id(40) == -1
        with pytest.raises(NoSuchEntryError):
            engine.get_entry(40, 0)

    def test_other_master_key_is_refused(self, engine: StorageEngine) -> None:
        from ledgerstore.errors import UnauthorizedAccessError

        engine.set_master_key(60, b"one")
        with pytest.raises(UnauthorizedAccessError):
            engine.set_master_key(60, b"two")
        assert engine.get_master_key(60) == b"one"

    def test_delete_unknown_ledger_is_a_no_op(self, engine: StorageEngine) -> None:
        engine.delete_ledger(424242)
        assert not engine.has_ledger(424242)

    def test_gc_reclaims_deleted_ledgers(
        self, engine: StorageEngine, engine_factory: EngineFactory, tmp_path: Path
    ) -> None:
        for lid in range(70, 76):
            engine.set_master_key(lid, b"mk")
            for e in range(64):
                engine.add_entry(lid, e, os.urandom(16 * 1024))
        engine.flush()
        before = engine.stats().bytes_on_disk
        for lid in range(70, 76, 2):
            engine.delete_ledger(lid)
        engine.flush()
        engine.gc()
        compact = getattr(engine, "compact", None)
        if compact is not None:
            compact(0.8)
        after = engine.stats().bytes_on_disk
        assert after < before, (before, after)
        for e in range(64):
            assert len(engine.get_entry(71, e)) == 16 * 1024

    def test_stats(self, engine: StorageEngine) -> None:
        engine.set_master_key(50, b"mk")
        engine.add_entry(50, 0, b"x")
        engine.flush()
        st = engine.stats()
        assert st.ledgers >= 1
