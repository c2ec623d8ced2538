"""The ``round-robin`` placement policy: ensembles rotate through the writable bookies in order.

Ledger 1 goes to bookies 0..E-1 (sorted by id), ledger 2 to 1..E, and so on, so over many ledgers
every writable bookie takes the same share, whatever its rack, region or free space.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from ledgerstore.api import BookieInfo, PlacementPolicy, option
from ledgerstore.errors import NotEnoughBookiesError

__all__ = ["RoundRobinPlacement"]

class RoundRobinPlacement(PlacementPolicy):
    """Consecutive writable bookies (sorted by id), starting one further on for every ensemble.

    Option ``start`` (int, default 0): the position of the first ensemble's first bookie.
    """

    name = "round-robin"

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``placement_options`` table. ledgerstore checks it when the configuration loads and
        parses it once into this object, which the constructor receives; cross-field checks would
        go in ``__post_init__`` (raise ``ValueError``)."""

        start: int = option(0, "the position of the first ensemble's first bookie")

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        # The base class keeps the parsed Options as self.options (keyword arguments, for a
        # policy built in code, are parsed by the same rules).
        super().__init__(options, **values)
        self._next: int = self.options.start
        # One policy serves every ledger a client creates, possibly from several threads.
        self._lock = threading.Lock()

    @staticmethod
    def _writable(bookies: Sequence[BookieInfo], exclude: frozenset[str]) -> list[str]:
        return sorted(b.bookie_id for b in bookies if not b.read_only and b.bookie_id not in exclude)

    def _advance(self, modulo: int) -> int:
        with self._lock:
            position = self._next % modulo
            self._next = position + 1
            return position

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> list[str]:
        """The next ``ensemble_size`` writable bookies in rotation."""
        candidates = self._writable(bookies, exclude)
        if len(candidates) < ensemble_size:
            raise NotEnoughBookiesError(
                f"round-robin placement needs {ensemble_size} writable bookies for the ensemble, "
                f"found {len(candidates)} ({len(bookies)} registered, {len(exclude)} excluded, "
                f"{sum(b.read_only for b in bookies)} read-only)"
            )
        first = self._advance(len(candidates))
        return [candidates[(first + i) % len(candidates)] for i in range(ensemble_size)]

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        ack_quorum: int,
        index: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """The next writable bookie in rotation that is not in the ensemble."""
        candidates = self._writable(bookies, exclude | frozenset(ensemble))
        if not candidates:
            raise NotEnoughBookiesError(
                f"round-robin placement found no writable bookie outside the ensemble to replace "
                f"{ensemble[index]} ({len(bookies)} registered, ensemble of {len(ensemble)}, {len(exclude)} excluded)"
            )
        return candidates[self._advance(len(candidates))]
