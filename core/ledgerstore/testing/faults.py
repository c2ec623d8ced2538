"""Fault injection at the transport and metadata seams, for tests that build an interleaving
step by step.

A :class:`FaultInjector` wraps the connections a client opens (any transport plugin underneath)
and, by rule, drops, delays, holds or duplicates requests to a named bookie or the responses that
bookie sends back. A :class:`FaultyMetadataStore` wraps any metadata store and fails or holds its
next writes. Nothing in the code under test changes: the faults happen on the wire and at the
store, as they would in production::

    faults = FaultInjector()
    async with Client(metadata=uri) as client:
        faults.install(client)
        rule = faults.hold("bookie-1", ops={Op.ADD_BATCH})     # bookie-1 sees no adds for now
        ...
        rule.release()                                          # deliver them, in order

Rules match on the bookie id, the direction (``"request"`` or ``"response"``), the opcode and an
optional predicate over the decoded message; ``times`` bounds how many frames a rule takes
(``None``: every matching frame until the rule is removed). Every decision is logged in
:attr:`FaultInjector.events` so a failing test can say what happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

from ledgerstore.api import Connection, MetadataStore, Transport
from ledgerstore.api.metadata import (
    ANY_VERSION,
    NotificationCallback,
    SessionListener,
    Subscription,
    Versioned,
)
from ledgerstore.errors import LedgerStoreError, MetadataError, ProtocolError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Op

__all__ = [
    "FaultInjector",
    "FaultRule",
    "FaultyMetadataStore",
    "FrameInfo",
    "MetadataFault",
]

log = logging.getLogger(__name__)

Direction = Literal["request", "response"]
Action = Literal["drop", "delay", "hold", "duplicate"]


@dataclasses.dataclass(frozen=True)
class FrameInfo:
    """What a rule sees of one frame: who, which way, the opcode and the decoded message
    (``None`` when the frame does not decode: it still passes through untouched)."""

    bookie: str
    direction: Direction
    op: int
    message: Any

    @property
    def ledger_id(self) -> int | None:
        return getattr(self.message, "ledger_id", None)

    @property
    def entry_ids(self) -> tuple[int, ...]:
        """Entry ids the frame names: one for ADD/READ, all of an ADD_BATCH or READ_MULTI."""
        m = self.message
        if m is None:
            return ()
        if isinstance(m, codec.AddBatchRequest):
            return tuple(e for e, _ in m.entries)
        if isinstance(m, codec.ReadMultiRequest):
            return m.entry_ids
        if isinstance(m, codec.AddBatchResponse | codec.ReadMultiResponse):
            return tuple(item[0] for item in m.items)
        eid = getattr(m, "entry_id", None)
        return () if eid is None else (eid,)

    @property
    def flags(self) -> int:
        return int(getattr(self.message, "flags", 0) or 0)

    @property
    def status(self) -> int | None:
        return getattr(self.message, "status", None) if self.direction == "response" else None


@dataclasses.dataclass(eq=False)
class FaultRule:
    """One rule of a :class:`FaultInjector`. ``hits`` counts the frames it took."""

    injector: FaultInjector
    action: Action
    bookie: str | None
    direction: Direction
    ops: frozenset[int] | None
    match: Callable[[FrameInfo], bool] | None
    times: int | None
    seconds: float = 0.0
    hits: int = 0
    _held: list[tuple[FrameInfo, Callable[[], None]]] = dataclasses.field(default_factory=list)
    _event: asyncio.Event | None = None

    def applies(self, info: FrameInfo) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.bookie is not None and info.bookie != self.bookie:
            return False
        if info.direction != self.direction:
            return False
        if self.ops is not None and info.op not in self.ops:
            return False
        return self.match is None or bool(self.match(info))

    @property
    def held(self) -> int:
        """Frames held by this rule and not yet released."""
        return len(self._held)

    def release(self) -> int:
        """Deliver every held frame, in the order they were held, and stop holding (the rule is
        removed). Returns how many were delivered."""
        self.injector.remove(self)
        held, self._held = self._held, []
        for info, deliver in held:
            self.injector._note("released", info)
            deliver()
        return len(held)

    def discard(self) -> int:
        """Forget every held frame (they are lost) and remove the rule."""
        self.injector.remove(self)
        n = len(self._held)
        for info, _ in self._held:
            self.injector._note("discarded", info)
        self._held = []
        return n

    async def wait_hits(self, n: int = 1, timeout: float = 10.0) -> None:
        """Wait until the rule took at least ``n`` frames (raises TimeoutError otherwise)."""
        if self._event is None:
            self._event = asyncio.Event()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.hits < n:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"fault rule {self.action} on {self.bookie} took {self.hits} frames, wanted {n}")
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), left)
            except TimeoutError:
                continue

    def _took(self) -> None:
        self.hits += 1
        if self._event is not None:
            self._event.set()


class _FaultyConnection(Connection):
    """A real connection whose outgoing frames pass through the injector's request rules."""

    def __init__(self, injector: FaultInjector, bookie: str, inner: Connection) -> None:
        self._injector = injector
        self._bookie = bookie
        self._inner = inner

    def send(self, frame: bytes) -> None:
        if self._inner.is_closed:
            self._inner.send(frame)  # raises the transport's own error
            return
        self._injector._route(self._bookie, "request", frame, self._send_now)

    def _send_now(self, frame: bytes) -> None:
        if not self._inner.is_closed:
            try:
                self._inner.send(frame)
            except LedgerStoreError as exc:  # a delayed frame found the connection gone: lost
                log.debug("delayed frame to %s lost: %s", self._bookie, exc)

    async def drain(self) -> None:
        await self._inner.drain()

    async def close(self) -> None:
        await self._inner.close()

    @property
    def is_closed(self) -> bool:
        return self._inner.is_closed


class FaultInjector:
    """Rules that drop, delay, hold or duplicate frames between clients and bookies.

    Install it on a started :class:`ledgerstore.aio.Client` (:meth:`install`); connections
    opened from then on go through it (:meth:`install` also closes the client's existing ones
    so that none bypasses the rules).
    """

    def __init__(self) -> None:
        self.rules: list[FaultRule] = []
        #: ``(what, bookie, direction, opcode name, ledger, entry ids)`` for every frame a rule took
        self.events: list[tuple[str, str, str, str, int | None, tuple[int, ...]]] = []

    # --- installing --------------------------------------------------------------------------------

    def install(self, client: Any) -> FaultInjector:
        """Route every connection of ``client`` (an ``aio.Client``) through this injector."""
        pool = client.pool
        pool.interceptor = self
        for ch in list(pool._channels.values()):
            conn = ch._conn
            if conn is not None and not isinstance(conn, _FaultyConnection):
                client.loop.create_task(conn.close())
        return self

    async def connect(self, bookie_id: str, transport: Transport, endpoint: str,
                      on_frames: Callable[[Sequence[bytes]], None],
                      on_close: Callable[[BaseException | None], None]) -> Connection:
        """The :class:`~ledgerstore.client.channel.ConnectInterceptor` seam."""

        def frames_in(frames: Sequence[bytes]) -> None:
            for frame in frames:
                self._route(bookie_id, "response", frame, lambda f: on_frames([f]))

        inner = await transport.connect(endpoint, frames_in, on_close)
        return _FaultyConnection(self, bookie_id, inner)

    # --- rules -------------------------------------------------------------------------------------

    def _add(self, action: Action, bookie: str | None, direction: Direction, ops: Collection[int] | None,
             match: Callable[[FrameInfo], bool] | None, times: int | None, seconds: float = 0.0) -> FaultRule:
        if direction not in ("request", "response"):
            raise ValueError(f"direction must be 'request' or 'response', not {direction!r}")
        rule = FaultRule(self, action, bookie, direction, None if ops is None else frozenset(int(o) for o in ops),
                         match, times, seconds)
        self.rules.append(rule)
        return rule

    def drop(self, bookie: str | None = None, *, direction: Direction = "request", ops: Collection[int] | None = None,
             match: Callable[[FrameInfo], bool] | None = None, times: int | None = None) -> FaultRule:
        """Lose matching frames (the sender sees a timeout)."""
        return self._add("drop", bookie, direction, ops, match, times)

    def delay(self, bookie: str | None, seconds: float, *, direction: Direction = "request",
              ops: Collection[int] | None = None, match: Callable[[FrameInfo], bool] | None = None,
              times: int | None = None) -> FaultRule:
        """Deliver matching frames ``seconds`` late (frames behind them may overtake them)."""
        return self._add("delay", bookie, direction, ops, match, times, seconds)

    def hold(self, bookie: str | None = None, *, direction: Direction = "request", ops: Collection[int] | None = None,
             match: Callable[[FrameInfo], bool] | None = None, times: int | None = None) -> FaultRule:
        """Keep matching frames until :meth:`FaultRule.release` (or lose them with
        :meth:`FaultRule.discard`): a paused process, a partition that heals."""
        return self._add("hold", bookie, direction, ops, match, times)

    def duplicate(self, bookie: str | None = None, *, direction: Direction = "request",
                  ops: Collection[int] | None = None, match: Callable[[FrameInfo], bool] | None = None,
                  times: int | None = None) -> FaultRule:
        """Deliver matching frames twice."""
        return self._add("duplicate", bookie, direction, ops, match, times)

    def remove(self, rule: FaultRule) -> None:
        """Stop applying ``rule`` (frames it holds stay held until released or discarded)."""
        if rule in self.rules:
            self.rules.remove(rule)

    def clear(self) -> None:
        """Remove every rule and release what they hold."""
        for rule in list(self.rules):
            rule.release()

    # --- routing -----------------------------------------------------------------------------------

    def _note(self, what: str, info: FrameInfo) -> None:
        name = Op(info.op).name if info.op in Op._value2member_map_ else str(info.op)
        self.events.append((what, info.bookie, info.direction, name, info.ledger_id, info.entry_ids))

    @staticmethod
    def _decode(bookie: str, direction: Direction, frame: bytes) -> FrameInfo:
        op = frame[1] if len(frame) > 1 else -1
        try:
            message: Any = codec.decode_request(frame) if direction == "request" else codec.decode_response(frame)
        except (ProtocolError, LedgerStoreError, ValueError):
            message = None
        return FrameInfo(bookie, direction, op, message)

    def _route(self, bookie: str, direction: Direction, frame: bytes, deliver: Callable[[bytes], None]) -> None:
        if not self.rules:
            deliver(frame)
            return
        info = self._decode(bookie, direction, frame)
        rule = next((r for r in self.rules if r.applies(info)), None)
        if rule is None:
            deliver(frame)
            return
        rule._took()
        self._note(rule.action, info)
        if rule.action == "drop":
            return
        if rule.action == "delay":
            asyncio.get_running_loop().call_later(rule.seconds, deliver, frame)
        elif rule.action == "hold":
            rule._held.append((info, lambda: deliver(frame)))
        else:  # duplicate
            deliver(frame)
            deliver(frame)


# --- the metadata seam ----------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class MetadataFault:
    """A pending fault of a :class:`FaultyMetadataStore`: the next ``times`` writes whose key
    matches fail with ``error`` (or, with ``hold``, wait until :meth:`release`)."""

    match: Callable[[str], bool]
    times: int
    error: BaseException | None
    hold: bool = False
    hits: int = 0
    _gate: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def release(self) -> None:
        """Let held writes go on."""
        self._gate.set()


class FaultyMetadataStore(MetadataStore):
    """Any metadata store, with writes (``put``, ``delete``) that fail or stall on demand.

    Pass it to ``aio.Client(config=..., metadata_store=FaultyMetadataStore(inner))``.
    Reads, watches, ephemerals and the id allocator go straight through.
    """

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner.uri)
        self.options = inner.options
        self.inner = inner
        self.schemes = inner.schemes
        self.faults: list[MetadataFault] = []
        #: ``(operation, key, outcome)`` for every write
        self.writes: list[tuple[str, str, str]] = []

    def fail_writes(self, times: int = 1, *, key: str | Callable[[str], bool] = "",
                    error: BaseException | None = None) -> MetadataFault:
        """Fail the next ``times`` writes to keys starting with ``key`` (or matching it, when
        callable) with ``error`` (default: a :class:`MetadataError`, as a lost connection gives).
        The write does not happen."""
        match = key if callable(key) else (lambda k, p=key: k.startswith(p))
        fault = MetadataFault(match, times, error or MetadataError("injected metadata write failure"))
        self.faults.append(fault)
        return fault

    def hold_writes(self, times: int = 1, *, key: str | Callable[[str], bool] = "") -> MetadataFault:
        """Stall the next ``times`` matching writes until ``release()`` (a paused writer)."""
        match = key if callable(key) else (lambda k, p=key: k.startswith(p))
        fault = MetadataFault(match, times, None, hold=True)
        self.faults.append(fault)
        return fault

    async def _before_write(self, op: str, key: str) -> None:
        for fault in self.faults:
            if fault.hits < fault.times and fault.match(key):
                fault.hits += 1
                if fault.hits >= fault.times:
                    self.faults.remove(fault)
                if fault.hold:
                    self.writes.append((op, key, "held"))
                    await fault._gate.wait()
                    return
                self.writes.append((op, key, "failed"))
                assert fault.error is not None  # only a fault that holds has none
                raise fault.error
        self.writes.append((op, key, "ok"))

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def get(self, key: str) -> Versioned | None:
        return await self.inner.get(key)

    async def put(self, key: str, value: bytes, expected_version: int | None = ANY_VERSION) -> int:
        await self._before_write("put", key)
        return await self.inner.put(key, value, expected_version)

    async def delete(self, key: str, expected_version: int | None = ANY_VERSION) -> None:
        await self._before_write("delete", key)
        await self.inner.delete(key, expected_version)

    async def children(self, key: str) -> list[str]:
        return await self.inner.children(key)

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        return await self.inner.put_ephemeral(key, value)

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        return await self.inner.watch(prefix, callback)

    async def next_id(self, name: str) -> int:
        return await self.inner.next_id(name)

    def add_session_listener(self, listener: SessionListener) -> None:
        self.inner.add_session_listener(listener)

    async def delete_recursive(self, key: str) -> None:
        await self._before_write("delete_recursive", key)
        await self.inner.delete_recursive(key)
