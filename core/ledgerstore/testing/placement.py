"""Conformance suite for :class:`ledgerstore.api.PlacementPolicy` backends."""

from __future__ import annotations

import dataclasses

import pytest

from ledgerstore.api import BookieInfo, PlacementPolicy
from ledgerstore.errors import NotEnoughBookiesError
from ledgerstore.testing.capabilities import require


def make_bookies(n: int, read_only: frozenset[int] = frozenset()) -> list[BookieInfo]:
    """``n`` bookies spread over three racks and three regions, ``read_only`` indexes read-only."""
    return [
        BookieInfo(
            bookie_id=f"127.0.0.1:{4000 + i}",
            endpoint=f"tcp://127.0.0.1:{4000 + i}",
            rack=f"/rack-{i % 3}",
            region=f"region-{i % 3}",
            free_bytes=max(5, 90 - 10 * i) * 10**9,
            total_bytes=100 * 10**9,
            ledger_count=10 * i,
            read_only=i in read_only,
        )
        for i in range(n)
    ]


class PlacementPolicyConformance:
    """Subclass and provide a ``policy`` fixture returning a policy instance. Cases follow the
    policy's capability flags (``supports_seed``, ``rack_aware``, ``region_aware``)."""

    @pytest.fixture
    def policy(self) -> PlacementPolicy:  # pragma: no cover - must be overridden
        raise NotImplementedError("conformance suites need a policy fixture")

    def test_new_ensemble_distinct_and_sized(self, policy: PlacementPolicy) -> None:
        bookies = make_bookies(6)
        for _ in range(50):
            ens = policy.new_ensemble(3, 2, 2, bookies)
            assert len(ens) == 3 and len(set(ens)) == 3
            assert set(ens) <= {b.bookie_id for b in bookies}
            assert policy.is_ensemble_adhering(ens, 2, 2, bookies)

    def test_exclusions_and_read_only_are_honoured(self, policy: PlacementPolicy) -> None:
        bookies = make_bookies(6, read_only=frozenset({0}))
        excluded = frozenset({bookies[1].bookie_id})
        for _ in range(50):
            ens = policy.new_ensemble(4, 2, 2, bookies, exclude=excluded)
            assert bookies[0].bookie_id not in ens and bookies[1].bookie_id not in ens

    def test_not_enough_bookies(self, policy: PlacementPolicy) -> None:
        with pytest.raises(NotEnoughBookiesError) as info:
            policy.new_ensemble(4, 2, 2, make_bookies(3))
        assert "4" in str(info.value) and "3" in str(info.value)

    def test_replace_bookie(self, policy: PlacementPolicy) -> None:
        bookies = make_bookies(6)  # two per rack: a same-rack replacement always exists
        ens = policy.new_ensemble(3, 2, 2, bookies)
        for _ in range(20):
            new = policy.replace_bookie(ens, 2, 2, 1, bookies, exclude=frozenset({ens[1]}))
            assert new not in ens
        with pytest.raises(NotEnoughBookiesError):
            policy.replace_bookie(
                ens, 2, 2, 1, [b for b in bookies if b.bookie_id in ens], exclude=frozenset({ens[1]})
            )

    def test_read_order_is_a_permutation(self, policy: PlacementPolicy) -> None:
        bookies = make_bookies(4, read_only=frozenset({0}))
        ens = [b.bookie_id for b in bookies[:3]]
        order = policy.reorder_read_sequence(ens, [0, 1, 2], bookies)
        assert sorted(order) == [0, 1, 2]

    def test_same_seed_same_choices(self, policy: PlacementPolicy) -> None:
        require(policy, "supports_seed")
        bookies = make_bookies(9)
        opts = policy.options
        if dataclasses.is_dataclass(opts) and not isinstance(opts, type):
            a, b = (type(policy)(dataclasses.replace(opts, seed=1234)) for _ in range(2))
        else:  # a policy without an Options dataclass keeps its keyword options as a dict
            a, b = (type(policy)(**{**opts, "seed": 1234}) for _ in range(2))
        assert [a.new_ensemble(3, 2, 2, bookies) for _ in range(20)] == [
            b.new_ensemble(3, 2, 2, bookies) for _ in range(20)]

    def test_write_quorums_span_racks(self, policy: PlacementPolicy) -> None:
        require(policy, "rack_aware")
        self._write_quorums_span(policy, "rack")

    def test_write_quorums_span_regions(self, policy: PlacementPolicy) -> None:
        require(policy, "region_aware")
        self._write_quorums_span(policy, "region")

    def _write_quorums_span(self, policy: PlacementPolicy, domain: str) -> None:
        bookies = make_bookies(6)  # three racks and three regions, two bookies in each
        where = {b.bookie_id: getattr(b, domain) for b in bookies}
        for _ in range(20):
            ens = policy.new_ensemble(3, 2, 2, bookies)
            for first in range(3):
                quorum = [ens[(first + i) % 3] for i in range(2)]
                assert len({where[b] for b in quorum}) == 2, (domain, ens)
