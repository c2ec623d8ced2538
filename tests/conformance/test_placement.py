import pytest

from ledgerstore.plugins import load_driver
from ledgerstore.testing import PlacementPolicyConformance


class TestRandomPlacement(PlacementPolicyConformance):
    @pytest.fixture
    def policy(self):
        return load_driver("placement", "random")()
