"""A log's single leader (the seeds' "Ledgers to logs"): becoming it, appending in position
order across rolls, rolling and closing. A writer becomes the leader by recovering (fencing and
closing) every ledger of the list that is not closed (:mod:`.tail`), creating a ledger and
appending it to the list by compare-and-set; only then does it accept writes. It rolls to a new
ledger by creating it, CAS-appending it, and only then closing the previous one; it never
appends another ledger before that close succeeded, so only the newest two ledgers of a log it
writes can be open."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
from collections.abc import Sequence

from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.log.base import LedgerSettings, LogClient, log_manager
from ledgerstore.client.log.entry import (
    FORMAT_KEY,
    FORMAT_SEQUENCED,
    MAX_SEQ,
    PLAIN_HEADER,
    check_producer_id,
    check_seq,
    encode_entry,
    encode_many,
    encoder,
)
from ledgerstore.client.log.producers import Producer, ProducerTable
from ledgerstore.client.log.rebuild import find_sequence, rebuild_table, write_snapshot
from ledgerstore.client.log.tail import recover_ledgers, unclosed
from ledgerstore.client.read import ReadHandle
from ledgerstore.errors import (
    BadVersionError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerStoreError,
    LogError,
)
from ledgerstore.meta.logs import LogMetadata, Position, validate_log_name

log = logging.getLogger(__name__)

#: how many times ``open_log`` starts over after losing a compare-and-set to another writer. Each
#: attempt fences the ledgers it found open, so an old leader that keeps writing can win another
#: round only by filling and rolling a whole ledger within one attempt: a fast writer with a small
#: roll size on a loaded host did that five times in a row, hence the margin
OPEN_ATTEMPTS = 20
#: after a failed attempt to create the next ledger, wait this long before trying to roll again
_ROLL_RETRY_S = 1.0
#: waits between attempts to close a ledger the writer rolled away from (or is closing): about 6 s
#: in all; after the last one the writer fails rather than add a ledger behind an open one
CLOSE_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
#: the custom metadata of every ledger a writer creates: its entries carry the format 2 header
LEDGER_CUSTOM = {FORMAT_KEY: FORMAT_SEQUENCED}

#: what a held acknowledgement keeps: the caller's future, the ledger's, and the producer and
#: last sequence of the append (None, 0 for one without a sequence)
_Held = tuple["asyncio.Future[Position]", "asyncio.Future[int]", Producer | None, int]


#: an append that waits for the previous ledger before it is sent: its entry (or a batch's
#: entries), the caller's future, the producer and last sequence
_Parked = tuple[bytes | list[bytes], "asyncio.Future[Position]", Producer | None, int]


class _Segment:
    """One ledger of this writer's leadership, and the bookkeeping that keeps the log a prefix
    across a roll: appends to a ledger are *parked* (not sent) until every entry of the previous
    ledger has been acknowledged or failed, so an entry of the new ledger is never stored while
    an earlier one of the old ledger is lost (a producer resending from the lost one would find
    a later sequence stored); if the old ledger's adds failed, the parked ones fail as not
    written. Acknowledgements of the new ledger are *held* likewise (none arrive early now that
    nothing is sent early; the hold stays for what was sent before a switch)."""

    __slots__ = ("lh", "ledger_id", "bytes", "started", "outstanding", "sealed", "waiting", "held",
                 "parked", "error", "successor")

    def __init__(self, lh: LedgerHandle, waiting: bool, started: float) -> None:
        self.lh = lh
        self.ledger_id = lh.ledger_id
        self.bytes = 0
        self.started = started
        self.outstanding = 0  # entries whose caller-facing future is not resolved yet
        self.sealed = False  # no more appends (the writer rolled past it or closed)
        self.waiting = waiting  # True while the previous segment still has unresolved entries
        self.held: collections.deque[_Held] = collections.deque()
        self.parked: list[_Parked] = []
        self.error: LedgerStoreError | None = None
        self.successor: _Segment | None = None


class LogWriter:
    """The leader of a log. Obtain with ``await client.open_log(name)``.

    ``append`` / ``append_async`` return the entry's :class:`Position`; acknowledgements complete in
    position order, across rolls too. After another writer takes the log over, the next add fails
    with :class:`~ledgerstore.errors.LedgerFencedError` (whose outcome is *unknown*, not "not
    written"), and so does every later call: open the log again to write more.

    Exactly-once: ``append(payload, seq=n)`` (with the writer's default ``producer_id`` from
    ``open_log``, or ``producer_id=`` per append) stores ``n`` at most once. ``seq`` increases
    strictly per producer, gaps allowed; a ``seq`` at or below the producer's highest one writes
    nothing and resolves to the position of the entry holding it, or, while that entry is in
    flight, with its outcome. A ``seq`` below the highest that was never stored (a gap) fails with
    :class:`~ledgerstore.errors.InvalidArgumentError`. :attr:`last_seq` and :meth:`last_seq_of`
    say where a restarted producer resumes.
    """

    def __init__(self, client: LogClient, md: LogMetadata, lh: LedgerHandle, settings: LedgerSettings,
                 roll_size_bytes: int | None, roll_interval_s: float | None, *,
                 table: ProducerTable | None = None, through: Position | None = None,
                 producer_id: str | None = None, producer_ttl_s: float | None = None) -> None:
        self.client = client
        self.name = md.name
        self._md = md
        self._settings = settings
        self._roll_size = roll_size_bytes
        self._roll_interval = roll_interval_s
        self._seg = _Segment(lh, waiting=False, started=client.loop.time())
        self._error: LedgerStoreError | None = None
        self._closed = False
        self._roll_task: asyncio.Task[None] | None = None
        self._roll_not_before = 0.0
        self._closers: set[asyncio.Task[None]] = set()
        self._last: Position | None = None
        self._logs = log_manager(client)
        self._roll_failure: LedgerStoreError | None = None
        self._newest: asyncio.Future[Position] | None = None
        self._table = ProducerTable() if table is None else table
        #: every entry of the log up to here is reflected in the table (before this writer's own)
        self._through = through
        self._producer_id = None if producer_id is None else check_producer_id(producer_id)
        self._default = None if producer_id is None else self._table.add(producer_id)
        self._ttl = producer_ttl_s
        #: this writer's ledgers that may still be open, by id (read through them while searching)
        self._own: dict[int, LedgerHandle] = {lh.ledger_id: lh}
        #: old (producer, seq) -> position, from searches of the log
        self._found: dict[tuple[str, int], Position] = {}
        self._search_lock = asyncio.Lock()
        self._searches: set[asyncio.Task[None]] = set()
        #: the entry encoder, compiled when the compiled hot path runs (chosen once, as a ledger
        #: handle chooses its pending adds' implementation)
        self._encode = encoder()

    # --- properties ----------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        """The ledger new entries go to."""
        return self._seg.ledger_id

    @property
    def ledger_ids(self) -> list[int]:
        """The log's ledgers as this writer last wrote them to the store."""
        return self._md.ledger_ids

    @property
    def last_position(self) -> Position | None:
        """Position of the last entry acknowledged to this writer's callers."""
        return self._last

    @property
    def error(self) -> LedgerStoreError | None:
        """Why this writer stopped accepting writes, if it did."""
        return self._error

    @property
    def producer_id(self) -> str | None:
        """The default producer of appends with a ``seq`` (``open_log(..., producer_id=)``)."""
        return self._producer_id

    @property
    def last_seq(self) -> int | None:
        """The highest sequence of the default producer stored in the log (right after
        ``open_log``: what a restarted producer resumes after); None if none, or no default."""
        p = self._default
        return None if p is None else p.last_seq

    def last_seq_of(self, producer_id: str) -> int | None:
        """The highest sequence of ``producer_id`` stored in the log; None if none."""
        return self._table.last_seq_of(producer_id)

    # --- appending -----------------------------------------------------------------------------

    def append_async(self, payload: bytes, *, seq: int | None = None,
                     producer_id: str | None = None) -> asyncio.Future[Position]:
        """Queue an add. The future resolves to the entry's position once it is acknowledged and
        every earlier entry of the log was acknowledged. With ``seq``, a duplicate writes nothing
        and resolves to the position of the entry holding it (see the class). Call on the
        client's event loop."""
        outer = self._future()
        if outer.done():
            return outer
        if seq is None:
            if producer_id is not None:
                outer.set_exception(_producer_without("seq"))
                return outer
            try:
                data = PLAIN_HEADER + payload
            except TypeError:
                outer.set_exception(_not_bytes(payload))
                return outer
            self._add(data, outer, None, 0)
            return outer
        # the hot path of a sequenced append: a known producer's next sequence. Everything else
        # (checks that fail, new producers, duplicates) is _append_seq's
        if producer_id is None:
            p = self._default
        else:
            p = self._table.get(producer_id) if type(producer_id) is str else None
        if p is None or type(seq) is not int or not p.sent < seq <= MAX_SEQ:
            return self._append_seq(payload, seq, producer_id, outer)
        try:
            data = self._encode(p.header, seq, payload)
        except TypeError:
            outer.set_exception(_not_bytes(payload))
            return outer
        p.sent = seq
        pending = p.pending
        if pending is None:
            p.pending = {seq: outer}
        else:
            pending[seq] = outer
        self._add(data, outer, p, seq)
        return outer

    def _append_seq(self, payload: bytes, seq: int, producer_id: str | None,
                    outer: asyncio.Future[Position]) -> asyncio.Future[Position]:
        """:meth:`append_async` with a ``seq`` off its hot path: check the arguments, add a new
        producer, resolve a duplicate."""
        try:
            p = self._producer(producer_id, seq)
            if seq <= p.sent:
                self._duplicate(p, seq, outer)
                return outer
            data = encode_entry(p.header, seq, payload)
        except InvalidArgumentError as exc:
            outer.set_exception(exc)
            return outer
        except TypeError:
            outer.set_exception(_not_bytes(payload))
            return outer
        p.sent_one(seq, outer)
        self._add(data, outer, p, seq)
        return outer

    async def append(self, payload: bytes, *, seq: int | None = None, producer_id: str | None = None) -> Position:
        """Add one entry and wait for its acknowledgement; returns its position (with ``seq``: of
        the entry holding that sequence, which a duplicate does not write again)."""
        return await self.append_async(payload, seq=seq, producer_id=producer_id)

    def append_many_async(self, payloads: Sequence[bytes], *, first_seq: int | None = None,
                          producer_id: str | None = None) -> asyncio.Future[Position]:
        """Queue many adds (consecutive positions); the future resolves to the last one's
        position once all are acknowledged. With ``first_seq`` they carry the sequences
        ``first_seq, first_seq + 1, ...``: those at or below the producer's highest are not
        written again, and when all are, the future resolves to the position holding the last."""
        outer = self._future()
        if outer.done():
            return outer
        try:
            if not payloads:
                raise InvalidArgumentError("append_many needs at least one payload")
            if first_seq is None:
                if producer_id is not None:
                    raise _producer_without("first_seq")
                self._add_many([PLAIN_HEADER + x for x in payloads], outer, None, 0)
                return outer
            p = self._producer(producer_id, first_seq)
            last = check_seq(first_seq + len(payloads) - 1, "first_seq + len(payloads) - 1")
            if last <= p.sent:
                self._duplicate(p, last, outer)
                return outer
            if first_seq <= p.sent:  # the front of the batch is stored or in flight already
                payloads = payloads[p.sent - first_seq + 1:]
                first_seq = p.sent + 1
            datas = encode_many(p.header, first_seq, payloads)
        except InvalidArgumentError as exc:
            outer.set_exception(exc)
            return outer
        except TypeError:
            bad = next((x for x in payloads if not isinstance(x, bytes | bytearray | memoryview)), None)
            outer.set_exception(InvalidArgumentError(f"payloads must be bytes, not {type(bad).__name__}"))
            return outer
        p.sent_one(last, outer, first_seq)
        self._add_many(datas, outer, p, last)
        return outer

    async def append_many(self, payloads: Sequence[bytes], *, first_seq: int | None = None,
                          producer_id: str | None = None) -> Position:
        """Add many entries and wait until all are acknowledged; returns the last one's position
        (see :meth:`append_many_async`)."""
        return await self.append_many_async(payloads, first_seq=first_seq, producer_id=producer_id)

    def _future(self) -> asyncio.Future[Position]:
        """The future of a new append: already failed if this writer failed or is closed."""
        outer: asyncio.Future[Position] = self.client.loop.create_future()
        if self._error is not None:
            outer.set_exception(self._error)
        elif self._closed:
            outer.set_exception(LedgerClosedError(f"log writer for {self.name!r} is closed; open the log again"))
        return outer

    def _producer(self, producer_id: str | None, seq: int) -> Producer:
        """The producer of an append with ``seq`` (both checked)."""
        check_seq(seq)
        if producer_id is None:
            p = self._default
            if p is None:
                raise InvalidArgumentError(
                    f"an append with a seq needs a producer: pass producer_id=, or open log {self.name!r} "
                    "with producer_id=")
            return p
        return self._table.add(check_producer_id(producer_id))


    def _add(self, data: bytes, outer: asyncio.Future[Position], p: Producer | None, seq: int) -> None:
        seg = self._seg
        if seg.waiting:
            seg.parked.append((data, outer, p, seq))
            self._queued(seg, None, len(data), outer, p, seq)
        else:
            self._queued(seg, seg.lh.append_async(data), len(data), outer, p, seq)

    def _add_many(self, datas: list[bytes], outer: asyncio.Future[Position], p: Producer | None, last: int) -> None:
        seg = self._seg
        if seg.waiting:
            seg.parked.append((datas, outer, p, last))
            self._queued(seg, None, sum(map(len, datas)), outer, p, last)
        else:
            self._queued(seg, seg.lh.append_many_async(datas), sum(map(len, datas)), outer, p, last)

    def _queued(self, seg: _Segment, inner: asyncio.Future[int] | None, size: int, outer: asyncio.Future[Position],
                p: Producer | None, seq: int) -> None:
        self._newest = outer
        seg.outstanding += 1
        seg.bytes += size
        if inner is not None:  # None: parked, sent by _settled
            inner.add_done_callback(functools.partial(self._on_added, seg, outer, p, seq))
        if self._roll_task is None and self._roll_due(seg):
            self._roll_task = self.client.loop.create_task(self._roll(), name=f"roll log {self.name}")

    # --- duplicates ----------------------------------------------------------------------------

    def _duplicate(self, p: Producer, seq: int, outer: asyncio.Future[Position]) -> None:
        """Resolve ``outer`` for a ``seq`` of ``p`` that was handed to the ledger before."""
        flight = p.in_flight(seq)
        if flight is not None:
            original, back = flight
            original.add_done_callback(functools.partial(_follow, outer, back))
        elif seq == p.seq:
            outer.set_result(p.position)
        elif seq > p.seq:  # sent after the highest stored one, not in flight: the producer skipped it
            outer.set_exception(InvalidArgumentError(
                f"log {self.name!r}: producer {p.producer_id!r} sequence {seq} was skipped: this writer already "
                f"sent sequence {p.sent} and sequences increase strictly; nothing was written"))
        else:
            pos = self._found.get((p.producer_id, seq))
            if pos is not None:
                outer.set_result(pos)
                return
            task = self.client.loop.create_task(self._search(p, seq, outer), name=f"find seq in log {self.name}")
            self._searches.add(task)
            task.add_done_callback(self._searches.discard)

    def _gap(self, p: Producer, seq: int) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"log {self.name!r}: producer {p.producer_id!r} sequence {seq} is below its highest stored sequence "
            f"{p.seq} but is not in the log (it was skipped, or truncated away); nothing was written: append "
            f"only sequences above {max(p.seq, p.sent)}")

    async def _search(self, p: Producer, seq: int, outer: asyncio.Future[Position]) -> None:
        """Find an old sequence in the log (one search at a time: the next one usually finds its
        answer among the entries this one read)."""
        try:
            async with self._search_lock:
                key = (p.producer_id, seq)
                pos = self._found.get(key)
                if pos is None:
                    pos = await find_sequence(self._open_for_search, self._md.ledger_ids, p.producer_id, seq,
                                              self._found)
        except LedgerStoreError as exc:
            if not outer.done():
                outer.set_exception(exc)
            return
        if outer.done():
            return
        if pos is None:
            outer.set_exception(self._gap(p, seq))
        else:
            outer.set_result(pos)

    async def _open_for_search(self, ledger_id: int) -> ReadHandle:
        own = self._own.get(ledger_id)
        if own is not None:
            return own
        return await self.client.open_ledger(ledger_id, self._settings.password, recovery=False)

    # --- acknowledgements ----------------------------------------------------------------------

    async def flush(self) -> None:
        """Wait until every add made so far is resolved and any roll in progress has finished
        (the previous ledger closed). Errors are not raised here: they belong to the adds."""
        while True:
            if self._newest is not None and not self._newest.done():
                await asyncio.wait([self._newest])
            elif self._roll_task is not None:
                await asyncio.wait([self._roll_task])
            elif self._closers:
                await asyncio.wait(list(self._closers))
            else:
                return

    def _roll_due(self, seg: _Segment) -> bool:
        now = self.client.loop.time()  # the loop's clock, so a simulated writer rolls on virtual time
        if self._roll_size is not None and seg.bytes >= self._roll_size:
            return now >= self._roll_not_before
        if self._roll_interval is not None and now - seg.started >= self._roll_interval:
            return now >= self._roll_not_before
        return False

    def _on_added(self, seg: _Segment, outer: asyncio.Future[Position], p: Producer | None, seq: int,
                  inner: asyncio.Future[int]) -> None:
        if seg.waiting:
            seg.held.append((outer, inner, p, seq))
        else:
            self._deliver(seg, outer, inner, p, seq, None)

    def _deliver(self, seg: _Segment, outer: asyncio.Future[Position], inner: asyncio.Future[int],
                 p: Producer | None, seq: int, inherited: LedgerStoreError | None) -> None:
        exc = inner.exception()
        cause = inherited if inherited is not None else self._error
        if exc is None and cause is None:
            eid = inner.result()
            pos = Position(seg.ledger_id, eid)
            self._last = pos
            if p is not None:  # Producer.stored and .settled, inline: once per acknowledged append
                if seq > p.seq:
                    p.seq = seq
                    p.ledger_id = seg.ledger_id
                    p.entry_id = eid
                pending = p.pending
                if pending is not None and len(pending) > 1 and p.firsts is None:
                    pending.pop(seq, None)  # not the last in flight, no batches: settled() in short
                else:
                    p.settled(seq)
            if not outer.done():
                outer.set_result(pos)
        else:
            if p is not None:
                p.settled(seq)
            if exc is None:
                # written to its ledger, but this writer already failed (an earlier entry failed, or
                # it lost the log): an acknowledgement now would follow a failure, so the outcome is
                # reported as unknown, with the same error class
                assert cause is not None
                err: LedgerStoreError = type(cause)(
                    f"entry {inner.result()} of ledger {seg.ledger_id} (log {self.name!r}) may or may not be "
                    f"in the log: this writer failed before it was acknowledged ({cause})")
            elif isinstance(exc, LedgerStoreError):
                err = exc
            else:
                err = LogError(f"add to ledger {seg.ledger_id} of log {self.name!r} failed: {exc!r}")
            if seg.error is None:
                seg.error = err
            self._fail(err)
            if not outer.done():
                outer.set_exception(err)
        seg.outstanding -= 1
        if seg.sealed and seg.outstanding == 0:
            self._settled(seg)


    def _settled(self, seg: _Segment) -> None:
        """Every entry of ``seg`` is resolved: release the next ledger's held acknowledgements."""
        nxt = seg.successor
        if nxt is None or not nxt.waiting:
            return
        nxt.waiting = False
        inherited = seg.error
        if inherited is not None and nxt.error is None:
            nxt.error = inherited
        while nxt.held:
            outer, inner, p, seq = nxt.held.popleft()
            self._deliver(nxt, outer, inner, p, seq, nxt.error)
        parked, nxt.parked = nxt.parked, []
        for data, outer, p, seq in parked:
            cause = nxt.error or self._error
            if cause is None:
                inner = nxt.lh.append_many_async(data) if isinstance(data, list) else nxt.lh.append_async(data)
                inner.add_done_callback(functools.partial(self._on_added, nxt, outer, p, seq))
                continue
            if p is not None:
                p.settled(seq)
            if not outer.done():
                outer.set_exception(type(cause)(
                    f"log {self.name!r}: not written (never sent): this writer failed before it could add it to "
                    f"ledger {nxt.ledger_id} ({cause})"))
            nxt.outstanding -= 1
        if nxt.sealed and nxt.outstanding == 0:
            self._settled(nxt)

    def _fail(self, err: LedgerStoreError) -> None:
        if self._error is None:
            self._error = err

    # --- rolling -------------------------------------------------------------------------------

    async def roll(self) -> int:
        """Roll to a new ledger now (create it, CAS-append it, then close the previous one).
        Returns the new ledger's id."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LedgerClosedError(f"log writer for {self.name!r} is closed")
        before = self.ledger_id
        if self._roll_task is None:
            self._roll_task = self.client.loop.create_task(self._roll(), name=f"roll log {self.name}")
        await asyncio.shield(self._roll_task)
        if self._error is not None:
            raise self._error
        if self.ledger_id == before:
            raise LogError(f"log {self.name!r}: could not roll past ledger {before}: {self._roll_failure}")
        return self.ledger_id

    async def _roll(self) -> None:
        try:
            await self._do_roll()
        finally:
            self._roll_task = None

    async def _do_roll(self) -> None:
        if self._closers:
            # the previous roll's ledger must be closed before another joins the list, so at most
            # two ledgers of the log (the newest two) are ever open at once
            await asyncio.wait(list(self._closers))
        if self._error is not None or self._closed:
            return  # e.g. that close failed for good: no ledger may follow an open one
        old = self._seg
        s = self._settings
        try:
            new_lh = await self.client.create_ledger(s.ensemble, s.write_quorum, s.ack_quorum, s.digest, s.password,
                                                     custom_metadata=dict(LEDGER_CUSTOM))
        except LedgerStoreError as exc:
            # not fatal: keep writing to the current ledger and try again a little later
            self._roll_not_before = self.client.loop.time() + _ROLL_RETRY_S
            self._roll_failure = exc
            log.warning("log %s: cannot create the next ledger (%s); staying on ledger %d", self.name, exc,
                        old.ledger_id)
            return
        if self._error is not None or self._closed:
            await self._discard(new_lh)  # failed or closed while creating it: it was never listed
            return
        try:
            appended = await self._append_to_list(new_lh)
        except LedgerStoreError as exc:
            # the CAS outcome is unknown: the ledger may be in the list, so it must not be deleted;
            # if it is, it is the last one and the next leader fences it
            self._fail(exc)
            return
        if not appended:
            await self._discard(new_lh)
            return
        if self._error is not None or self._closed:
            # failed or closed meanwhile: the new ledger is in the list, so close it (empty)
            await self._close_quietly(new_lh)
            return
        # switch: from here on, appends go to the new ledger; the old one is sealed
        nxt = _Segment(new_lh, waiting=old.outstanding > 0, started=self.client.loop.time())
        old.successor = nxt
        old.sealed = True
        self._seg = nxt
        self._own[new_lh.ledger_id] = new_lh
        closer = self.client.loop.create_task(self._close_sealed(old), name=f"close ledger {old.ledger_id}")
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    async def _append_to_list(self, new_lh: LedgerHandle) -> bool:
        """CAS-append ``new_lh`` to the log. False (and the writer failed) if another writer took
        the log over, so the new ledger was never listed and may be deleted."""
        md = self._md
        old_id = self._seg.ledger_id
        while True:
            if md.last_ledger_id != old_id:
                self._fail(LedgerFencedError(
                    f"log {self.name!r} was taken over by another writer: its last ledger is "
                    f"{md.last_ledger_id}, not this writer's {old_id}"))
                return False
            try:
                self._md = await self._logs.write(md.with_ledger(new_lh.ledger_id))
                return True
            except BadVersionError:
                fresh = await self._logs.read(self.name)
                if fresh is None:
                    self._fail(LogError(f"log {self.name!r} was deleted while this writer was rolling it"))
                    return False
                if fresh.last_ledger_id == new_lh.ledger_id:  # an earlier attempt did land
                    self._md = fresh
                    return True
                md = fresh  # e.g. a truncation changed the list: try again if we still lead

    async def _close_sealed(self, seg: _Segment) -> None:
        try:
            await self._close_ledger(seg.lh)  # waits for its in-flight adds to be acknowledged or fail
        except LedgerStoreError as exc:
            self._fail(exc)
            if seg.error is None:
                seg.error = exc
            return
        self._own.pop(seg.ledger_id, None)
        await self._snapshot(seg.ledger_id)

    async def _snapshot(self, ledger_id: int) -> None:
        """Write the producer table into the metadata of ``ledger_id``, just closed, so that the
        next leader starts from it instead of reading the ledger (only acknowledged entries are in
        the table, so everything it says is stored). Idle producers past ``producer_ttl_s`` are
        forgotten first."""
        through = self._last if self._last is not None else self._through
        if through is None:
            return  # nothing in the log to reflect: the next leader has nothing to read either
        self._table.expire(self._ttl)
        if self._default is not None and self._table.get(self._default.producer_id) is None:
            self._table.producers[self._default.producer_id] = self._default
        snapshot = self._table.encode_snapshot(through)
        if snapshot is not None:
            await write_snapshot(self.client, ledger_id, snapshot)

    async def _close_ledger(self, lh: LedgerHandle) -> None:
        """Close ``lh`` in metadata, retrying a failed write with backoff. A ledger left open
        behind a later one would end every reader there and stay open after the next leader's
        takeover, so when the retries run out this raises a :class:`LogError` that stops the
        writer. A fenced ledger is not retried: another writer took the log over."""
        for delay in (*CLOSE_RETRY_DELAYS_S, None):
            try:
                await lh.close()
                return
            except LedgerFencedError:
                raise
            except LedgerStoreError as exc:
                if delay is None:
                    raise LogError(
                        f"log {self.name!r}: ledger {lh.ledger_id} could not be closed after "
                        f"{len(CLOSE_RETRY_DELAYS_S) + 1} attempts (last error: {exc}); this writer stopped "
                        "so that no ledger follows an open one in the log. Open the log again "
                        "(client.open_log) to recover it and write on") from exc
                log.warning("log %s: closing ledger %d failed (%s); retrying in %.2f s", self.name,
                            lh.ledger_id, exc, delay)
                await asyncio.sleep(delay)

    async def _discard(self, lh: LedgerHandle) -> None:
        try:
            await self.client.delete_ledger(lh.ledger_id)
        except LedgerStoreError as exc:
            log.warning("log %s: could not delete unused ledger %d (%s); it is an orphan", self.name,
                        lh.ledger_id, exc)

    async def _close_quietly(self, lh: LedgerHandle) -> None:
        try:
            await lh.close()
        except LedgerStoreError as exc:
            log.warning("log %s: closing ledger %d failed: %s", self.name, lh.ledger_id, exc)

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for in-flight adds, then close the current ledger. Closing a writer that already
        failed only releases it (errors were reported by its adds; a new leader closes the ledgers)."""
        if self._closed:
            return
        self._closed = True
        if self._roll_task is not None:
            await asyncio.shield(self._roll_task)
        if self._closers:  # in log order: the ledger rolled away from first
            await asyncio.gather(*self._closers)
        seg = self._seg
        seg.sealed = True
        try:
            await self._close_ledger(seg.lh)
        except LedgerFencedError:
            if self._error is None:
                raise
            return
        if self._searches:
            await asyncio.gather(*self._searches, return_exceptions=True)
        if self._error is None:
            await self._snapshot(seg.ledger_id)

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _producer_without(seq_name: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"producer_id is given without a {seq_name}: pass {seq_name}= too, or neither")


def _not_bytes(payload: object) -> InvalidArgumentError:
    return InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")


def _follow(outer: asyncio.Future[Position], back: int, original: asyncio.Future[Position]) -> None:
    """Resolve a duplicate's ``outer`` with the outcome of the in-flight ``original``: its
    position (``back`` entries before it, for a sequence inside a batch) or its error."""
    if outer.done():
        return
    if original.cancelled():
        outer.cancel()
    elif original.exception() is not None:
        outer.set_exception(original.exception())  # type: ignore[arg-type]
    else:
        pos = original.result()
        outer.set_result(Position(pos.ledger_id, pos.entry_id - back))


async def open_log_writer(client: LogClient, name: str, settings: LedgerSettings, *, roll_size_bytes: int | None,
                          roll_interval_s: float | None, create: bool, producer_id: str | None = None,
                          producer_ttl_s: float | None = None) -> LogWriter:
    """Become the log's leader (the seeds' "Opening a log"): read the list, recover every ledger
    of it that is not closed (the last two, and any older one a failed writer left open), create a
    ledger, CAS-append it, then rebuild the producer table (:func:`~.rebuild.rebuild_table`: the
    newest snapshot, then the ledgers after it). A lost CAS deletes the new ledger and starts
    over, at most :data:`OPEN_ATTEMPTS` times."""
    validate_log_name(name)
    if roll_size_bytes is not None and roll_size_bytes <= 0:
        raise InvalidArgumentError(f"roll_size_bytes must be positive, got {roll_size_bytes}")
    if roll_interval_s is not None and roll_interval_s <= 0:
        raise InvalidArgumentError(f"roll_interval_s must be positive, got {roll_interval_s}")
    if producer_id is not None:
        check_producer_id(producer_id)
    if producer_ttl_s is not None and (isinstance(producer_ttl_s, bool) or not isinstance(producer_ttl_s, int | float)
                                       or not producer_ttl_s > 0):
        raise InvalidArgumentError(f"producer_ttl_s must be a positive number of seconds, got {producer_ttl_s!r}")
    logs = log_manager(client)
    for attempt in range(OPEN_ATTEMPTS):
        if attempt:
            await asyncio.sleep(random.uniform(0.01, 0.05) * attempt)  # duelling writers: spread out
        md = await logs.get_or_create(name) if create else await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist; pass create=True to create it")
        if not await recover_ledgers(client, logs, md, settings.password, await unclosed(client, md)):
            continue
        lh = await client.create_ledger(settings.ensemble, settings.write_quorum, settings.ack_quorum,
                                        settings.digest, settings.password, custom_metadata=dict(LEDGER_CUSTOM))
        recovered = md
        try:
            md = await logs.write(md.with_ledger(lh.ledger_id))
        except BadVersionError:
            try:
                await client.delete_ledger(lh.ledger_id)
            except LedgerStoreError as exc:
                log.warning("log %s: could not delete unused ledger %d (%s)", name, lh.ledger_id, exc)
            continue
        # after the list holds our ledger (no other writer can add one without fencing ours): the
        # read of the recovered ledgers does not widen the window in which a roll of the old
        # leader makes this open start over
        table = ProducerTable()
        through = await rebuild_table(client, recovered, settings.password, table)
        table.expire(producer_ttl_s)
        return LogWriter(client, md, lh, settings, roll_size_bytes, roll_interval_s, table=table, through=through,
                         producer_id=producer_id, producer_ttl_s=producer_ttl_s)
    raise LogError(
        f"could not open log {name!r} for writing: its ledger list changed under this writer {OPEN_ATTEMPTS} "
        "times in a row (another writer is opening or rolling it); make sure only one process leads the log")
