"""Which bookies the replicas check leaves to repair themselves: those whose registration says they
have ledgers in limbo (:attr:`~ledgerstore.api.BookieInfo.ledgers_in_limbo`, see
``ledgerstore.bookie.limbo_announce``), for as long as they make progress.

A bookie that lost data repairs its limbo ledgers itself (``ledgerstore.bookie.repair``). Were
the replicas check to find it short of those ledgers and mark them, the replication workers
would copy the same fragments elsewhere and swap the bookie out of their ensembles while it
fills itself up: twice the copying, and the bookie's own repair made moot. So while a bookie's
limbo count is above zero its shortfalls are not marked; once it registers zero it is checked
like any other bookie.

A repair can also be stuck for good (an entry with no readable replica elsewhere, a ledger
whose metadata holds no password): the count then stops falling, and a loss the bookie cannot
repair must not stay hidden. :class:`LimboPatience` remembers since when each bookie's count has
not fallen; past ``limbo_patience_s`` the bookie's shortfalls are checked and marked again (the
marker then says, as any stuck marker does, why it cannot be re-replicated either).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ledgerstore.api import BookieInfo

__all__ = ["LimboPatience"]

log = logging.getLogger(__name__)


class LimboPatience:
    """Remembers, across replicas checks, how long each bookie in limbo has gone without progress."""

    def __init__(self, patience_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``patience_s``: how long a bookie's limbo count may stay unchanged before its
        shortfalls are checked again (0: never left to it); ``clock``: the simulation's seam."""
        self.patience_s = patience_s
        self.clock = clock
        #: bookie id -> (its limbo count, when it last fell or rose)
        self._since: dict[str, tuple[int, float]] = {}
        #: bookies reported out of patience (warned once until they progress)
        self._warned: set[str] = set()

    def left_to_repair(self, infos: Iterable[BookieInfo]) -> dict[str, int]:
        """The bookies among ``infos`` whose shortfalls are left to their own repair now, with
        their limbo counts. Also records what changed for the next call."""
        now = self.clock()
        out: dict[str, int] = {}
        for info in sorted(infos, key=lambda i: i.bookie_id):
            bid, count = info.bookie_id, info.ledgers_in_limbo
            if count <= 0 or self.patience_s <= 0:
                # out of limbo: forgotten. A bookie merely unregistered for a while is not: its
                # patience does not start again because it restarted
                self._since.pop(bid, None)
                self._warned.discard(bid)
                continue
            before = self._since.get(bid)
            if before is None or before[0] != count:  # new to limbo, or progress (or a new loss)
                self._since[bid] = (count, now)
                self._warned.discard(bid)
            still = now - self._since[bid][1]
            if still < self.patience_s:
                out[bid] = count
            elif bid not in self._warned:
                self._warned.add(bid)
                log.warning("replicas check: bookie %s has had %d ledgers in limbo for %.0fs without repairing one "
                            "(limbo_patience_s = %g): its shortfalls are checked and marked like any other bookie's",
                            bid, count, still, self.patience_s)
        return out
