"""The ``round-robin`` placement policy: ensembles rotate through the writable bookies in order.

Ledger 1 goes to bookies 0..E-1 (sorted by id), ledger 2 to 1..E, and so on, so over many ledgers
every writable bookie takes the same share, whatever its rack, region or free space.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from ledgerstore.api import BookieInfo, PlacementPolicy, option
from ledgerstore.errors import ConfigError, NotEnoughBookiesError

__all__ = ["RoundRobinPlacement"]

_OPTIONS = ("start",)


class RoundRobinPlacement(PlacementPolicy):
    """Consecutive writable bookies (sorted by id), starting one further on for every ensemble.

    Option ``start`` (int, default 0): the position of the first ensemble's first bookie.
    """

    name = "round-robin"

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``placement_options`` table: checked by ledgerstore when the configuration loads."""

        start: int = option(0, "the position of the first ensemble's first bookie")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown round-robin placement option(s) {', '.join(unknown)}; accepted: {', '.join(_OPTIONS)}"
            )
        try:
            self._next = int(options.get("start", 0))
        except (TypeError, ValueError):
            raise ConfigError(f"round-robin placement option start={options['start']!r} is not an integer") from None
        # One policy serves every ledger a client creates, possibly from several threads.
        self._lock = threading.Lock()

    @staticmethod
    def _writable(bookies: Sequence[BookieInfo], exclude: frozenset[str]) -> list[str]:
        return sorted(b.bookie_id for b in bookies if not b.read_only and b.bookie_id not in exclude)

    def _advance(self, modulo: int) -> int:
        with self._lock:
            position = self._next % modulo
            self._next = position + 1
            return position

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> list[str]:
        """The next ``ensemble_size`` writable bookies in rotation."""
        candidates = self._writable(bookies, exclude)
        if len(candidates) < ensemble_size:
            raise NotEnoughBookiesError(
                f"round-robin placement needs {ensemble_size} writable bookies for the ensemble, "
                f"found {len(candidates)} ({len(bookies)} registered, {len(exclude)} excluded, "
                f"{sum(b.read_only for b in bookies)} read-only)"
            )
        first = self._advance(len(candidates))
        return [candidates[(first + i) % len(candidates)] for i in range(ensemble_size)]

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        ack_quorum: int,
        index: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """The next writable bookie in rotation that is not in the ensemble."""
        candidates = self._writable(bookies, exclude | frozenset(ensemble))
        if not candidates:
            raise NotEnoughBookiesError(
                f"round-robin placement found no writable bookie outside the ensemble to replace "
                f"{ensemble[index]} ({len(bookies)} registered, ensemble of {len(ensemble)}, {len(exclude)} excluded)"
            )
        return candidates[self._advance(len(candidates))]
