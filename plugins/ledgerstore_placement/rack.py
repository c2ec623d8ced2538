"""The ``rack-aware`` placement policy: every write quorum spans several racks."""

from __future__ import annotations

import dataclasses
from typing import Any

from ledgerstore.api import BookieInfo, option
from ledgerstore_placement.domains import FaultDomainPlacement

__all__ = ["RackAwarePlacement"]


class RackAwarePlacement(FaultDomainPlacement):
    """Orders each ensemble so that every write quorum spans at least
    ``min(min_racks_per_write_quorum, write_quorum)`` racks, after BookKeeper's
    RackawareEnsemblePlacementPolicy.

    Options: ``min_racks_per_write_quorum`` (default 2), ``enforce`` (default true; false places
    best effort when the racks cannot meet the constraint), ``local_rack`` (read from bookies of
    this rack first), ``seed``.
    """

    name = "rack-aware"
    domain = "rack"
    rack_aware = True

    @dataclasses.dataclass(frozen=True)
    class Options(FaultDomainPlacement.Options):
        """The ``placement_options`` table of the rack-aware policy."""

        min_racks_per_write_quorum: int = option(2, "racks every write quorum spans (capped at its size)",
                                                 minimum=1)
        local_rack: str | None = option(None, "the reader's rack: its bookies are read first")

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        super().__init__(options, **values)
        #: the reader's rack: its bookies are read first
        self.local_rack: str | None = self.options.local_rack

    def domain_of(self, bookie: BookieInfo) -> str:
        """The bookie's rack."""
        return bookie.rack

    def locality(self, bookie: BookieInfo) -> int:
        """0 for a bookie in ``local_rack``, 1 otherwise."""
        return 0 if self.local_rack is not None and bookie.rack == self.local_rack else 1
