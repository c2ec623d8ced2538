"""Ledger metadata and the ledger manager, built once on any MetadataStore."""

from __future__ import annotations

import bisect
import dataclasses
import enum
import functools
import json
import time
from collections.abc import AsyncIterator

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
    """CRUD for ledger metadata with compare-and-set."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def new_ledger_id(self) -> int:
        return await self.store.next_id(layout.LEDGER_ID_COUNTER)

    async def create(self, md: LedgerMetadata) -> LedgerMetadata:
        check_ensembles(md)
        try:
            md.version = await self.store.put(layout.ledger_path(md.ledger_id), md.to_bytes(), NOT_EXISTS)
        except BadVersionError:
            raise LedgerExistsError(f"ledger {md.ledger_id} already exists") from None
        return md

    async def read(self, ledger_id: int) -> LedgerMetadata:
        from ledgerstore.meta.retry import retry_read

        path = layout.ledger_path(ledger_id)
        got = await retry_read(lambda: self.store.get(path), f"of ledger {ledger_id}")
        if got is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_bytes(got.value, got.version)

    async def write(self, md: LedgerMetadata) -> LedgerMetadata:
        """CAS ``md`` against ``md.version``; BadVersionError if it changed since it was read."""
        if md.version is None:
            raise ValueError("write() needs metadata read from the store (version unknown)")
        check_ensembles(md)
        md.version = await self.store.put(layout.ledger_path(md.ledger_id), md.to_bytes(), md.version)
        return md

    async def delete(self, ledger_id: int) -> None:
        try:
            await self.store.delete(layout.ledger_path(ledger_id))
        except NoSuchKeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def list(self) -> AsyncIterator[int]:
        """Every ledger id, ascending."""
        for bucket in await self.store.children(layout.LEDGERS):
            ids = [layout.parse_ledger_node(n) for n in await self.store.children(f"{layout.LEDGERS}/{bucket}")]
            for lid in sorted(i for i in ids if i is not None):
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
