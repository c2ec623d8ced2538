"""Conformance suite for :class:`ledgerstore.api.StorageEngine` backends (on real files)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledgerstore.api import StorageEngine, StorageStats
from ledgerstore.errors import InvalidArgumentError, NoSuchEntryError, NoSuchLedgerError
from ledgerstore.testing.capabilities import require, require_not

EngineFactory = Callable[[Path], StorageEngine]


class StorageEngineConformance:
    """Subclass and provide an ``engine_factory`` fixture: a callable that, given a directory,
    returns an unopened engine storing its data there. Calling it twice on one directory must
    give two engines over the same data (used to test reopening).

    Cases follow the engine's capability flags: reopening needs ``durable_sync``, compaction
    cases need ``supports_compaction`` (and the default ``compact`` is checked on engines
    without it)."""

    @pytest.fixture
    def engine_factory(self) -> EngineFactory:  # pragma: no cover - must be overridden
        raise NotImplementedError("conformance suites need an engine_factory fixture")

    @pytest.fixture
    def engine(self, engine_factory: EngineFactory, tmp_path: Path) -> Iterator[StorageEngine]:
        e = engine_factory(tmp_path / "data")
        e.open()
        yield e
        e.close()

    def _reopen(self, engine: StorageEngine, factory: EngineFactory, tmp_path: Path) -> StorageEngine:
        require(engine, "durable_sync")
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
        if engine.supports_compaction:
            engine.compact(0.8)
        after = engine.stats().bytes_on_disk
        assert after < before, (before, after)
        for e in range(64):
            assert len(engine.get_entry(71, e)) == 16 * 1024

    def _two_ledgers_one_deleted(self, engine: StorageEngine) -> dict[int, bytes]:
        kept = {e: os.urandom(8 * 1024) for e in range(64)}
        for lid in (80, 81):
            engine.set_master_key(lid, b"mk")
            for e, data in kept.items():
                engine.add_entry(lid, e, data)
        engine.flush()
        engine.delete_ledger(80)
        engine.flush()
        engine.gc()
        return kept

    def test_compaction_keeps_every_live_entry(
        self, engine: StorageEngine, engine_factory: EngineFactory, tmp_path: Path
    ) -> None:
        require(engine, "supports_compaction")
        kept = self._two_ledgers_one_deleted(engine)
        for threshold in (0.2, 0.8, 1.0):
            assert isinstance(engine.compact(threshold), StorageStats)
        assert not engine.has_ledger(80)
        assert all(engine.get_entry(81, e) == data for e, data in kept.items())
        engine.flush()
        if engine.durable_sync:
            engine = self._reopen(engine, engine_factory, tmp_path)
            try:
                assert all(engine.get_entry(81, e) == data for e, data in kept.items())
                assert not engine.has_ledger(80)
            finally:
                engine.close()

    def test_compact_without_the_capability_does_nothing(self, engine: StorageEngine) -> None:
        require_not(engine, "supports_compaction")
        kept = self._two_ledgers_one_deleted(engine)
        before = engine.stats()
        assert engine.compact(0.8) == before
        assert all(engine.get_entry(81, e) == data for e, data in kept.items())

    def test_the_batch_capability_matches_the_overrides(self, engine: StorageEngine) -> None:
        overridden = (type(engine).add_entries is not StorageEngine.add_entries
                      and type(engine).get_entries is not StorageEngine.get_entries)
        assert engine.supports_batch_add == overridden, (
            f"{type(engine).__qualname__} declares supports_batch_add = {engine.supports_batch_add} but "
            f"{'overrides' if overridden else 'does not override'} add_entries and get_entries")

    def test_stats(self, engine: StorageEngine) -> None:
        engine.set_master_key(50, b"mk")
        engine.add_entry(50, 0, b"x")
        engine.flush()
        st = engine.stats()
        assert st.ledgers >= 1

    # --- batch operations: add_entries / get_entries ---------------------------------------------

    def test_add_entries_round_trip(self, engine: StorageEngine) -> None:
        rnd = random.Random(11)
        engine.set_master_key(80, b"mk")
        batch = [(i, rnd.randbytes(rnd.randint(0, 2000))) for i in range(200)]
        engine.add_entries(80, batch)
        for eid, data in batch:
            assert engine.get_entry(80, eid) == data
        assert engine.get_entries(80, [eid for eid, _ in batch]) == [data for _, data in batch]
        assert engine.last_entry_id(80) == 199
        assert list(engine.list_ledgers()) == [80]

    def test_add_entries_creates_an_unknown_ledger(self, engine: StorageEngine) -> None:
        engine.add_entries(81, [(0, b"a"), (1, b"b")])
        assert engine.has_ledger(81)
        assert engine.get_entries(81, [1, 0]) == [b"b", b"a"]

    def test_add_entries_matches_add_entry_for_duplicates_and_replays(self, engine: StorageEngine) -> None:
        engine.set_master_key(82, b"mk")
        engine.add_entries(82, [(0, b"first"), (1, b"one"), (0, b"second")])
        assert engine.get_entry(82, 0) == b"second"  # a later pair overwrites, as in order
        engine.add_entries(82, [(0, b"second"), (1, b"one")])  # a journal replay of the batch
        assert engine.get_entries(82, [0, 1]) == [b"second", b"one"]
        assert engine.last_entry_id(82) == 1

    def test_empty_batches_do_nothing(self, engine: StorageEngine) -> None:
        engine.add_entries(83, [])
        assert not engine.has_ledger(83)
        assert engine.get_entries(83, []) == []
        engine.add_entry(84, 0, b"x")
        assert engine.get_entries(84, []) == []

    def test_get_entries_returns_errors_in_place(self, engine: StorageEngine) -> None:
        engine.set_master_key(85, b"mk")
        engine.add_entries(85, [(0, b"zero"), (1, b"one"), (3, b"three")])
        results = engine.get_entries(85, [3, 2, 0, 99, 1, 0])
        assert len(results) == 6
        assert results[0] == b"three"
        assert isinstance(results[1], NoSuchEntryError)
        assert results[2] == b"zero"
        assert isinstance(results[3], NoSuchEntryError)
        assert results[4] == b"one"
        assert results[5] == b"zero"
        missing = engine.get_entries(86, [0, 1, 2])
        assert len(missing) == 3
        assert all(isinstance(r, NoSuchLedgerError) for r in missing)
        # Each result is what get_entry gives for that id: bytes, or an error of the same type.
        for eid in (0, 1, 2, 3, 99):
            (got,) = engine.get_entries(85, [eid])
            try:
                expected: object = engine.get_entry(85, eid)
            except NoSuchEntryError as exc:
                expected = exc
            if isinstance(expected, bytes):
                assert got == expected
            else:
                assert type(got) is type(expected)

    def test_get_entries_of_a_deleted_ledger(self, engine: StorageEngine) -> None:
        engine.add_entries(87, [(0, b"x"), (1, b"y")])
        engine.delete_ledger(87)
        results = engine.get_entries(87, [0, 1])
        assert len(results) == 2
        assert all(isinstance(r, NoSuchLedgerError) for r in results)

    def test_last_entry_id_after_add_entries(self, engine: StorageEngine) -> None:
        engine.set_master_key(88, b"mk")
        engine.add_entries(88, [(3, b"c"), (1, b"a"), (7, b"g"), (2, b"b")])
        assert engine.last_entry_id(88) == 7
        engine.add_entries(88, [(5, b"e")])
        assert engine.last_entry_id(88) == 7
        engine.add_entry(88, 8, b"h")
        engine.add_entries(88, [(9, b"i"), (10, b"j")])
        assert engine.last_entry_id(88) == 10
        assert engine.get_entries(88, list(range(11)))[7:] == [b"g", b"h", b"i", b"j"]

    def test_add_entries_with_an_invalid_entry_id_is_refused(self, engine: StorageEngine) -> None:
        engine.set_master_key(89, b"mk")
        with pytest.raises(InvalidArgumentError):
            engine.add_entry(89, -1, b"bad")
        with pytest.raises(InvalidArgumentError):
            engine.add_entries(89, [(0, b"good"), (-1, b"bad"), (1, b"after")])
        # Entries before the bad one may be stored, none after it; the engine stays usable.
        assert isinstance(engine.get_entries(89, [1])[0], NoSuchEntryError)
        engine.add_entries(89, [(0, b"good"), (1, b"after")])
        assert engine.get_entries(89, [0, 1]) == [b"good", b"after"]
        assert engine.last_entry_id(89) == 1

    def test_add_entries_across_log_rolls_survive_reopen(
        self, engine: StorageEngine, engine_factory: EngineFactory, tmp_path: Path
    ) -> None:
        # About 1.5 MB in batches interleaved over ledgers, as a bookie's journal hands them
        # over: more than an engine configured with small logs or buffers holds in one.
        rnd = random.Random(13)
        expected: dict[int, list[bytes]] = {lid: [] for lid in (90, 91, 92)}
        for lid in expected:
            engine.set_master_key(lid, b"mk")
        for round_no in range(6):
            for lid, stored in expected.items():
                batch = [(len(stored) + i, rnd.randbytes(rnd.randint(500, 3500))) for i in range(40)]
                engine.add_entries(lid, batch)
                stored.extend(data for _, data in batch)
            if round_no == 2:
                engine.flush()
        for lid, stored in expected.items():
            assert engine.get_entries(lid, range(len(stored))) == stored
        engine.flush()
        e2 = self._reopen(engine, engine_factory, tmp_path)
        try:
            for lid, stored in expected.items():
                assert e2.last_entry_id(lid) == len(stored) - 1
                assert e2.get_entries(lid, list(range(len(stored)))) == stored
                assert e2.get_entry(lid, len(stored) // 2) == stored[len(stored) // 2]
            assert sorted(e2.list_ledgers()) == [90, 91, 92]
        finally:
            e2.close()
