"""The bookie's read side: entries (READ, READ_MULTI), the last-add-confirmed (READ_LAC and the
long poll with its waiters) and what the bookie holds (BOOKIE_INFO, LIST_LEDGERS). The request
processor (``processor.py``) dispatches to these handlers by its table; a fencing read goes
through the ledger rules (``ledgers.py``: :meth:`Ledgers.fence`) first.

Entries are read from the storage engine on the read workers (BookKeeper's read thread pool,
``num_read_worker_threads``), never on the event loop: a catch-up reader whose entries are no
longer in the page cache waits for the disk on a worker thread while the loop goes on serving
adds (and the journal keeps its own writer thread). Reads waiting for a worker are bounded
(``max_pending_read_requests_per_thread`` per thread; more are answered TOO_MANY_REQUESTS). The
answers are sent from the loop. ``docs/performance.md`` ("Catch-up reads beside writers") has
the measurement.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ledgerstore.api import ServerConnection
from ledgerstore.bookie.counters import BookieCounters
from ledgerstore.bookie.ledger_state import LacWaiters, LedgerDescriptors
from ledgerstore.bookie.ledgers import REFUSALS, LedgerLookup, LedgerNotLookedUpError, Ledgers
from ledgerstore.bookie.ownership import Ownership
from ledgerstore.bookie.state import BookieState
from ledgerstore.config import BookieConfig
from ledgerstore.errors import LedgerStoreError, NoSuchLedgerError, status_for
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, Op, Status

log = logging.getLogger(__name__)

#: what a read worker hands back to the loop: the answer frame and the entry bytes it carries
ReadAnswer = tuple[bytes, int]


def read_status(ledger_id: int, entry_id: int, exc: BaseException, *, bad_request: bool = True,
                limbo: bool = False) -> int:
    """The status a failed read of one entry answers: what its error class declares when that is
    "no such ledger / entry" (or "bad request", for an id the engine cannot hold: no such entry
    can exist), else an IO error, logged. For a ledger in limbo (``limbo``) "no such ledger /
    entry" is answered UNKNOWN: this bookie cannot tell whether it lost the entry."""
    status = status_for(exc)
    if status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY):
        return Status.UNKNOWN if limbo else status
    if bad_request and status == Status.BAD_REQUEST:
        return status
    log.error("read of ledger %d entry %d failed: %s", ledger_id, entry_id, exc)
    return Status.IO_ERROR


class Reads:
    """Serves the read-side requests. Built with the bookie's per-ledger state; handed its ledger
    rules, look-ups and ownership once they are open (:meth:`attach`)."""

    ledgers: Ledgers
    lookup: LedgerLookup
    ownership: Ownership | None
    loop: asyncio.AbstractEventLoop

    def __init__(self, config: BookieConfig, state: BookieState, descriptors: LedgerDescriptors,
                 counters: BookieCounters) -> None:
        #: the frame limit (a READ_MULTI answer's budget) and the long-poll waiter limits
        self.config = config
        #: read-only or not (BOOKIE_INFO)
        self.state = state
        #: keys, fenced flags and LACs of the ledgers held
        self.descriptors = descriptors
        self.counters = counters
        #: long-poll LAC requests waiting here (woken by the adds that pass what they know)
        self.waiters = LacWaiters(self._answer_long_poll)
        #: the read workers (None: entries are read on the event loop)
        self.executor: ThreadPoolExecutor | None = None
        #: reads handed to the workers and not answered yet, and how many may be
        self.pending_reads = 0
        self.max_pending_reads = max(1, config.num_read_worker_threads) * config.max_pending_read_requests_per_thread
        #: reads refused because max_pending_reads were waiting
        self.refused_reads = 0

    def attach(self, ledgers: Ledgers, lookup: LedgerLookup, ownership: Ownership | None,
               loop: asyncio.AbstractEventLoop) -> None:
        """Serve with these (before the bookie serves)."""
        self.ledgers = ledgers
        self.lookup = lookup
        self.ownership = ownership
        self.loop = loop
        if self.config.num_read_worker_threads and self.executor is None:
            self.executor = ThreadPoolExecutor(self.config.num_read_worker_threads, thread_name_prefix="bookie-read")

    def close(self) -> None:
        """Stop the read workers; reads still waiting for one are dropped (their connections are
        closing with the bookie)."""
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None

    def _serve(self, conn: ServerConnection, read: Callable[[], ReadAnswer], refusal: Callable[[int], bytes],
               started: float) -> None:
        """Answer ``conn`` with what ``read`` returns, read on a read worker (on the loop when
        there are none); past the bound of waiting reads, answer ``refusal(TOO_MANY_REQUESTS)``."""
        ex = self.executor
        if ex is None:
            self._answer(conn, refusal, started, read())
            return
        if self.pending_reads >= self.max_pending_reads:
            self.refused_reads += 1
            if self.refused_reads % 1000 == 1:
                log.warning("refusing reads from %s: %d are waiting for the %d read workers (limit %d; %d refused "
                            "so far)", conn.peer, self.pending_reads, self.config.num_read_worker_threads,
                            self.max_pending_reads, self.refused_reads)
            conn.send(refusal(Status.TOO_MANY_REQUESTS))
            return
        self.pending_reads += 1
        fut = self.loop.run_in_executor(ex, read)
        if fut.done():  # a loop that runs it at once (the simulation's): answered now, as without workers
            self._read_done(conn, refusal, started, fut)
            return
        fut.add_done_callback(functools.partial(self._read_done, conn, refusal, started))

    def _read_done(self, conn: ServerConnection, refusal: Callable[[int], bytes], started: float,
                   fut: Future[ReadAnswer] | asyncio.Future[ReadAnswer]) -> None:
        """A read worker finished (called on the loop)."""
        self.pending_reads -= 1
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            log.error("a read failed unexpectedly: %r", exc, exc_info=exc)
            conn.send(refusal(Status.IO_ERROR))
            return
        self._answer(conn, refusal, started, fut.result())

    def _answer(self, conn: ServerConnection, refusal: Callable[[int], bytes], started: float,
                answer: ReadAnswer) -> None:
        frame, nbytes = answer
        self.counters.read_bytes += nbytes
        conn.send(frame)
        self.counters.read_request_seconds.observe(time.perf_counter() - started)

    # --- entries -------------------------------------------------------------------------------------

    def handle_read(self, conn: ServerConnection, req: codec.ReadRequest) -> None:
        """One entry; with the fence flag, the ledger is fenced durably first."""
        refusal = functools.partial(self._read_refusal, req)
        read = functools.partial(self._read_response, req)
        if req.flags & FLAG_FENCE:
            try:
                self.ledgers.fence(conn, req.ledger_id, req.master_key,
                                   lambda: self._serve(conn, read, refusal, time.perf_counter()))
            except LedgerNotLookedUpError:
                self.lookup.wait(conn, req)
                return
            except REFUSALS as exc:
                self.counters.read_requests += 1
                conn.send(codec.encode_read_response(req.request_id, status_for(exc), req.ledger_id, req.entry_id))
                return
            self.counters.read_requests += 1
            return
        self.counters.read_requests += 1
        self._serve(conn, read, refusal, time.perf_counter())

    @staticmethod
    def _read_refusal(req: codec.ReadRequest, status: int) -> bytes:
        return codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id)

    def _read_response(self, req: codec.ReadRequest) -> ReadAnswer:
        """The answer to a READ (on a read worker)."""
        try:
            data = self.ledgers.engine.get_entry(req.ledger_id, req.entry_id)
        except (LedgerStoreError, OSError) as exc:
            limbo = req.ledger_id in self.descriptors.limbo
            return self._read_refusal(req, read_status(req.ledger_id, req.entry_id, exc, limbo=limbo)), 0
        return codec.encode_read_response(req.request_id, Status.OK, req.ledger_id, req.entry_id, data), len(data)

    def handle_read_multi(self, conn: ServerConnection, req: codec.ReadMultiRequest) -> None:
        """Many entries in one answer, up to the frame limit; the rest are answered
        TOO_MANY_REQUESTS for the client to ask again."""
        self.counters.read_requests += len(req.entry_ids)
        self._serve(conn, functools.partial(self._read_multi_response, req), functools.partial(
            self._read_multi_refusal, req), time.perf_counter())

    @staticmethod
    def _read_multi_refusal(req: codec.ReadMultiRequest, status: int) -> bytes:
        return codec.encode_read_multi_response(req.request_id, status, req.ledger_id, [])

    def _read_multi_response(self, req: codec.ReadMultiRequest) -> ReadAnswer:
        """The answer to a READ_MULTI (on a read worker)."""
        budget = self.config.max_frame_size - 64 - 14 * len(req.entry_ids)
        sent = 0
        items: list[tuple[int, int, bytes]] = []
        append = items.append
        limbo = req.ledger_id in self.descriptors.limbo
        for eid, got in zip(req.entry_ids, self.ledgers.engine.get_entries(req.ledger_id, req.entry_ids), strict=True):
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
                append((eid, read_status(req.ledger_id, eid, got, bad_request=False, limbo=limbo), b""))
        return codec.encode_read_multi_response(req.request_id, Status.OK, req.ledger_id, items), sent

    # --- last-add-confirmed ----------------------------------------------------------------------------

    def _lac_response(self, op: Op, rid: int, ledger_id: int) -> bytes:
        if ledger_id in self.descriptors.limbo:  # what it holds may be short of what it acknowledged
            return codec.encode_lac_response(op, rid, Status.UNKNOWN, ledger_id, -1, -1)
        if ledger_id not in self.descriptors.master_keys:
            return codec.encode_lac_response(op, rid, Status.NO_SUCH_LEDGER, ledger_id, -1, -1)
        try:
            last = self.ledgers.engine.last_entry_id(ledger_id)
        except NoSuchLedgerError:
            last = -1
        return codec.encode_lac_response(op, rid, Status.OK, ledger_id, self.descriptors.lac.get(ledger_id, -1), last)

    def _answer_long_poll(self, conn: ServerConnection, rid: int, ledger_id: int) -> None:
        conn.send(self._lac_response(Op.LONG_POLL_LAC, rid, ledger_id))

    def handle_read_lac(self, conn: ServerConnection, req: codec.ReadLacRequest) -> None:
        """The ledger's LAC and last entry; with the fence flag, after fencing it durably."""
        if req.flags & FLAG_FENCE:
            then = lambda: conn.send(self._lac_response(Op.READ_LAC, req.request_id, req.ledger_id))  # noqa: E731
            try:
                self.ledgers.fence(conn, req.ledger_id, req.master_key, then)
            except LedgerNotLookedUpError:
                self.lookup.wait(conn, req)
                return
            except REFUSALS as exc:
                self.counters.read_requests += 1
                conn.send(codec.encode_lac_response(Op.READ_LAC, req.request_id, status_for(exc), req.ledger_id,
                                                    -1, -1))
                return
            self.counters.read_requests += 1
            return
        self.counters.read_requests += 1
        conn.send(self._lac_response(Op.READ_LAC, req.request_id, req.ledger_id))

    def handle_long_poll(self, conn: ServerConnection, req: codec.LongPollLacRequest) -> None:
        """The LAC once it passes what the client knows, or when the request times out."""
        lid = req.ledger_id
        lac = self.descriptors.lac.get(lid, -1)
        if (lac > req.known_lac or req.timeout_ms == 0 or lid in self.descriptors.fenced
                or lid in self.descriptors.limbo):
            conn.send(self._lac_response(Op.LONG_POLL_LAC, req.request_id, lid))
            return
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
        """Free and total disk, ledgers held, read-only or not, and the process's instance."""
        total, _, free = self.ledgers.disk_usage()
        conn.send(codec.encode_bookie_info_response(
            req.request_id, Status.OK, free, total, len(self.descriptors.master_keys), self.state.read_only,
            self.state.instance if req.flags & codec.FLAG_INSTANCE else 0))

    def handle_list_ledgers(self, conn: ServerConnection, req: codec.ListLedgersRequest) -> None:
        """The ledgers held from ``req.first_ledger_id`` on, with the last entry of each (the
        auditor's replicas check). A bookie that lost its data holds nothing it could vouch for."""
        engine = self.ledgers.engine
        out: list[tuple[int, int]] = []
        if self.ownership is None or self.ownership.lost is None:
            for lid in sorted(lid for lid in engine.list_ledgers() if lid >= req.first_ledger_id):
                try:
                    out.append((lid, engine.last_entry_id(lid)))
                except NoSuchLedgerError:
                    continue
                if len(out) >= req.max_ledgers:
                    break
        conn.send(codec.encode_list_ledgers_response(req.request_id, Status.OK, out))
