"""Ledger metadata and the ledger manager, built once on any MetadataStore."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import enum
import functools
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TypeVar

from ledgerstore.api import NOT_EXISTS, MetadataStore
from ledgerstore.errors import (
    BadVersionError,
    InvalidMetadataError,
    LedgerExistsError,
    MetadataError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from ledgerstore.meta import layout

FORMAT_VERSION = 1
T = TypeVar("T")
#: metadata reads :meth:`LedgerManager.read_many` keeps in flight: enough to hide a round trip to
#: ZooKeeper or etcd (about 1 ms here) behind the others, few enough not to flood the server
READ_WINDOW = 64


@functools.lru_cache(maxsize=64)
def _write_sets(ensemble_size: int, write_quorum: int) -> tuple[tuple[int, ...], ...]:
    """The E distinct write sets of a striping, by ``entry_id % E``."""
    return tuple(tuple((start + i) % ensemble_size for i in range(write_quorum)) for start in range(ensemble_size))


class LedgerState(enum.StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclasses.dataclass
class LedgerMetadata:
    """What the cluster knows of a ledger. ``ensembles`` is the fragment list: (first entry id,
    bookie ids), ascending by first entry. ``version`` is the store version it was read at."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest_type: str
    #: derived from the password (:func:`ledgerstore.proto.digest.password_check`): stored, never
    #: shown (not in ``repr``, :meth:`to_dict`, HTTP bodies or shell output)
    password_check: str = dataclasses.field(repr=False)
    ensembles: list[tuple[int, list[str]]]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    ctime_ms: int = dataclasses.field(default_factory=lambda: int(time.time() * 1000))
    custom: dict[str, str] = dataclasses.field(default_factory=dict)
    version: int | None = None
    #: the ledger password (base64), stored so auto-recovery can fence and re-replicate the
    #: ledger (as BookKeeper stores it); ``None`` when the creator chose not to store it
    password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_for(self, entry_id: int) -> tuple[int, list[str]]:
        """The fragment (first entry, bookies) that holds ``entry_id``."""
        last = self.ensembles[-1]
        if entry_id >= last[0]:  # the common case: the current fragment
            return last
        firsts = [f for f, _ in self.ensembles]
        i = bisect.bisect_right(firsts, entry_id) - 1
        return self.ensembles[max(i, 0)]

    @property
    def current_ensemble(self) -> list[str]:
        return self.ensembles[-1][1]

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Indexes into the ensemble of the bookies that store ``entry_id`` (striping)."""
        return _write_sets(self.ensemble_size, self.write_quorum)[entry_id % self.ensemble_size]

    def fragment_ranges(self) -> list[tuple[int, int, list[str]]]:
        """(first, last, bookies) for each fragment; ``last`` is -1-bounded by the ledger's end
        (``last_entry_id`` when closed, else ``2**63-1``)."""
        end = self.last_entry_id if self.is_closed else 2**63 - 1
        out = []
        for i, (first, bookies) in enumerate(self.ensembles):
            last = self.ensembles[i + 1][0] - 1 if i + 1 < len(self.ensembles) else end
            out.append((first, last, bookies))
        return out

    def bookies(self) -> set[str]:
        return {b for _, bs in self.ensembles for b in bs}

    def to_bytes(self) -> bytes:
        d = {
            "format": FORMAT_VERSION,
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "digest_type": self.digest_type,
            "password_check": self.password_check,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "ctime_ms": self.ctime_ms,
            "ensembles": [[f, list(b)] for f, b in self.ensembles],
            "custom": self.custom,
        }
        if self.password is not None:
            d["password"] = self.password
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, version: int | None = None) -> LedgerMetadata:
        try:
            d = json.loads(data)
            if d.get("format") != FORMAT_VERSION:
                raise MetadataError(f"ledger metadata format {d.get('format')!r} is not supported (expected {FORMAT_VERSION})")
            return cls(
                ledger_id=int(d["ledger_id"]),
                ensemble_size=int(d["ensemble_size"]),
                write_quorum=int(d["write_quorum"]),
                ack_quorum=int(d["ack_quorum"]),
                digest_type=str(d["digest_type"]),
                password_check=str(d["password_check"]),
                state=LedgerState(d["state"]),
                last_entry_id=int(d["last_entry_id"]),
                length=int(d["length"]),
                ctime_ms=int(d["ctime_ms"]),
                ensembles=[(int(f), [str(x) for x in b]) for f, b in d["ensembles"]],
                custom={str(k): str(v) for k, v in d.get("custom", {}).items()},
                version=version,
                password=None if d.get("password") is None else str(d["password"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"corrupt ledger metadata: {exc}") from exc

    def to_dict(self) -> dict[str, object]:
        """The metadata for display (HTTP bodies, shell output): everything but what is derived
        from the password; a stored password shows as ``"(stored)"``."""
        d: dict[str, object] = json.loads(self.to_bytes())
        del d["password_check"]
        d["version"] = self.version
        if "password" in d:
            d["password"] = "(stored)"  # printed metadata must not reveal it
        return d


class LedgerManager:
    """CRUD for ledger metadata with compare-and-set, keyed as the cluster's ``/LAYOUT`` says
    (:class:`~ledgerstore.meta.layout.LedgerLayout`; read once per manager)."""

    def __init__(self, store: MetadataStore, read_retry_s: float | None = None) -> None:
        self.store = store
        #: seconds a read retries while the store is unreachable (default ``DEFAULT_READ_RETRY_S``)
        self.read_retry_s = read_retry_s
        self._layout: layout.LedgerLayout | None = None

    async def ledger_layout(self) -> layout.LedgerLayout:
        """The ledger layout of the cluster in the store (MetadataError for an unknown one)."""
        if self._layout is None:
            marker = await self.store.get(layout.LAYOUT)
            exists = marker is not None or await self.store.get(layout.INSTANCE_ID) is not None
            try:
                self._layout = layout.parse_layout(None if marker is None else marker.value, exists)
            except ValueError as exc:
                raise MetadataError(str(exc)) from None
        return self._layout

    async def _path(self, ledger_id: int) -> str:
        return (await self.ledger_layout()).path(ledger_id)

    async def new_ledger_id(self) -> int:
        return await self.store.next_id(layout.LEDGER_ID_COUNTER)

    async def create(self, md: LedgerMetadata) -> LedgerMetadata:
        check_ensembles(md)
        try:
            md.version = await self.store.put(await self._path(md.ledger_id), md.to_bytes(), NOT_EXISTS)
        except BadVersionError:
            raise LedgerExistsError(f"ledger {md.ledger_id} already exists") from None
        return md

    async def read(self, ledger_id: int) -> LedgerMetadata:
        from ledgerstore.meta.retry import retry_read

        path = await self._path(ledger_id)
        got = await retry_read(lambda: self.store.get(path), f"of ledger {ledger_id}", self.read_retry_s)
        if got is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_bytes(got.value, got.version)

    async def read_many(self, ids: AsyncIterable[int] | Iterable[int],
                        window: int = READ_WINDOW) -> AsyncIterator[tuple[int, LedgerMetadata | None]]:
        """(id, metadata) for every id of ``ids``, ``None`` for a ledger that does not exist, in
        the order the reads complete, with at most ``window`` reads in flight: a pass over
        100,000 ledgers waits for about 100,000 / ``window`` round trips instead of 100,000. The
        first read that fails otherwise ends the iteration with its error."""
        if window < 1:
            raise ValueError(f"the read window holds at least one read, asked for {window}")

        async def one(lid: int) -> tuple[int, LedgerMetadata | None]:
            try:
                return lid, await self.read(lid)
            except NoSuchLedgerError:
                return lid, None

        # a list, not a set: the reads complete in an order the loop decides, and are handed
        # on in the order they were started among those done, never in a set's hash order
        # (a simulation run must replay exactly from its seed)
        pending: list[asyncio.Task[tuple[int, LedgerMetadata | None]]] = []
        try:
            async for lid in _as_async(ids):
                pending.append(asyncio.ensure_future(one(lid)))
                if len(pending) >= window:
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    done, pending = _split_done(pending)
                    for task in done:
                        yield task.result()
            while pending:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                done, pending = _split_done(pending)
                for task in done:
                    yield task.result()
        finally:
            for task in pending:
                task.cancel()

    async def missing(self, ids: Iterable[int], window: int = READ_WINDOW) -> list[int]:
        """Those of ``ids`` that have no metadata (deleted ledgers), ascending."""
        return sorted([lid async for lid, md in self.read_many(ids, window) if md is None])

    async def write(self, md: LedgerMetadata) -> LedgerMetadata:
        """CAS ``md`` against ``md.version``; BadVersionError if it changed since it was read."""
        if md.version is None:
            raise ValueError("write() needs metadata read from the store (version unknown)")
        check_ensembles(md)
        md.version = await self.store.put(await self._path(md.ledger_id), md.to_bytes(), md.version)
        return md

    async def delete(self, ledger_id: int) -> None:
        try:
            await self.store.delete(await self._path(ledger_id))
        except NoSuchKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def list(self) -> AsyncIterator[int]:
        """Every ledger id, ascending. The walk goes down the layout's levels one page of
        children at a time (:meth:`MetadataStore.iter_children`): no request or answer grows
        with the number of ledgers."""
        lay = await self.ledger_layout()
        async for lid in self._walk(lay, layout.LEDGERS, (), 0):
            yield lid

    async def _walk(self, lay: layout.LedgerLayout, key: str, parents: tuple[str, ...], level: int) -> AsyncIterator[int]:
        async for name in self.store.iter_children(key):
            if level < lay.depth:
                if lay.level_ok(level, name):
                    async for below in self._walk(lay, f"{key}/{name}", (*parents, name), level + 1):
                        yield below
            elif (leaf := lay.leaf_id(parents, name)) is not None:
                yield leaf


def _split_done(tasks: list[asyncio.Task[T]]) -> tuple[list[asyncio.Task[T]], list[asyncio.Task[T]]]:
    """(the done tasks, the others), each in the order of ``tasks``."""
    return [t for t in tasks if t.done()], [t for t in tasks if not t.done()]


async def _as_async(ids: AsyncIterable[int] | Iterable[int]) -> AsyncIterator[int]:
    if isinstance(ids, AsyncIterable):
        async for lid in ids:
            yield lid
    else:
        for lid in ids:
            yield lid


def check_ensembles(md: LedgerMetadata) -> None:
    """Refuse metadata no path may write: a fragment naming one bookie twice (its entries would
    have fewer copies than the write quorum says), a fragment of the wrong size, or fragments not
    in strictly ascending order of their first entries. InvalidMetadataError names the fault."""
    prev = -1
    for first, bookies in md.ensembles:
        if len(set(bookies)) != len(bookies):
            dup = sorted({b for b in bookies if bookies.count(b) > 1})
            raise InvalidMetadataError(
                f"ledger {md.ledger_id}: the fragment starting at entry {first} names {', '.join(dup)} more than "
                f"once ({bookies}); an ensemble must hold {md.ensemble_size} distinct bookies")
        if len(bookies) != md.ensemble_size:
            raise InvalidMetadataError(
                f"ledger {md.ledger_id}: the fragment starting at entry {first} has {len(bookies)} bookies, "
                f"the ledger's ensemble size is {md.ensemble_size}")
        if first <= prev:
            raise InvalidMetadataError(
                f"ledger {md.ledger_id}: fragments must start at ascending entries, found {first} after {prev}")
        prev = first
