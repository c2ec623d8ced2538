"""The ``region-aware`` placement policy: every write quorum spans several regions, and the bookies
of one region are spread over its racks."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerstore.api import BookieInfo, option
from ledgerstore_placement.domains import FaultDomainPlacement

__all__ = ["RegionAwarePlacement"]


class RegionAwarePlacement(FaultDomainPlacement):
    """Orders each ensemble so that every write quorum spans at least
    ``min(min_regions_per_write_quorum, write_quorum)`` regions, after BookKeeper's
    RegionAwareEnsemblePlacementPolicy; within a region, bookies are taken from different racks
    while it has racks left.

    Options: ``min_regions_per_write_quorum`` (default 2), ``enforce`` (default true),
    ``local_region`` and ``local_rack`` (read from the reader's region, and rack within it, first),
    ``seed``.
    """

    name = "region-aware"
    domain = "region"
    rack_aware = True
    region_aware = True

    @dataclasses.dataclass(frozen=True)
    class Options(FaultDomainPlacement.Options):
        """The ``placement_options`` table of the region-aware policy."""

        min_regions_per_write_quorum: int = option(2, "regions every write quorum spans (capped at its size)",
                                                   minimum=1)
        local_region: str | None = option(None, "the reader's region: its bookies are read first")
        local_rack: str | None = option(None, "the reader's rack within local_region: read before the rest")

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        super().__init__(options, **values)
        #: the reader's region: its bookies are read first
        self.local_region: str | None = self.options.local_region
        #: the reader's rack inside ``local_region``: read before the rest of the region
        self.local_rack: str | None = self.options.local_rack

    def domain_of(self, bookie: BookieInfo) -> str:
        """The bookie's region."""
        return bookie.region

    def locality(self, bookie: BookieInfo) -> int:
        """0 for the local rack of the local region, 1 for the rest of the local region, 2 for
        other regions."""
        if self.local_region is None or bookie.region != self.local_region:
            return 2
        return 0 if self.local_rack is not None and bookie.rack == self.local_rack else 1

    def assign_bookies(self, labels: Sequence[str], pools: Mapping[str, list[BookieInfo]]) -> list[str]:
        """Deal each region's bookies rack by rack, so the positions a region fills (consecutive
        ones first) land on as many of its racks as possible."""
        dealt: dict[str, collections.deque[BookieInfo]] = {}
        for region, pool in pools.items():
            racks: dict[str, list[BookieInfo]] = collections.defaultdict(list)
            for b in self._rnd.sample(pool, len(pool)):
                racks[b.rack].append(b)
            order = self._rnd.sample(list(racks.values()), len(racks))
            dealt[region] = collections.deque(
                b for round_ in _round_robin(order) for b in round_
            )
        return [dealt[region].popleft().bookie_id for region in labels]

    def tie_break(self, candidate: BookieInfo, neighbours: Sequence[Sequence[BookieInfo]]) -> int:
        """Prefer a rack the write windows do not already hold in the candidate's region."""
        return sum(
            1 for window in neighbours
            if any(b.region == candidate.region and b.rack == candidate.rack for b in window)
        )


def _round_robin(groups: Sequence[list[BookieInfo]]) -> list[list[BookieInfo]]:
    """Rounds of one bookie per group: [[g0[0], g1[0], ...], [g0[1], g1[1], ...], ...]."""
    depth = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(depth)]
