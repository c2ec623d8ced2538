"""Placement policies: ``random``, ``rack-aware``, ``region-aware`` and ``disk-aware``.

Each is registered under the ``ledgerstore.placement`` entry-point group and selected by the
client's ``placement`` setting; ``placement_options`` are passed to its constructor. See
``docs/placement.md``.
"""

from __future__ import annotations

from ledgerstore_placement.disk import DiskAwarePlacement
from ledgerstore_placement.rack import RackAwarePlacement
from ledgerstore_placement.random import RandomPlacement
from ledgerstore_placement.region import RegionAwarePlacement

__all__ = ["DiskAwarePlacement", "RackAwarePlacement", "RandomPlacement", "RegionAwarePlacement"]
