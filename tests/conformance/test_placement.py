"""Every first-party placement policy passes the shared conformance suite.

``random`` is loaded by its entry point; the others are imported directly so this file does not
depend on their entry points being declared. The suite builds 2 racks / 2 regions and asks for an
ensemble of 3 with write quorum 2: no order of 3 bookies over 2 racks gives each of the 3 cyclic
write quorums 2 racks, so the fault-domain policies run here with ``enforce = false`` (their
enforced behaviour is covered in tests/unit/test_placement_policies.py). The suite's bookies use
94-99 % of their disks, so ``disk-aware`` runs with ``max_disk_usage = 1.0``.
"""

from __future__ import annotations

import pytest

from ledgerstore.api import PlacementPolicy
from ledgerstore.plugins import load_driver
from ledgerstore.testing import PlacementPolicyConformance
from ledgerstore_placement import DiskAwarePlacement, RackAwarePlacement, RegionAwarePlacement

POLICIES = {
    "random": lambda: load_driver("placement", "random")(),
    "rack-aware": lambda: RackAwarePlacement(),
    "rack-aware-3": lambda: RackAwarePlacement(enforce=False, min_racks_per_write_quorum=3),
    "region-aware": lambda: RegionAwarePlacement(),
    "disk-aware": lambda: DiskAwarePlacement(),
}


class TestPlacementPolicies(PlacementPolicyConformance):
    @pytest.fixture(params=sorted(POLICIES))
    def policy(self, request: pytest.FixtureRequest) -> PlacementPolicy:
        return POLICIES[request.param]()
