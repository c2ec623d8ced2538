"""What the bookie knows of each ledger it holds: master key, fenced flag, last-add-confirmed,
and the long-poll LAC waiters (BookKeeper's ``LedgerDescriptor`` and its LAC watchers).

The engine persists the key and the fenced flag; these in-memory copies answer the hot path
without asking it. The journal records a first master key and every fence before either is
acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ledgerstore.api import ServerConnection, StorageEngine
from ledgerstore.errors import LedgerStoreError
from ledgerstore.proto.digest import parse_entry_header


class LedgerDescriptors:
    """Master key, fenced flag and LAC of every ledger held (the rules that change them are
    :class:`~ledgerstore.bookie.ledgers.Ledgers`)."""

    def __init__(self) -> None:
        self.master_keys: dict[int, bytes] = {}
        self.fenced: set[int] = set()
        self.lac: dict[int, int] = {}
        #: ledgers in limbo: this bookie lost data it may have held of them
        #: (:class:`~ledgerstore.bookie.limbo.Limbo` keeps the set and its durable record)
        self.limbo: set[int] = set()

    def load(self, engine: StorageEngine) -> None:
        """Read every ledger's key, fenced flag and LAC from the engine (at start-up)."""
        for lid in engine.list_ledgers():
            key = engine.get_master_key(lid)
            if key is not None:
                self.master_keys[lid] = key
            if engine.is_fenced(lid):
                self.fenced.add(lid)
            last = engine.last_entry_id(lid)
            if last >= 0:
                try:
                    _, _, lac = parse_entry_header(engine.get_entry(lid, last))
                    self.lac[lid] = lac
                except LedgerStoreError:
                    self.lac[lid] = -1

    def forget(self, ledger_id: int) -> None:
        """The ledger was deleted (garbage collected)."""
        self.master_keys.pop(ledger_id, None)
        self.fenced.discard(ledger_id)
        self.lac.pop(ledger_id, None)


class LacWaiters:
    """Long-poll LAC requests waiting for a ledger's LAC to pass what they know, each with its
    expiry timer; indexed by ledger and by connection, so a connection's waiters are counted
    against its limit and freed with it without scanning the others."""

    def __init__(self, answer: Callable[[ServerConnection, int, int], None]) -> None:
        #: called with (connection, request id, ledger) to answer a waiter (woken or expired)
        self._answer = answer
        #: ledger → (connection, request id) → (known LAC, expiry timer)
        self.by_ledger: dict[int, dict[tuple[ServerConnection, int], tuple[int, asyncio.TimerHandle]]] = {}
        #: connection → {(ledger, request id)}
        self.by_conn: dict[ServerConnection, set[tuple[int, int]]] = {}
        self.count = 0

    def refuses(self, conn: ServerConnection, request_id: int, ledger_id: int, total: int, per_connection: int) -> bool:
        """Whether a new waiter is past a limit (or its request id is already waiting)."""
        mine = self.by_conn.get(conn)
        waiters = self.by_ledger.get(ledger_id)
        return (self.count >= total
                or (mine is not None and len(mine) >= per_connection)
                or (waiters is not None and (conn, request_id) in waiters))

    def of_connection(self, conn: ServerConnection) -> int:
        """Waiters of ``conn``."""
        mine = self.by_conn.get(conn)
        return len(mine) if mine else 0

    def add(self, loop: asyncio.AbstractEventLoop, conn: ServerConnection, request_id: int, ledger_id: int,
            known_lac: int, timeout_s: float) -> None:
        """Wait until the ledger's LAC passes ``known_lac``, or ``timeout_s``; then answer."""
        handle = loop.call_later(timeout_s, self._expire, ledger_id, request_id, conn)
        waiters = self.by_ledger.get(ledger_id)
        if waiters is None:
            waiters = self.by_ledger[ledger_id] = {}
        waiters[(conn, request_id)] = (known_lac, handle)
        mine = self.by_conn.get(conn)
        if mine is None:
            mine = self.by_conn[conn] = set()
        mine.add((ledger_id, request_id))
        self.count += 1

    def _forget(self, ledger_id: int, rid: int, conn: ServerConnection) -> None:
        """Drop a waiter from the per-connection index and the count (it left its ledger's dict)."""
        self.count -= 1
        mine = self.by_conn.get(conn)
        if mine is not None:
            mine.discard((ledger_id, rid))
            if not mine:
                del self.by_conn[conn]

    def _expire(self, ledger_id: int, rid: int, conn: ServerConnection) -> None:
        waiters = self.by_ledger.get(ledger_id)
        if waiters is None or waiters.pop((conn, rid), None) is None:
            return
        if not waiters:
            del self.by_ledger[ledger_id]
        self._forget(ledger_id, rid, conn)
        self._answer(conn, rid, ledger_id)

    def wake(self, ledger_id: int, lac: int) -> None:
        """Answer the waiters of ``ledger_id`` that know less than ``lac``."""
        waiters = self.by_ledger.get(ledger_id)
        if waiters is None:
            return
        woken = [(key, w) for key, w in waiters.items() if lac > w[0]]
        for key, w in woken:
            del waiters[key]
            w[1].cancel()
            conn, rid = key
            self._forget(ledger_id, rid, conn)
            self._answer(conn, rid, ledger_id)
        if not waiters:
            del self.by_ledger[ledger_id]

    def drop_connection(self, conn: ServerConnection) -> None:
        """The connection is gone: cancel its waiters without answering them."""
        mine = self.by_conn.pop(conn, None)
        if not mine:
            return
        for lid, rid in mine:
            waiters = self.by_ledger.get(lid)
            w = waiters.pop((conn, rid), None) if waiters is not None else None
            if w is not None:
                w[1].cancel()
                self.count -= 1
                if not waiters:
                    del self.by_ledger[lid]
