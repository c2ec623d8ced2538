"""The ledger reader: reads with replica fallback and speculation, batched READ_MULTI ranges,
the last-add-confirmed and long-poll tailing."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from time import perf_counter

from ledgerstore.client.context import ClientContext
from ledgerstore.client.metrics import CLIENT_METRICS
from ledgerstore.errors import (
    BookieUnavailableError,
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto.digest import DigestManager, Entry, master_key

#: entries read per round of READ_MULTI requests, and per request
READ_WINDOW = 20_000
READ_MULTI_ENTRIES = 2_000


class ReadHandle:
    """Reads a ledger. Obtained from ``Client.open_ledger``; also the base of the writer."""

    def __init__(self, ctx: ClientContext, md: LedgerMetadata, password: bytes) -> None:
        self.ctx = ctx
        self.md = md
        self.ledger_id = md.ledger_id
        self.digest = DigestManager(md.ledger_id, md.digest_type, password)
        self.master_key = master_key(password)
        self._lac = md.last_entry_id if md.is_closed else -1

    @property
    def last_add_confirmed(self) -> int:
        """Last entry known to be acknowledged (the ledger's last entry once closed)."""
        return self._lac

    def advance_lac(self, entry_id: int) -> int:
        """Learn that every entry up to ``entry_id`` is acknowledged: the last-add-confirmed
        rises to it, never falls (an older answer is ignored). For what knows more than the
        handle: a long poll's answer, a bookie's read-LAC, recovery that found the entries it
        read back. Returns the last-add-confirmed after."""
        if entry_id > self._lac:
            self._lac = entry_id
        return self._lac

    @property
    def is_closed(self) -> bool:
        return self.md.is_closed

    @property
    def metadata(self) -> LedgerMetadata:
        return self.md

    @property
    def length(self) -> int:
        return self.md.length

    # --- reading --------------------------------------------------------------------------------

    async def read(self, first: int, last: int | None = None, *, allow_beyond_lac: bool = False) -> list[Entry]:
        """Entries ``first..last`` inclusive (``last`` defaults to the LAC), verified."""
        if last is None:
            last = self._lac
        if first < 0 or last < first:
            if last == first - 1:
                return []
            raise InvalidArgumentError(f"bad entry range {first}..{last} for ledger {self.ledger_id}")
        if last > self._lac and not allow_beyond_lac:
            if self.md.is_closed:
                raise NoSuchEntryError(
                    f"ledger {self.ledger_id} is closed at entry {self.md.last_entry_id}; asked for up to {last}")
            raise NoSuchEntryError(
                f"entry {last} of ledger {self.ledger_id} is beyond the last add confirmed ({self._lac}); "
                "call read_last_add_confirmed() or pass allow_beyond_lac=True")
        out: list[Entry] = []
        eid = first
        while eid <= last:
            hi = min(last, eid + READ_WINDOW - 1)
            out.extend(await self._read_range(eid, hi))
            eid = hi + 1
        return out

    async def _read_range(self, first: int, last: int) -> list[Entry]:
        """Ask each entry's preferred replica, many entries per READ_MULTI request; anything not
        answered with a valid copy goes through :meth:`read_entry` (fallback, speculation)."""
        started = perf_counter()
        md = self.md
        plan: dict[str, list[int]] = {}
        e_size = md.ensemble_size
        fragments = md.ensembles
        for i, (frag_first, ensemble) in enumerate(fragments):
            frag_last = fragments[i + 1][0] - 1 if i + 1 < len(fragments) else last
            lo, hi = max(first, frag_first), min(last, frag_last)
            if lo > hi:
                continue
            # entries with the same id modulo E share a write set: one preferred replica each
            for r in range(e_size):
                start = lo + (r - lo) % e_size
                if start > hi:
                    continue
                order = self.ctx.read_order(ensemble, md.write_set(start))
                ids = range(start, hi + 1, e_size)
                plan.setdefault(ensemble[order[0]], []).extend(ids)
        timeout = self.ctx.config.read_timeout_s
        lid = self.ledger_id
        read_multi = self.ctx.bookie_client.read_multi
        reads = []
        for bid, wanted in plan.items():
            wanted.sort()
            for i in range(0, len(wanted), READ_MULTI_ENTRIES):
                reads.append(read_multi(bid, lid, wanted[i : i + READ_MULTI_ENTRIES], timeout))
        got: dict[int, Entry] = {}
        verify_into = self.digest.verify_into
        for items in await asyncio.gather(*reads, return_exceptions=True):
            if not isinstance(items, BaseException):
                verify_into(items, got)  # invalid copies are left out: the fallback asks other replicas
        if len(got) != last - first + 1:
            missing = [e for e in range(first, last + 1) if e not in got]
            for e, entry in zip(missing, await asyncio.gather(*(self.read_entry(e) for e in missing)), strict=True):
                got[e] = entry
        CLIENT_METRICS.read_seconds.observe(perf_counter() - started)
        return list(map(got.__getitem__, range(first, last + 1)))

    async def iter_entries(self, first: int = 0, last: int | None = None, batch: int = 1000,
                           read_ahead: int = 1) -> AsyncIterator[Entry]:
        """Iterate entries in batches (bounded memory: ``read_ahead`` more batches are read while
        the caller consumes one, so the bookies work while the caller does)."""
        end = self._lac if last is None else last
        ranges = ((lo, min(end, lo + batch - 1)) for lo in range(first, end + 1, batch))
        ahead: collections.deque[asyncio.Task[list[Entry]]] = collections.deque()
        try:
            for lo, hi in ranges:
                ahead.append(asyncio.ensure_future(self.read(lo, hi)))
                if len(ahead) > read_ahead:
                    for e in await ahead.popleft():
                        yield e
            while ahead:
                for e in await ahead.popleft():
                    yield e
        finally:
            for t in ahead:
                t.cancel()

    async def read_entry(self, entry_id: int, *, fence: bool = False) -> Entry:
        """One entry, from the first replica of its write set that has it with a valid digest;
        a speculative request goes to the next replica if one is slow."""
        md = self.md
        _, ensemble = md.ensemble_for(entry_id)
        order = self.ctx.read_order(ensemble, md.write_set(entry_id))
        config = self.ctx.config
        timeout = config.read_timeout_s
        spec = config.speculative_read_timeout_ms / 1000.0
        fence_key = self.master_key if fence else None
        read = self.ctx.bookie_client.read
        lid = self.ledger_id
        errors: list[str] = []
        missing = 0
        bad_copy = False
        pending: dict[asyncio.Future[bytes], str] = {}
        next_i = 0

        def launch() -> None:
            nonlocal next_i
            bid = ensemble[order[next_i]]
            next_i += 1
            pending[asyncio.ensure_future(read(bid, lid, entry_id, timeout, fence_key=fence_key))] = bid

        launch()
        try:
            while pending:
                wait_for = spec if (spec > 0 and next_i < len(order)) else None
                done, _ = await asyncio.wait(pending, timeout=wait_for, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # speculative: ask the next replica too
                    CLIENT_METRICS.speculative_reads += 1
                    launch()
                    continue
                for fut in done:
                    bid = pending.pop(fut)
                    exc = fut.exception()
                    if exc is None:
                        try:
                            return self.digest.verify(fut.result(), entry_id)
                        except DigestMismatchError as dexc:
                            bad_copy = True
                            errors.append(f"{bid}: {dexc}")
                    elif isinstance(exc, NoSuchEntryError | NoSuchLedgerError):
                        missing += 1
                        errors.append(f"{bid}: {exc}")
                    elif isinstance(exc, UnauthorizedAccessError):
                        raise UnauthorizedAccessError(f"bookie {bid} refused the password for ledger {lid}")
                    else:
                        errors.append(f"{bid}: {exc}")
                if not pending and next_i < len(order):
                    launch()
        finally:
            for fut in pending:
                fut.cancel()
        if missing == len(order):
            raise NoSuchEntryError(f"no replica of ledger {lid} has entry {entry_id} ({'; '.join(errors)})")
        if missing and not bad_copy and fence:
            raise NoSuchEntryError(f"entry {entry_id} of ledger {lid}: {'; '.join(errors)}")
        if bad_copy:
            raise DigestMismatchError(
                f"entry {entry_id} of ledger {lid}: no replica has a valid copy ({'; '.join(errors)})")
        raise BookieUnavailableError(f"cannot read entry {entry_id} of ledger {lid}: {'; '.join(errors)}")

    async def read_last_add_confirmed(self) -> int:
        """Ask the last fragment's bookies for the LAC (for readers of an open ledger)."""
        if self.md.is_closed:
            return self._lac
        ensemble = self.md.current_ensemble
        timeout = self.ctx.config.read_timeout_s
        read_lac = self.ctx.bookie_client.read_lac
        best = self._lac
        ok = 0
        for r in await asyncio.gather(*(read_lac(b, self.ledger_id, timeout) for b in ensemble),
                                      return_exceptions=True):
            if not isinstance(r, BaseException):
                ok += 1
                best = max(best, r)
        if ok == 0:
            await self._refresh_metadata()
            if self.md.is_closed:
                return self._lac
        return self.advance_lac(best)

    async def wait_for_lac(self, known: int, timeout: float = 10.0) -> int:
        """Long-poll: return as soon as the LAC passes ``known`` (or ``timeout`` elapses)."""
        if self._lac > known:
            return self._lac
        if not self.md.is_closed:
            ensemble = self.md.current_ensemble
            poll = self.ctx.bookie_client.long_poll_lac
            limit = timeout + self.ctx.config.read_timeout_s
            pending = {asyncio.ensure_future(poll(b, self.ledger_id, known, timeout, limit)) for b in ensemble}
            try:
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        if not f.exception():
                            self.advance_lac(f.result())
                    if self._lac > known:
                        break
            finally:
                # a poll no longer awaited (answered elsewhere, or the caller cancelled) is
                # withdrawn before returning: none stays pending on its channel
                for f in pending:
                    f.cancel()
                if pending:
                    await asyncio.wait(pending)
        if self._lac <= known:
            await self._refresh_metadata()
        return self._lac

    async def _refresh_metadata(self) -> None:
        md = await self.ctx.ledgers.read(self.ledger_id)
        self.md = md
        if md.is_closed:
            self._lac = md.last_entry_id

    async def close(self) -> None:
        """Release the handle (a reader has nothing to persist)."""


