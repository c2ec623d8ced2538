"""Replication workers: take an under-replicated ledger's marker and move every fragment off its
missing bookies.

For each closed fragment whose ensemble holds a missing bookie, a worker chooses a replacement
with the client's placement policy (writable, not in that fragment's ensemble as it has become,
so two missing bookies never get the same replacement), copies exactly the fragment's entries
whose write set includes the missing bookie's index (read from a surviving replica, digest
verified, written as-is with a recovery add), throttled, and then swaps the bookie in that
fragment by compare-and-set on the ledger metadata (re-reading and redoing the swap on a version
conflict).

A ledger that fails is backed off from, exponentially up to a cap, by every worker alike: the
failure count and its reason live in the marker (see ``stuck.py``). A worker warns once when a
ledger becomes stuck and once when it is re-replicated after all, and retries stuck ledgers at
once when the registered bookies change (a bookie added may be the replacement they lacked).

The last fragment of an open ledger is never swapped: it is left to its writer (who replaces a
failed bookie by an ensemble change) for the grace period, and after that the worker recovers the
ledger exactly as ``open_ledger(recovery=True)`` does: fence and read the ensemble the metadata
names, replace bookies that fail the write-back in the recovery's memory, and commit them with
the close. Then every fragment is closed and is re-replicated as above.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

from ledgerstore.client.client import Client
from ledgerstore.client.recovery import recover
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import (
    BadVersionError,
    LedgerStoreError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from ledgerstore.meta import layout
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.plugins import notify
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager, master_key
from ledgerstore.recovery.markers import (
    MARKERS,
    Marker,
    ReplicationError,
    UnderReplicationManager,
)
from ledgerstore.recovery.stuck import (
    OTHER,
    NoPasswordError,
    NoReadableReplicaError,
    backoff_s,
    no_replacement,
    reason_of,
)

log = logging.getLogger(__name__)

#: batches of one fragment in flight at once (each of ``rereplication_entry_batch_size`` entries)
COPY_BATCHES = 4
#: requests that try to reach a replacement after its swap before it is replaced in turn
CONFIRM_ATTEMPTS = 8


class Throttle:
    """Paces a worker's copies to at most ``entries_per_s`` entries and ``bytes_per_s`` bytes
    per second (``math.inf``: unlimited), shared by all its copies."""

    def __init__(self, entries_per_s: float = math.inf, bytes_per_s: float = math.inf) -> None:
        self.entries_per_s = entries_per_s
        self.bytes_per_s = bytes_per_s
        self._next = 0.0

    async def take(self, entries: int, nbytes: int = 0) -> None:
        """Wait until ``entries`` entries holding ``nbytes`` bytes may be copied."""
        cost = entries / self.entries_per_s + nbytes / self.bytes_per_s
        if cost <= 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = max(now, self._next)
        self._next = at + cost
        if at > now:
            await asyncio.sleep(at - now)


class _TargetFailed(ReplicationError):
    """The replacement bookie refused or failed a copy: choose another."""


class _Deferred(Exception):
    """An open ledger's last fragment is still within its grace period."""

    def __init__(self, until: float) -> None:
        super().__init__(until)
        self.until = until


class ReplicationWorker:
    """Claims markers and re-replicates their ledgers until stopped (``await run()``).

    ``only`` restricts the worker to markers naming one of those bookies, and
    ``obey_switch=False`` makes it work even while auto-recovery is disabled cluster-wide (both
    for the shell's explicit recover and decommission).
    """

    def __init__(self, client: Client, settings: AutoRecoveryConfig, worker_id: str,
                 only: set[str] | None = None, obey_switch: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        #: the wall clock leases and grace periods are read on (the simulation's seam)
        self.clock = clock
        self.obey_switch = obey_switch
        self.settings = settings
        self.worker_id = worker_id
        self.only = only
        assert client.store is not None, "the client is not started"
        self.markers = UnderReplicationManager(client.store, clock)
        self.throttle = Throttle(settings.rereplication_entries_per_s, settings.replication_rate_by_bytes)
        self._busy_until: dict[int, float] = {}
        self._wake = asyncio.Event()
        #: a registration changed; if the set of writable bookies did (not merely a bookie's
        #: disk figures), stuck ledgers are retried before their backoff ends
        self._bookies_changed = False
        self._writable: frozenset[str] = frozenset()
        self.stats = {"ledgers": 0, "fragments": 0, "entries": 0, "bytes": 0, "failures": 0}
        #: ledger id -> stuck reason, of the ledgers this worker last failed on (the gauge)
        self.stuck: dict[int, str] = {}

    # --- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        store = self.client.store
        assert store is not None
        sub = await store.watch(MARKERS, lambda _n: self._wake.set())
        bookies_sub = await store.watch(layout.AVAILABLE, lambda _n: self._on_bookies_changed())
        active: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                try:
                    if not self.obey_switch or await self.markers.is_enabled():
                        await self._claim_some(active)
                except LedgerStoreError as exc:
                    log.warning("replication worker %s: %s", self.worker_id, exc)
                waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait()), *active.values()}
                try:
                    await asyncio.wait(waiters, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        if w not in active.values():
                            w.cancel()
                self._wake.clear()
                for lid, t in list(active.items()):
                    if t.done():
                        del active[lid]
                await asyncio.sleep(0.05)  # coalesce bursts of marker notifications
        finally:
            sub.cancel()
            bookies_sub.cancel()
            for t in active.values():
                t.cancel()
            for t in active.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def _on_bookies_changed(self) -> None:
        self._bookies_changed = True
        self._wake.set()

    async def _claim_some(self, active: dict[int, asyncio.Task[None]]) -> None:
        ids = await self.markers.ledger_ids()
        for gone in self.stuck.keys() - set(ids):  # re-replicated by another worker, or deleted
            del self.stuck[gone]
        random.shuffle(ids)  # workers spread over the markers instead of all racing for the first
        only = self.only
        accept = None if only is None else (lambda m: bool(set(m.missing) & only))
        early = False
        if self._bookies_changed:
            self._bookies_changed = False
            writable = frozenset(b.bookie_id for b in await self.client.bookie_infos(max_age=0) if not b.read_only)
            early, self._writable = writable != self._writable, writable
        if early:
            self._busy_until.clear()
        for lid in ids:
            if len(active) >= self.settings.parallel_ledgers:
                return
            if lid in active or self._busy_until.get(lid, 0.0) > self.clock():
                continue
            m, busy_until = await self.markers.claim(lid, self.worker_id, self.settings.lease_s, accept, early)
            if m is None:
                self._busy_until[lid] = busy_until
                continue
            active[lid] = asyncio.get_running_loop().create_task(self._handle(m), name=f"rereplicate-{lid}")

    async def _handle(self, m: Marker) -> None:
        lock = asyncio.Lock()
        renewer = asyncio.get_running_loop().create_task(self._renew(m, lock))
        was_stuck = m.stuck_reason
        try:
            if await self.process(m, lock):
                self.stats["ledgers"] += 1
                self.stuck.pop(m.ledger_id, None)
                if was_stuck:
                    log.warning("ledger %d is no longer stuck: re-replicated after %d failed attempts (it was: %s)",
                                m.ledger_id, m.failures, m.last_error or was_stuck)
        except _Deferred as d:
            renewer.cancel()
            async with lock:
                await self.markers.release(m, self.worker_id, "open ledger: waiting for its grace period", d.until)
        except LedgerStoreError as exc:
            renewer.cancel()
            async with lock:
                await self._failed(m, reason_of(exc), f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug must not leave the marker claimed until its lease lapses
            if m.stuck_reason != OTHER:  # the traceback once, like the warning
                log.exception("re-replication of ledger %d failed unexpectedly", m.ledger_id)
            renewer.cancel()
            async with lock:
                await self._failed(m, OTHER, f"{type(exc).__name__}: {exc}")
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer

    async def _failed(self, m: Marker, reason: str, error: str) -> None:
        """Give a failed ledger's marker back with its backoff, warning only when the ledger
        becomes stuck or its reason changes (later failures of the same kind are quiet)."""
        self.stats["failures"] += 1
        failures = m.failures + 1
        wait = backoff_s(failures)
        if reason != m.stuck_reason:
            log.warning("ledger %d is stuck: it cannot be re-replicated (%s); retrying with backoff (next in %.0fs, "
                        "at once when bookies change), quiet until it is unstuck", m.ledger_id, error, wait)
        else:
            log.debug("ledger %d still stuck after %d attempts (%s); next try in %.0fs", m.ledger_id, failures,
                      error, wait)
        self.stuck[m.ledger_id] = reason
        await self.markers.release(m, self.worker_id, error, self.clock() + wait, reason, failures)

    async def _renew(self, m: Marker, lock: asyncio.Lock) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            async with lock:
                await self.markers.update(m, self.worker_id, self.settings.lease_s)

    # --- one ledger -------------------------------------------------------------------------------

    async def process(self, m: Marker, lock: asyncio.Lock | None = None) -> bool:
        """Re-replicate ``m``'s ledger and delete the marker. True when the marker is gone."""
        lock = lock or asyncio.Lock()
        client = self.client
        while True:
            try:
                md = await client.ledgers.read(m.ledger_id)
            except NoSuchLedgerError:
                await self.markers.remove(m.ledger_id)
                return True
            if m.pending:
                # swaps recorded by earlier versions, which changed an open ledger's last fragment
                # before recovering it; the recovery below works from the metadata as it is
                log.warning("ledger %d: ignoring %d pending swaps recorded by an earlier version", m.ledger_id,
                            len(m.pending))
                async with lock:
                    m.pending.clear()
                    await self.markers.update(m, self.worker_id, self.settings.lease_s)
            todo = await self._still_missing(set(m.missing)) & md.bookies()
            if not todo:
                async with lock:
                    if await self.markers.complete(m):
                        return True
                    fresh = await self.markers.get(m.ledger_id)
                    if fresh is None:
                        return True
                    if fresh.owner != self.worker_id:
                        raise ReplicationError(f"lost the claim on ledger {m.ledger_id}'s marker")
                    m.missing, m.version, m.pending = fresh.missing, fresh.version, fresh.pending
                continue  # an auditor added bookies meanwhile
            password = self._password(md)
            open_last = False
            for fi, (first, last, ensemble) in enumerate(md.fragment_ranges()):
                idxs = [i for i, b in enumerate(ensemble) if b in todo]
                if not idxs:
                    continue
                if fi == len(md.ensembles) - 1 and not md.is_closed:
                    open_last = True  # never swapped while open: recovered first (below)
                    continue
                ensemble = list(ensemble)
                for i in idxs:
                    # each replacement is chosen against the ensemble as it has become
                    ensemble[i] = await self._replace(md, password, first, last, ensemble, i, todo)
            if open_last:
                until = m.since + self.settings.open_ledger_rereplication_grace_s
                if self.clock() < until:
                    # the writer may still replace the bookie itself by an ensemble change
                    fresh_md = await client.ledgers.read(m.ledger_id)
                    if set(fresh_md.current_ensemble) & todo and not fresh_md.is_closed:
                        raise _Deferred(until)
                    continue
                await self._recover_open(md, password, todo)

    async def _still_missing(self, missing: set[str]) -> set[str]:
        """Missing bookies that really are. A registered bookie (not being decommissioned) needs
        nothing only if it is the same incarnation that went away: a bookie id registered again
        after a format, or one the replicas check found lacking data, holds nothing of it."""
        registered = {b.bookie_id for b in await self.client.bookie_infos(max_age=0)}
        decommissioning = await self.markers.decommissioning()
        return {b for b in missing
                if b not in registered or b in decommissioning or not await self.markers.came_back(b)}

    @staticmethod
    def _password(md: LedgerMetadata) -> bytes:
        if md.password is None:
            raise NoPasswordError(
                f"ledger {md.ledger_id} has no password in its metadata (created with "
                "store_password_in_metadata = false), so it cannot be re-replicated automatically")
        return base64.b64decode(md.password)

    async def _choose(self, md: LedgerMetadata, ensemble: list[str], index: int, exclude: set[str]) -> str:
        bookies = await self.client.bookie_infos(max_age=0)
        decommissioning = await self.markers.decommissioning()
        shut_out = frozenset(exclude | decommissioning)
        try:
            # through the client's health, as the writer's ensemble changes: a bookie its health
            # check quarantined is left out while enough others exist
            return self.client.ensemble_placement.replace_bookie(
                ensemble, md.write_quorum, md.ack_quorum, index, bookies, exclude=shut_out)
        except NotEnoughBookiesError as exc:
            raise no_replacement(md.ledger_id, ensemble, index, bookies, shut_out, exc) from exc

    async def _replace(self, md: LedgerMetadata, password: bytes, first: int, last: int, ensemble: list[str],
                       index: int, missing: set[str]) -> str:
        """Copy a closed fragment's share of ``ensemble[index]`` to a replacement, then swap it
        in. Returns the replacement."""
        exclude = set(missing)
        for _ in range(3):
            target = await self._choose(md, ensemble, index, exclude)
            try:
                before = await self._instance(target)
                await self.copy(md, password, first, last, ensemble, index, target, missing)
            except _TargetFailed as exc:
                log.warning("ledger %d: replacement %s failed (%s); choosing another", md.ledger_id, target, exc)
                exclude.add(target)
                continue
            swapped = await self._swap(md.ledger_id, first, index, ensemble[index], target)
            if swapped is not None and not await self._kept(md, password, first, last, ensemble, index, target,
                                                            missing, before):
                # unreachable since the swap: its share is copied from the other replicas to
                # another bookie, which takes its place
                named = list(ensemble)
                named[index] = target
                log.warning("ledger %d: replacement %s cannot be confirmed to hold its copy; replacing it",
                            md.ledger_id, target)
                return await self._replace(md, password, first, last, named, index, missing | {target})
            self.stats["fragments"] += 1
            return target
        raise ReplicationError(f"ledger {md.ledger_id}: every replacement tried for {ensemble[index]} failed")

    async def _instance(self, bookie_id: str) -> int:
        """The process instance of ``bookie_id`` (BOOKIE_INFO); _TargetFailed when it does not answer."""
        try:
            info = await self.client.bookie_client.bookie_info(bookie_id, self.client.config.read_timeout_s)
        except LedgerStoreError as exc:
            raise _TargetFailed(f"{bookie_id}: {exc}") from exc
        return info.instance

    async def _kept(self, md: LedgerMetadata, password: bytes, first: int, last: int, ensemble: list[str],
                    index: int, target: str, missing: set[str], before: int) -> bool:
        """Whether ``target``, now named in the fragment, still holds the copy made to it.

        A bookie that restarts after losing data lists the ledgers that name it, and puts them in
        limbo, before it serves. One that restarted between the copy and the swap listed the
        ledgers before this one named it, so nothing tells it that it lacks this copy. The same
        process instance answering before the copy and after the swap proves no restart came in
        between; another instance gets the copy again (the metadata names it now, so any later
        restart finds the ledger). False when ``target`` stays unreachable."""
        for attempt in range(CONFIRM_ATTEMPTS):
            try:
                now = await self._instance(target)
            except _TargetFailed as exc:
                log.info("ledger %d: confirming %s's copy: %s", md.ledger_id, target, exc)
                await asyncio.sleep(min(2.0 ** attempt * 0.1, 5.0))
                continue
            if now == before and now != 0:
                return True
            if before == 0 == now:  # an older bookie, which does not tell its instance
                return True
            log.warning("ledger %d: %s restarted while it was given a copy of entries %d..%d; copying again",
                        md.ledger_id, target, first, last)
            before = now
            try:
                await self.copy(md, password, first, last, ensemble, index, target, missing)
            except _TargetFailed as exc:
                log.info("ledger %d: copying to %s again: %s", md.ledger_id, target, exc)
        return False

    async def _swap(self, ledger_id: int, first: int, index: int, old: str, new: str) -> LedgerMetadata | None:
        """Put ``new`` in place of ``old`` in the closed fragment starting at ``first`` by CAS.
        None when that fragment no longer holds ``old`` there."""
        mgr = self.client.ledgers
        while True:
            md = await mgr.read(ledger_id)
            k = next((k for k, (f, _) in enumerate(md.ensembles) if f == first), None)
            if k is None or md.ensembles[k][1][index] != old:
                return None
            bookies = list(md.ensembles[k][1])
            bookies[index] = new
            ensembles = list(md.ensembles)
            ensembles[k] = (first, bookies)
            changes: dict[str, Any] = {"ensembles": ensembles}
            if not md.is_closed and k == len(md.ensembles) - 1:
                raise ReplicationError(f"ledger {ledger_id}: refusing to swap a bookie in the last fragment "
                                       "of an open ledger (it is recovered, not swapped)")
            try:
                md = await mgr.write(LedgerMetadata(**{**md.__dict__, **changes}))
            except BadVersionError:
                continue
            log.info("ledger %d: fragment at entry %d: %s replaced by %s", ledger_id, first, old, new)
            notify("ledgerstore_ensemble_changed", ledger_id=ledger_id, first_entry_id=first,
                   old=md.ensembles[k][1][:index] + [old] + md.ensembles[k][1][index + 1:], new=bookies)
            return md

    async def _recover_open(self, md: LedgerMetadata, password: bytes, missing: set[str]) -> None:
        """Past the grace period: recover the open ledger exactly as ``open_ledger(recovery=True)``
        does, fencing and reading its last fragment as the metadata names it (the missing bookie
        included: it just does not answer). Bookies that fail the write-back are replaced in the
        recovery's memory and committed with the close; the caller then re-replicates what are now
        closed fragments."""
        decommissioning = await self.markers.decommissioning()
        log.info("ledger %d is open past its grace period with %s missing: recovering it", md.ledger_id,
                 sorted(missing & set(md.current_ensemble)))
        await recover(self.client, md, password, exclude=missing | decommissioning)

    # --- copying ----------------------------------------------------------------------------------

    async def copy(self, md: LedgerMetadata, password: bytes, first: int, last: int, ensemble: list[str],
                   index: int, target: str, missing: set[str], extra_sources: Iterable[str] = ()) -> int:
        """Copy entries ``first..last`` whose write set includes ``index`` to ``target``, reading
        each from another bookie of its write set (missing ones last). Returns entries copied.

        Entries go in batches of ``rereplication_entry_batch_size``: each batch is read with one
        READ_MULTI per surviving bookie (an entry whose read fails there is read from its other
        replicas one by one), throttled, and written with one recovery ADD_BATCH;
        :data:`COPY_BATCHES` batches are in flight at once."""
        entries = [e for e in range(first, last + 1) if index in md.write_set(e)]
        if not entries:
            return 0
        digest = DigestManager(md.ledger_id, md.digest_type, password)
        key = master_key(password)
        timeout = self.client.config.add_timeout_s
        add_batch = self.client.bookie_client.recovery_add_batch
        extra = [b for b in extra_sources if b != target]
        sem = asyncio.Semaphore(COPY_BATCHES)

        def sources_of(eid: int) -> list[str]:
            ws = md.write_set(eid)
            sources = [ensemble[i] for i in ws if i != index and ensemble[i] not in missing]
            sources += [ensemble[i] for i in ws if i != index and ensemble[i] in missing]
            return sources + ([ensemble[index]] + extra if ensemble[index] != target else extra)

        async def one_batch(eids: list[int]) -> None:
            async with sem:
                got = await self._read_batch(md, eids, sources_of, digest)
                nbytes = sum(len(d) for _, d in got)
                await self.throttle.take(len(got), nbytes)
                try:
                    await add_batch(target, md.ledger_id, key, got, timeout)
                except LedgerStoreError as exc:
                    raise _TargetFailed(f"{target}: {exc}") from exc
                self.stats["entries"] += len(got)
                self.stats["bytes"] += nbytes

        size = self.settings.rereplication_entry_batch_size
        step = size * COPY_BATCHES * 16  # bounded memory for long fragments
        for at in range(0, len(entries), step):
            part = entries[at:at + step]
            tasks = [asyncio.ensure_future(one_batch(part[i:i + size])) for i in range(0, len(part), size)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
        return len(entries)

    async def _read_batch(self, md: LedgerMetadata, eids: list[int], sources_of: Callable[[int], list[str]],
                          digest: DigestManager) -> list[tuple[int, bytes]]:
        """``(entry id, verified signed bytes)`` of each of ``eids``: one READ_MULTI to the first
        source of each entry; what that does not answer well is read from the entry's other
        sources one by one (:meth:`_read_replica`)."""
        timeout = self.client.config.read_timeout_s
        by_source: dict[str, list[int]] = {}
        for eid in eids:
            by_source.setdefault(sources_of(eid)[0], []).append(eid)
        got: dict[int, bytes] = {}

        async def from_source(bid: str, ids: list[int]) -> None:
            try:
                items = await self.client.bookie_client.read_multi(bid, md.ledger_id, ids, timeout)
            except LedgerStoreError:
                return  # every one is read one by one below
            for eid, status, data in items:
                if status != Status.OK:
                    continue
                try:
                    digest.verify(data, eid)
                except LedgerStoreError:
                    continue
                got[eid] = data

        await asyncio.gather(*(from_source(b, ids) for b, ids in by_source.items()))
        for eid in eids:
            if eid not in got:
                got[eid] = await self._read_replica(md, eid, sources_of(eid), digest)
        return [(eid, got[eid]) for eid in eids]

    async def _read_replica(self, md: LedgerMetadata, eid: int, sources: list[str], digest: DigestManager) -> bytes:
        timeout = self.client.config.read_timeout_s
        seen: list[str] = []
        read = self.client.bookie_client.read
        for bid in dict.fromkeys(sources):
            try:
                data = await read(bid, md.ledger_id, eid, timeout)
                digest.verify(data, eid)
            except LedgerStoreError as exc:  # unreachable, no copy, or a bad one (DigestMismatchError)
                seen.append(f"{bid}: {exc}")
                continue
            return data
        raise NoReadableReplicaError(f"no readable replica of entry {eid} of ledger {md.ledger_id}: {'; '.join(seen)}")
