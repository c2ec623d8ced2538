"""The ledger writer: pipelined striped adds, in-order acks, ensemble change, close. The reader
it extends is in :mod:`ledgerstore.client.read`, recovery in :mod:`ledgerstore.client.recovery`.

Each protocol step is its own object, and the handle acts on what it returns: one
:class:`~ledgerstore.client.add_batch.AddBatchOp` per ADD_BATCH frame (its ``on_response()``
gives an ``AddOutcome``), one :class:`~ledgerstore.client.ensemble_change.EnsembleChange` per
attempt to replace failed bookies. The per-entry work (pending adds, the in-order
acknowledgement loop) is in :mod:`ledgerstore.client.adds` and its compiled twin ``_adds.pyx``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter

from ledgerstore.client import adds
from ledgerstore.client.add_batch import AckObserver, AddBatchOp, AddGroup, AddOutcome
from ledgerstore.client.adds import PendingAdd
from ledgerstore.client.bookie_client import status_error
from ledgerstore.client.context import ClientContext
from ledgerstore.client.ensemble_change import Changed, EnsembleChange, LedgerGone, NoReplacement
from ledgerstore.client.metrics import CLIENT_METRICS
from ledgerstore.client.read import ReadHandle
from ledgerstore.errors import (
    AddFailedError,
    BadVersionError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerStoreError,
    UnauthorizedAccessError,
)
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.plugins import notify
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status

log = logging.getLogger(__name__)

#: wait before resending adds a bookie refused with TOO_MANY_REQUESTS
_THROTTLE_BACKOFF_S = 0.02
#: most entries in one ADD_BATCH frame
_BATCH_ENTRIES = 4096
#: bytes a frame adds around one payload: frame and batch headers, the entry header, the
#: largest digest (HMAC-SHA256), with room to spare
_FRAME_OVERHEAD = 256
_CLOSED = LedgerState.CLOSED
#: ``(bookie_id, body)``: an ADD_BATCH body (:func:`codec.add_batch_body_of_items`) as it goes out
SendObserver = Callable[[str, bytes], None]


class LedgerHandle(ReadHandle):
    """The single writer of a ledger."""

    def __init__(self, ctx: ClientContext, md: LedgerMetadata, password: bytes) -> None:
        super().__init__(ctx, md, password)
        self._next_entry_id = 0
        self._pending: collections.deque[PendingAdd] = collections.deque()
        self._error: LedgerStoreError | None = None
        self._closing = False
        self._changing = False
        self._failed_bookies: set[str] = set()
        self._length = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._space = asyncio.Event()
        self._space.set()
        self._ensemble_task: asyncio.Task[None] | None = None
        #: new adds not sent yet (they leave together at the end of the loop iteration)
        self._unsent: list[PendingAdd] = []
        #: resends of single entries to single bookies: (bookie, ensemble index) -> adds
        self._resends: dict[tuple[str, int], list[PendingAdd]] = {}
        self._flush_scheduled = False
        #: write-set bit masks by ``entry_id % ensemble_size`` (striping never changes in a ledger)
        self._ws_masks = [sum(1 << i for i in md.write_set(e)) for e in range(md.ensemble_size)]
        #: largest payload that fits one frame with its headers and digest
        self._payload_max = ctx.config.max_frame_size - _FRAME_OVERHEAD - len(self.master_key)
        self._max_outstanding = ctx.config.max_outstanding_adds
        #: the pending-add class and the in-order acknowledgement loop (compiled when built)
        self._new_add, self._pop_acknowledged = adds.implementation()
        #: signs one payload as an ADD_BATCH item: ``(entry_id, lac, payload) -> item``
        self._sign_one = codec.item_signer(self.digest)
        #: optional ``(entry_id, bookie_id)`` callback for every bookie acknowledgement (tests, tools)
        self.ack_observer: AckObserver | None = None
        #: optional ``(bookie_id, body)`` callback for every ADD_BATCH body, as it is sent: a
        #: checker of what the writer sends (the simulation's LAC check); unset, it costs nothing
        self.send_observer: SendObserver | None = None

    def advance_lac(self, entry_id: int) -> int:
        """Refused: a writer's last-add-confirmed is what its own bookies acknowledged, and it
        travels with every add; nothing else may move it."""
        raise InvalidArgumentError(
            f"ledger {self.ledger_id}: the writer's last-add-confirmed ({self._lac}) advances only with its "
            f"acknowledged adds, not to {entry_id} from outside")

    # --- adding --------------------------------------------------------------------------------

    def _refusal(self) -> LedgerStoreError | None:
        if self._error is not None:
            return self._error
        if self._closing or self.md.is_closed:
            return LedgerClosedError(f"ledger {self.ledger_id} is closed")
        return None

    def _max_payload(self) -> int:
        """Largest payload that fits one frame with its headers and digest."""
        return self._payload_max

    def _too_large(self, size: int) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"payload of {size} bytes does not fit a frame of max_frame_size={self.ctx.config.max_frame_size} "
            f"bytes (at most {self._max_payload()} bytes of payload); nothing was sent and the ledger "
            "handle stays usable")

    def append_async(self, payload: bytes) -> asyncio.Future[int]:
        """Queue an add; the future resolves to the entry id once Qa bookies acknowledged it and
        every earlier entry was acknowledged. Must be called on the client's event loop."""
        fut: asyncio.Future[int] = self.ctx.loop.create_future()
        if (type(payload) is not bytes or self._error is not None or self._closing
                or len(payload) > self._payload_max or self.md.state is _CLOSED):
            error = self._append_refusal(payload)
            if error is not None:
                fut.set_exception(error)
                return fut
            payload = bytes(payload)
        eid = self._next_entry_id
        self._next_entry_id = eid + 1
        masks = self._ws_masks
        pa = self._new_add(eid, self._sign_one(eid, self._lac, payload), fut, masks[eid % len(masks)], perf_counter())
        pending = self._pending
        pending.append(pa)
        self._unsent.append(pa)
        self._length += len(payload)
        if len(pending) == 1:
            self._drained.clear()
        if len(pending) >= self._max_outstanding > 0:
            self._space.clear()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.ctx.loop.call_soon(self._flush)
        return fut

    def _append_refusal(self, payload: object) -> LedgerStoreError | None:
        """Why ``append_async`` refuses ``payload`` (None: it does not)."""
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        if not isinstance(payload, bytes | bytearray | memoryview):
            return InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")
        if len(payload) > self._payload_max:
            return self._too_large(len(payload))
        return None

    def append_many_async(self, payloads: Sequence[bytes]) -> asyncio.Future[int]:
        """Queue many adds at once; the future resolves to the entry id of the last one once all
        of them are acknowledged (in order, as with :meth:`append_async`). Their entry ids are
        consecutive, ending at the result. Much cheaper per entry than one future per add: use it
        when the caller only needs to know that a whole batch is stored. Must be called on the
        client's event loop."""
        fut: asyncio.Future[int] = self.ctx.loop.create_future()
        refusal = self._refusal()
        if refusal is not None:
            fut.set_exception(refusal)
            return fut
        if not payloads:
            fut.set_exception(InvalidArgumentError("append_many needs at least one payload"))
            return fut
        try:
            biggest = max(map(len, payloads))
        except TypeError:
            biggest = 0  # not bytes: reported below
        if biggest > self._max_payload():
            fut.set_exception(self._too_large(biggest))
            return fut
        try:
            items = codec.add_batch_items(self.digest, self._next_entry_id, self._lac, payloads)
        except TypeError:  # checked only on failure: a per-entry isinstance costs the hot loop
            bad = next(p for p in payloads if not isinstance(p, bytes | bytearray | memoryview))
            fut.set_exception(InvalidArgumentError(f"payloads must be bytes, not {type(bad).__name__}"))
            return fut
        self._queue_adds(items, sum(map(len, payloads)), fut)
        return fut

    def _queue_adds(self, items: list[bytes], length: int, fut: asyncio.Future[int]) -> None:
        """Queue signed ``items`` (of ``length`` payload bytes) as the next entries; ``fut`` goes
        with the last one."""
        eid = self._next_entry_id
        masks = self._ws_masks
        e_size = len(masks)
        new = self._new_add
        pas = [new(e, d, None, masks[e % e_size]) for e, d in enumerate(items, eid)]
        pas[-1].future = fut
        pas[-1].started = perf_counter()
        self._pending.extend(pas)
        self._unsent.extend(pas)
        self._next_entry_id = eid + len(pas)
        self._length += length
        self._queued()

    def _queued(self) -> None:
        """Bookkeeping after adds joined the pending queue: not drained, maybe full, flush soon."""
        self._drained.clear()
        if len(self._pending) >= self.ctx.config.max_outstanding_adds > 0:
            self._space.clear()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.ctx.loop.call_soon(self._flush)

    async def append(self, payload: bytes) -> int:
        """Add one entry and wait for its acknowledgement; returns its entry id."""
        if not self._space.is_set():
            await self._space.wait()
        return await self.append_async(payload)

    async def append_many(self, payloads: Sequence[bytes]) -> int:
        """Add many entries and wait until all are acknowledged; returns the last one's entry id."""
        if not self._space.is_set():
            await self._space.wait()
        return await self.append_many_async(payloads)

    def _send(self, pa: PendingAdd, only: set[int] | None = None) -> None:
        """Queue ``pa`` again for (some of) its write set's bookies in its fragment's ensemble;
        such resends leave as per-bookie batches at the end of the loop iteration."""
        md = self.md
        _, ensemble = md.ensemble_for(pa.entry_id)
        pa.ensemble = ensemble
        resends = self._resends
        for idx in md.write_set(pa.entry_id):
            if only is not None and idx not in only:
                continue
            key = (ensemble[idx], idx)
            b = resends.get(key)
            if b is None:
                resends[key] = [pa]
            else:
                b.append(pa)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.ctx.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send what this loop iteration queued: new adds as groups (each group's entries in one
        frame per bookie, encoded once when every bookie gets all of them), then resends."""
        self._flush_scheduled = False
        unsent, self._unsent = self._unsent, []
        if unsent and not self._changing and self._error is None:
            # while the ensemble changes, unsent adds wait: the change sends every pending add
            # that has no ensemble yet
            for chunk in self._chunks(unsent):
                self._send_group(chunk)
        if self._resends:
            resends, self._resends = self._resends, {}
            for (bid, idx), pas in resends.items():
                for chunk in self._chunks(pas):
                    body = codec.add_batch_body_of_items(self.ledger_id, self.master_key, [pa.item for pa in chunk])
                    self._send_frame(bid, idx, chunk, None, body)

    def _chunks(self, pas: list[PendingAdd]) -> Iterator[list[PendingAdd]]:
        """Consecutive slices of ``pas`` that fit one frame (entries and bytes)."""
        limit = self.ctx.config.max_frame_size // 2
        start = 0
        while start < len(pas):
            size = 0
            end = start
            stop = min(len(pas), start + _BATCH_ENTRIES)
            while end < stop and (size < limit or end == start):
                size += len(pas[end].item)
                end += 1
            yield pas[start:end]
            start = end

    def _send_group(self, pas: list[PendingAdd]) -> None:
        md = self.md
        ensemble = md.current_ensemble
        group = AddGroup(ensemble)
        for pa in pas:
            pa.group = group
            pa.ensemble = ensemble
        e_size, wq = md.ensemble_size, md.write_quorum
        lid, key = self.ledger_id, self.master_key
        if e_size == wq:  # every bookie gets every entry: encode the frame once
            body = codec.add_batch_body_of_items(lid, key, [pa.item for pa in pas])
            for idx, bid in enumerate(ensemble):
                self._send_frame(bid, idx, pas, group, body)
            return
        per_idx: list[list[PendingAdd]] = [[] for _ in range(e_size)]
        for pa in pas:
            for idx in md.write_set(pa.entry_id):
                per_idx[idx].append(pa)
        for idx, bid in enumerate(ensemble):
            if per_idx[idx]:
                body = codec.add_batch_body_of_items(lid, key, [pa.item for pa in per_idx[idx]])
                self._send_frame(bid, idx, per_idx[idx], group, body)

    def _send_frame(self, bid: str, idx: int, pas: list[PendingAdd], group: AddGroup | None, body: bytes) -> None:
        if self.send_observer is not None:
            self.send_observer(bid, body)
        op = AddBatchOp(pas, idx, bid, group)
        self.ctx.bookie_client.add_batch(bid, body,
                                         lambda resp, exc: self._act(op, op.on_response(resp, exc, self.ack_observer)),
                                         self.ctx.config.add_timeout_s)

    def _act(self, op: AddBatchOp, outcome: AddOutcome) -> None:
        """Act on what a bookie's answer to ``op`` meant: failures first (one may fail the
        handle or start an ensemble change), then in-order acknowledgement, then resends of
        what the bookie shed."""
        for pa, status in outcome.failed:
            self._add_failed(pa, op.index, op.bookie_id, status, outcome.error)
            if self._error is not None:
                return
        if outcome.completed:
            self._complete()
        if outcome.throttled:  # the bookie is at its in-flight limit for us: back off, then resend
            self.ctx.loop.call_later(_THROTTLE_BACKOFF_S, self._resend_throttled, outcome.throttled, op.index,
                                     op.bookie_id)

    def _resend_throttled(self, pas: Sequence[PendingAdd], idx: int, bid: str) -> None:
        if self._error is not None:
            return
        for pa in pas:
            if not pa.done and pa.ensemble is not None and pa.ensemble[idx] == bid:
                self._send(pa, only={idx})

    def _add_failed(self, pa: PendingAdd, idx: int, bid: str, status: int | None, exc: BaseException | None) -> None:
        if status == Status.FENCED:
            self._fail_all(LedgerFencedError(
                f"ledger {self.ledger_id} was fenced (recovery by another client); entries from "
                f"{self._lac + 1} on may or may not be written"))
            return
        if status == Status.UNAUTHORIZED:
            self._fail_all(UnauthorizedAccessError(f"bookie {bid} refused the master key of ledger {self.ledger_id}"))
            return
        if exc is not None:
            reason: BaseException = exc
        else:
            reason = status_error(bid, f"adds to ledger {self.ledger_id}", status or 0)
        pa.failed |= 1 << idx
        self._bookie_failed(bid, reason)

    def _complete(self) -> None:
        """Acknowledge, in entry order, every leading entry that has its ack quorum. Not while
        the ensemble changes: the new fragment starts after the last acknowledged entry, and an
        entry acknowledged meanwhile by the old bookies would never reach the replacement (as
        BookKeeper, completions wait for the change)."""
        if self._changing:
            return
        q = self._pending
        last = self._pop_acknowledged(q, self.md.ack_quorum, CLIENT_METRICS.add_seconds)
        if last >= 0:
            self._lac = last
        if not q:
            self._drained.set()
        if not self._space.is_set() and len(q) < self._max_outstanding:
            self._space.set()

    def _fail_all(self, error: LedgerStoreError) -> None:
        if self._error is None:
            self._error = error
        while self._pending:
            pa = self._pending.popleft()
            pa.done = True
            if pa.future is not None and not pa.future.done():
                pa.future.set_exception(error)
        self._unsent.clear()
        self._drained.set()
        self._space.set()

    def _bookie_failed(self, bid: str, reason: BaseException) -> None:
        if self._error is not None:
            return
        self._failed_bookies.add(bid)
        if self._ensemble_task is None and bid in self.md.current_ensemble:
            if self.ctx.config.ensemble_change:
                self._changing = True
                self._ensemble_task = self.ctx.loop.create_task(self._change_ensemble(reason))
            else:
                self._check_quorum_possible(reason)
        elif bid not in self.md.current_ensemble:
            self._check_quorum_possible(reason)

    def _check_quorum_possible(self, reason: BaseException) -> None:
        """Fail the handle if some pending entry can no longer reach its ack quorum."""
        wq, aq = self.md.write_quorum, self.md.ack_quorum
        for pa in self._pending:
            if wq - pa.failed.bit_count() < aq:
                self._fail_all(AddFailedError(
                    f"entry {pa.entry_id} of ledger {self.ledger_id} cannot reach its ack quorum of {aq}: {reason}"))
                return

    async def _change_ensemble(self, reason: BaseException) -> None:
        """Replace failed bookies of the current ensemble with a new fragment, by CAS, one
        :class:`EnsembleChange` attempt after another until no bookie of the current fragment
        has failed."""
        try:
            while True:
                failed = [b for b in self.md.current_ensemble if b in self._failed_bookies]
                if not failed or self._error is not None:
                    break
                change = EnsembleChange(self.ctx, self.md, self._lac + 1, failed, self._failed_bookies, reason)
                outcome = await change.attempt()
                if isinstance(outcome, NoReplacement):
                    self._go_on_without_replacement(outcome, reason)
                    return
                if isinstance(outcome, LedgerGone):
                    self._fail_all(outcome.error)
                    return
                self.md = outcome.md
                if isinstance(outcome, Changed):
                    self._resend_to_replacements(outcome.first, outcome.new)
        except LedgerStoreError as exc:
            self._fail_all(exc)
        finally:
            self._ensemble_task = None
            self._changing = False
        # a bookie of the new ensemble may have failed meanwhile: go round again (not when this
        # task was cancelled or its loop is shutting down: those leave through the finally above)
        if self._error is None and any(b in self._failed_bookies for b in self.md.current_ensemble):
            self._bookie_failed(next(b for b in self.md.current_ensemble if b in self._failed_bookies), reason)
        if self._error is None:
            self._complete()  # what was acknowledged during the change (held back until now)

    def _go_on_without_replacement(self, outcome: NoReplacement, reason: BaseException) -> None:
        """No bookie can replace the failed ones: go on with the remaining bookies while every
        pending entry can still reach its ack quorum."""
        log.warning("ledger %d: no replacement for %s (%s); continuing with the remaining bookies",
                    self.ledger_id, outcome.failed, outcome.error)
        self._changing = False
        self._resend_unsent()
        self._check_quorum_possible(reason)
        if self._error is None:
            self._complete()

    def _resend_to_replacements(self, first: int, new: list[str]) -> None:
        """After a change to ``new`` from entry ``first`` on: resend what the replaced bookies
        held of pending entries; a group's answers from replaced bookies stop counting, those of
        the bookies that stay still count."""
        for pa in list(self._pending):
            if pa.entry_id < first:
                continue
            ws = self.md.write_set(pa.entry_id)
            sent = pa.ensemble
            g = pa.group
            if g is not None:
                replaced = sum(1 << i for i, b in enumerate(g.ensemble) if b != new[i])
                g.stale |= replaced
                g.acked &= ~replaced
            redo = set(ws) if sent is None else {i for i in ws if sent[i] != new[i]}
            for i in redo:
                pa.acked &= ~(1 << i)
                pa.failed &= ~(1 << i)
            self._send(pa, only=redo)

    def _resend_unsent(self) -> None:
        for pa in self._pending:
            if pa.ensemble is None:
                self._send(pa)

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for outstanding adds, then close the ledger in metadata at the last acknowledged
        entry (the seeds' writer-close rules)."""
        if self.md.is_closed:
            return
        self._closing = True
        await self._drained.wait()
        if self._ensemble_task is not None:
            await asyncio.shield(self._ensemble_task)
        last = self._lac
        md = self.md
        while True:
            candidate = LedgerMetadata(**{**md.__dict__, "state": LedgerState.CLOSED, "last_entry_id": last,
                                          "length": self._length if self._error is None else md.length})
            try:
                self.md = await self.ctx.ledgers.write(candidate)
                notify("ledgerstore_ledger_closed", ledger_id=self.ledger_id, last_entry_id=last, recovered=False)
                return
            except BadVersionError:
                md = await self.ctx.ledgers.read(self.ledger_id)
                if md.state is LedgerState.OPEN:
                    continue
                if md.state is LedgerState.IN_RECOVERY:
                    self.md = md
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} is being recovered by another client; not closed by this writer"
                    ) from None
                self.md = md
                if md.last_entry_id != last:
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} was closed by recovery at entry {md.last_entry_id}, "
                        f"but this writer had acknowledged up to {last}") from None
                return
