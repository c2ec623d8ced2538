"""The ``random`` placement policy: any distinct writable bookies."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from ledgerstore.api import BookieInfo, PlacementPolicy, option
from ledgerstore.errors import NotEnoughBookiesError

__all__ = ["RandomPlacement"]


class RandomPlacement(PlacementPolicy):
    """Any distinct writable bookies, chosen uniformly at random. Option: ``seed``."""

    name = "random"
    supports_seed = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``placement_options`` table of the random policy."""

        seed: int | str | None = option(None, "seed of the random choices, for reproducible placement")

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        super().__init__(options, **values)
        self._rnd = random.Random(self.options.seed)

    @staticmethod
    def _candidates(bookies: Sequence[BookieInfo], exclude: frozenset[str]) -> list[str]:
        return [b.bookie_id for b in bookies if not b.read_only and b.bookie_id not in exclude]

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> list[str]:
        """``ensemble_size`` distinct writable bookies not in ``exclude``, uniformly at random."""
        cands = self._candidates(bookies, exclude)
        if len(cands) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies for the ensemble, found {len(cands)} "
                f"({len(bookies)} registered, {len(exclude)} excluded, "
                f"{sum(b.read_only for b in bookies)} read-only)"
            )
        return self._rnd.sample(cands, ensemble_size)

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        ack_quorum: int,
        index: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """Any writable bookie outside the ensemble and ``exclude``."""
        cands = self._candidates(bookies, exclude | frozenset(ensemble))
        if not cands:
            raise NotEnoughBookiesError(
                f"no writable bookie outside the ensemble to replace {ensemble[index]} "
                f"({len(bookies)} registered, ensemble of {len(ensemble)}, {len(exclude)} excluded)"
            )
        return self._rnd.choice(cands)
