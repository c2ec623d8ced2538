"""The bookie's request processor (BookKeeper's ``BookieRequestProcessor``): decodes each frame,
finds its handler in a table (one request type per opcode), limits what is in flight, and answers.

Write path: the ledger rules (``ledgers.py``: :meth:`Ledgers.check_add`) → store in the engine
(:meth:`Ledgers.add_entry`) → log to the journal with an
:class:`~ledgerstore.bookie.completions.AddCompletion` → answered once the journal group holding it
is fsync'd (:meth:`RequestProcessor.on_durable`). Reads are served from the engine (entries are
readable as soon as they are added, like BookKeeper's). A refusal's status is the one its error
class declares (:func:`ledgerstore.errors.status_for`: the one table from error to status).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ledgerstore.api import ServerConnection
from ledgerstore.bookie.completions import AddCompletion, Completion
from ledgerstore.bookie.counters import BookieCounters
from ledgerstore.bookie.journal import Journal
from ledgerstore.bookie.ledger_state import LedgerDescriptors
from ledgerstore.bookie.ledgers import REFUSALS, KeyedRequest, LedgerLookup, LedgerNotLookedUpError, Ledgers
from ledgerstore.bookie.ownership import Ownership
from ledgerstore.bookie.reads import Reads
from ledgerstore.bookie.state import BookieState
from ledgerstore.config import BookieConfig
from ledgerstore.errors import (
    BookieIOError,
    InvalidArgumentError,
    LedgerStoreError,
    ProtocolError,
    status_for,
)
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Op, Status
from ledgerstore.proto.digest import parse_entry_header

log = logging.getLogger(__name__)

Handler = Callable[[ServerConnection, Any], None]


class RequestProcessor:
    """Serves the requests of every connection. The bookie attaches its ledger rules, journal,
    metadata look-ups and ownership once they are open (:meth:`attach`); until the state says
    serving, every request is refused READ_ONLY."""

    ledgers: Ledgers
    journal: Journal[Completion]
    lookup: LedgerLookup

    def __init__(self, config: BookieConfig, state: BookieState, descriptors: LedgerDescriptors,
                 counters: BookieCounters) -> None:
        self.config, self.state, self.descriptors, self.counters = config, state, descriptors, counters
        #: the read side's handlers (``reads.py``), and its long-poll LAC waiters that adds wake
        self.reads = Reads(config, state, descriptors, counters)
        self.waiters = self.reads.waiters
        #: adds waiting for the journal, per connection (the per-connection in-flight limit)
        self.inflight: dict[ServerConnection, int] = {}
        #: called on the event loop once per durable journal group with its record count (metrics);
        #: per group, never per entry, so the write path stays flat
        self.group_observer: Callable[[int], None] | None = None
        #: request type (one per opcode) → its handler
        self.handlers: dict[type, Handler] = {
            codec.AddBatchRequest: self.handle_add_batch,
            codec.ReadMultiRequest: self.reads.handle_read_multi,
            codec.AddRequest: self.handle_add,
            codec.ReadRequest: self.reads.handle_read,
            codec.ReadLacRequest: self.reads.handle_read_lac,
            codec.LongPollLacRequest: self.reads.handle_long_poll,
            codec.BookieInfoRequest: self.reads.handle_bookie_info,
            codec.ListLedgersRequest: self.reads.handle_list_ledgers,
        }
        #: request type → how a request of it that waited for a ledger's look-up is refused
        self.refusals: dict[type, Callable[[ServerConnection, Any, int], None]] = {
            codec.AddBatchRequest: self._refuse_add_batch,
            codec.AddRequest: self._refuse_add,
            codec.ReadRequest: lambda conn, req, status: conn.send(
                codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id)),
            codec.ReadLacRequest: lambda conn, req, status: conn.send(
                codec.encode_lac_response(Op.READ_LAC, req.request_id, status, req.ledger_id, -1, -1)),
        }

    def attach(self, ledgers: Ledgers, journal: Journal[Completion], lookup: LedgerLookup,
               ownership: Ownership | None, loop: asyncio.AbstractEventLoop) -> None:
        """Serve with these (the bookie calls this once they are open, before it serves)."""
        self.ledgers = ledgers
        self.journal = journal
        self.lookup = lookup
        self.reads.attach(ledgers, lookup, ownership, loop)

    # --- frames in, answers out --------------------------------------------------------------------

    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        """Decode and serve each frame (the transport's callback, on the event loop)."""
        if not self.state.serving:  # still starting (replaying the journal): refuse, do not queue
            for frame in frames:
                if len(frame) >= codec.HEADER_SIZE:
                    _, op, _, rid = codec.HEADER.unpack_from(frame)
                    conn.send(codec.encode_error_response(op, rid, Status.READ_ONLY))
            return
        max_frame_size = self.config.max_frame_size
        for frame in frames:
            # One request's failure is answered for that request alone: the connection, the
            # requests after it and other peers carry on.
            try:
                req = codec.decode_request(frame, max_frame_size)
                self.dispatch(conn, req)
            except (ProtocolError, InvalidArgumentError) as exc:
                self._bad_request(conn, frame, exc)
            except Exception as exc:
                self._failed_request(conn, frame, exc)

    def dispatch(self, conn: ServerConnection, req: codec.Request) -> None:
        """Serve one decoded request through the handler table."""
        handler = self.handlers.get(type(req))
        if handler is None:
            raise ProtocolError(f"this bookie does not serve {type(req).__name__}")
        handler(conn, req)

    def resume(self, conn: ServerConnection, req: KeyedRequest) -> None:
        """Serve a request that waited for its ledger's look-up (the ledger exists)."""
        try:
            self.dispatch(conn, req)
        except Exception as exc:
            self._failed_request(conn, codec.encode_request(req)[: codec.HEADER_SIZE], exc)

    def refuse(self, conn: ServerConnection, req: KeyedRequest, status: int) -> None:
        """Answer a request that waited for its ledger's look-up with ``status``."""
        refuse = self.refusals.get(type(req))
        if refuse is not None:
            refuse(conn, req, status)

    def connection_lost(self, conn: ServerConnection) -> None:
        """Forget the connection's in-flight count and its long-poll waiters."""
        self.inflight.pop(conn, None)
        self.waiters.drop_connection(conn)

    def _bad_request(self, conn: ServerConnection, frame: bytes, exc: Exception) -> None:
        self.counters.bad_requests += 1
        if len(frame) >= codec.HEADER_SIZE:
            _, op, _, rid = codec.HEADER.unpack_from(frame)
            conn.send(codec.encode_error_response(op, rid, Status.BAD_REQUEST))
        else:
            conn.send(codec.encode_error_response(0, 0, Status.BAD_REQUEST))
        if self.counters.bad_requests % 1000 == 1:
            log.warning("bad request from %s: %s (%d so far)", conn.peer, exc, self.counters.bad_requests)

    def _failed_request(self, conn: ServerConnection, frame: bytes, exc: Exception) -> None:
        """A request whose handling failed unexpectedly: answered IO_ERROR, logged (with the
        traceback of the first of every thousand), the connection kept."""
        c = self.counters
        c.failed_requests += 1
        _, op, _, rid = codec.HEADER.unpack_from(frame)
        conn.send(codec.encode_error_response(op, rid, Status.IO_ERROR))
        if c.failed_requests % 1000 == 1:
            log.error("request from %s (opcode %d) failed: %r (%d so far)", conn.peer, op, exc, c.failed_requests,
                      exc_info=exc)

    # --- journal completions -----------------------------------------------------------------------

    def on_durable(self, completions: list[Completion]) -> None:
        """A journal group is on disk: answer every request waiting for it (on the loop)."""
        if self.group_observer is not None:
            self.group_observer(sum(1 if c is None else c.records for c in completions))
        for c in completions:
            if c is not None:
                c.durable(self)

    def on_journal_failed(self, completions: list[Completion], exc: BaseException) -> None:
        """The journal writer failed: answer the adds of its last group with an IO error."""
        for c in completions:
            if c is not None:
                c.failed(self)

    def in_flight(self, conn: ServerConnection) -> int:
        """Adds of ``conn`` waiting for the journal."""
        return self.inflight.get(conn, 0)

    def release_inflight(self, conn: ServerConnection, n: int) -> None:
        """``n`` adds of ``conn`` were answered: they no longer count against its limit."""
        left = self.inflight.get(conn, 0) - n
        if left > 0:
            self.inflight[conn] = left
        else:
            self.inflight.pop(conn, None)

    # --- adds ----------------------------------------------------------------------------------------

    def _note_lac(self, lid: int, lac: int) -> None:
        lacs = self.descriptors.lac
        if lac > lacs.get(lid, -1):
            lacs[lid] = lac
            if lid in self.waiters.by_ledger:
                self.waiters.wake(lid, lac)

    def handle_add(self, conn: ServerConnection, req: codec.AddRequest) -> None:
        """One entry: stored in the engine now, answered once its journal record is durable."""
        started = time.perf_counter()
        c = self.counters
        status: int | None = None
        try:
            self.ledgers.check_add(req.ledger_id, req.master_key, req.flags)
        except LedgerNotLookedUpError:
            self.lookup.wait(conn, req)
            return
        except REFUSALS as exc:
            status = status_for(exc)
        c.add_requests += 1
        entry = req.entry
        if status is None:
            try:
                lid, eid, lac = parse_entry_header(entry)
            except LedgerStoreError:
                lid = eid = lac = -1
            if lid != req.ledger_id or eid != req.entry_id:
                status = Status.BAD_REQUEST
        if status is not None:
            self._refuse_add(conn, req, status)
            return
        try:
            self.ledgers.add_entry(req.ledger_id, req.entry_id, entry)
        except BookieIOError:
            conn.send(codec.encode_add_response(req.request_id, Status.IO_ERROR, req.ledger_id, req.entry_id))
            return
        c.add_bytes += len(entry)
        self._note_lac(req.ledger_id, lac)
        self.inflight[conn] = self.inflight.get(conn, 0) + 1
        self.journal.log_add(req.ledger_id, req.entry_id, entry, AddCompletion(
            conn, codec.encode_add_response(req.request_id, Status.OK, req.ledger_id, req.entry_id)), started)

    def handle_add_batch(self, conn: ServerConnection, req: codec.AddBatchRequest) -> None:
        """Many entries of one ledger: one key/fence check, one journal item, one answer once
        the whole batch is durable."""
        started = time.perf_counter()
        c = self.counters
        entries = req.entries
        lid = req.ledger_id
        status: int | None = None
        try:
            self.ledgers.check_add(lid, req.master_key, req.flags)
        except LedgerNotLookedUpError:
            self.lookup.wait(conn, req)
            return
        except REFUSALS as exc:
            status = status_for(exc)
        c.add_requests += len(entries)
        inflight = self.inflight.get(conn, 0)
        if status is None and inflight + len(entries) > self.config.max_adds_in_flight_per_connection and inflight:
            status = Status.TOO_MANY_REQUESTS
        if status is not None:
            self._refuse_add_batch(conn, req, status)
            return
        # every signed entry must name this ledger and the id it is sent under
        max_lac = codec.batch_max_lac(lid, entries)
        if max_lac is None or not req.raw_entries:
            self._add_batch_each(conn, req, inflight)
            return
        try:
            self.ledgers.add_entries(lid, entries)
        except BookieIOError:
            conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, lid,
                                                      [(e, Status.IO_ERROR) for e, _ in entries]))
            return
        n = len(entries)
        c.add_bytes += len(req.raw_entries) - 12 * n
        self._note_lac(lid, max_lac)
        self.inflight[conn] = inflight + n
        # the entry section as received is the journal record's data: nothing is encoded per entry
        self.journal.log_add_batch(lid, n, req.raw_entries,
                                   AddCompletion(conn, codec.encode_add_batch_all_ok(req.request_id, lid, n), n),
                                   started)

    def _add_batch_each(self, conn: ServerConnection, req: codec.AddBatchRequest, inflight: int) -> None:
        """A batch with malformed entries: store and answer entry by entry."""
        lid = req.ledger_id
        items, stored, nbytes, max_lac = self.ledgers.add_each(lid, req.entries)
        self.counters.add_bytes += nbytes
        self._note_lac(lid, max_lac)
        frame = codec.encode_add_batch_response(req.request_id, Status.OK, lid, items)
        if stored:
            self.inflight[conn] = inflight + len(stored)
            self.journal.log_adds(lid, stored, AddCompletion(conn, frame, len(stored)))
        else:
            conn.send(frame)

    def _refuse_add_batch(self, conn: ServerConnection, req: codec.AddBatchRequest, status: int) -> None:
        self.counters.rejected_adds[Status(status).name] += len(req.entries)
        conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, req.ledger_id,
                                                  [(e, status) for e, _ in req.entries]))

    def _refuse_add(self, conn: ServerConnection, req: codec.AddRequest, status: int) -> None:
        self.counters.rejected_adds[Status(status).name] += 1
        conn.send(codec.encode_add_response(req.request_id, status, req.ledger_id, req.entry_id))
