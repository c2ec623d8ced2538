"""Why a ledger cannot be re-replicated now, and how long its workers wait before trying again.

A worker that fails on a ledger records the failure in the ledger's under-replication marker
(:class:`~ledgerstore.recovery.markers.Marker`: ``stuck_reason``, ``failures``, ``last_error``),
so that every worker of the cluster backs off from it alike and speaks of it once: one warning
when the ledger becomes stuck (or its reason changes), one when it is re-replicated after all.
The reasons below are the values of the ``reason`` label of the stuck-ledgers gauge and are
shown by ``ledgerstore shell listunderreplicated``.

Neighbours: ``worker.py`` (raises these errors and applies the backoff), ``admin.py`` (the
operator's decommission and recover, which fail fast on :data:`NOT_ENOUGH_BOOKIES`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ledgerstore.api import BookieInfo
from ledgerstore.errors import NotEnoughBookiesError
from ledgerstore.recovery.markers import ReplicationError

#: placement cannot choose a replacement (too few writable bookies outside the ensemble)
NOT_ENOUGH_BOOKIES = "not-enough-bookies"
#: no bookie of an entry's write set could serve a valid copy of it
NO_READABLE_REPLICA = "no-readable-replica"
#: the ledger's password is not in its metadata (``store_password_in_metadata = false``)
NO_PASSWORD = "no-password"
#: anything else (a metadata error, a bookie refusing the copies, a bug)
OTHER = "error"
#: every reason, in the order the gauge lists them
REASONS = (NOT_ENOUGH_BOOKIES, NO_READABLE_REPLICA, NO_PASSWORD, OTHER)

#: the first retry after a failure; each further failure doubles the wait ...
BACKOFF_FIRST_S = 2.0
#: ... up to this. A change of the registered bookies retries stuck ledgers at once (see the
#: worker), so a long cap costs nothing when a bookie is added; it only bounds how long a ledger
#: stuck for another reason waits after that reason went away.
BACKOFF_CAP_S = 120.0


class StuckError(ReplicationError):
    """A ledger cannot be re-replicated for ``reason`` (one of :data:`REASONS`)."""

    reason = OTHER


class NoReplacementError(StuckError):
    """Placement cannot choose a replacement for a bookie of a fragment."""

    reason = NOT_ENOUGH_BOOKIES


class NoReadableReplicaError(StuckError):
    """No bookie of an entry's write set served a valid copy of it."""

    reason = NO_READABLE_REPLICA


class NoPasswordError(StuckError):
    """The ledger's metadata holds no password to write copies with."""

    reason = NO_PASSWORD


def reason_of(exc: BaseException) -> str:
    """The stuck reason an exception raised while re-replicating stands for (an open ledger's
    recovery raises :class:`NotEnoughBookiesError` itself when no bookie can take its entries)."""
    if isinstance(exc, NotEnoughBookiesError):
        return NOT_ENOUGH_BOOKIES
    return exc.reason if isinstance(exc, StuckError) else OTHER


def backoff_s(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (1, 2, ...)."""
    return float(min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2.0 ** max(0, min(failures, 32) - 1)))


def no_replacement(ledger_id: int, ensemble: Sequence[str], index: int, bookies: Iterable[BookieInfo],
                   exclude: Iterable[str], detail: object) -> NoReplacementError:
    """The error for a fragment whose ``ensemble[index]`` has no replacement, naming what
    placement had to choose from."""
    shut_out = set(exclude) | set(ensemble)
    writable = [b.bookie_id for b in bookies if not b.read_only]
    outside = sorted(set(writable) - shut_out)
    return NoReplacementError(
        f"not enough bookies: ledger {ledger_id}'s ensemble of {len(ensemble)} needs a replacement for "
        f"{ensemble[index]} outside {{{', '.join(sorted(shut_out))}}}, {len(writable)} writable bookies "
        f"({len(outside)} outside it{': ' + ', '.join(outside) if outside else ''}); placement said: {detail}")
