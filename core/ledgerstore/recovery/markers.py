"""Under-replication markers, worker claims and the auto-recovery switches, kept in the metadata
store (BookKeeper's ``LedgerUnderreplicationManager``), built once on the MetadataStore primitive.

Layout below :data:`ledgerstore.meta.layout.UNDERREPLICATION`::

    /underreplication/ledgers/<ledger id>           a marker (JSON, see :class:`Marker`)
    /underreplication/enable                        {"enabled": bool}; absent = enabled
    /underreplication/lostbookierecoverydelay       {"seconds": float}; absent = each process's config
    /underreplication/audittrigger                  written to ask the auditor for a full check now
                                                    ({"replicas": true}: and a replicas check)
    /underreplication/lostbookies/<bookie id>       what was lost of a bookie (see :class:`LossRecord`)
    /underreplication/decommission/<bookie id>      bookies being decommissioned
    /underreplication/auditor/candidates/<id>       auditor election (ephemeral; see election.py)

A marker is claimed by compare-and-set (owner + lease), renewed while its worker works, and
deleted by compare-and-set when no fragment of the ledger holds a missing bookie any more. A
killed worker's lease lapses and another worker takes the marker over.

A bookie id is not a bookie: a formatted bookie restarted under the same id holds nothing of what
it held before. So whoever marks ledgers for a bookie first writes a :class:`LossRecord` saying
which incarnation (cookie) of it was lost and why, and a worker treats the bookie as back only if
that same incarnation is registered again after it had merely gone away (see
:meth:`UnderReplicationManager.came_back`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from ledgerstore.api import NOT_EXISTS, MetadataStore
from ledgerstore.errors import BadVersionError, LedgerStoreError, MetadataError, NoSuchKeyError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import CookieManager, identity

MARKERS = f"{layout.UNDERREPLICATION}/ledgers"
ENABLE = f"{layout.UNDERREPLICATION}/enable"
LOST_BOOKIE_DELAY = f"{layout.UNDERREPLICATION}/lostbookierecoverydelay"
AUDIT_TRIGGER = f"{layout.UNDERREPLICATION}/audittrigger"
DECOMMISSION = f"{layout.UNDERREPLICATION}/decommission"
CANDIDATES = f"{layout.UNDERREPLICATION}/auditor/candidates"
LOST_BOOKIES = f"{layout.UNDERREPLICATION}/lostbookies"

#: why a bookie's ledgers were marked (:attr:`LossRecord.reason`)
GONE = "gone"  # unregistered for longer than the lost-bookie delay: its data may come back with it
REFORMATTED = "reformatted"  # registered again with another incarnation: its old data is gone
NOT_HELD = "not-held"  # the replicas check found it lacks data it should hold
DECOMMISSIONED = "decommissioned"


class ReplicationError(LedgerStoreError):
    """A ledger could not be re-replicated now (no readable replica, no replacement bookie, no
    stored password, ...); its marker stays and is retried."""


def marker_path(ledger_id: int) -> str:
    return f"{MARKERS}/{ledger_id:019d}"


@dataclasses.dataclass
class PendingSwap:
    """A replacement already written into an open ledger's last fragment whose copy is not done:
    whoever holds the marker next must recover (close) the ledger and finish the copy."""

    first: int
    index: int
    old: str
    new: str

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "index": self.index, "from": self.old, "to": self.new}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PendingSwap:
        return cls(int(d["first"]), int(d["index"]), str(d["from"]), str(d["to"]))


@dataclasses.dataclass
class LossRecord:
    """What is known of a bookie whose ledgers were marked: the incarnation lost (its cookie's,
    see :func:`ledgerstore.bookie.cookie.identity`; None if it had no cookie any more) and why."""

    bookie_id: str
    incarnation: str | None
    reason: str
    since: float

    def to_bytes(self) -> bytes:
        return json.dumps({"incarnation": self.incarnation, "reason": self.reason, "since": self.since}).encode()

    @classmethod
    def from_bytes(cls, bookie_id: str, data: bytes) -> LossRecord:
        try:
            d = json.loads(data)
            inc = d.get("incarnation")
            return cls(bookie_id, None if inc is None else str(inc), str(d["reason"]), float(d.get("since", 0.0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"corrupt lost-bookie record of {bookie_id}: {exc}") from exc


@dataclasses.dataclass
class Marker:
    """One under-replicated ledger. ``version`` is the store version it was read at."""

    ledger_id: int
    missing: list[str]
    since: float
    owner: str | None = None
    lease_until: float = 0.0
    pending: list[PendingSwap] = dataclasses.field(default_factory=list)
    last_error: str = ""
    #: no worker takes the marker before this (backoff after a failure, an open ledger's grace)
    not_before: float = 0.0
    #: the incarnation of each missing bookie when it was found missing (informational: the
    #: worker decides by the bookie's :class:`LossRecord`)
    incarnations: dict[str, str | None] = dataclasses.field(default_factory=dict)
    #: why the ledger cannot be re-replicated now (a reason of ``stuck.py``; "" = not stuck),
    #: and the failures in a row behind it (the backoff grows with them). Markers written before
    #: these fields existed read as not stuck.
    stuck_reason: str = ""
    failures: int = 0
    version: int | None = None

    def claimable(self, now: float, ignore_backoff: bool = False) -> bool:
        """Free to take: no live lease, and past ``not_before`` (a stuck marker's backoff is
        skipped with ``ignore_backoff``, when something that may unstick it changed)."""
        backed_off = ignore_backoff and bool(self.stuck_reason)
        return (self.owner is None or self.lease_until <= now) and (backed_off or self.not_before <= now)

    def busy_until(self) -> float:
        """Wall-clock time before which no worker may take the marker."""
        return max(self.lease_until if self.owner is not None else 0.0, self.not_before)

    def to_bytes(self) -> bytes:
        d = {
            "ledger_id": self.ledger_id,
            "missing": sorted(set(self.missing)),
            "since": self.since,
            "owner": self.owner,
            "lease_until": self.lease_until,
            "pending": [p.to_dict() for p in self.pending],
            "last_error": self.last_error,
            "not_before": self.not_before,
            "incarnations": self.incarnations,
            "stuck_reason": self.stuck_reason,
            "failures": self.failures,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, version: int | None = None) -> Marker:
        try:
            d = json.loads(data)
            return cls(
                ledger_id=int(d["ledger_id"]),
                missing=[str(b) for b in d["missing"]],
                since=float(d["since"]),
                owner=None if d.get("owner") is None else str(d["owner"]),
                lease_until=float(d.get("lease_until", 0.0)),
                pending=[PendingSwap.from_dict(p) for p in d.get("pending", [])],
                last_error=str(d.get("last_error", "")),
                not_before=float(d.get("not_before", 0.0)),
                incarnations={str(k): None if v is None else str(v) for k, v in d.get("incarnations", {}).items()},
                stuck_reason=str(d.get("stuck_reason", "")),
                failures=int(d.get("failures", 0)),
                version=version,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"corrupt under-replication marker: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = json.loads(self.to_bytes())
        d["version"] = self.version
        return d


class UnderReplicationManager:
    """Markers, claims and switches of auto-recovery on any MetadataStore."""

    def __init__(self, store: MetadataStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        #: the wall clock leases, ``since`` and ``not_before`` are read on (the simulation's seam)
        self.clock = clock

    # --- markers ---------------------------------------------------------------------------------

    async def mark(self, ledger_id: int, missing: set[str] | list[str],
                   incarnations: dict[str, str | None] | None = None) -> bool:
        """Mark ``ledger_id`` under-replicated for ``missing`` bookies, merging with an existing
        marker (its owner keeps it). ``incarnations``: what was lost of each (recorded in the
        marker for operators). Returns True if the store changed."""
        want = set(missing)
        if not want:
            return False
        known = {b: (incarnations or {}).get(b) for b in want}
        path = marker_path(ledger_id)
        while True:
            got = await self.store.get(path)
            try:
                if got is None:
                    m = Marker(ledger_id, sorted(want), self.clock(), incarnations=known)
                    await self.store.put(path, m.to_bytes(), NOT_EXISTS)
                    return True
                m = Marker.from_bytes(got.value, got.version)
                if want <= set(m.missing):
                    return False
                m.missing = sorted(set(m.missing) | want)
                m.incarnations = {**known, **m.incarnations}
                await self.store.put(path, m.to_bytes(), got.version)
                return True
            except BadVersionError:
                continue  # raced with a worker or another auditor: re-read and merge again

    async def get(self, ledger_id: int) -> Marker | None:
        got = await self.store.get(marker_path(ledger_id))
        return None if got is None else Marker.from_bytes(got.value, got.version)

    async def ledger_ids(self) -> list[int]:
        """Ids of every marked ledger, ascending."""
        return sorted(int(n) for n in await self.store.children(MARKERS) if n.isdigit())

    async def all(self) -> list[Marker]:
        out = []
        for lid in await self.ledger_ids():
            m = await self.get(lid)
            if m is not None:
                out.append(m)
        return out

    async def claim(self, ledger_id: int, owner: str, lease_s: float,
                    accept: Callable[[Marker], bool] | None = None,
                    ignore_backoff: bool = False) -> tuple[Marker | None, float]:
        """Take the marker for ``owner`` if it is claimable (and ``accept``-ed; a stuck one
        before its backoff ends with ``ignore_backoff``). Returns the claimed marker, or None and
        the wall-clock time worth waiting for before trying again."""
        got = await self.store.get(marker_path(ledger_id))
        if got is None:
            return None, float("inf")
        m = Marker.from_bytes(got.value, got.version)
        now = self.clock()
        if not m.claimable(now, ignore_backoff):
            return None, m.busy_until()
        if accept is not None and not accept(m):
            return None, float("inf")
        m.owner, m.lease_until, m.not_before = owner, now + lease_s, 0.0
        try:
            m.version = await self.store.put(marker_path(ledger_id), m.to_bytes(), got.version)
        except BadVersionError:
            return None, now + 1.0
        return m, 0.0

    async def update(self, m: Marker, owner: str, lease_s: float | None = None) -> Marker:
        """Write ``m`` (held by ``owner``) back, renewing the lease when ``lease_s`` is given.
        A marker changed meanwhile by an auditor (new missing bookies) is merged and retried;
        :class:`ReplicationError` if the claim was lost (lease lapsed and taken, or deleted)."""
        path = marker_path(m.ledger_id)
        while True:
            if lease_s is not None:
                m.lease_until = self.clock() + lease_s
            try:
                m.version = await self.store.put(path, m.to_bytes(), m.version)
                return m
            except BadVersionError:
                fresh = await self.get(m.ledger_id)
                if fresh is None or fresh.owner != owner:
                    raise ReplicationError(
                        f"lost the claim on the marker of ledger {m.ledger_id} "
                        f"(now {'gone' if fresh is None else f'held by {fresh.owner}'})") from None
                m.missing = sorted(set(m.missing) | set(fresh.missing))
                m.version = fresh.version

    async def release(self, m: Marker, owner: str, error: str = "", not_before: float = 0.0,
                      stuck_reason: str | None = None, failures: int | None = None) -> None:
        """Give the marker back (unclaimed) so any worker may retry it from ``not_before`` on,
        recording why it is stuck and its failures in a row when given."""
        m.owner, m.lease_until, m.last_error, m.not_before = None, 0.0, error[:500], not_before
        if stuck_reason is not None:
            m.stuck_reason = stuck_reason
        if failures is not None:
            m.failures = failures
        try:
            await self.update(m, owner)
        except ReplicationError:
            pass  # already taken over or deleted: nothing of ours left to give back

    async def complete(self, m: Marker) -> bool:
        """Delete the marker if it is unchanged since ``m`` was read; False if it changed."""
        try:
            await self.store.delete(marker_path(m.ledger_id), m.version)
            return True
        except NoSuchKeyError:
            return True
        except BadVersionError:
            return False

    async def remove(self, ledger_id: int) -> None:
        """Delete a marker whatever its state (its ledger is gone)."""
        try:
            await self.store.delete(marker_path(ledger_id))
        except NoSuchKeyError:
            pass

    # --- switches ---------------------------------------------------------------------------------

    async def is_enabled(self) -> bool:
        got = await self.store.get(ENABLE)
        if got is None:
            return True
        try:
            return bool(json.loads(got.value).get("enabled", True))
        except (ValueError, AttributeError):
            return True

    async def set_enabled(self, enabled: bool) -> None:
        await self.store.put(ENABLE, json.dumps({"enabled": enabled, "at": self.clock()}).encode())

    async def lost_bookie_delay(self) -> float | None:
        """The cluster-wide lost-bookie recovery delay, or None when each process's config rules."""
        got = await self.store.get(LOST_BOOKIE_DELAY)
        if got is None:
            return None
        try:
            return float(json.loads(got.value)["seconds"])
        except (ValueError, KeyError, TypeError):
            return None

    async def set_lost_bookie_delay(self, seconds: float) -> None:
        await self.store.put(LOST_BOOKIE_DELAY, json.dumps({"seconds": float(seconds)}).encode())

    async def trigger_audit(self, replicas: bool = False) -> None:
        """Ask the auditor for a full check now; with ``replicas`` also for a replicas check
        (every bookie asked which ledgers it holds)."""
        await self.store.put(AUDIT_TRIGGER, json.dumps({"at": self.clock(), "replicas": replicas}).encode())

    async def audit_trigger(self) -> dict[str, Any]:
        """The last trigger written (``{}`` if none)."""
        got = await self.store.get(AUDIT_TRIGGER)
        if got is None:
            return {}
        try:
            d = json.loads(got.value)
        except ValueError:
            return {}
        return d if isinstance(d, dict) else {}

    # --- lost bookies ------------------------------------------------------------------------------

    async def loss(self, bookie_id: str) -> LossRecord | None:
        got = await self.store.get(f"{LOST_BOOKIES}/{bookie_id}")
        return None if got is None else LossRecord.from_bytes(bookie_id, got.value)

    async def note_loss(self, bookie_id: str, incarnation: str | None, reason: str) -> LossRecord:
        """Record that ``incarnation`` of ``bookie_id`` was lost, before marking its ledgers. A
        record saying the data is gone for good (anything but :data:`GONE`) is never weakened
        back to :data:`GONE`. Returns the record in force."""
        path = f"{LOST_BOOKIES}/{bookie_id}"
        while True:
            got = await self.store.get(path)
            if got is not None:
                old = LossRecord.from_bytes(bookie_id, got.value)
                if reason == GONE or (old.reason != GONE and old.incarnation == incarnation):
                    return old
            rec = LossRecord(bookie_id, incarnation, reason, self.clock())
            try:
                await self.store.put(path, rec.to_bytes(), NOT_EXISTS if got is None else got.version)
                return rec
            except BadVersionError:
                continue

    async def forget_loss(self, bookie_id: str) -> None:
        try:
            await self.store.delete(f"{LOST_BOOKIES}/{bookie_id}")
        except NoSuchKeyError:
            pass

    async def lost_bookies(self) -> list[str]:
        return sorted(await self.store.children(LOST_BOOKIES))

    async def incarnation(self, bookie_id: str) -> str | None:
        """The incarnation the cluster's cookie for ``bookie_id`` names (None: no cookie)."""
        return identity(await CookieManager(self.store).get(bookie_id))

    async def came_back(self, bookie_id: str) -> bool:
        """Whether ``bookie_id``, registered again, holds what its markers say it lacks: only if
        it had merely gone away and the same incarnation returned. Without a record (markers an
        operator tool wrote for a bookie that was down) a registered bookie is taken at its word."""
        rec = await self.loss(bookie_id)
        if rec is None:
            return True
        return (rec.reason == GONE and rec.incarnation is not None
                and rec.incarnation == await self.incarnation(bookie_id))

    async def decommissioning(self) -> set[str]:
        return set(await self.store.children(DECOMMISSION))

    async def start_decommission(self, bookie_id: str) -> None:
        await self.store.put(f"{DECOMMISSION}/{bookie_id}", json.dumps({"since": self.clock()}).encode())

    async def end_decommission(self, bookie_id: str) -> None:
        try:
            await self.store.delete(f"{DECOMMISSION}/{bookie_id}")
        except NoSuchKeyError:
            pass

    async def auditor(self) -> str | None:
        """The elected auditor: the smallest candidate id (see election.py)."""
        cands = await self.store.children(CANDIDATES)
        return min(cands) if cands else None

    async def candidates(self) -> list[str]:
        return sorted(await self.store.children(CANDIDATES))
