"""The client's bookie health check (BookKeeper's ``bookieHealthCheck``): errors are counted per
bookie where requests are answered; every ``health_check_interval_s`` the bookies whose count
reached ``bookie_error_threshold_per_interval`` are quarantined for ``bookie_quarantine_time_s``,
and new ensembles and replacements avoid them while enough other bookies exist
(:class:`~ledgerstore.client.placement.EnsemblePlacement`).

The check obeys a cluster-wide switch kept where BookKeeper keeps it: a ``/disableHealthCheck``
key in the metadata store (present = disabled; ``ledgerstore shell healthcheck``). It is read at
every check; while it is set nothing is quarantined and every quarantine is lifted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from ledgerstore.api import MetadataStore
from ledgerstore.client.metrics import CLIENT_METRICS, ClientMetrics
from ledgerstore.errors import (
    BookieIOError,
    BookieUnavailableError,
    LedgerStoreError,
    NoSuchKeyError,
    ProtocolError,
)
from ledgerstore.proto.codec import Status

log = logging.getLogger(__name__)

#: BookKeeper's key: present = the clients' periodic bookie health check is disabled cluster-wide
HEALTH_CHECK_DISABLED = "/disableHealthCheck"

#: answers that say something about the request, not about the bookie's health (BookKeeper's
#: ``expectedBkOperationErrors``), and throttling (a bookie that answers it is alive and sheds
#: load on purpose): they are never counted
PROTOCOL_ANSWERS = frozenset({Status.OK, Status.UNAUTHORIZED, Status.BAD_VERSION, Status.FENCED,
                              Status.READ_ONLY, Status.TOO_MANY_REQUESTS, Status.NO_SUCH_LEDGER,
                              Status.NO_SUCH_ENTRY})
#: failures that count against a bookie: no answer in time, a lost or refused connection, an IO
#: error, a malformed exchange
COUNTED_ERRORS = (BookieUnavailableError, BookieIOError, ProtocolError)


async def health_check_enabled(store: MetadataStore) -> bool:
    """True unless the health check was disabled cluster-wide (``shell healthcheck -enable false``)."""
    return await store.get(HEALTH_CHECK_DISABLED) is None


async def set_health_check(store: MetadataStore, enabled: bool) -> None:
    """Enable (delete the key) or disable (create it) the periodic health check cluster-wide."""
    if enabled:
        try:
            await store.delete(HEALTH_CHECK_DISABLED)
        except NoSuchKeyError:
            pass  # already enabled
    else:
        await store.put(HEALTH_CHECK_DISABLED, json.dumps({"disabled_at": time.time()}).encode())


def counts_as_error(error: BaseException | int) -> bool:
    """Whether a failed request (its exception, or the non-OK status the bookie answered) counts
    against the bookie's health."""
    if isinstance(error, int):
        return error not in PROTOCOL_ANSWERS
    return isinstance(error, COUNTED_ERRORS)


class BookieHealth:
    """Error counts of the current interval and the quarantined bookies of one client.

    ``record_error`` is the :class:`~ledgerstore.client.channel.ChannelPool` ``on_error`` hook;
    ``clock`` (seconds, monotonic) decides when quarantines end."""

    def __init__(self, metrics: ClientMetrics = CLIENT_METRICS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.clock = clock
        self._errors: dict[str, int] = {}
        self._quarantined: dict[str, float] = {}  # bookie -> end of its quarantine

    def record_error(self, bookie_id: str, error: BaseException | int) -> None:
        """Count one failed request to ``bookie_id`` if it says the bookie is unhealthy."""
        if counts_as_error(error):
            self._errors[bookie_id] = self._errors.get(bookie_id, 0) + 1

    def error_count(self, bookie_id: str) -> int:
        """Errors counted against ``bookie_id`` in the current interval."""
        return self._errors.get(bookie_id, 0)

    def take_faulty(self, threshold: int) -> list[str]:
        """End the interval: the bookies whose error count reached ``threshold`` (as BookKeeper's
        ``getFaultyBookies``), sorted; every count starts again from zero."""
        counts, self._errors = self._errors, {}
        return sorted(b for b, n in counts.items() if n >= threshold)

    def quarantine(self, bookie_id: str, seconds: float) -> bool:
        """Quarantine ``bookie_id`` for ``seconds``; False if it already was (its end is kept, as
        BookKeeper's quarantine cache does not extend an entry)."""
        if bookie_id in self.quarantined:
            return False
        self._quarantined[bookie_id] = self.clock() + seconds
        self.metrics.bookie_quarantines += 1
        self._publish()
        log.warning("bookie %s quarantined for %.0f s because of read/write errors", bookie_id, seconds)
        return True

    def release_all(self) -> None:
        """Lift every quarantine (the health check was disabled cluster-wide)."""
        if self._quarantined:
            log.info("health check disabled: quarantine of %s lifted", sorted(self._quarantined))
        self._quarantined.clear()
        self._publish()

    @property
    def quarantined(self) -> frozenset[str]:
        """Bookies in quarantine now."""
        self.expire()
        return frozenset(self._quarantined)

    def expire(self) -> None:
        """Drop the quarantines that ended."""
        now = self.clock()
        expired = [b for b, end in self._quarantined.items() if end <= now]
        for b in expired:
            del self._quarantined[b]
            log.info("bookie %s leaves quarantine", b)
        if expired:
            self._publish()

    def _publish(self) -> None:
        self.metrics.quarantined_bookies[id(self)] = len(self._quarantined)

    def close(self) -> None:
        """Forget this client's figures (its client closed)."""
        self._quarantined.clear()
        self.metrics.quarantined_bookies.pop(id(self), None)


class HealthChecker:
    """Every ``interval_s`` seconds: read the cluster-wide switch; if enabled, quarantine the
    faulty bookies of the interval, else lift every quarantine. Counts restart each interval."""

    def __init__(self, health: BookieHealth, store: MetadataStore, interval_s: float, threshold: int,
                 quarantine_s: float) -> None:
        self.health = health
        self.store = store
        self.interval_s = interval_s
        self.threshold = threshold
        self.quarantine_s = quarantine_s
        #: checks done so far (tests wait on it)
        self.checks = 0
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> list[str]:
        """One check; returns the bookies it newly quarantined."""
        faulty = self.health.take_faulty(self.threshold)
        try:
            enabled = await health_check_enabled(self.store)
        finally:
            self.checks += 1
        if not enabled:
            self.health.release_all()
            return []
        self.health.expire()
        return [b for b in faulty if self.health.quarantine(b, self.quarantine_s)]

    @property
    def running(self) -> bool:
        """Whether the periodic check runs (started, with an ``interval_s`` above 0)."""
        return self._task is not None

    def start(self) -> None:
        """Run the periodic check on the running loop (nothing when ``interval_s`` is 0)."""
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="bookie-health-check")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except LedgerStoreError as exc:  # the metadata store is unreachable: try next interval
                log.warning("bookie health check skipped: %s", exc)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
