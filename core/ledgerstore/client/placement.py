"""Where a client places ledgers (BookKeeper's ``BookieWatcher`` over its
``EnsemblePlacementPolicy``): the configured :class:`~ledgerstore.api.PlacementPolicy` asked
through the client's :class:`~ledgerstore.client.health.BookieHealth`, so that new ensembles and
replacements leave quarantined bookies out while enough others exist.

Creating a ledger, a writer's ensemble change, recovery and the re-replication worker all choose
bookies here, through the client context's ``ensemble_placement``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from ledgerstore.api import BookieInfo, PlacementPolicy
from ledgerstore.client.health import BookieHealth
from ledgerstore.errors import NotEnoughBookiesError

log = logging.getLogger(__name__)

T = TypeVar("T")


class EnsemblePlacement:
    """The placement ``policy`` of one client, avoiding what its ``health`` quarantined."""

    def __init__(self, policy: PlacementPolicy, health: BookieHealth) -> None:
        self.policy = policy
        self.health = health

    def new_ensemble(self, ensemble_size: int, write_quorum: int, ack_quorum: int, bookies: Sequence[BookieInfo],
                     exclude: frozenset[str] = frozenset()) -> list[str]:
        """``policy.new_ensemble`` avoiding the quarantined bookies while enough others exist.

        Raises :class:`~ledgerstore.errors.NotEnoughBookiesError` when even the quarantined
        bookies are too few."""
        return self._avoiding(exclude, functools.partial(
            self.policy.new_ensemble, ensemble_size, write_quorum, ack_quorum, bookies))

    def replace_bookie(self, ensemble: Sequence[str], write_quorum: int, ack_quorum: int, index: int,
                       bookies: Sequence[BookieInfo], exclude: frozenset[str] = frozenset()) -> str:
        """``policy.replace_bookie`` for ``ensemble[index]``, avoiding the quarantined bookies
        while enough others exist.

        Raises :class:`~ledgerstore.errors.NotEnoughBookiesError` when no bookie outside the
        ensemble and ``exclude`` is left."""
        return self._avoiding(exclude, functools.partial(
            self.policy.replace_bookie, list(ensemble), write_quorum, ack_quorum, index, bookies))

    def _avoiding(self, exclude: frozenset[str], choose: Callable[[frozenset[str]], T]) -> T:
        # as BookKeeper's BookieWatcher: quarantined bookies excluded first; if that leaves too
        # few, chosen among them rather than fail
        quarantined = self.health.quarantined - exclude
        if quarantined:
            try:
                return choose(exclude | quarantined)
            except NotEnoughBookiesError:
                log.debug("not enough healthy bookies; using quarantined ones (%s)", sorted(quarantined))
        return choose(exclude)
