"""The round-robin policy: ledgerstore's placement conformance suite, then its own promises.

The policy is loaded through its entry point, as ledgerstore loads it, so these tests also prove
the distribution is installed and registered correctly.
"""

from __future__ import annotations

from collections import Counter

import pytest

from ledgerstore.api import PlacementPolicy
from ledgerstore.errors import ConfigError
from ledgerstore.plugins import installed, load_driver
from ledgerstore.testing import PlacementPolicyConformance
from ledgerstore.testing.placement import make_bookies
from ledgerstore_example_plugin import RoundRobinPlacement


class TestRoundRobinPlacement(PlacementPolicyConformance):
    @pytest.fixture
    def policy(self) -> PlacementPolicy:
        return load_driver("placement", "round-robin")()


def test_entry_point_names_this_class() -> None:
    assert "round-robin" in installed("placement")
    assert load_driver("placement", "round-robin") is RoundRobinPlacement


def test_ensembles_rotate_one_bookie_at_a_time() -> None:
    bookies = make_bookies(5)
    ids = sorted(b.bookie_id for b in bookies)
    policy = RoundRobinPlacement()
    first, second = policy.new_ensemble(3, 2, 2, bookies), policy.new_ensemble(3, 2, 2, bookies)
    assert first == ids[0:3]
    assert second == ids[1:4]


def test_every_writable_bookie_gets_the_same_share() -> None:
    bookies = make_bookies(7, read_only=frozenset({2}))
    policy = RoundRobinPlacement(start=3)
    counts = Counter(b for _ in range(60) for b in policy.new_ensemble(3, 3, 2, bookies))
    assert bookies[2].bookie_id not in counts
    assert set(counts.values()) == {30}  # 60 ledgers x 3 bookies over 6 writable bookies


def test_replacement_rotates_over_bookies_outside_the_ensemble() -> None:
    bookies = make_bookies(6)
    policy = RoundRobinPlacement()
    ensemble = policy.new_ensemble(3, 2, 2, bookies)
    picks = {policy.replace_bookie(ensemble, 2, 2, 0, bookies) for _ in range(6)}
    assert picks == {b.bookie_id for b in bookies} - set(ensemble)


def test_unknown_or_bad_option_is_a_config_error_naming_the_plugin_and_option() -> None:
    with pytest.raises(ConfigError, match="placement plugin 'round-robin': unknown option 'rack_aware'"):
        RoundRobinPlacement(rack_aware=True)
    with pytest.raises(ConfigError, match="placement plugin 'round-robin': option 'start' = 'two' is not an integer"):
        RoundRobinPlacement(start="two")


def test_the_policy_is_built_from_the_options_ledgerstore_parsed() -> None:
    bookies = make_bookies(4)
    policy = RoundRobinPlacement(RoundRobinPlacement.Options(start=2))
    assert policy.new_ensemble(2, 2, 2, bookies) == [bookies[2].bookie_id, bookies[3].bookie_id]
