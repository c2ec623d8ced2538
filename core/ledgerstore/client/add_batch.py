"""One ADD_BATCH frame to one bookie, from send to answer (BookKeeper's ``PendingAddOp``, per
frame rather than per entry): :class:`AddBatchOp` reads the bookie's answer and returns an
:class:`AddOutcome`; the writer (:class:`ledgerstore.client.ledger.LedgerHandle`) acts on it.

The entries' own state (:class:`~ledgerstore.client.adds.PendingAdd`) and the in-order
acknowledgement loop are in :mod:`ledgerstore.client.adds`; an op only sets ack bits. A frame
whose answer is a compact all-OK sets one bit on its :class:`AddGroup`, with no per-entry work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ledgerstore.client.adds import PendingAdd
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status

#: ``(entry_id, bookie_id)``: told of every bookie acknowledgement (tests, tools)
AckObserver = Callable[[int, str], None]


class AddGroup:
    """Entries first sent together: one ADD_BATCH frame to each bookie of their write sets.

    Bit ``i`` of ``acked`` is set once ensemble index ``i`` stored every entry of the group sent
    to it (a compact all-OK answer), so a whole frame is acknowledged without per-entry work.
    ``stale`` marks indexes whose bookie an ensemble change replaced: answers the old bookie
    gives for them no longer count (the new bookie's count per entry, in ``PendingAdd.acked``).
    """

    __slots__ = ("acked", "stale", "ensemble")

    def __init__(self, ensemble: list[str]) -> None:
        self.acked = 0
        self.stale = 0
        self.ensemble = ensemble


class AddOutcome:
    """What a bookie's answer to one frame means for the writer.

    ``completed``: acknowledgements were counted, so the writer acknowledges what now has its
    quorum. ``failed``: entries the bookie refused or lost, each with the status it answered
    (None: no answer, see ``error``), in entry order. ``throttled``: entries the bookie shed at
    its in-flight limit, to send again after a pause."""

    __slots__ = ("completed", "failed", "error", "throttled")

    def __init__(self, completed: bool, failed: Sequence[tuple[PendingAdd, int | None]] = (),
                 error: BaseException | None = None, throttled: Sequence[PendingAdd] = ()) -> None:
        self.completed = completed
        self.failed = failed
        self.error = error
        self.throttled = throttled


#: every entry of the frame is stored: acknowledge what has its quorum
ACKED = AddOutcome(completed=True)
#: the answer no longer counts (its bookie was replaced since): nothing to do
IGNORED = AddOutcome(completed=False)


class AddBatchOp:
    """The entries ``pas`` sent in one frame to bookie ``bookie_id`` at ensemble index ``index``,
    as part of ``group`` (None for a resend, whose answers count per entry)."""

    __slots__ = ("pas", "index", "bookie_id", "group")

    def __init__(self, pas: list[PendingAdd], index: int, bookie_id: str, group: AddGroup | None) -> None:
        self.pas = pas
        self.index = index
        self.bookie_id = bookie_id
        self.group = group

    def on_response(self, resp: codec.Response | None, exc: BaseException | None,
                    observer: AckObserver | None) -> AddOutcome:
        """Count the acknowledgements of the bookie's answer ``resp`` (None: it failed with
        ``exc``) and say what the writer must do next. ``observer`` hears of each one.

        An entry counts only while it waits for this bookie at this index: not acknowledged
        already, not moved to a replacement since (the test is written out in each loop: it is
        the hot path)."""
        if not (isinstance(resp, codec.AddBatchResponse) and resp.status == Status.OK
                and resp.count == len(self.pas)):
            return self._refused(resp, exc)
        if resp.all_ok:
            return self._all_ok(observer)
        return self._per_entry(resp, observer)

    def _refused(self, resp: codec.Response | None, exc: BaseException | None) -> AddOutcome:
        """No answer, or one that refuses the whole frame: every entry still waiting fails."""
        idx, bid = self.index, self.bookie_id
        status = resp.status if resp is not None else None
        if resp is not None and status == Status.OK:  # answered, but not for these entries
            status = Status.BAD_REQUEST
        return AddOutcome(False, [(pa, status) for pa in self.pas
                                  if not pa.done and pa.ensemble is not None and pa.ensemble[idx] == bid], exc)

    def _all_ok(self, observer: AckObserver | None) -> AddOutcome:
        """The compact answer: a group's frame sets one bit for all of it; a resend counts per entry."""
        pas, idx, bid = self.pas, self.index, self.bookie_id
        bit = 1 << idx
        group = self.group
        if group is not None:
            if group.stale & bit:
                return IGNORED  # from a bookie replaced since (see ledger.LedgerHandle._resend_to_replacements)
            group.acked |= bit
            if observer is not None:
                for pa in pas:
                    if not pa.done:
                        observer(pa.entry_id, bid)
            return ACKED
        for pa in pas:
            if not pa.done and pa.ensemble is not None and pa.ensemble[idx] == bid:
                pa.acked |= bit
                if observer is not None:
                    observer(pa.entry_id, bid)
        return ACKED

    def _per_entry(self, resp: codec.AddBatchResponse, observer: AckObserver | None) -> AddOutcome:
        """An answer with a status per entry: count the OKs, collect the throttled and failed."""
        idx, bid = self.index, self.bookie_id
        bit = 1 << idx
        throttled: list[PendingAdd] = []
        failed: list[tuple[PendingAdd, int | None]] = []
        for pa, item in zip(self.pas, resp.items, strict=True):
            if pa.done or pa.ensemble is None or pa.ensemble[idx] != bid:
                continue  # late answer for an acknowledged entry, or from a replaced bookie
            if item[1] == Status.OK:
                pa.acked |= bit
                if observer is not None:
                    observer(pa.entry_id, bid)
            elif item[1] == Status.TOO_MANY_REQUESTS:
                throttled.append(pa)
            else:
                failed.append((pa, int(item[1])))
        return AddOutcome(True, failed, None, throttled)
