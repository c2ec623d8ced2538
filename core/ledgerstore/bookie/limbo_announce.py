"""A bookie's limbo count in its registration: how the auditor learns that the bookie is repairing
its limbo ledgers itself (``ledgerstore.bookie.repair``) and leaves them to it.

The bookie registers with :attr:`~ledgerstore.api.BookieInfo.ledgers_in_limbo` set from its
first registration on (limbo is entered before the bookie registers). As the repair takes
ledgers out of limbo, :class:`LimboAnnouncer` registers the bookie again: at once when the count
reaches zero (the auditor checks the bookie's replicas again only from then on), otherwise at
most once every :data:`ANNOUNCE_INTERVAL_S`, so a repair of thousands of small ledgers does not
write the registration thousands of times. A registration that fails is tried again at the
next change, or after the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ledgerstore.errors import LedgerStoreError

__all__ = ["ANNOUNCE_INTERVAL_S", "LimboAnnouncer"]

log = logging.getLogger(__name__)

#: at most one re-registration this often while the count falls (reaching zero is published at
#: once): the count is for the auditor, whose replicas check runs hours apart, not a progress bar
ANNOUNCE_INTERVAL_S = 5.0


class LimboAnnouncer:
    """Registers the bookie again when its limbo count changes (``await run()``; cancel to stop)."""

    def __init__(self, count: Callable[[], int], register: Callable[[], Awaitable[None]],
                 interval_s: float = ANNOUNCE_INTERVAL_S) -> None:
        """``count``: the ledgers in limbo now; ``register``: publishes the registration (which
        reports the count it carried to :meth:`published`, as every registration of the bookie does)."""
        self._count, self._register = count, register
        self.interval_s = interval_s
        #: the count the registration carries, as last published (None: not yet, or it failed)
        self.published_count: int | None = None
        #: registrations this announcer wrote (a metric of its throttle)
        self.announcements = 0
        self._last = -float("inf")
        self._changed = asyncio.Event()
        self._zero = asyncio.Event()

    def published(self, count: int | None) -> None:
        """The registration was just written carrying ``count`` (None: the attempt failed)."""
        self.published_count = count
        if count is not None:
            self._last = self.clock()

    @staticmethod
    def clock() -> float:
        """The running loop's clock (virtual in the simulation, so a seed replays exactly)."""
        return asyncio.get_running_loop().time()

    def changed(self) -> None:
        """The limbo count may have changed: publish it (now if it is zero, else within the interval)."""
        self._changed.set()
        if self._count() == 0:
            self._zero.set()

    async def run(self) -> None:
        """Publish changes of the count until cancelled."""
        failing = ""
        while True:
            await self._changed.wait()
            wait = self._last + self.interval_s - self.clock()
            if wait > 0 and self._count() != 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._zero.wait(), wait)
            self._changed.clear()
            self._zero.clear()
            if self._count() == self.published_count:
                continue
            try:
                await self._register()
            except Exception as exc:
                # the announcer outlives any one failure: if it ended, the registration would keep
                # a count above zero and the auditor would leave the bookie alone for too long
                if str(exc) != failing:
                    log.warning("could not publish the limbo count in the registration (retried every %.0fs): %s",
                                self.interval_s, exc, exc_info=not isinstance(exc, LedgerStoreError))
                    failing = str(exc)
                await asyncio.sleep(self.interval_s)
                self._changed.set()
                continue
            failing = ""
            self.announcements += 1
