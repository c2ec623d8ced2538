"""The bookie's request processor (BookKeeper's ``BookieRequestProcessor``): decodes each frame,
finds its handler in a table (one request type per opcode), and answers.

Write path: check master key, fenced flag, read-only → add to the storage engine → append to the
journal with a :class:`Completion` → answer once the journal group holding it is fsync'd. Reads are
served from the engine (entries are readable as soon as they are added, like BookKeeper's). A
failure's status comes from its exception class (:func:`ledgerstore.errors.status_for`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import MetadataStore, ServerConnection, StorageEngine
from ledgerstore.bookie.disks import disk_usage
from ledgerstore.bookie.journal import ADD, ADD_BATCH, FENCE, MASTER_KEY, Journal, encode_record, record_parts
from ledgerstore.bookie.ledger_state import AWAIT_METADATA, LacWaiters, LedgerDescriptors
from ledgerstore.bookie.ownership import Ownership
from ledgerstore.bookie.state import BookieState
from ledgerstore.config import BookieConfig
from ledgerstore.errors import (
    BookieDiskFullError,
    InvalidArgumentError,
    LedgerStoreError,
    NoSuchLedgerError,
    ProtocolError,
    status_for,
)
from ledgerstore.latency import LatencyHistogram
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Op, Status
from ledgerstore.proto.digest import master_key, parse_entry_header
from ledgerstore.stalls import peaks

log = logging.getLogger(__name__)

#: a ledger the metadata store did not have is looked up once more after this long (a metadata
#: store read from another session may lag the writer's create by a moment)
_LOOKUP_RETRY_S = 0.1
#: a read-only bookie accepts recovery adds while its ledger disks have this much free space
RECOVERY_ADD_RESERVE_BYTES = 64 << 20


class BookieCounters:
    """Figures exported as metrics."""

    def __init__(self) -> None:
        self.add_requests = 0
        self.add_bytes = 0
        self.read_requests = 0
        #: bytes of entries answered to reads (BookKeeper's READ_BYTES), counted per request
        self.read_bytes = 0
        self.bad_requests = 0
        #: requests whose handler failed unexpectedly (answered IO_ERROR; the connection carries on)
        self.failed_requests = 0
        self.rejected_adds: dict[str, int] = defaultdict(int)
        #: long-poll LAC requests refused because a waiter limit was reached
        self.refused_long_polls = 0
        #: metadata look-ups of ledgers new to this bookie (one per ledger, before its first key)
        self.ledger_lookups = 0
        #: requests naming a ledger new to this bookie that the metadata store does not hold
        self.unknown_ledger_claims = 0
        #: read requests (READ, READ_MULTI) from arrival to answer (BookKeeper's READ_ENTRY_REQUEST)
        self.read_request_seconds = LatencyHistogram()
        #: engine.flush() of each checkpoint (the ledger storage flush), and the whole checkpoint
        self.flush_seconds = LatencyHistogram()
        self.checkpoint_seconds = LatencyHistogram()


# --- journal completions ----------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class AddCompletion:
    """Adds (one entry or a batch of ``records``) answered with ``frame`` once durable."""

    conn: ServerConnection
    frame: bytes
    records: int = 1

    def durable(self, processor: RequestProcessor) -> None:
        """Answer OK and release the adds' in-flight count."""
        processor.release_inflight(self.conn, self.records)
        self.conn.send(self.frame)

    def failed(self, processor: RequestProcessor) -> None:
        """Answer IO_ERROR under the request's opcode and id."""
        _, op, _, rid = codec.HEADER.unpack_from(self.frame)
        self.conn.send(codec.encode_error_response(op, rid, Status.IO_ERROR))


@dataclasses.dataclass(slots=True)
class FenceCompletion:
    """A fence, answered by ``answer()`` once the fence record is durable."""

    conn: ServerConnection
    answer: Callable[[], None]
    records: int = 1

    def durable(self, processor: RequestProcessor) -> None:
        """Answer the fencing request."""
        try:  # a fence's answer: its failure must not cost the rest of the group theirs
            self.answer()
        except Exception as exc:
            processor.counters.failed_requests += 1
            log.error("answering a fence of %s failed: %r", self.conn.peer, exc, exc_info=exc)

    def failed(self, processor: RequestProcessor) -> None:
        """No answer: the client times out and retries elsewhere."""


#: what the bookie's journal carries per append (None: a record nobody waits for, a first key)
Completion = AddCompletion | FenceCompletion | None

Handler = Callable[[ServerConnection, Any], None]


class RequestProcessor:
    """Serves the requests of every connection. The bookie attaches its engine, journal, metadata
    store and ownership once they are open (:meth:`attach`); until the state says serving, every
    request is refused READ_ONLY."""

    def __init__(self, config: BookieConfig, ledger_dirs: Sequence[Path], state: BookieState,
                 ledgers: LedgerDescriptors, counters: BookieCounters) -> None:
        self.config = config
        self.ledger_dirs = list(ledger_dirs)
        self.state = state
        self.ledgers = ledgers
        self.counters = counters
        self.waiters = LacWaiters(self._answer_long_poll)
        self.engine: StorageEngine | None = None
        self.journal: Journal[Completion] | None = None
        self.store: MetadataStore | None = None
        self.ownership: Ownership | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: adds waiting for the journal, per connection (the per-connection in-flight limit)
        self.inflight: dict[ServerConnection, int] = {}
        #: requests waiting for the metadata look-up of a ledger new to this bookie
        self.awaiting_metadata: dict[int, list[tuple[ServerConnection, codec.Request]]] = {}
        self.awaiting_count = 0
        self.lookups: set[asyncio.Task[None]] = set()
        #: called on the event loop once per durable journal group with its record count (metrics);
        #: per group, never per entry, so the write path stays flat
        self.group_observer: Callable[[int], None] | None = None
        #: called on the event loop when storage found a disk full (the bookie checks its disks now)
        self.on_disk_full: Callable[[], None] | None = None
        #: request type (one per opcode) → its handler
        self.handlers: dict[type, Handler] = {
            codec.AddBatchRequest: self.handle_add_batch,
            codec.ReadMultiRequest: self.handle_read_multi,
            codec.AddRequest: self.handle_add,
            codec.ReadRequest: self.handle_read,
            codec.ReadLacRequest: self.handle_read_lac,
            codec.LongPollLacRequest: self.handle_long_poll,
            codec.BookieInfoRequest: self.handle_bookie_info,
            codec.ListLedgersRequest: self.handle_list_ledgers,
        }
        #: request type → how a request of it that waited for a ledger's look-up is refused
        self.refusals: dict[type, Callable[[ServerConnection, Any, int], None]] = {
            codec.AddBatchRequest: self._refuse_add_batch,
            codec.AddRequest: self._refuse_add,
            codec.ReadRequest: self._refuse_read,
            codec.ReadLacRequest: self._refuse_read_lac,
        }

    def attach(self, engine: StorageEngine, journal: Journal[Completion], store: MetadataStore | None,
               ownership: Ownership | None, loop: asyncio.AbstractEventLoop) -> None:
        """Serve with these (the bookie calls this once they are open, before it serves)."""
        self.engine = engine
        self.journal = journal
        self.store = store
        self.ownership = ownership
        self.loop = loop

    def _storage_failed(self, exc: BaseException) -> None:
        if isinstance(exc, BookieDiskFullError) and self.on_disk_full is not None:
            self.on_disk_full()

    def disk_usage(self) -> tuple[int, int, int]:
        """(total, used, free) bytes of the ledger directories' file systems."""
        return disk_usage(self.ledger_dirs)

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

    def release_inflight(self, conn: ServerConnection, n: int) -> None:
        """``n`` adds of ``conn`` were answered: they no longer count against its limit."""
        left = self.inflight.get(conn, 0) - n
        if left > 0:
            self.inflight[conn] = left
        else:
            self.inflight.pop(conn, None)

    # --- keys and fences ---------------------------------------------------------------------------

    def _record_first_key(self, ledger_id: int, key: bytes) -> None:
        assert self.engine is not None and self.journal is not None
        self.engine.set_master_key(ledger_id, key)
        self.journal.append(encode_record(MASTER_KEY, ledger_id, 0, key), None)

    def check_key(self, ledger_id: int, key: bytes) -> int | None:
        """Status to refuse with, or None (or ``AWAIT_METADATA``: see :class:`LedgerDescriptors`)."""
        return self.ledgers.check_key(ledger_id, key, self._record_first_key)

    def _fence(self, conn: ServerConnection, ledger_id: int, key: bytes, then: Callable[[], None]) -> int | None:
        """Fence durably, then run ``then()``. Returns None when under way, else the status the
        caller refuses with (or ``AWAIT_METADATA`` for it to wait for the ledger's look-up)."""
        assert self.engine is not None and self.journal is not None
        status = self.check_key(ledger_id, key)
        if status is not None:
            return status
        if ledger_id not in self.ledgers.fenced:
            self.engine.set_fenced(ledger_id)
            self.ledgers.fenced.add(ledger_id)
        # Answer only once the fence record (and everything queued before it) is durable.
        self.journal.append(encode_record(FENCE, ledger_id, 0), FenceCompletion(conn, then))
        return None

    # --- adds ----------------------------------------------------------------------------------------

    def _add_refusal(self, ledger_id: int, key: bytes, flags: int) -> int | None:
        """The status refusing every add of a request, or None to go on."""
        if not self.state.registered.is_set():
            return Status.READ_ONLY
        if self.state.read_only and not (flags & FLAG_RECOVERY_ADD
                                         and self.disk_usage()[2] >= RECOVERY_ADD_RESERVE_BYTES):
            # like BookKeeper's high-priority writes: recovery adds still land on a read-only
            # bookie so that ledgers can be closed, as long as its disks keep a reserve
            return Status.READ_ONLY
        if self.journal is None or self.journal.failed is not None:
            return Status.IO_ERROR
        status = self.check_key(ledger_id, key)
        if status is None and ledger_id in self.ledgers.fenced and not flags & FLAG_RECOVERY_ADD:
            return Status.FENCED
        return status

    def _note_lac(self, lid: int, lac: int) -> None:
        lacs = self.ledgers.lac
        if lac > lacs.get(lid, -1):
            lacs[lid] = lac
            if lid in self.waiters.by_ledger:
                self.waiters.wake(lid, lac)

    def handle_add(self, conn: ServerConnection, req: codec.AddRequest) -> None:
        """One entry: stored in the engine now, answered once its journal record is durable."""
        started = time.perf_counter()
        c = self.counters
        status = self._add_refusal(req.ledger_id, req.master_key, req.flags)
        if status == AWAIT_METADATA:
            self._await_metadata(conn, req)
            return
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
            c.rejected_adds[Status(status).name] += 1
            conn.send(codec.encode_add_response(req.request_id, status, req.ledger_id, req.entry_id))
            return
        assert self.engine is not None and self.journal is not None
        try:
            self.engine.add_entry(req.ledger_id, req.entry_id, entry)
        except (LedgerStoreError, OSError) as exc:
            log.error("storage failed to add ledger %d entry %d: %s", req.ledger_id, req.entry_id, exc)
            self._storage_failed(exc)
            conn.send(codec.encode_add_response(req.request_id, Status.IO_ERROR, req.ledger_id, req.entry_id))
            return
        c.add_bytes += len(entry)
        self._note_lac(req.ledger_id, lac)
        self.inflight[conn] = self.inflight.get(conn, 0) + 1
        self.journal.append(
            encode_record(ADD, req.ledger_id, req.entry_id, entry),
            AddCompletion(conn, codec.encode_add_response(req.request_id, Status.OK, req.ledger_id, req.entry_id)),
            1, started,
        )

    def handle_add_batch(self, conn: ServerConnection, req: codec.AddBatchRequest) -> None:
        """Many entries of one ledger: one key/fence check, one journal item, one answer once
        the whole batch is durable."""
        started = time.perf_counter()
        c = self.counters
        entries = req.entries
        lid = req.ledger_id
        status = self._add_refusal(lid, req.master_key, req.flags)
        if status == AWAIT_METADATA:
            self._await_metadata(conn, req)
            return
        c.add_requests += len(entries)
        inflight = self.inflight.get(conn, 0)
        if status is None and inflight + len(entries) > self.config.max_adds_in_flight_per_connection and inflight:
            status = Status.TOO_MANY_REQUESTS
        if status is not None:
            c.rejected_adds[Status(status).name] += len(entries)
            conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, lid, [(e, status) for e, _ in entries]))
            return
        assert self.engine is not None and self.journal is not None
        # every signed entry must name this ledger and the id it is sent under
        max_lac = codec.batch_max_lac(lid, entries)
        if max_lac is None or not req.raw_entries:
            self._add_batch_each(conn, req, inflight)
            return
        try:
            self.engine.add_entries(lid, entries)
        except (LedgerStoreError, OSError) as exc:
            log.error("storage failed to add a batch of %d entries of ledger %d: %s", len(entries), lid, exc)
            self._storage_failed(exc)
            conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, lid,
                                                      [(e, Status.IO_ERROR) for e, _ in entries]))
            return
        n = len(entries)
        c.add_bytes += len(req.raw_entries) - 12 * n
        self._note_lac(lid, max_lac)
        self.inflight[conn] = inflight + n
        # the entry section as received is the journal record's data: nothing is encoded per entry
        self.journal.append(record_parts(ADD_BATCH, lid, n, req.raw_entries),
                            AddCompletion(conn, codec.encode_add_batch_all_ok(req.request_id, lid, n), n), n, started)

    def _add_batch_each(self, conn: ServerConnection, req: codec.AddBatchRequest, inflight: int) -> None:
        """A batch with malformed entries: store and answer entry by entry."""
        assert self.engine is not None and self.journal is not None
        lid = req.ledger_id
        add = self.engine.add_entry
        items: list[tuple[int, int]] = []
        records: list[bytes] = []
        max_lac = -1
        nbytes = 0
        for eid, entry in req.entries:
            try:
                hl, he, lac = parse_entry_header(entry)
            except LedgerStoreError:
                hl = he = lac = -1
            if hl != lid or he != eid:
                items.append((eid, Status.BAD_REQUEST))
                continue
            try:
                add(lid, eid, entry)
            except (LedgerStoreError, OSError) as exc:
                log.error("storage failed to add ledger %d entry %d: %s", lid, eid, exc)
                self._storage_failed(exc)
                items.append((eid, Status.IO_ERROR))
                continue
            records.append(encode_record(ADD, lid, eid, entry))
            items.append((eid, Status.OK))
            nbytes += len(entry)
            if lac > max_lac:
                max_lac = lac
        self.counters.add_bytes += nbytes
        self._note_lac(lid, max_lac)
        frame = codec.encode_add_batch_response(req.request_id, Status.OK, lid, items)
        if records:
            self.inflight[conn] = inflight + len(records)
            self.journal.append(b"".join(records), AddCompletion(conn, frame, len(records)), len(records))
        else:
            conn.send(frame)

    # --- reads ---------------------------------------------------------------------------------------

    @staticmethod
    def _read_status(ledger_id: int, entry_id: int, exc: BaseException, *, bad_request: bool = True) -> int:
        """The status a failed read of one entry answers: what its error class declares when that
        is "no such ledger / entry" (or "bad request", for an id the engine cannot hold: no such
        entry can exist), else an IO error, logged."""
        status = status_for(exc)
        if status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY) or (bad_request and status == Status.BAD_REQUEST):
            return status
        log.error("read of ledger %d entry %d failed: %s", ledger_id, entry_id, exc)
        return Status.IO_ERROR

    def handle_read(self, conn: ServerConnection, req: codec.ReadRequest) -> None:
        """One entry; with the fence flag, the ledger is fenced durably first."""
        if req.flags & FLAG_FENCE:
            status = self._fence(conn, req.ledger_id, req.master_key, lambda: conn.send(self._read_response(req)))
            if status == AWAIT_METADATA:
                self._await_metadata(conn, req)
                return
            self.counters.read_requests += 1
            if status is not None:
                conn.send(codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id))
            return
        self.counters.read_requests += 1
        started = time.perf_counter()
        conn.send(self._read_response(req))
        self.counters.read_request_seconds.observe(time.perf_counter() - started)

    def _read_response(self, req: codec.ReadRequest) -> bytes:
        assert self.engine is not None
        try:
            data = self.engine.get_entry(req.ledger_id, req.entry_id)
        except (LedgerStoreError, OSError) as exc:
            status = self._read_status(req.ledger_id, req.entry_id, exc)
            return codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id)
        self.counters.read_bytes += len(data)
        return codec.encode_read_response(req.request_id, Status.OK, req.ledger_id, req.entry_id, data)

    def handle_read_multi(self, conn: ServerConnection, req: codec.ReadMultiRequest) -> None:
        """Many entries in one answer, up to the frame limit; the rest are answered
        TOO_MANY_REQUESTS for the client to ask again."""
        started = time.perf_counter()
        assert self.engine is not None
        self.counters.read_requests += len(req.entry_ids)
        budget = self.config.max_frame_size - 64 - 14 * len(req.entry_ids)
        sent = 0
        items: list[tuple[int, int, bytes]] = []
        append = items.append
        for eid, got in zip(req.entry_ids, self.engine.get_entries(req.ledger_id, req.entry_ids), strict=True):
            if isinstance(got, bytes):
                if budget <= 0 or len(got) > budget:
                    # past the frame limit: the client asks again for the rest
                    append((eid, Status.TOO_MANY_REQUESTS, b""))
                    budget = 0
                    continue
                budget -= len(got)
                sent += len(got)
                append((eid, Status.OK, got))
            else:
                append((eid, self._read_status(req.ledger_id, eid, got, bad_request=False), b""))
        conn.send(codec.encode_read_multi_response(req.request_id, Status.OK, req.ledger_id, items))
        self.counters.read_bytes += sent
        self.counters.read_request_seconds.observe(time.perf_counter() - started)

    # --- last-add-confirmed ----------------------------------------------------------------------------

    def _lac_response(self, op: Op, rid: int, ledger_id: int) -> bytes:
        assert self.engine is not None
        if ledger_id not in self.ledgers.master_keys:
            return codec.encode_lac_response(op, rid, Status.NO_SUCH_LEDGER, ledger_id, -1, -1)
        try:
            last = self.engine.last_entry_id(ledger_id)
        except NoSuchLedgerError:
            last = -1
        return codec.encode_lac_response(op, rid, Status.OK, ledger_id, self.ledgers.lac.get(ledger_id, -1), last)

    def _answer_long_poll(self, conn: ServerConnection, rid: int, ledger_id: int) -> None:
        conn.send(self._lac_response(Op.LONG_POLL_LAC, rid, ledger_id))

    def handle_read_lac(self, conn: ServerConnection, req: codec.ReadLacRequest) -> None:
        """The ledger's LAC and last entry; with the fence flag, after fencing it durably."""
        if req.flags & FLAG_FENCE:
            then = lambda: conn.send(self._lac_response(Op.READ_LAC, req.request_id, req.ledger_id))  # noqa: E731
            status = self._fence(conn, req.ledger_id, req.master_key, then)
            if status == AWAIT_METADATA:
                self._await_metadata(conn, req)
                return
            self.counters.read_requests += 1
            if status is not None:
                conn.send(codec.encode_lac_response(Op.READ_LAC, req.request_id, status, req.ledger_id, -1, -1))
            return
        self.counters.read_requests += 1
        conn.send(self._lac_response(Op.READ_LAC, req.request_id, req.ledger_id))

    def handle_long_poll(self, conn: ServerConnection, req: codec.LongPollLacRequest) -> None:
        """The LAC once it passes what the client knows, or when the request times out."""
        lid = req.ledger_id
        lac = self.ledgers.lac.get(lid, -1)
        if lac > req.known_lac or req.timeout_ms == 0 or lid in self.ledgers.fenced:
            conn.send(self._lac_response(Op.LONG_POLL_LAC, req.request_id, lid))
            return
        assert self.loop is not None
        cfg = self.config
        w = self.waiters
        if w.refuses(conn, req.request_id, lid, cfg.max_long_poll_waiters, cfg.max_long_poll_waiters_per_connection):
            # past a limit (or a request id already waiting): refused, the client polls again later
            c = self.counters
            c.refused_long_polls += 1
            if c.refused_long_polls % 1000 == 1:
                log.warning("refusing long-poll LAC waiters from %s: %d waiting here, %d from it (limits %d and %d "
                            "per connection; %d refused so far)", conn.peer, w.count, w.of_connection(conn),
                            cfg.max_long_poll_waiters, cfg.max_long_poll_waiters_per_connection, c.refused_long_polls)
            conn.send(codec.encode_lac_response(Op.LONG_POLL_LAC, req.request_id, Status.TOO_MANY_REQUESTS, lid, -1, -1))
            return
        w.add(self.loop, conn, req.request_id, lid, req.known_lac, min(req.timeout_ms, 600_000) / 1000.0)

    # --- bookie facts --------------------------------------------------------------------------------

    def handle_bookie_info(self, conn: ServerConnection, req: codec.BookieInfoRequest) -> None:
        """Free and total disk, ledgers held, read-only or not."""
        total, _, free = self.disk_usage()
        conn.send(codec.encode_bookie_info_response(
            req.request_id, Status.OK, free, total, len(self.ledgers.master_keys), self.state.read_only))

    def handle_list_ledgers(self, conn: ServerConnection, req: codec.ListLedgersRequest) -> None:
        """The ledgers held from ``req.first_ledger_id`` on, with the last entry of each (the
        auditor's replicas check). A bookie that lost its data holds nothing it could vouch for."""
        assert self.engine is not None
        out: list[tuple[int, int]] = []
        if self.ownership is None or self.ownership.lost is None:
            for lid in sorted(lid for lid in self.engine.list_ledgers() if lid >= req.first_ledger_id):
                try:
                    out.append((lid, self.engine.last_entry_id(lid)))
                except NoSuchLedgerError:
                    continue
                if len(out) >= req.max_ledgers:
                    break
        conn.send(codec.encode_list_ledgers_response(req.request_id, Status.OK, out))

    # --- first master key of a ledger new to this bookie ------------------------------------------

    def _await_metadata(self, conn: ServerConnection,
                        req: codec.AddRequest | codec.AddBatchRequest | codec.ReadRequest | codec.ReadLacRequest) -> None:
        """Hold ``req`` (an add or fence of a ledger new to this bookie) until the metadata store
        says whether the ledger exists: one look-up per ledger, however many requests wait for it.
        Later requests of the ledger find its key recorded and are not delayed."""
        lid = req.ledger_id
        if self.awaiting_count >= self.config.max_requests_awaiting_metadata:
            self._refuse_waiting(conn, req, Status.TOO_MANY_REQUESTS)
            return
        waiting = self.awaiting_metadata.get(lid)
        self.awaiting_count += 1
        if waiting is not None:
            waiting.append((conn, req))
            return
        self.awaiting_metadata[lid] = [(conn, req)]
        assert self.loop is not None
        task = self.loop.create_task(self._look_up_ledger(lid), name=f"ledger-lookup-{lid}")
        self.lookups.add(task)
        task.add_done_callback(self.lookups.discard)

    async def _look_up_ledger(self, ledger_id: int) -> None:
        assert self.store is not None
        mgr = LedgerManager(self.store)
        self.counters.ledger_lookups += 1
        status: int | None = None
        t0 = time.perf_counter()
        try:
            try:
                md = await mgr.read(ledger_id)
            except NoSuchLedgerError:
                await asyncio.sleep(_LOOKUP_RETRY_S)
                md = await mgr.read(ledger_id)
            finally:  # the first adds of the ledger wait for it
                peaks.observe("metadata_lookup", time.perf_counter() - t0)
        except NoSuchLedgerError:
            status = Status.NO_SUCH_LEDGER
        except Exception as exc:  # the store is unreachable: the writer retries, nothing is claimed
            log.warning("could not look up ledger %d in the metadata store: %s", ledger_id, exc)
            status = Status.IO_ERROR
        else:
            allowed = b""
            if md.password is not None:
                try:
                    allowed = master_key(base64.b64decode(md.password, validate=True))
                except binascii.Error:
                    log.warning("ledger %d's metadata holds a password that is not base64; its first key is not "
                                "checked against it", ledger_id)
            self.ledgers.allow_first_key(ledger_id, allowed)
        waiting = self.awaiting_metadata.pop(ledger_id, [])
        self.awaiting_count -= len(waiting)
        if status is not None:
            c = self.counters
            if status == Status.NO_SUCH_LEDGER:
                c.unknown_ledger_claims += 1
                if c.unknown_ledger_claims % 1000 == 1:
                    log.warning("refused %d request(s) from %s naming ledger %d, which the metadata store does not "
                                "hold (%d such ledgers so far)", len(waiting), waiting[0][0].peer if waiting else "?",
                                ledger_id, c.unknown_ledger_claims)
            for conn, req in waiting:
                self._refuse_waiting(conn, req, status)
            return
        for conn, req in waiting:
            try:
                self.dispatch(conn, req)
            except Exception as exc:
                self._failed_request(conn, codec.encode_request(req)[: codec.HEADER_SIZE], exc)

    def _refuse_waiting(self, conn: ServerConnection, req: codec.Request, status: int) -> None:
        refuse = self.refusals.get(type(req))
        if refuse is not None:
            refuse(conn, req, status)

    def _refuse_add_batch(self, conn: ServerConnection, req: codec.AddBatchRequest, status: int) -> None:
        self.counters.rejected_adds[Status(status).name] += len(req.entries)
        conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, req.ledger_id,
                                                  [(e, status) for e, _ in req.entries]))

    def _refuse_add(self, conn: ServerConnection, req: codec.AddRequest, status: int) -> None:
        self.counters.rejected_adds[Status(status).name] += 1
        conn.send(codec.encode_add_response(req.request_id, status, req.ledger_id, req.entry_id))

    @staticmethod
    def _refuse_read(conn: ServerConnection, req: codec.ReadRequest, status: int) -> None:
        conn.send(codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id))

    @staticmethod
    def _refuse_read_lac(conn: ServerConnection, req: codec.ReadLacRequest, status: int) -> None:
        conn.send(codec.encode_lac_response(Op.READ_LAC, req.request_id, status, req.ledger_id, -1, -1))
