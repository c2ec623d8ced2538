"""Ledger recovery (the seeds' "closing a ledger as a reader", BookKeeper's ``LedgerRecoveryOp``):
fence the last fragment, read forward with fencing reads, write back what is found, close by
compare-and-set."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Collection, Iterable
from typing import Any

from ledgerstore.client.context import ClientContext
from ledgerstore.client.metrics import CLIENT_METRICS, timed
from ledgerstore.client.read import READ_MULTI_ENTRIES, ReadHandle
from ledgerstore.errors import (
    BadVersionError,
    DigestMismatchError,
    LedgerRecoveryError,
    LedgerStateUnknownError,
    LedgerStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
)
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.plugins import notify

log = logging.getLogger(__name__)

#: entries whose fencing reads are in flight at once while recovery reads forward; it still
#: writes back and stops in entry order
READ_AHEAD = 16


class _MetadataMoved(Exception):
    """The ledger's metadata changed under a recovery in a way it cannot merge: start again."""


@timed(CLIENT_METRICS.recover_seconds)
async def recover(ctx: ClientContext, md: LedgerMetadata, password: bytes, *,
                  exclude: Collection[str] = ()) -> LedgerMetadata:
    """Fence the ledger, find its last entry, re-replicate the tail and close it (the seeds'
    "closing a ledger as a reader", BookKeeper's LedgerRecoveryOp). Concurrent recoverers converge
    on one last entry.

    The ensemble recovered is the one the metadata names, failed bookies included (they just do
    not answer). A bookie that fails a write-back is replaced through the placement policy (never
    by one of ``exclude``), in this recovery's memory only: the new fragment is written together
    with the close, by compare-and-set. Metadata changed by someone else meanwhile (other than a
    close by a concurrent recoverer, which stands) makes the recovery start again.
    """
    mgr = ctx.ledgers
    while True:
        while md.state is LedgerState.OPEN:
            try:
                md = await mgr.write(LedgerMetadata(**{**md.__dict__, "state": LedgerState.IN_RECOVERY}))
            except BadVersionError:
                md = await mgr.read(md.ledger_id)
        if md.is_closed:
            return md
        try:
            return await _LedgerRecovery(ctx, md, password, frozenset(exclude)).run()
        except _MetadataMoved:
            md = await mgr.read(md.ledger_id)


class _LedgerRecovery:
    """One attempt at recovering an IN_RECOVERY ledger: fence, read forward, write back, close."""

    def __init__(self, ctx: ClientContext, md: LedgerMetadata, password: bytes, exclude: frozenset[str]) -> None:
        self.ctx = ctx
        self.md = md
        self.handle = ReadHandle(ctx, md, password)
        self.key = self.handle.master_key
        self.need = md.write_quorum - md.ack_quorum + 1
        self.exclude = exclude
        #: the fragments as this recovery will close the ledger with them (changed in memory only)
        self.ensembles: list[tuple[int, list[str]]] = [(f, list(b)) for f, b in md.ensembles]
        self.failed: set[str] = set()

    async def run(self) -> LedgerMetadata:
        md = self.md
        lac = await self._fence()
        # Everything before the last fragment was acknowledged before the ensemble change that
        # started it, so reading starts in the current fragment even when the bookies' LACs lag
        # behind it (BookKeeper #2615): recovery never rewrites an earlier fragment.
        start = max(lac + 1, md.ensembles[-1][0], 0)
        eid = start
        tail_length = 0
        # the fencing reads of the next entries are in flight while one is written back; the
        # decisions are taken one entry at a time, in order, as without the read-ahead
        ahead: collections.deque[asyncio.Future[tuple[bytes, bytes] | None]] = collections.deque()
        try:
            while True:
                while len(ahead) < READ_AHEAD:
                    ahead.append(asyncio.ensure_future(self._read(eid + len(ahead))))
                entry = await ahead.popleft()
                if entry is None:
                    break
                await self._write_back(eid, entry[0])
                tail_length += len(entry[1])
                eid += 1
        finally:
            _discard(ahead)
        last = eid - 1
        length = await self._prefix_length(start) + tail_length
        return await self._close(last, length)

    async def _fence(self) -> int:
        """Fence every bookie of the last fragment as the metadata names it; wait for
        Qw−Qa+1 answers in every write quorum. Returns the highest LAC they reported."""
        md = self.md
        ensemble = md.ensembles[-1][1]
        e_size, qw = md.ensemble_size, md.write_quorum
        timeout = self.ctx.config.read_timeout_s
        read_lac = self.ctx.bookie_client.read_lac
        results = await asyncio.gather(*(read_lac(b, md.ledger_id, timeout, fence_key=self.key) for b in ensemble),
                                       return_exceptions=True)
        ok = [False] * e_size
        lac = -1
        for i, r in enumerate(results):
            if not isinstance(r, BaseException):
                ok[i] = True
                lac = max(lac, r)
            elif isinstance(r, NoSuchLedgerError | LedgerStateUnknownError):
                # fenced (a bookie with the ledger in limbo records the fence durably before it
                # answers), with no LAC to tell: reading forward from a lower LAC is only longer
                ok[i] = True
            elif isinstance(r, UnauthorizedAccessError):
                raise UnauthorizedAccessError(
                    f"bookie {ensemble[i]} refused the password while fencing ledger {md.ledger_id}")
        for start in range(e_size):
            quorum = [(start + j) % e_size for j in range(qw)]
            if sum(ok[i] for i in quorum) < self.need:
                errs = [f"{ensemble[i]}: {results[i]}" for i in quorum if not ok[i]]
                raise LedgerRecoveryError(
                    f"cannot fence ledger {md.ledger_id}: write quorum {[ensemble[i] for i in quorum]} gave fewer "
                    f"than {self.need} answers ({'; '.join(errs)})")
        return lac

    async def _read(self, eid: int) -> tuple[bytes, bytes] | None:
        """Read ``eid`` from its write set (as the writer wrote it) with the fence flag, so every
        bookie that answers is fenced by then (BookKeeper #2614). Returns the signed bytes and
        the payload, or None once ``need`` replicas said they lack it (then it cannot have been
        acknowledged). A replica that answers UNKNOWN (the ledger is in limbo there: it lost data
        and cannot tell) is no vote either way: with too few votes left the attempt fails, and
        the ledger stays open for a later one, never closed short."""
        md = self.md
        _, ensemble = md.ensemble_for(eid)
        timeout = self.ctx.config.read_timeout_s
        read = self.ctx.bookie_client.read
        owner: dict[asyncio.Future[bytes], str] = {asyncio.ensure_future(read(ensemble[i], md.ledger_id, eid, timeout, fence_key=self.key)): ensemble[i]
                 for i in md.write_set(eid)}
        pending: set[asyncio.Future[bytes]] = set(owner)
        missing = unknown = 0
        errors: list[str] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for f in done:
                    bid = owner[f]
                    exc = f.exception()
                    if exc is None:
                        data = f.result()
                        try:
                            entry = self.handle.digest.verify(data, eid)
                        except DigestMismatchError as dexc:
                            errors.append(f"{bid}: {dexc}")
                            continue
                        return data, entry.payload
                    if isinstance(exc, NoSuchEntryError | NoSuchLedgerError):
                        missing += 1
                    elif isinstance(exc, LedgerStateUnknownError):
                        unknown += 1
                        errors.append(f"{bid}: in limbo, cannot tell")
                    elif isinstance(exc, UnauthorizedAccessError):
                        raise UnauthorizedAccessError(
                            f"bookie {bid} refused the password while recovering ledger {md.ledger_id}")
                    else:
                        errors.append(f"{bid}: {exc}")
                if missing >= self.need:
                    return None
        finally:
            _discard(pending)
        raise LedgerRecoveryError(
            f"recovery of ledger {md.ledger_id} cannot tell whether entry {eid} exists: {missing} replicas lack it "
            f"(need {self.need} to be sure), {unknown} cannot tell, errors: {'; '.join(errors)}")

    async def _write_back(self, eid: int, data: bytes) -> None:
        """Write a found entry to its whole write set with recovery adds (they pass the fence).
        A bookie that fails is replaced (in this recovery's memory) and the entry sent to its
        replacement, so the entry ends on Qw bookies; with no replacement to be had, Qa acks do."""
        md = self.md
        timeout = self.ctx.config.add_timeout_s
        add = self.ctx.bookie_client.recovery_add
        ws = md.write_set(eid)
        acked: set[int] = set()
        while True:
            ensemble = self.ensembles[self._fragment_of(eid)][1]
            targets = [i for i in ws if i not in acked]
            results = await asyncio.gather(*(add(ensemble[i], md.ledger_id, eid, self.key, data, timeout)
                                             for i in targets), return_exceptions=True)
            failed: list[int] = []
            reasons: list[str] = []
            for i, r in zip(targets, results, strict=True):
                if not isinstance(r, BaseException):
                    acked.add(i)
                    continue
                if isinstance(r, UnauthorizedAccessError):
                    raise UnauthorizedAccessError(
                        f"bookie {ensemble[i]} refused the master key while recovering ledger {md.ledger_id}")
                failed.append(i)
                reasons.append(f"{ensemble[i]}: {r}")
            if not failed:
                return
            try:
                await self._replace(eid, failed)
            except NotEnoughBookiesError as exc:
                if len(acked) >= md.ack_quorum:
                    log.warning("recovery of ledger %d: entry %d is on %d of %d bookies (%s) and no replacement "
                                "is available (%s)", md.ledger_id, eid, len(acked), len(ws), "; ".join(reasons), exc)
                    return
                raise LedgerRecoveryError(
                    f"recovery of ledger {md.ledger_id}: entry {eid} re-replicated to {len(acked)} bookies, fewer "
                    f"than the ack quorum {md.ack_quorum} ({'; '.join(reasons)}), and no replacement: {exc}") from exc

    def _fragment_of(self, eid: int) -> int:
        """Index in :attr:`ensembles` of the fragment holding ``eid``."""
        return max(k for k, (first, _) in enumerate(self.ensembles) if first <= eid or k == 0)

    async def _replace(self, eid: int, idxs: list[int]) -> None:
        """Replace the bookies at ``idxs`` from entry ``eid`` on: in place when the fragment
        starts at ``eid`` (nothing of it was written before), else as a new fragment."""
        md = self.md
        k = self._fragment_of(eid)
        first, ensemble = self.ensembles[k]
        new = list(ensemble)
        bookies = await self.ctx.bookie_infos(max_age=0)
        for i in idxs:
            self.failed.add(new[i])
        for i in idxs:
            # chosen one after another against the ensemble as it becomes: never the same twice
            new[i] = self.ctx.ensemble_placement.replace_bookie(
                new, md.write_quorum, md.ack_quorum, i, bookies, exclude=frozenset(self.failed | self.exclude))
        log.info("recovery of ledger %d: from entry %d, %s replaced by %s", md.ledger_id, eid,
                 [ensemble[i] for i in idxs], [new[i] for i in idxs])
        if first == eid:
            self.ensembles[k] = (eid, new)
        else:
            self.ensembles.insert(k + 1, (eid, new))

    async def _prefix_length(self, start: int) -> int:
        """Payload bytes of entries ``0..start-1`` (acknowledged before recovery began): read
        them back, which also shows they are readable. A ledger is never closed with a length it
        does not know (a closed ledger never changes): a failed read fails this recovery, which
        the caller retries."""
        if start <= 0:
            return 0
        self.handle.advance_lac(start - 1)
        total = 0
        try:
            async for entry in self.handle.iter_entries(0, start - 1, batch=READ_MULTI_ENTRIES):
                total += len(entry.payload)
        except LedgerStoreError as exc:
            raise LedgerRecoveryError(f"recovery of ledger {self.md.ledger_id}: cannot read entries 0..{start - 1} "
                                      f"to learn its length ({exc}); try again once they are readable") from exc
        return total

    async def _close(self, last: int, length: int) -> LedgerMetadata:
        """Close at ``last`` by CAS, with this recovery's fragments. A concurrent recoverer's close
        stands; any other change to the metadata means starting again."""
        mgr = self.ctx.ledgers
        md = self.md
        ensembles = self.ensembles
        while True:
            candidate = LedgerMetadata(**{**md.__dict__, "state": LedgerState.CLOSED, "last_entry_id": last,
                                          "length": length, "ensembles": ensembles})
            try:
                md = await mgr.write(candidate)
            except BadVersionError:
                fresh = await mgr.read(md.ledger_id)
                if fresh.is_closed:
                    return fresh
                if fresh.state is LedgerState.IN_RECOVERY and fresh.ensembles == self.md.ensembles:
                    md = fresh  # rewritten with the same fragments (another recoverer's state CAS): retry
                    continue
                raise _MetadataMoved() from None
            notify("ledgerstore_ledger_closed", ledger_id=md.ledger_id, last_entry_id=last, recovered=True)
            return md


def _discard(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel reads no longer needed; the failure of one that already ended is not reported."""
    for f in futures:
        if not f.cancel() and not f.cancelled():
            f.exception()
