"""The ``disk-aware`` placement policy: new replicas go preferably to bookies with free space and
few ledgers.

A bookie chooses its followers "by load, by the free space of the other bookies and by the
replication number"; a bookie past ``max_disk_usage`` is never chosen. The choice stays random,
weighted, so that a new empty bookie draws more ledgers without drawing all of them at once.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from ledgerstore.api import BookieInfo, PlacementPolicy, option
from ledgerstore.errors import NotEnoughBookiesError

__all__ = ["DiskAwarePlacement"]

#: weight floor, so a bookie with no free space left (still at or under ``max_disk_usage = 1``) can
#: be chosen when nothing else is left
_MIN_FREE_FRACTION = 1e-3


def disk_usage(bookie: BookieInfo) -> float | None:
    """Fraction of the bookie's disk in use, or None when its registration gives no capacity."""
    if bookie.total_bytes <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - bookie.free_bytes / bookie.total_bytes))


class DiskAwarePlacement(PlacementPolicy):
    """Weighted random choice: weight = free fraction of the disk x ``1 / (1 + ledgers / mean)``,
    ``mean`` being the average ledger count of the eligible bookies (so the load term does not
    depend on the cluster's age). A bookie registered without disk figures weighs like the average
    free fraction of the others.

    Options: ``max_disk_usage`` (default 0.95; bookies using more of their disk are never chosen),
    ``seed``.
    """

    name = "disk-aware"
    supports_seed = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``placement_options`` table of the disk-aware policy."""

        max_disk_usage: float = option(0.95, "bookies using more of their disk are never chosen",
                                       minimum=0.0, maximum=1.0)
        seed: int | str | None = option(None, "seed of the random choices, for reproducible placement")

        def __post_init__(self) -> None:
            if not self.max_disk_usage > 0:
                raise ValueError(f"max_disk_usage must be in (0, 1], got {self.max_disk_usage!r}")

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        super().__init__(options, **values)
        #: a bookie using more than this fraction of its disk is never chosen
        self.max_disk_usage: float = self.options.max_disk_usage
        self._rnd = random.Random(self.options.seed)

    def _eligible(self, bookies: Sequence[BookieInfo], exclude: frozenset[str]) -> tuple[list[BookieInfo], int]:
        writable = [b for b in bookies if not b.read_only and b.bookie_id not in exclude]
        eligible = [b for b in writable if (u := disk_usage(b)) is None or u <= self.max_disk_usage]
        return eligible, len(writable) - len(eligible)

    def weights(self, bookies: Sequence[BookieInfo]) -> list[float]:
        """The choice weight of each of ``bookies`` (all assumed eligible)."""
        known = [1.0 - u for b in bookies if (u := disk_usage(b)) is not None]
        unknown_free = sum(known) / len(known) if known else 1.0
        mean_ledgers = sum(b.ledger_count for b in bookies) / len(bookies) if bookies else 0.0
        out = []
        for b in bookies:
            u = disk_usage(b)
            free = unknown_free if u is None else 1.0 - u
            load = 1.0 / (1.0 + b.ledger_count / mean_ledgers) if mean_ledgers > 0 else 1.0
            out.append(max(free, _MIN_FREE_FRACTION) * load)
        return out

    def _draw(self, pool: list[BookieInfo], count: int) -> list[str]:
        # successive weighted draws without replacement
        pool = list(pool)
        weights = self.weights(pool)
        chosen = []
        for _ in range(count):
            i = self._rnd.choices(range(len(pool)), weights=weights)[0]
            chosen.append(pool.pop(i).bookie_id)
            weights.pop(i)
        return chosen

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> list[str]:
        """``ensemble_size`` distinct writable bookies at or under ``max_disk_usage``, emptier and
        less loaded ones more likely. Raises :class:`NotEnoughBookiesError` when too few qualify."""
        eligible, too_full = self._eligible(bookies, exclude)
        if len(eligible) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies at or under {self.max_disk_usage:.0%} disk usage "
                f"for the ensemble, found {len(eligible)} ({len(bookies)} registered, {len(exclude)} excluded, "
                f"{sum(b.read_only for b in bookies)} read-only, {too_full} over max_disk_usage)"
            )
        return self._draw(eligible, ensemble_size)

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        ack_quorum: int,
        index: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """A writable bookie outside the ensemble, at or under ``max_disk_usage``, drawn with the
        same weights. Raises :class:`NotEnoughBookiesError` when none qualifies."""
        eligible, too_full = self._eligible(bookies, exclude | frozenset(ensemble))
        if not eligible:
            raise NotEnoughBookiesError(
                f"no writable bookie outside the ensemble at or under {self.max_disk_usage:.0%} disk usage "
                f"to replace {ensemble[index]} ({len(bookies)} registered, ensemble of {len(ensemble)}, "
                f"{len(exclude)} excluded, {too_full} over max_disk_usage)"
            )
        return self._draw(eligible, 1)[0]
