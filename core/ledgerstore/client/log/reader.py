"""Reading a log in order, across its ledgers, without fencing anything: closed ledgers whole,
the open one up to its last-add-confirmed, and tailing for new entries and new ledgers. Entries
of format 2 ledgers lose their header here (:mod:`.entry`); :meth:`LogReader.records` shows the
producer and sequence it carried."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from typing import Literal

from ledgerstore.client.log.base import LogClient, log_manager
from ledgerstore.client.log.entry import LogRecord, decode, is_sequenced_format
from ledgerstore.client.read import ReadHandle
from ledgerstore.errors import (
    BookieUnavailableError,
    InvalidArgumentError,
    LogError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from ledgerstore.meta.logs import LogMetadata, Position, validate_log_name
from ledgerstore.proto.digest import Entry

log = logging.getLogger(__name__)

#: how long a reader waits at an OPEN ledger that later ledgers follow before it reports it (a
#: roll closes the previous ledger within the writer's close retries; longer means its writer died)
OPEN_LEDGER_GRACE_S = 30.0

#: where a reader starts: a position (or ``(ledger, entry)``, or ``"ledger:entry"``), the
#: earliest entry still stored, or after the latest confirmed one
StartAt = Position | tuple[int, int] | str | Literal["earliest", "latest"]


class LogReader:
    """Reads a log in order, across its ledgers, without fencing anything.

    ``async for position, payload in reader`` reads what is in the log now and stops; ``tail()``
    (or ``follow=True``) keeps waiting for new entries and new ledgers. ``records()`` iterates
    the same way over :class:`~ledgerstore.client.log.entry.LogRecord` (position, payload,
    producer_id, seq), from the same cursor. ``read_batch(n)`` returns up
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
        self._logs = log_manager(client)
        self._md = md
        self._idx = index
        self._next = next_entry
        self._rh: ReadHandle | None = None
        self._buf: collections.deque[LogRecord] = collections.deque()
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
        pop = self._buf.popleft
        return [pop()[:2] for _ in range(n)]

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
                if is_sequenced_format(rh.md.custom):
                    self._buf.extend(LogRecord(Position(lid, e.entry_id), *decode(e.payload))
                                     for e in entries)
                else:
                    self._buf.extend(LogRecord(Position(lid, e.entry_id), e.payload, None, None) for e in entries)
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

    async def _peek(self) -> bool:
        await self._fetch(self.batch_size)
        return bool(self._buf)

    def __aiter__(self) -> AsyncIterator[tuple[Position, bytes]]:
        return self._iterate(self.follow)

    def tail(self) -> AsyncIterator[tuple[Position, bytes]]:
        """Iterate forever: every entry from the reader's position on, waiting for new ones."""
        return self._iterate(True)

    async def records(self, follow: bool | None = None) -> AsyncIterator[LogRecord]:
        """Iterate as ``async for`` does (``follow``: as :meth:`tail` does; default: the reader's
        ``follow``), yielding :class:`~ledgerstore.client.log.entry.LogRecord` s: each entry's
        position, payload, and the producer and sequence it was appended with (None, None for
        one appended without a sequence or written by an older release)."""
        buf = self._buf
        while await self._await_more(self.follow if follow is None else follow):
            yield buf.popleft()

    async def _iterate(self, follow: bool) -> AsyncIterator[tuple[Position, bytes]]:
        buf = self._buf
        while await self._await_more(follow):
            rec = buf.popleft()
            yield rec[0], rec[1]

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
    md = await log_manager(client).read(name)
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
