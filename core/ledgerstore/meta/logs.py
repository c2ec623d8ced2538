"""Log metadata: a named log is an ordered list of ledgers kept at ``/logs/<name>``.

Every change is a compare-and-set on the store version (the seeds' "Ledgers to logs"): whoever
changes the list read it first, and a :class:`~ledgerstore.errors.BadVersionError` means someone
else changed it in between, so the caller re-reads and decides again.

Stored value (JSON, ``format`` 1)::

    {"format": 1, "name": "orders", "ctime_ms": 1763800000000,
     "ledgers": [{"id": 17, "ctime_ms": 1763800000000}, ...],   # log order
     "truncated_before": "17:0" | null,                          # Position, see below
     "deleting": [12, 13]}                                       # dropped from the list, not yet deleted

A :class:`Position` names one entry of a log: ``(ledger id, entry id)``. Ledger ids come from a
monotonic allocator and a ledger is only ever appended to a log after every ledger already in the
list was created, so ordering positions by ``(ledger_id, entry_id)`` is the log order.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import NamedTuple

from ledgerstore.api import NOT_EXISTS, MetadataStore
from ledgerstore.errors import BadVersionError, InvalidArgumentError, LogError, MetadataError, NoSuchKeyError
from ledgerstore.meta import layout

FORMAT_VERSION = 1

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._\-]{0,199}")
_POSITION = re.compile(r"([0-9]+):([0-9]+)")


class Position(NamedTuple):
    """Where an entry sits in a log. Totally ordered (log order); ``str(p)`` is ``"ledger:entry"``
    and :meth:`parse` reads it back. The same entry always has the same position."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Read ``"ledger:entry"`` (two non-negative decimal integers)."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"a log position is a 'ledger:entry' string, not {type(text).__name__}")
        m = _POSITION.fullmatch(text.strip())
        if m is None:
            raise InvalidArgumentError(
                f"bad log position {text!r}: expected 'ledger:entry' with two non-negative integers, e.g. '17:0'")
        return cls(int(m.group(1)), int(m.group(2)))

    @classmethod
    def coerce(cls, value: Position | tuple[int, int] | str) -> Position:
        """A Position from a Position, a ``(ledger, entry)`` pair or a ``"ledger:entry"`` string."""
        if isinstance(value, Position):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        try:
            ledger, entry = value
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"not a log position: {value!r}") from None
        if not isinstance(ledger, int) or not isinstance(entry, int) or ledger < 0 or entry < 0:
            raise InvalidArgumentError(f"not a log position: {value!r} (need two non-negative integers)")
        return cls(ledger, entry)


def validate_log_name(name: str) -> str:
    """Return ``name`` if it can be a log name (one path component of letters, digits, ``._-``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"bad log name {name!r}: use 1-200 characters from A-Z a-z 0-9 . _ - , not starting with . or -")
    return name


def log_path(name: str) -> str:
    return f"{layout.LOGS}/{validate_log_name(name)}"


@dataclasses.dataclass(frozen=True)
class LogSegment:
    """One ledger of a log and when it joined the log."""

    ledger_id: int
    ctime_ms: int


@dataclasses.dataclass
class LogMetadata:
    """What the cluster knows of a log. ``version`` is the store version it was read at."""

    name: str
    segments: list[LogSegment] = dataclasses.field(default_factory=list)
    truncated_before: Position | None = None
    deleting: list[int] = dataclasses.field(default_factory=list)
    ctime_ms: int = dataclasses.field(default_factory=lambda: int(time.time() * 1000))
    version: int | None = None

    @property
    def ledger_ids(self) -> list[int]:
        """The log's ledgers, in log order."""
        return [s.ledger_id for s in self.segments]

    @property
    def last_ledger_id(self) -> int | None:
        return self.segments[-1].ledger_id if self.segments else None

    def with_ledger(self, ledger_id: int) -> LogMetadata:
        """A copy with ``ledger_id`` appended (same version, ready for a CAS)."""
        last = self.last_ledger_id
        if last is not None and ledger_id <= last:
            # would break "position order is log order"; only a non-monotonic id allocator does this
            raise LogError(
                f"cannot append ledger {ledger_id} to log {self.name!r}: its last ledger is {last} and ledger "
                "ids must increase along a log (is the metadata store's id counter monotonic?)")
        return dataclasses.replace(
            self, segments=[*self.segments, LogSegment(ledger_id, int(time.time() * 1000))])

    def to_bytes(self) -> bytes:
        d = {
            "format": FORMAT_VERSION,
            "name": self.name,
            "ctime_ms": self.ctime_ms,
            "ledgers": [{"id": s.ledger_id, "ctime_ms": s.ctime_ms} for s in self.segments],
            "truncated_before": None if self.truncated_before is None else str(self.truncated_before),
            "deleting": list(self.deleting),
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, version: int | None = None) -> LogMetadata:
        try:
            d = json.loads(data)
            if d.get("format") != FORMAT_VERSION:
                raise MetadataError(f"log metadata format {d.get('format')!r} is not supported (expected {FORMAT_VERSION})")
            tb = d.get("truncated_before")
            return cls(
                name=str(d["name"]),
                segments=[LogSegment(int(s["id"]), int(s["ctime_ms"])) for s in d["ledgers"]],
                truncated_before=None if tb is None else Position.parse(tb),
                deleting=[int(x) for x in d.get("deleting", [])],
                ctime_ms=int(d["ctime_ms"]),
                version=version,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"corrupt log metadata: {exc}") from exc


class LogManager:
    """Reads and compare-and-sets log metadata on any MetadataStore."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def read(self, name: str) -> LogMetadata | None:
        """The log's metadata, or ``None`` if there is no such log."""
        got = await self.store.get(log_path(name))
        if got is None:
            return None
        return LogMetadata.from_bytes(got.value, got.version)

    async def get_or_create(self, name: str) -> LogMetadata:
        """Read the log, creating it empty if absent (a concurrent creator wins harmlessly)."""
        while True:
            md = await self.read(name)
            if md is not None:
                return md
            md = LogMetadata(name=name)
            try:
                md.version = await self.store.put(log_path(name), md.to_bytes(), NOT_EXISTS)
                return md
            except BadVersionError:  # KeyExistsError: someone created it first; read theirs
                continue

    async def write(self, md: LogMetadata) -> LogMetadata:
        """CAS ``md`` against ``md.version``; BadVersionError if it changed since it was read."""
        if md.version is None:
            raise InvalidArgumentError("LogManager.write() needs metadata read from the store (version unknown)")
        md.version = await self.store.put(log_path(md.name), md.to_bytes(), md.version)
        return md

    async def delete(self, md: LogMetadata) -> None:
        """Delete the log's key if it is still at ``md.version`` (BadVersionError otherwise)."""
        try:
            await self.store.delete(log_path(md.name), md.version)
        except NoSuchKeyError:
            raise BadVersionError(f"log {md.name!r} was deleted by another client") from None

    async def list(self) -> list[str]:
        """Names of every log, sorted."""
        return sorted(await self.store.children(layout.LOGS))


__all__ = ["FORMAT_VERSION", "LogManager", "LogMetadata", "LogSegment", "Position", "log_path", "validate_log_name"]
