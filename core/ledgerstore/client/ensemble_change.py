"""A writer's ensemble change (BookKeeper's ``LedgerHandle.handleBookieFailure`` and its metadata
update loop), one attempt at a time: :class:`EnsembleChange` chooses replacements for the failed
bookies of the current fragment and writes a new fragment by compare-and-set; what happened comes
back as an outcome the writer (:class:`ledgerstore.client.ledger.LedgerHandle`) acts on.

The seeds' rule: the new fragment starts at the first unacknowledged entry; on a CAS failure the
metadata is read again, and if the ledger is no longer OPEN the pending adds fail. The writer
owns what follows a change: resending to the replacements what the replaced bookies held.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Set

from ledgerstore.client.context import ClientContext
from ledgerstore.client.metrics import CLIENT_METRICS
from ledgerstore.errors import BadVersionError, LedgerFencedError, NotEnoughBookiesError
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.plugins import notify

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Changed:
    """The new fragment is written: ``md`` holds it, from entry ``first`` on ``new`` (was ``old``)."""

    md: LedgerMetadata
    first: int
    old: list[str]
    new: list[str]


@dataclasses.dataclass(frozen=True)
class Raced:
    """Someone else (auto-recovery swapping bookies of earlier fragments) changed the metadata,
    and the ledger is still OPEN: start again from ``md``, which holds the current fragment too."""

    md: LedgerMetadata


@dataclasses.dataclass(frozen=True)
class NoReplacement:
    """No bookie could replace ``failed``: the writer goes on with the remaining ones if the ack
    quorum allows."""

    failed: list[str]
    error: NotEnoughBookiesError


@dataclasses.dataclass(frozen=True)
class LedgerGone:
    """The ledger is no longer OPEN (another client recovered it): the pending adds fail."""

    error: LedgerFencedError


ChangeOutcome = Changed | Raced | NoReplacement | LedgerGone


@dataclasses.dataclass(frozen=True)
class EnsembleChange:
    """Replace ``failed`` (bookies of ``md``'s current fragment) from entry ``first`` on.

    ``failed_bookies`` is the writer's set of every bookie that failed it so far, read when the
    replacements are chosen so that none of them is chosen; ``reason`` is the failure that
    started the change (for the log)."""

    ctx: ClientContext
    md: LedgerMetadata
    first: int
    failed: list[str]
    failed_bookies: Set[str]
    reason: BaseException

    async def attempt(self) -> ChangeOutcome:
        """One attempt: choose the replacements, then write the new fragment by CAS.

        Raises what the metadata store raises other than a CAS conflict
        (:class:`~ledgerstore.errors.LedgerStoreError`)."""
        md = self.md
        old = list(md.current_ensemble)
        new = list(old)
        try:
            bookies = await self.ctx.bookie_infos()
            exclude = frozenset(self.failed_bookies)
            for b in self.failed:
                idx = new.index(b)
                new[idx] = self.ctx.ensemble_placement.replace_bookie(
                    new, md.write_quorum, md.ack_quorum, idx, bookies, exclude=exclude)
        except NotEnoughBookiesError as exc:
            return NoReplacement(self.failed, exc)
        first = self.first
        ensembles = [e for e in md.ensembles if e[0] < first] + [(first, new)]
        candidate = LedgerMetadata(**{**md.__dict__, "ensembles": ensembles})
        try:
            written = await self.ctx.ledgers.write(candidate)
        except BadVersionError:
            fresh = await self.ctx.ledgers.read(md.ledger_id)
            if fresh.state is not LedgerState.OPEN:
                return LedgerGone(LedgerFencedError(
                    f"ledger {md.ledger_id} is {fresh.state.value} (recovered by another client) "
                    "while replacing a failed bookie"))
            return Raced(fresh)
        log.info("ledger %d: ensemble change at entry %d: %s -> %s (%s)", md.ledger_id, first, old, new, self.reason)
        CLIENT_METRICS.ensemble_changes += 1
        notify("ledgerstore_ensemble_changed", ledger_id=md.ledger_id, first_entry_id=first, old=old, new=new)
        return Changed(written, first, old, new)
