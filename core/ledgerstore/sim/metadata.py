"""The simulation's metadata store: one in-memory namespace, reached with simulated latency.

:class:`SimMetadata` is the server (it outlives every client); each process gets a
:class:`SimMetadataStore` client with its own session. Every call waits a random virtual
latency before it takes effect, so concurrent callers interleave as against a real store. The
simulation can fail a client's next writes (:meth:`SimMetadata.fail_writes`: the write is not
applied and raises :class:`~ledgerstore.errors.MetadataError`) and expire a session (its
ephemeral keys vanish; listeners hear LOST, then RESTORED with a new session).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from ledgerstore.api import (
    NOT_EXISTS,
    EventType,
    MetadataStore,
    Notification,
    NotificationCallback,
    SessionEvent,
    Subscription,
    Versioned,
)
from ledgerstore.errors import (
    BadVersionError,
    KeyExistsError,
    MetadataError,
    NoSuchKeyError,
    SessionExpiredError,
)
from ledgerstore.meta import layout
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.sim.trace import Trace

SCHEME = "sim"


class _Watch(Subscription):
    def __init__(self, owner: SimMetadata, prefix: str, callback: NotificationCallback) -> None:
        self.owner = owner
        self.prefix = prefix
        self.callback = callback
        self.active = True

    def matches(self, key: str) -> bool:
        p = self.prefix
        return p == "/" or key == p or key.startswith(p.rstrip("/") + "/")

    def cancel(self) -> None:
        self.active = False


class SimMetadata:
    """The namespace every simulated process shares (the metadata server)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rng: random.Random, trace: Trace) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.data: dict[str, tuple[bytes, int, int | None]] = {}  # key → (value, version, owner session)
        self.revision = 0
        self.counters: dict[str, int] = {}
        self.sessions: set[int] = set()
        self._next_session = 0
        self.watches: list[_Watch] = []
        #: latency bounds of one call, in seconds
        self.min_delay = 0.0005
        self.max_delay = 0.003
        #: writes still to fail, per node name
        self.failing: dict[str, int] = {}
        #: writes still to apply whose answer is then lost, per node name
        self.unanswered: dict[str, int] = {}
        #: node name -> (probability that a write fails, until when): a flaky store for that process
        self.flaky: dict[str, tuple[float, float]] = {}
        #: paused nodes (the network's held nodes): their calls wait until they wake
        self.paused: dict[str, Any] = {}

    def open_session(self) -> int:
        self._next_session += 1
        self.sessions.add(self._next_session)
        return self._next_session

    def end_session(self, session: int) -> None:
        """The session is gone: its ephemeral keys vanish."""
        self.sessions.discard(session)
        for key in [k for k, (_, _, owner) in self.data.items() if owner == session]:
            self._remove(key)

    def fail_writes(self, node: str, n: int) -> None:
        """The next ``n`` writes of ``node``'s store fail (and are not applied)."""
        self.failing[node] = self.failing.get(node, 0) + n
        self.trace("meta.fail_writes", f"{node} {n}")

    def lose_answers(self, node: str, n: int) -> None:
        """The next ``n`` writes of ``node``'s store are applied, but their answers are lost: the
        caller sees a failure (a connection lost after the server committed the write)."""
        self.unanswered[node] = self.unanswered.get(node, 0) + n
        self.trace("meta.lose_answers", f"{node} {n}")

    def answer_lost(self, node: str) -> bool:
        """Whether the answer to ``node``'s write just applied is lost (one of its next ``n``)."""
        if not self.unanswered.get(node):
            return False
        self.unanswered[node] -= 1
        return True

    def fail_writes_for(self, node: str, probability: float, seconds: float) -> None:
        """For ``seconds``, each write of ``node``'s store fails with ``probability`` (and is not
        applied): a metadata store that times out now and then, for one process."""
        self.flaky[node] = (probability, self.loop.time() + seconds)
        self.trace("meta.flaky", f"{node} p={probability:g} for {seconds:.3f}s")

    def write_fails(self, node: str) -> bool:
        """Whether ``node``'s write now fails (a drawn failure, or one of its next failing writes)."""
        if self.failing.get(node):
            self.failing[node] -= 1
            return True
        flaky = self.flaky.get(node)
        if flaky is None:
            return False
        if self.loop.time() >= flaky[1]:
            del self.flaky[node]
            return False
        return self.rng.random() < flaky[0]

    def _notify(self, kind: EventType, key: str) -> None:
        note = Notification(kind, key)
        for w in self.watches:
            if w.active and w.matches(key):
                self.loop.call_soon(self._deliver, w, note)

    @staticmethod
    def _deliver(w: _Watch, note: Notification) -> None:
        if w.active:
            w.callback(note)

    def _remove(self, key: str) -> None:
        if self.data.pop(key, None) is not None:
            self.revision += 1
            self._notify(EventType.DELETED, key)

    def put(self, key: str, value: bytes, expected: int | None, session: int | None) -> int:
        cur = self.data.get(key)
        if expected == NOT_EXISTS:
            if cur is not None:
                raise KeyExistsError(f"cannot create {key}: it exists (version {cur[1]})")
        elif expected is not None:
            if cur is None or cur[1] != expected:
                found = "nothing" if cur is None else f"version {cur[1]}"
                raise BadVersionError(f"cannot put {key} at version {expected}: found {found}; re-read and retry")
        self.revision += 1
        owner = session if session is not None else (cur[2] if cur is not None else None)
        self.data[key] = (value, self.revision, owner)
        self._notify(EventType.CREATED if cur is None else EventType.MODIFIED, key)
        return self.revision

    def delete(self, key: str, expected: int | None) -> None:
        cur = self.data.get(key)
        if cur is None:
            raise NoSuchKeyError(f"cannot delete {key}: no such key")
        if expected is not None and cur[1] != expected:
            raise BadVersionError(f"cannot delete {key}: expected version {expected}, found {cur[1]}")
        self._remove(key)

    def children(self, key: str) -> list[str]:
        base = key.rstrip("/") + "/"
        return sorted({k[len(base):].split("/", 1)[0] for k in self.data if k.startswith(base)})

    # --- for the checks: the stored state, read without a process, latency or faults ------------------

    def ledger(self, ledger_id: int) -> LedgerMetadata | None:
        """A ledger's metadata as stored now (None if there is none)."""
        cur = self.data.get(layout.ledger_path(ledger_id))
        return None if cur is None else LedgerMetadata.from_bytes(cur[0], cur[1])

    def ledgers(self) -> list[LedgerMetadata]:
        """Every ledger's metadata as stored now, by ledger id."""
        prefix = layout.LEDGERS + "/"
        return [LedgerMetadata.from_bytes(v, ver) for k, (v, ver, _) in sorted(self.data.items())
                if k.startswith(prefix) and k.rsplit("/", 1)[-1].startswith("L")]


class SimMetadataStore(MetadataStore):
    """The metadata-store client of one simulated process (``node`` names it)."""

    schemes = (SCHEME,)
    supports_session_events = True

    def __init__(self, server: SimMetadata, node: str, **options: Any) -> None:
        super().__init__(f"{SCHEME}://{node}", **options)
        self.server = server
        self.node = node
        self.session: int | None = None
        self._watches: list[_Watch] = []

    async def _call(self, what: str, write: bool = False) -> int:
        s = self.server
        while self.node in s.paused:  # a paused process makes no calls
            await asyncio.sleep(0.05)
        await asyncio.sleep(s.rng.uniform(s.min_delay, s.max_delay))
        while self.node in s.paused:  # nor hears the answers
            await asyncio.sleep(0.05)
        if self.session is None or self.session not in s.sessions:
            raise SessionExpiredError(f"simulated metadata store of {self.node}: no session for {what}")
        if write and s.write_fails(self.node):
            s.trace("meta.failed", f"{self.node} {what}")
            raise MetadataError(f"simulated metadata store of {self.node}: {what} failed")
        return self.session

    async def start(self) -> None:
        if self.session is None:
            self.session = self.server.open_session()

    async def close(self) -> None:
        if self.session is not None:
            self.server.end_session(self.session)
            self.session = None
        for w in self._watches:
            w.cancel()

    def crash(self) -> None:
        """The process died: its session ends now (as if it timed out) and its watches stop."""
        self.server.loop.create_task(self.close())

    def expire_session(self) -> None:
        """The server expired the session: ephemeral keys go; a new session replaces it."""
        if self.session is None:
            return
        self.server.trace("meta.expire", self.node)
        self.server.end_session(self.session)
        self.session = self.server.open_session()
        for event in (SessionEvent.LOST, SessionEvent.RESTORED):
            self.server.loop.call_soon(self._fire_session_event, event)

    async def get(self, key: str) -> Versioned | None:
        await self._call(f"get {key}")
        cur = self.server.data.get(key)
        return None if cur is None else Versioned(cur[0], cur[1])

    async def put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        await self._call(f"put {key}", write=True)
        version = self.server.put(key, bytes(value), expected_version, None)
        if self.server.answer_lost(self.node):
            self.server.trace("meta.answer_lost", f"{self.node} put {key} (applied at version {version})")
            raise MetadataError(f"simulated metadata store of {self.node}: the answer to put {key} was lost")
        return version

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        session = await self._call(f"put_ephemeral {key}", write=True)
        return self.server.put(key, bytes(value), None, session)

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        await self._call(f"delete {key}", write=True)
        self.server.delete(key, expected_version)

    async def children(self, key: str) -> list[str]:
        await self._call(f"children {key}")
        return self.server.children(key)

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        await self._call(f"watch {prefix}")
        w = _Watch(self.server, prefix, callback)
        self.server.watches.append(w)
        self._watches.append(w)
        return w

    async def next_id(self, name: str) -> int:
        await self._call(f"next_id {name}", write=True)
        value = self.server.counters.get(name, 0) + 1
        self.server.counters[name] = value
        return value
