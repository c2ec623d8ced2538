"""Behaviour of the rack-aware, region-aware and disk-aware placement policies.

The fault-domain properties are checked against brute force: for small ensembles every order of
racks is enumerated, so "no valid ensemble exists" is proven, not assumed.
"""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ledgerstore.api import BookieInfo
from ledgerstore.errors import ConfigError, NotEnoughBookiesError
from ledgerstore_placement import (
    DiskAwarePlacement,
    RackAwarePlacement,
    RandomPlacement,
    RegionAwarePlacement,
)
from ledgerstore_placement.striping import arrange, min_shortfall, shortfall, write_windows

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bookie(i: int, rack: str = "/r0", region: str = "reg0", *, free: int = 50, total: int = 100,
           ledgers: int = 0, read_only: bool = False) -> BookieInfo:
    return BookieInfo(
        bookie_id=f"127.0.0.1:{5000 + i}", endpoint=f"tcp://127.0.0.1:{5000 + i}", rack=rack, region=region,
        free_bytes=free, total_bytes=total, ledger_count=ledgers, read_only=read_only,
    )


def spans(ensemble: Sequence[str], write_quorum: int, bookies: Sequence[BookieInfo], attr: str = "rack") -> list[int]:
    """Number of distinct racks (or regions) in every write window, computed independently."""
    where = {b.bookie_id: getattr(b, attr) for b in bookies}
    e = len(ensemble)
    return [len({where[ensemble[(s + j) % e]] for j in range(write_quorum)}) for s in range(e)]


def brute_min_shortfall(capacity: dict[str, int], e: int, qw: int, required: int) -> int:
    best = None
    for seq in itertools.product(sorted(capacity), repeat=e):
        counts = collections.Counter(seq)
        if any(counts[d] > capacity[d] for d in counts):
            continue
        s = sum(max(0, required - len({seq[(i + j) % e] for j in range(qw)})) for i in range(e))
        best = s if best is None else min(best, s)
    assert best is not None
    return best


@st.composite
def clusters(draw: st.DrawFn, max_racks: int = 4, max_bookies: int = 10) -> tuple[list[BookieInfo], int, int, int]:
    """A random cluster (racks, read-only bookies) and E >= Qw >= Qa that it can fill."""
    n = draw(st.integers(2, max_bookies))
    n_racks = draw(st.integers(1, max_racks))
    bookies = [
        # every third bookie may be read-only, so most clusters keep enough writable ones
        bookie(i, rack=f"/rack-{draw(st.integers(0, n_racks - 1))}", read_only=i % 3 == 0 and draw(st.booleans()))
        for i in range(n)
    ]
    writable = sum(not b.read_only for b in bookies)
    assume(writable >= 1)
    e = draw(st.integers(1, min(writable, 6)))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    return bookies, e, qw, qa


def rack_capacity(bookies: Sequence[BookieInfo], exclude: frozenset[str] = frozenset()) -> dict[str, int]:
    return dict(collections.Counter(b.rack for b in bookies if not b.read_only and b.bookie_id not in exclude))


# --- striping arithmetic -----------------------------------------------------------------------


def test_write_windows_follow_round_robin_striping() -> None:
    assert write_windows(5, 3) == [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 0), (4, 0, 1)]
    assert shortfall(["a", "a", "b", "b"], 2, 2) == 2
    assert shortfall(["a", "b", "a", "b"], 2, 2) == 0


@PROPERTY
@given(
    caps=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    e=st.integers(1, 6),
    qw=st.integers(1, 6),
    required=st.integers(1, 4),
    seed=st.integers(0, 2**32),
)
def test_arrange_finds_the_smallest_shortfall(caps: list[int], e: int, qw: int, required: int, seed: int) -> None:
    capacity = {f"d{i}": c for i, c in enumerate(caps)}
    assume(sum(caps) >= e and qw <= e)
    found = arrange(capacity, e, qw, required, random.Random(seed))
    assert found.proven
    assert collections.Counter(found.labels) <= collections.Counter(capacity)
    assert len(found.labels) == e
    assert shortfall(found.labels, qw, required) == found.shortfall == brute_min_shortfall(capacity, e, qw, required)


def test_arrange_proves_impossibility_quickly_for_large_ensembles() -> None:
    # every window of 5 needs 4 racks but the 4th rack has one bookie: 12 of 17 windows fall short
    found = arrange({"a": 20, "b": 20, "c": 20, "d": 1}, 17, 5, 4, random.Random(1))
    assert found.proven and found.shortfall == 12


# --- rack-aware ----------------------------------------------------------------------------------


@PROPERTY
@given(cluster=clusters(), seed=st.integers(0, 2**32))
def test_rack_aware_never_puts_a_write_quorum_on_one_rack_when_two_racks_exist(cluster, seed: int) -> None:
    bookies, e, qw, qa = cluster
    policy = RackAwarePlacement(seed=seed)
    capacity = rack_capacity(bookies)
    required = min(2, qw)
    if len(capacity) < required:
        with pytest.raises(NotEnoughBookiesError, match="only 1 rack has writable bookies"):
            policy.new_ensemble(e, qw, qa, bookies)
        return
    possible = brute_min_shortfall(capacity, e, qw, required) == 0
    if not possible:
        with pytest.raises(NotEnoughBookiesError, match="write quorum must span 2 racks"):
            policy.new_ensemble(e, qw, qa, bookies)
        return
    ens = policy.new_ensemble(e, qw, qa, bookies)
    assert len(set(ens)) == e
    assert all(not b.read_only for b in bookies if b.bookie_id in ens)
    assert min(spans(ens, qw, bookies)) >= required
    assert policy.is_ensemble_adhering(ens, qw, qa, bookies)


@PROPERTY
@given(cluster=clusters(), m=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_rack_aware_best_effort_is_as_good_as_any_order(cluster, m: int, seed: int) -> None:
    bookies, e, qw, qa = cluster
    policy = RackAwarePlacement(seed=seed, enforce=False, min_racks_per_write_quorum=m)
    capacity = rack_capacity(bookies)
    required = min(m, qw, len(capacity))
    ens = policy.new_ensemble(e, qw, qa, bookies)
    short = sum(max(0, required - s) for s in spans(ens, qw, bookies))
    assert len(set(ens)) == e
    assert short == brute_min_shortfall(capacity, e, qw, required)
    assert policy.is_ensemble_adhering(ens, qw, qa, bookies)


@PROPERTY
@given(cluster=clusters(max_bookies=12), data=st.data(), seed=st.integers(0, 2**32))
def test_rack_aware_replacement_keeps_every_write_quorum_on_two_racks(cluster, data: st.DataObject, seed: int) -> None:
    bookies, e, qw, qa = cluster
    policy = RackAwarePlacement(seed=seed)
    try:
        ens = policy.new_ensemble(e, qw, qa, bookies)
    except NotEnoughBookiesError:
        assume(False)
    index = data.draw(st.integers(0, e - 1))
    failed = frozenset({ens[index]})
    outside = [b for b in bookies if not b.read_only and b.bookie_id not in ens]
    fixes = [b for b in outside if min(spans([*ens[:index], b.bookie_id, *ens[index + 1:]], qw, bookies)) >= min(2, qw)]
    if not outside:
        with pytest.raises(NotEnoughBookiesError, match="no writable bookie outside the ensemble"):
            policy.replace_bookie(ens, qw, qa, index, bookies, exclude=failed)
        return
    if not fixes:
        with pytest.raises(NotEnoughBookiesError, match="must span 2 racks"):
            policy.replace_bookie(ens, qw, qa, index, bookies, exclude=failed)
        return
    new = policy.replace_bookie(ens, qw, qa, index, bookies, exclude=failed)
    assert new not in ens
    replaced = [*ens[:index], new, *ens[index + 1:]]
    assert min(spans(replaced, qw, bookies)) >= min(2, qw)
    assert policy.is_ensemble_adhering(replaced, qw, qa, bookies)


def test_replacement_is_refused_when_only_the_remaining_rack_has_bookies() -> None:
    bookies = [bookie(0, "/a"), bookie(1, "/a"), bookie(2, "/b")]
    ens = [bookies[0].bookie_id, bookies[2].bookie_id]
    with pytest.raises(NotEnoughBookiesError) as info:
        RackAwarePlacement().replace_bookie(ens, 2, 2, 1, bookies, exclude=frozenset({ens[1]}))
    assert "must span 2 racks; only 1 rack has writable bookies" in str(info.value)
    assert "outside it per rack: /a: 1" in str(info.value)
    assert RackAwarePlacement(enforce=False).replace_bookie(ens, 2, 2, 1, bookies) == bookies[1].bookie_id


def test_replacement_comes_from_the_rack_the_windows_need() -> None:
    bookies = [bookie(0, "/a"), bookie(1, "/b"), bookie(2, "/a"), bookie(3, "/b"),
               *(bookie(i, "/a") for i in range(4, 10)), bookie(10, "/b")]
    ens = [b.bookie_id for b in bookies[:4]]  # a b a b
    policy = RackAwarePlacement(seed=3)
    for _ in range(50):
        new = policy.replace_bookie(ens, 2, 2, 1, bookies, exclude=frozenset({ens[1]}))
        assert new == bookies[10].bookie_id  # the only other bookie on /b


def test_enforced_rack_aware_names_the_constraint_when_only_one_rack_is_writable() -> None:
    bookies = [bookie(i, "/a") for i in range(4)] + [bookie(4, "/b", read_only=True)]
    with pytest.raises(NotEnoughBookiesError) as info:
        RackAwarePlacement().new_ensemble(3, 2, 2, bookies)
    msg = str(info.value)
    assert "write quorum must span 2 racks; only 1 rack has writable bookies" in msg
    assert "/a: 4" in msg and "enforce = false" in msg


def test_unenforced_rack_aware_falls_back_to_one_rack() -> None:
    bookies = [bookie(i, "/a") for i in range(4)]
    policy = RackAwarePlacement(enforce=False)
    ens = policy.new_ensemble(3, 2, 2, bookies)
    assert len(set(ens)) == 3
    assert policy.is_ensemble_adhering(ens, 2, 2, bookies)
    assert not RackAwarePlacement().is_ensemble_adhering(ens, 2, 2, bookies)


def test_odd_ensemble_over_two_racks_is_refused_when_enforced_and_nearly_covered_otherwise() -> None:
    # 3 cyclic windows of 2 over 2 racks: one window must repeat a rack
    bookies = [bookie(i, f"/rack-{i % 2}") for i in range(6)]
    with pytest.raises(NotEnoughBookiesError, match=r"no order of 3 bookies .* leaves 1 of its 3 write quorums short"):
        RackAwarePlacement().new_ensemble(3, 2, 2, bookies)
    ens = RackAwarePlacement(enforce=False).new_ensemble(3, 2, 2, bookies)
    assert sorted(spans(ens, 2, bookies)) == [1, 2, 2]


def test_three_racks_per_write_quorum() -> None:
    bookies = [bookie(i, f"/rack-{i % 3}") for i in range(9)]
    policy = RackAwarePlacement(min_racks_per_write_quorum=3, seed=7)
    for e in (3, 6):
        ens = policy.new_ensemble(e, 3, 2, bookies)
        assert spans(ens, 3, bookies) == [3] * e
    with pytest.raises(NotEnoughBookiesError, match="must span 3 racks; only 2 racks have writable bookies"):
        policy.new_ensemble(4, 3, 2, bookies[:2] + bookies[3:5])


def test_is_ensemble_adhering_checks_every_window_including_the_wrapping_one() -> None:
    bookies = [bookie(0, "/a"), bookie(1, "/b"), bookie(2, "/a"), bookie(3, "/b"), bookie(4, "/a")]
    policy = RackAwarePlacement()
    ids = [b.bookie_id for b in bookies]
    assert policy.is_ensemble_adhering(ids[:4], 2, 2, bookies)           # a b a b
    assert not policy.is_ensemble_adhering([ids[0], ids[1], ids[3], ids[2]], 2, 2, bookies)  # a b b a
    assert not policy.is_ensemble_adhering([ids[1], ids[0], ids[2], ids[3]], 2, 2, bookies)  # b a a b
    assert not policy.is_ensemble_adhering([ids[0], ids[0], ids[1]], 2, 2, bookies)


def test_rack_aware_reads_local_rack_first_and_read_only_last() -> None:
    bookies = [bookie(0, "/a", read_only=True), bookie(1, "/b"), bookie(2, "/a"), bookie(3, "/b")]
    ens = [b.bookie_id for b in bookies] + ["127.0.0.1:1"]  # the last one is not registered
    assert RackAwarePlacement(local_rack="/a").reorder_read_sequence(ens, [4, 0, 1, 2, 3], bookies) == [2, 1, 3, 0, 4]
    assert RackAwarePlacement(local_rack="/b").reorder_read_sequence(ens, [0, 2, 3, 1], bookies) == [3, 1, 2, 0]
    assert RackAwarePlacement().reorder_read_sequence(ens, [0, 3, 2], bookies) == [3, 2, 0]


# --- region-aware --------------------------------------------------------------------------------


def region_cluster() -> list[BookieInfo]:
    """3 regions x 3 racks x 2 bookies."""
    return [bookie(i, rack=f"/rack-{(i // 2) % 3}", region=f"region-{i // 6}") for i in range(18)]


@pytest.mark.parametrize(("e", "qw"), [(2, 2), (3, 2), (3, 3), (4, 2), (5, 3), (6, 3), (9, 3)])
def test_region_aware_spans_regions_in_every_write_quorum(e: int, qw: int) -> None:
    bookies = region_cluster()
    policy = RegionAwarePlacement(seed=11)
    for _ in range(30):
        ens = policy.new_ensemble(e, qw, 2, bookies)
        assert len(set(ens)) == e
        assert min(spans(ens, qw, bookies, "region")) >= 2
        assert policy.is_ensemble_adhering(ens, qw, 2, bookies)


def test_region_aware_spreads_a_regions_bookies_over_its_racks() -> None:
    bookies = [bookie(i, rack=f"/rack-{i % 3}", region=f"region-{i // 9}") for i in range(18)]  # 2 regions x 3 racks
    by_id = {b.bookie_id: b for b in bookies}
    policy = RegionAwarePlacement(seed=5)
    for _ in range(30):
        ens = policy.new_ensemble(6, 2, 2, bookies)
        for region in ("region-0", "region-1"):
            racks = [by_id[x].rack for x in ens if by_id[x].region == region]
            assert len(racks) == 3 and len(set(racks)) == 3


def test_region_aware_replacement_stays_out_of_the_neighbours_region_and_rack() -> None:
    bookies = [bookie(i, rack=f"/rack-{i % 3}", region=f"region-{i // 9}") for i in range(18)]
    by_id = {b.bookie_id: b for b in bookies}
    policy = RegionAwarePlacement(seed=9)
    ens = policy.new_ensemble(4, 3, 2, bookies)
    for index in range(4):
        new = policy.replace_bookie(ens, 3, 2, index, bookies, exclude=frozenset({ens[index]}))
        replaced = [*ens[:index], new, *ens[index + 1:]]
        assert min(spans(replaced, 3, bookies, "region")) >= 2
        neighbours = [by_id[x] for i, x in enumerate(ens) if i != index]
        assert (by_id[new].region, by_id[new].rack) not in {(b.region, b.rack) for b in neighbours}


def test_region_aware_refuses_a_single_region_unless_told_otherwise() -> None:
    bookies = [bookie(i, rack=f"/rack-{i % 2}", region="us-east") for i in range(5)]
    with pytest.raises(NotEnoughBookiesError, match="write quorum must span 2 regions; only 1 region has writable bookies"):
        RegionAwarePlacement().new_ensemble(3, 2, 2, bookies)
    ens = RegionAwarePlacement(enforce=False).new_ensemble(3, 2, 2, bookies)
    assert len(set(ens)) == 3


def test_region_aware_reads_local_rack_then_local_region_then_remote() -> None:
    bookies = [bookie(0, "/a", "east"), bookie(1, "/b", "east"), bookie(2, "/a", "west"),
               bookie(3, "/a", "east", read_only=True)]
    ens = [b.bookie_id for b in bookies]
    policy = RegionAwarePlacement(local_region="east", local_rack="/b")
    assert policy.reorder_read_sequence(ens, [3, 2, 0, 1], bookies) == [1, 0, 2, 3]


# --- disk-aware ----------------------------------------------------------------------------------


def test_disk_aware_prefers_the_emptiest_bookies() -> None:
    bookies = [
        bookie(0, free=90, ledgers=5),   # emptiest, least loaded
        bookie(1, free=50, ledgers=20),
        bookie(2, free=30, ledgers=40),
        bookie(3, free=8, ledgers=60),   # fullest that is still eligible (92 % used)
        bookie(4, free=2, ledgers=0),    # 98 % used: over max_disk_usage
    ]
    policy = DiskAwarePlacement(seed=1234)
    picks = collections.Counter(policy.new_ensemble(1, 1, 1, bookies)[0] for _ in range(2000))
    assert picks[bookies[4].bookie_id] == 0
    assert picks[bookies[0].bookie_id] > 5 * picks[bookies[3].bookie_id]
    counts = [picks[b.bookie_id] for b in bookies[:4]]
    assert counts == sorted(counts, reverse=True), counts


def test_disk_aware_prefers_fewer_ledgers_when_space_is_equal() -> None:
    bookies = [bookie(0, free=50, ledgers=0), bookie(1, free=50, ledgers=100), bookie(2, free=50, ledgers=100)]
    policy = DiskAwarePlacement(seed=99)
    chosen = collections.Counter(policy.new_ensemble(1, 1, 1, bookies)[0] for _ in range(2000))
    assert chosen[bookies[0].bookie_id] > 2 * chosen[bookies[1].bookie_id]
    # a replacement is drawn with the same weights
    replaced = collections.Counter(
        policy.replace_bookie(["127.0.0.1:1"], 1, 1, 0, bookies) for _ in range(2000)
    )
    assert replaced[bookies[0].bookie_id] > 2 * replaced[bookies[2].bookie_id]


def test_disk_aware_never_chooses_a_bookie_over_max_disk_usage() -> None:
    full = [bookie(i, free=3, ledgers=0) for i in range(3)]    # 97 % used
    roomy = [bookie(10 + i, free=40, ledgers=500) for i in range(4)]
    bookies = full + roomy
    policy = DiskAwarePlacement(seed=3)
    full_ids = {b.bookie_id for b in full}
    for _ in range(300):
        ens = policy.new_ensemble(4, 2, 2, bookies)
        assert not full_ids & set(ens)
        assert policy.replace_bookie(ens[:3], 2, 2, 0, bookies, exclude=frozenset({ens[0]})) == ens[3]
    with pytest.raises(NotEnoughBookiesError) as info:
        policy.new_ensemble(5, 2, 2, bookies)
    msg = str(info.value)
    assert "need 5" in msg and "found 4" in msg and "3 over max_disk_usage" in msg and "95%" in msg
    assert len(DiskAwarePlacement(max_disk_usage=0.99).new_ensemble(7, 2, 2, bookies)) == 7


def test_disk_aware_treats_bookies_without_disk_figures_as_average() -> None:
    bookies = [bookie(0, free=0, total=0), bookie(1, free=10, total=100), bookie(2, free=90, total=100)]
    weights = DiskAwarePlacement().weights(bookies)
    assert weights[0] == pytest.approx(0.5) and weights[1] == pytest.approx(0.1) and weights[2] == pytest.approx(0.9)


# --- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "options", "match"),
    [
        (RackAwarePlacement, {"min_rack_per_write_quorum": 2},
         "placement plugin 'rack-aware': unknown option 'min_rack_per_write_quorum'"),
        (RackAwarePlacement, {"min_racks_per_write_quorum": 0}, "'min_racks_per_write_quorum' = 0 .*integer >= 1"),
        (RackAwarePlacement, {"enforce": "maybe"}, "'enforce' = 'maybe' is not true or false"),
        (RegionAwarePlacement, {"local_region": ""}, "'region-aware': local_region must be a non-empty string"),
        (RegionAwarePlacement, {"default_rack": "rack"}, "'region-aware': default_rack must start with '/'"),
        (DiskAwarePlacement, {"max_disk_usage": 1.5}, "'max_disk_usage' = 1.5 is out of range"),
        (DiskAwarePlacement, {"max_disk_usage": 0}, r"'disk-aware': max_disk_usage must be in \(0, 1\]"),
        (RandomPlacement, {"local_rack": "/a"}, "'random': unknown option 'local_rack'"),
    ],
)
def test_bad_options_are_refused_at_construction(cls: type, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cls(**options)


def test_options_accept_text_from_environment_overrides() -> None:
    policy = RackAwarePlacement(enforce="false", min_racks_per_write_quorum="3")
    assert policy.enforce is False and policy.min_domains == 3
    assert RegionAwarePlacement(enforce="True").enforce is True
    assert DiskAwarePlacement(max_disk_usage="0.9").max_disk_usage == 0.9
    with pytest.raises(ConfigError, match="integer >= 1"):
        RackAwarePlacement(min_racks_per_write_quorum="two")


def test_min_shortfall_depends_only_on_capacities() -> None:
    assert min_shortfall({"x": 3, "y": 3}, 3, 2, 2) == min_shortfall({"p": 5, "q": 9}, 3, 2, 2) == 1
