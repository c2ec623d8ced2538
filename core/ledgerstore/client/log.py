"""Named logs built from ledgers (the seeds' "Ledgers to logs"): the leader's writer and readers.

A log is an ordered list of ledgers in the metadata store (:mod:`ledgerstore.meta.logs`). A writer
becomes the leader by recovering (fencing and closing) every ledger of the list that is not closed,
creating a ledger and appending it to the list by compare-and-set; only then does it accept writes.
It rolls to a new ledger by creating it, CAS-appending it, and only then closing the previous one;
it never appends another ledger before that close succeeded, so only the newest two ledgers of a
log it writes can be open. Readers never fence: they read closed ledgers whole and the open one up
to its last-add-confirmed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import random
from collections.abc import AsyncIterator
from typing import Literal, Protocol

from ledgerstore.api import MetadataStore
from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.read import ReadHandle
from ledgerstore.errors import (
    BadVersionError,
    BookieUnavailableError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerStoreError,
    LogError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.meta.logs import LogManager, LogMetadata, Position, validate_log_name
from ledgerstore.proto.digest import Entry

log = logging.getLogger(__name__)

#: how many times ``open_log`` starts over after losing a compare-and-set to another writer
OPEN_ATTEMPTS = 5
#: after a failed attempt to create the next ledger, wait this long before trying to roll again
_ROLL_RETRY_S = 1.0
#: waits between attempts to close a ledger the writer rolled away from (or is closing): about 6 s
#: in all; after the last one the writer fails rather than add a ledger behind an open one
CLOSE_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
#: ledgers whose metadata a new leader reads at once while looking for ones to recover
_RECOVERY_SCAN_BATCH = 32
#: how long a reader waits at an OPEN ledger that later ledgers follow before it reports it (a
#: roll closes the previous ledger within the writer's close retries; longer means its writer died)
OPEN_LEDGER_GRACE_S = 30.0

StartAt = Position | tuple[int, int] | str | Literal["earliest", "latest"]


class LogClient(Protocol):
    """What logs use of :class:`ledgerstore.client.client.Client`: its public ledger calls, its
    metadata store and its event loop (logs sit above ledgers and see nothing else)."""

    store: MetadataStore | None
    loop: asyncio.AbstractEventLoop

    async def create_ledger(self, ensemble: int | None = None, write_quorum: int | None = None,
                            ack_quorum: int | None = None, digest: str | None = None,
                            password: bytes = b"") -> LedgerHandle:
        """Create a ledger (see ``Client.create_ledger``)."""
        ...

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """Open a ledger for reading, recovering it first when ``recovery`` (see ``Client.open_ledger``)."""
        ...

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata."""
        ...

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """A ledger's metadata as stored."""
        ...


@dataclasses.dataclass(frozen=True)
class LedgerSettings:
    """How the ledgers of a log are created."""

    ensemble: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    digest: str | None = None
    password: bytes = b""


def _log_manager(client: LogClient) -> LogManager:
    # writers and readers are made by a started client, and a started client has its store
    assert client.store is not None, "the client is not started"
    return LogManager(client.store)


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
        self._logs = _log_manager(client)
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
    logs = _log_manager(client)
    for attempt in range(OPEN_ATTEMPTS):
        if attempt:
            await asyncio.sleep(random.uniform(0.01, 0.05) * attempt)  # duelling writers: spread out
        md = await logs.get_or_create(name) if create else await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist; pass create=True to create it")
        if not await _recover_ledgers(client, logs, md, settings.password, await _unclosed(client, md)):
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


async def _unclosed(client: LogClient, md: LogMetadata) -> list[int]:
    """The log's ledgers that must be recovered before a new leader writes: the last two always
    (their writer may still be adding), and every older one whose metadata is not CLOSED. A writer
    never rolls past a ledger it failed to close, but a writer of an older release did, and a
    reader stops at such a ledger until someone closes it (DistributedLog likewise recovers every
    in-progress segment of a log, not only the last)."""
    ids = md.ledger_ids
    tail = ids[-2:]
    older = ids[:-2]
    found: list[int] = []
    for i in range(0, len(older), _RECOVERY_SCAN_BATCH):
        chunk = older[i:i + _RECOVERY_SCAN_BATCH]
        got = await asyncio.gather(*(client.ledger_metadata(lid) for lid in chunk), return_exceptions=True)
        for lid, lmd in zip(chunk, got, strict=True):
            if isinstance(lmd, NoSuchLedgerError):
                found.append(lid)  # _recover_ledgers tells a damaged list from a changed one
            elif isinstance(lmd, BaseException):
                raise lmd
            elif not lmd.is_closed:
                found.append(lid)
    return [*found, *tail]


async def _fence_tail(client: LogClient, logs: LogManager, md: LogMetadata, password: bytes) -> bool:
    """Fence (recover and close) the last two ledgers. False if the list changed meanwhile."""
    return await _recover_ledgers(client, logs, md, password, md.ledger_ids[-2:])


async def _recover_ledgers(client: LogClient, logs: LogManager, md: LogMetadata, password: bytes,
                           ids: list[int]) -> bool:
    """Recover and close ``ids`` (ledgers of ``md``) in log order. False if the list changed meanwhile."""
    for lid in ids:
        try:
            await client.open_ledger(lid, password, recovery=True)
        except NoSuchLedgerError:
            fresh = await logs.read(md.name)
            if fresh is None or fresh.version != md.version:
                return False
            raise LogError(
                f"log {md.name!r} lists ledger {lid}, which does not exist: the log metadata is damaged") from None
    return True


async def fence_and_delete_log(client: LogClient, name: str, password: bytes) -> None:
    """Delete a log: fence its tail (so a live writer stops), delete its key by CAS, then its ledgers."""
    logs = _log_manager(client)
    while True:
        md = await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist")
        if not await _fence_tail(client, logs, md, password):
            continue
        try:
            await logs.delete(md)
        except BadVersionError:
            continue
        break
    for lid in [*md.deleting, *md.ledger_ids]:
        await _delete_quietly(client, lid)


async def _delete_quietly(client: LogClient, ledger_id: int) -> None:
    try:
        await client.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass  # already gone (an earlier, interrupted truncation or deletion got this far)


async def truncate_log(client: LogClient, name: str, before: Position | tuple[int, int] | str) -> list[int]:
    """Delete the whole ledgers that lie entirely before ``before`` and return their ids. The list
    is changed by CAS first (ledgers move to ``deleting``), then the ledgers are deleted, then
    ``deleting`` is cleared, so an interrupted truncation is finished by the next one. The last
    ledger of the log is never deleted."""
    pos = Position.coerce(before)
    logs = _log_manager(client)
    while True:
        md = await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist")
        drop: list[int] = []
        for lid in md.ledger_ids[:-1]:
            if lid < pos.ledger_id:
                drop.append(lid)
            elif lid == pos.ledger_id:
                lmd = await client.ledger_metadata(lid)
                if lmd.is_closed and lmd.last_entry_id < pos.entry_id:
                    drop.append(lid)
                break
            else:
                break
        tb = md.truncated_before
        new_tb = pos if tb is None or pos > tb else tb
        if not drop and new_tb == tb and not md.deleting:
            return []
        candidate = dataclasses.replace(
            md, segments=[s for s in md.segments if s.ledger_id not in drop], truncated_before=new_tb,
            deleting=sorted({*md.deleting, *drop}))
        try:
            md = await logs.write(candidate)
        except BadVersionError:
            continue
        break
    for lid in md.deleting:
        await _delete_quietly(client, lid)
    done = set(md.deleting)
    while True:
        try:
            await logs.write(dataclasses.replace(md, deleting=[x for x in md.deleting if x not in done]))
            break
        except BadVersionError:
            fresh = await logs.read(name)
            if fresh is None:
                break
            md = fresh
    return drop


# --- reading ------------------------------------------------------------------------------------


class LogReader:
    """Reads a log in order, across its ledgers, without fencing anything.

    ``async for position, payload in reader`` reads what is in the log now and stops; ``tail()``
    (or ``follow=True``) keeps waiting for new entries and new ledgers. ``read_batch(n)`` returns up
    to ``n`` entries (an empty list when nothing more is available yet). The open ledger is read up
    to its last-add-confirmed: its newest entry becomes visible once the writer adds another entry,
    rolls or closes.

    A ledger that is still OPEN although later ledgers follow it (a roll closing it, or a writer
    that stopped before it could) is never skipped: iteration waits there until it is closed, and
    one that does not follow the log raises :class:`~ledgerstore.errors.LogError` after
    :attr:`open_ledger_grace_s` instead of ending short of the rest of the log.
    """

    def __init__(self, client: LogClient, name: str, password: bytes, md: LogMetadata, index: int, next_entry: int,
                 *, follow: bool, poll_interval_s: float, batch_size: int) -> None:
        self.client = client
        self.name = name
        self._password = password
        self._logs = _log_manager(client)
        self._md = md
        self._idx = index
        self._next = next_entry
        self._rh: ReadHandle | None = None
        self._buf: collections.deque[tuple[Position, bytes]] = collections.deque()
        self.follow = follow
        self.poll_interval_s = poll_interval_s
        self.batch_size = batch_size
        #: how long iteration without ``follow`` waits at an OPEN ledger that later ledgers follow
        self.open_ledger_grace_s = OPEN_LEDGER_GRACE_S
        #: (position, since when, warned) while stopped at such a ledger
        self._blocked: tuple[Position, float, bool] | None = None

    @property
    def position(self) -> Position | None:
        """Position of the next entry this reader returns (None when it waits for a new ledger)."""
        if self._buf:
            return self._buf[0][0]
        if self._idx < len(self._md.segments):
            return Position(self._md.segments[self._idx].ledger_id, self._next)
        return None

    @property
    def blocked_at(self) -> Position | None:
        """Where this reader waits at an OPEN ledger that later ledgers follow (None otherwise):
        its writer is closing it, or failed to and the next leader will recover it."""
        return None if self._blocked is None else self._blocked[0]

    async def read_batch(self, max_entries: int = 1000) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` next entries in log order; ``[]`` if none is available right now."""
        if max_entries < 1:
            raise InvalidArgumentError(f"max_entries must be at least 1, got {max_entries}")
        if not self._buf:
            await self._fetch(max_entries)
        n = min(max_entries, len(self._buf))
        return [self._buf.popleft() for _ in range(n)]

    async def _refresh_log(self) -> None:
        md = await self._logs.read(self.name)
        if md is None:
            raise LogError(f"log {self.name!r} was deleted")
        current = self._md.segments[self._idx].ledger_id if self._idx < len(self._md.segments) else None
        if current is not None and current not in md.ledger_ids:
            raise LogError(f"log {self.name!r}: ledger {current}, which this reader is on "
                           f"(position {self.position}), was truncated away")
        # ledgers are only added at the end, removed from the front: re-find our place
        if current is not None:
            self._idx = md.ledger_ids.index(current)
        else:
            old_ids = set(self._md.ledger_ids)
            self._idx = sum(1 for lid in md.ledger_ids if lid in old_ids)
        self._md = md

    async def _handle(self) -> ReadHandle:
        if self._rh is None:
            lid = self._md.segments[self._idx].ledger_id
            try:
                self._rh = await self.client.open_ledger(lid, self._password, recovery=False)
            except NoSuchLedgerError:
                await self._refresh_log()  # raises if it was truncated away
                raise
        return self._rh

    async def _fetch(self, max_entries: int) -> None:
        """Fill the buffer with up to ``max_entries`` entries, moving to later ledgers as needed."""
        refreshed = False
        while True:
            if self._idx >= len(self._md.segments):
                if refreshed:
                    return
                await self._refresh_log()
                refreshed = True
                continue
            rh = await self._handle()
            end = rh.last_add_confirmed
            if self._next > end and not rh.is_closed:
                end = await rh.read_last_add_confirmed()
            if self._next <= end:
                last = min(end, self._next + max_entries - 1)
                entries = await self._read(rh, self._next, last)
                lid = rh.ledger_id
                self._buf.extend((Position(lid, e.entry_id), e.payload) for e in entries)
                self._next = last + 1
                self._blocked = None
                return
            if rh.is_closed:
                if self._idx + 1 < len(self._md.segments):
                    self._idx += 1
                    self._next = 0
                    self._rh = None
                    self._blocked = None
                    continue
                if refreshed:
                    return
                await self._refresh_log()
                refreshed = True
                continue
            # caught up with an open ledger: if the log moved on, it is about to be closed (a roll)
            # or was fenced (a takeover); its true end is in its metadata once closed
            if self._idx + 1 >= len(self._md.segments) and not refreshed:
                await self._refresh_log()
                refreshed = True
            if self._idx + 1 < len(self._md.segments):
                self._rh = None
                fresh = await self._handle()
                if fresh.is_closed or fresh.last_add_confirmed >= self._next:
                    continue
                self._note_blocked(Position(fresh.ledger_id, self._next))
            return

    def _note_blocked(self, pos: Position) -> None:
        now = self.client.loop.time()
        if self._blocked is None or self._blocked[0] != pos:
            self._blocked = (pos, now, False)
        elif not self._blocked[2] and now - self._blocked[1] >= self.open_ledger_grace_s:
            self._blocked = (pos, self._blocked[1], True)
            log.warning("log %s: reader waits at %s: ledger %d is still OPEN although later ledgers follow it; "
                        "open the log as a writer to recover it", self.name, pos, pos.ledger_id)

    async def _await_more(self, follow: bool) -> bool:
        """Fill the buffer, waiting as needed. False once a reader that does not follow has read
        everything that is in the log now, which is never at an OPEN ledger that later ledgers
        follow: there it waits for the close and after the grace period raises LogError."""
        while not self._buf:
            await self._fetch(self.batch_size)
            if self._buf:
                break
            if follow:
                await self.wait()
                continue
            if self._blocked is None:
                return False
            pos, since, _ = self._blocked
            remaining = since + self.open_ledger_grace_s - self.client.loop.time()
            if remaining <= 0:
                raise LogError(
                    f"log {self.name!r}: ledger {pos.ledger_id} is still OPEN after {self.open_ledger_grace_s:g} s "
                    "although later ledgers follow it: its writer rolled past it without closing it, or stopped "
                    f"during a roll. This reader stays at {pos} rather than skip the rest of that ledger; open "
                    "the log as a writer (client.open_log) to recover it, then read on")
            await self.wait(remaining)
        return True

    async def _next_batch(self, follow: bool) -> list[tuple[Position, bytes]] | None:
        """The next entries (up to ``batch_size``), waiting as :meth:`_await_more` does; None at the end."""
        if not await self._await_more(follow):
            return None
        n = min(self.batch_size, len(self._buf))
        return [self._buf.popleft() for _ in range(n)]

    async def _read(self, rh: ReadHandle, first: int, last: int) -> list[Entry]:
        try:
            return await rh.read(first, last)
        except (NoSuchEntryError, BookieUnavailableError):
            if rh.is_closed:
                raise
            # an open ledger may have changed ensemble since this handle read its metadata
            self._rh = None
            fresh = await self._handle()
            return await fresh.read(first, last)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until more entries may be available (long-polls the open ledger's LAC; polls the
        ledger list). True if :meth:`read_batch` now has something."""
        deadline = None if timeout is None else self.client.loop.time() + timeout
        while True:
            batch_ready = bool(self._buf) or await self._peek()
            if batch_ready:
                return True
            remaining = self.poll_interval_s if deadline is None else min(self.poll_interval_s,
                                                                           deadline - self.client.loop.time())
            if remaining <= 0:
                return False
            rh = self._rh
            if rh is not None and not rh.is_closed and self._idx < len(self._md.segments):
                started = self.client.loop.time()
                lac = await rh.wait_for_lac(self._next - 1, timeout=remaining)
                if lac < self._next and not rh.is_closed and self.client.loop.time() - started < remaining / 2:
                    # bookies answer at once for a ledger being recovered: do not spin meanwhile
                    await asyncio.sleep(min(remaining, 0.05))
            else:
                await asyncio.sleep(remaining)

    def _unread(self, items: list[tuple[Position, bytes]]) -> None:
        """Put entries handed out but not consumed back in front (for the sync iterator)."""
        self._buf.extendleft(reversed(items))

    async def _peek(self) -> bool:
        await self._fetch(self.batch_size)
        return bool(self._buf)

    def __aiter__(self) -> AsyncIterator[tuple[Position, bytes]]:
        return self._iterate(self.follow)

    def tail(self) -> AsyncIterator[tuple[Position, bytes]]:
        """Iterate forever: every entry from the reader's position on, waiting for new ones."""
        return self._iterate(True)

    async def _iterate(self, follow: bool) -> AsyncIterator[tuple[Position, bytes]]:
        while await self._await_more(follow):
            yield self._buf.popleft()

    async def close(self) -> None:
        """Release the reader (nothing is held on the bookies)."""
        self._rh = None
        self._buf.clear()

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_log_reader(client: LogClient, name: str, start: StartAt, password: bytes, *, follow: bool,
                          poll_interval_s: float, batch_size: int) -> LogReader:
    """A reader positioned at ``start``: ``"earliest"`` (the truncation point, or the first entry
    still stored), ``"latest"`` (after the last confirmed entry), or a position (the first entry at
    or after it; :class:`~ledgerstore.errors.LogError` if that part was truncated away)."""
    validate_log_name(name)
    if poll_interval_s <= 0 or batch_size < 1:
        raise InvalidArgumentError("poll_interval_s must be positive and batch_size at least 1")
    md = await _log_manager(client).read(name)
    if md is None:
        raise LogError(f"log {name!r} does not exist")
    ids = md.ledger_ids

    def mk(index: int, entry: int) -> LogReader:
        return LogReader(client, name, password, md, index, entry, follow=follow,
                         poll_interval_s=poll_interval_s, batch_size=batch_size)

    if start == "earliest":
        tb = md.truncated_before
        if tb is not None and tb.ledger_id in ids:
            return mk(ids.index(tb.ledger_id), tb.entry_id)
        return mk(0, 0)
    if start == "latest":
        if not ids:
            return mk(0, 0)
        rh = await client.open_ledger(ids[-1], password, recovery=False)
        return mk(len(ids) - 1, rh.last_add_confirmed + 1)
    if isinstance(start, str) and ":" not in start:
        raise InvalidArgumentError(f"start must be 'earliest', 'latest' or a position 'ledger:entry', not {start!r}")
    pos = Position.coerce(start)
    if ids and pos.ledger_id < ids[0]:
        raise LogError(f"position {pos} of log {name!r} was truncated away: the log now starts at ledger {ids[0]}")
    for i, lid in enumerate(ids):
        if lid >= pos.ledger_id:
            return mk(i, pos.entry_id if lid == pos.ledger_id else 0)
    return mk(len(ids), 0)


__all__ = ["LedgerSettings", "LogReader", "LogWriter", "Position", "open_log_reader", "open_log_writer",
           "truncate_log", "fence_and_delete_log"]
