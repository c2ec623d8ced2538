"""A log's single leader (the seeds' "Ledgers to logs"): becoming it, appending in position
order across rolls, rolling and closing. A writer becomes the leader by recovering (fencing and
closing) every ledger of the list that is not closed (:mod:`.tail`), creating a ledger and
appending it to the list by compare-and-set; only then does it accept writes. It rolls to a new
ledger by creating it, CAS-appending it, and only then closing the previous one; it never
appends another ledger before that close succeeded, so only the newest two ledgers of a log it
writes can be open."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random

from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.log.base import LedgerSettings, LogClient, log_manager
from ledgerstore.client.log.tail import recover_ledgers, unclosed
from ledgerstore.errors import (
    BadVersionError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerStoreError,
    LogError,
)
from ledgerstore.meta.logs import LogMetadata, Position, validate_log_name

log = logging.getLogger(__name__)

#: how many times ``open_log`` starts over after losing a compare-and-set to another writer
OPEN_ATTEMPTS = 5
#: after a failed attempt to create the next ledger, wait this long before trying to roll again
_ROLL_RETRY_S = 1.0
#: waits between attempts to close a ledger the writer rolled away from (or is closing): about 6 s
#: in all; after the last one the writer fails rather than add a ledger behind an open one
CLOSE_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)


class _Segment:
    """One ledger of this writer's leadership, and the bookkeeping that keeps acknowledgements in
    log order across a roll: entries of a ledger are *held* until every entry of the previous
    ledger has been acknowledged (or failed)."""

    __slots__ = ("lh", "ledger_id", "bytes", "started", "outstanding", "sealed", "waiting", "held",
                 "error", "successor")

    def __init__(self, lh: LedgerHandle, waiting: bool, started: float) -> None:
        self.lh = lh
        self.ledger_id = lh.ledger_id
        self.bytes = 0
        self.started = started
        self.outstanding = 0  # entries whose caller-facing future is not resolved yet
        self.sealed = False  # no more appends (the writer rolled past it or closed)
        self.waiting = waiting  # True while the previous segment still has unresolved entries
        self.held: collections.deque[tuple[asyncio.Future[Position], asyncio.Future[int]]] = collections.deque()
        self.error: LedgerStoreError | None = None
        self.successor: _Segment | None = None


class LogWriter:
    """The leader of a log. Obtain with ``await client.open_log(name)``.

    ``append`` / ``append_async`` return the entry's :class:`Position`; acknowledgements complete in
    position order, across rolls too. After another writer takes the log over, the next add fails
    with :class:`~ledgerstore.errors.LedgerFencedError` (whose outcome is *unknown*, not "not
    written"), and so does every later call: open the log again to write more.
    """

    def __init__(self, client: LogClient, md: LogMetadata, lh: LedgerHandle, settings: LedgerSettings,
                 roll_size_bytes: int | None, roll_interval_s: float | None) -> None:
        self.client = client
        self.name = md.name
        self._md = md
        self._settings = settings
        self._roll_size = roll_size_bytes
        self._roll_interval = roll_interval_s
        self._seg = _Segment(lh, waiting=False, started=client.loop.time())
        self._error: LedgerStoreError | None = None
        self._closed = False
        self._roll_task: asyncio.Task[None] | None = None
        self._roll_not_before = 0.0
        self._closers: set[asyncio.Task[None]] = set()
        self._last: Position | None = None
        self._logs = log_manager(client)
        self._roll_failure: LedgerStoreError | None = None
        self._newest: asyncio.Future[Position] | None = None

    # --- properties ----------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        """The ledger new entries go to."""
        return self._seg.ledger_id

    @property
    def ledger_ids(self) -> list[int]:
        """The log's ledgers as this writer last wrote them to the store."""
        return self._md.ledger_ids

    @property
    def last_position(self) -> Position | None:
        """Position of the last entry acknowledged to this writer's callers."""
        return self._last

    @property
    def error(self) -> LedgerStoreError | None:
        """Why this writer stopped accepting writes, if it did."""
        return self._error

    # --- appending -----------------------------------------------------------------------------

    def append_async(self, payload: bytes) -> asyncio.Future[Position]:
        """Queue an add. The future resolves to the entry's position once it is acknowledged and
        every earlier entry of the log was acknowledged. Call on the client's event loop."""
        loop = self.client.loop
        outer: asyncio.Future[Position] = loop.create_future()
        if self._error is not None:
            outer.set_exception(self._error)
            return outer
        if self._closed:
            outer.set_exception(LedgerClosedError(f"log writer for {self.name!r} is closed; open the log again"))
            return outer
        seg = self._seg
        inner = seg.lh.append_async(payload)
        self._newest = outer
        seg.outstanding += 1
        seg.bytes += len(payload)
        inner.add_done_callback(functools.partial(self._on_added, seg, outer))
        if self._roll_task is None and self._roll_due(seg):
            self._roll_task = loop.create_task(self._roll(), name=f"roll log {self.name}")
        return outer

    async def append(self, payload: bytes) -> Position:
        """Add one entry and wait for its acknowledgement; returns its position."""
        return await self.append_async(payload)

    async def flush(self) -> None:
        """Wait until every add made so far is resolved and any roll in progress has finished
        (the previous ledger closed). Errors are not raised here: they belong to the adds."""
        while True:
            if self._newest is not None and not self._newest.done():
                await asyncio.wait([self._newest])
            elif self._roll_task is not None:
                await asyncio.wait([self._roll_task])
            elif self._closers:
                await asyncio.wait(list(self._closers))
            else:
                return

    def _roll_due(self, seg: _Segment) -> bool:
        now = self.client.loop.time()  # the loop's clock, so a simulated writer rolls on virtual time
        if self._roll_size is not None and seg.bytes >= self._roll_size:
            return now >= self._roll_not_before
        if self._roll_interval is not None and now - seg.started >= self._roll_interval:
            return now >= self._roll_not_before
        return False

    def _on_added(self, seg: _Segment, outer: asyncio.Future[Position], inner: asyncio.Future[int]) -> None:
        if seg.waiting:
            seg.held.append((outer, inner))
        else:
            self._deliver(seg, outer, inner, None)

    def _deliver(self, seg: _Segment, outer: asyncio.Future[Position], inner: asyncio.Future[int],
                 inherited: LedgerStoreError | None) -> None:
        exc = inner.exception()
        cause = inherited if inherited is not None else self._error
        if exc is None and cause is None:
            pos = Position(seg.ledger_id, inner.result())
            self._last = pos
            if not outer.done():
                outer.set_result(pos)
        else:
            if exc is None:
                # written to its ledger, but this writer already failed (an earlier entry failed, or
                # it lost the log): an acknowledgement now would follow a failure, so the outcome is
                # reported as unknown, with the same error class
                assert cause is not None
                err: LedgerStoreError = type(cause)(
                    f"entry {inner.result()} of ledger {seg.ledger_id} (log {self.name!r}) may or may not be "
                    f"in the log: this writer failed before it was acknowledged ({cause})")
            elif isinstance(exc, LedgerStoreError):
                err = exc
            else:
                err = LogError(f"add to ledger {seg.ledger_id} of log {self.name!r} failed: {exc!r}")
            if seg.error is None:
                seg.error = err
            self._fail(err)
            if not outer.done():
                outer.set_exception(err)
        seg.outstanding -= 1
        if seg.sealed and seg.outstanding == 0:
            self._settled(seg)

    def _settled(self, seg: _Segment) -> None:
        """Every entry of ``seg`` is resolved: release the next ledger's held acknowledgements."""
        nxt = seg.successor
        if nxt is None or not nxt.waiting:
            return
        nxt.waiting = False
        inherited = seg.error
        if inherited is not None and nxt.error is None:
            nxt.error = inherited
        while nxt.held:
            outer, inner = nxt.held.popleft()
            self._deliver(nxt, outer, inner, nxt.error)

    def _fail(self, err: LedgerStoreError) -> None:
        if self._error is None:
            self._error = err

    # --- rolling -------------------------------------------------------------------------------

    async def roll(self) -> int:
        """Roll to a new ledger now (create it, CAS-append it, then close the previous one).
        Returns the new ledger's id."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LedgerClosedError(f"log writer for {self.name!r} is closed")
        before = self.ledger_id
        if self._roll_task is None:
            self._roll_task = self.client.loop.create_task(self._roll(), name=f"roll log {self.name}")
        await asyncio.shield(self._roll_task)
        if self._error is not None:
            raise self._error
        if self.ledger_id == before:
            raise LogError(f"log {self.name!r}: could not roll past ledger {before}: {self._roll_failure}")
        return self.ledger_id

    async def _roll(self) -> None:
        try:
            await self._do_roll()
        finally:
            self._roll_task = None

    async def _do_roll(self) -> None:
        if self._closers:
            # the previous roll's ledger must be closed before another joins the list, so at most
            # two ledgers of the log (the newest two) are ever open at once
            await asyncio.wait(list(self._closers))
        if self._error is not None or self._closed:
            return  # e.g. that close failed for good: no ledger may follow an open one
        old = self._seg
        s = self._settings
        try:
            new_lh = await self.client.create_ledger(s.ensemble, s.write_quorum, s.ack_quorum, s.digest, s.password)
        except LedgerStoreError as exc:
            # not fatal: keep writing to the current ledger and try again a little later
            self._roll_not_before = self.client.loop.time() + _ROLL_RETRY_S
            self._roll_failure = exc
            log.warning("log %s: cannot create the next ledger (%s); staying on ledger %d", self.name, exc,
                        old.ledger_id)
            return
        if self._error is not None or self._closed:
            await self._discard(new_lh)  # failed or closed while creating it: it was never listed
            return
        try:
            appended = await self._append_to_list(new_lh)
        except LedgerStoreError as exc:
            # the CAS outcome is unknown: the ledger may be in the list, so it must not be deleted;
            # if it is, it is the last one and the next leader fences it
            self._fail(exc)
            return
        if not appended:
            await self._discard(new_lh)
            return
        if self._error is not None or self._closed:
            # failed or closed meanwhile: the new ledger is in the list, so close it (empty)
            await self._close_quietly(new_lh)
            return
        # switch: from here on, appends go to the new ledger; the old one is sealed
        nxt = _Segment(new_lh, waiting=old.outstanding > 0, started=self.client.loop.time())
        old.successor = nxt
        old.sealed = True
        self._seg = nxt
        closer = self.client.loop.create_task(self._close_sealed(old), name=f"close ledger {old.ledger_id}")
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    async def _append_to_list(self, new_lh: LedgerHandle) -> bool:
        """CAS-append ``new_lh`` to the log. False (and the writer failed) if another writer took
        the log over, so the new ledger was never listed and may be deleted."""
        md = self._md
        old_id = self._seg.ledger_id
        while True:
            if md.last_ledger_id != old_id:
                self._fail(LedgerFencedError(
                    f"log {self.name!r} was taken over by another writer: its last ledger is "
                    f"{md.last_ledger_id}, not this writer's {old_id}"))
                return False
            try:
                self._md = await self._logs.write(md.with_ledger(new_lh.ledger_id))
                return True
            except BadVersionError:
                fresh = await self._logs.read(self.name)
                if fresh is None:
                    self._fail(LogError(f"log {self.name!r} was deleted while this writer was rolling it"))
                    return False
                if fresh.last_ledger_id == new_lh.ledger_id:  # an earlier attempt did land
                    self._md = fresh
                    return True
                md = fresh  # e.g. a truncation changed the list: try again if we still lead

    async def _close_sealed(self, seg: _Segment) -> None:
        try:
            await self._close_ledger(seg.lh)  # waits for its in-flight adds to be acknowledged or fail
        except LedgerStoreError as exc:
            self._fail(exc)
            if seg.error is None:
                seg.error = exc

    async def _close_ledger(self, lh: LedgerHandle) -> None:
        """Close ``lh`` in metadata, retrying a failed write with backoff. A ledger left open
        behind a later one would end every reader there and stay open after the next leader's
        takeover, so when the retries run out this raises a :class:`LogError` that stops the
        writer. A fenced ledger is not retried: another writer took the log over."""
        for delay in (*CLOSE_RETRY_DELAYS_S, None):
            try:
                await lh.close()
                return
            except LedgerFencedError:
                raise
            except LedgerStoreError as exc:
                if delay is None:
                    raise LogError(
                        f"log {self.name!r}: ledger {lh.ledger_id} could not be closed after "
                        f"{len(CLOSE_RETRY_DELAYS_S) + 1} attempts (last error: {exc}); this writer stopped "
                        "so that no ledger follows an open one in the log. Open the log again "
                        "(client.open_log) to recover it and write on") from exc
                log.warning("log %s: closing ledger %d failed (%s); retrying in %.2f s", self.name,
                            lh.ledger_id, exc, delay)
                await asyncio.sleep(delay)

    async def _discard(self, lh: LedgerHandle) -> None:
        try:
            await self.client.delete_ledger(lh.ledger_id)
        except LedgerStoreError as exc:
            log.warning("log %s: could not delete unused ledger %d (%s); it is an orphan", self.name,
                        lh.ledger_id, exc)

    async def _close_quietly(self, lh: LedgerHandle) -> None:
        try:
            await lh.close()
        except LedgerStoreError as exc:
            log.warning("log %s: closing ledger %d failed: %s", self.name, lh.ledger_id, exc)

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for in-flight adds, then close the current ledger. Closing a writer that already
        failed only releases it (errors were reported by its adds; a new leader closes the ledgers)."""
        if self._closed:
            return
        self._closed = True
        if self._roll_task is not None:
            await asyncio.shield(self._roll_task)
        if self._closers:  # in log order: the ledger rolled away from first
            await asyncio.gather(*self._closers)
        seg = self._seg
        seg.sealed = True
        try:
            await self._close_ledger(seg.lh)
        except LedgerFencedError:
            if self._error is None:
                raise

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_log_writer(client: LogClient, name: str, settings: LedgerSettings, *, roll_size_bytes: int | None,
                          roll_interval_s: float | None, create: bool) -> LogWriter:
    """Become the log's leader (the seeds' "Opening a log"): read the list, recover every ledger
    of it that is not closed (the last two, and any older one a failed writer left open), create a
    ledger, CAS-append it. A lost CAS deletes the new ledger and starts over, at most
    :data:`OPEN_ATTEMPTS` times."""
    validate_log_name(name)
    if roll_size_bytes is not None and roll_size_bytes <= 0:
        raise InvalidArgumentError(f"roll_size_bytes must be positive, got {roll_size_bytes}")
    if roll_interval_s is not None and roll_interval_s <= 0:
        raise InvalidArgumentError(f"roll_interval_s must be positive, got {roll_interval_s}")
    logs = log_manager(client)
    for attempt in range(OPEN_ATTEMPTS):
        if attempt:
            await asyncio.sleep(random.uniform(0.01, 0.05) * attempt)  # duelling writers: spread out
        md = await logs.get_or_create(name) if create else await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist; pass create=True to create it")
        if not await recover_ledgers(client, logs, md, settings.password, await unclosed(client, md)):
            continue
        lh = await client.create_ledger(settings.ensemble, settings.write_quorum, settings.ack_quorum,
                                        settings.digest, settings.password)
        try:
            md = await logs.write(md.with_ledger(lh.ledger_id))
        except BadVersionError:
            try:
                await client.delete_ledger(lh.ledger_id)
            except LedgerStoreError as exc:
                log.warning("log %s: could not delete unused ledger %d (%s)", name, lh.ledger_id, exc)
            continue
        return LogWriter(client, md, lh, settings, roll_size_bytes, roll_interval_s)
    raise LogError(
        f"could not open log {name!r} for writing: its ledger list changed under this writer {OPEN_ATTEMPTS} "
        "times in a row (another writer is opening or rolling it); make sure only one process leads the log")
