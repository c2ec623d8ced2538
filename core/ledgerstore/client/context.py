"""What a ledger handle and a recovery see of the client (BookKeeper's ``ClientContext``): the
metadata managers, the ensemble placement, the bookie client and the configuration, never the
whole :class:`~ledgerstore.client.client.Client`. Tests hand a handle any object with these."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from ledgerstore.api import BookieInfo
from ledgerstore.client.bookie_client import BookieClient
from ledgerstore.client.placement import EnsemblePlacement
from ledgerstore.config import ClientConfig
from ledgerstore.meta.ledgers import LedgerManager


class ClientContext(Protocol):
    """The narrow view of a client that ledger handles and recoveries work against."""

    config: ClientConfig
    ledgers: LedgerManager
    #: chooses new ensembles and replacements (the placement policy under the bookies' health)
    ensemble_placement: EnsemblePlacement
    bookie_client: BookieClient
    loop: asyncio.AbstractEventLoop

    async def bookie_infos(self, max_age: float = 1.0) -> list[BookieInfo]:
        """Registered bookies (writable and read-only), cached for ``max_age`` seconds."""
        ...

    def read_order(self, ensemble: Sequence[str], write_set: Sequence[int]) -> list[int]:
        """Indexes of ``write_set`` in the order its bookies should be asked for a read."""
        ...
