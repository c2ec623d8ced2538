"""The PlacementPolicy interface: which bookies hold a ledger's entries."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from ledgerstore.api.options import options_for


@dataclasses.dataclass(frozen=True, slots=True)
class BookieInfo:
    """What placement may know of a bookie; comes from its registration record."""

    bookie_id: str
    endpoint: str = ""
    rack: str = "/default-rack"
    region: str = "default-region"
    free_bytes: int = 0
    total_bytes: int = 0
    ledger_count: int = 0
    read_only: bool = False
    #: ledgers the bookie has in limbo (it lost data it may have held of them and is repairing
    #: them itself from their other replicas); 0 in registrations written before this field
    ledgers_in_limbo: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)


class PlacementPolicy(abc.ABC):
    """Chooses ensembles and replacements.

    Errors: :class:`~ledgerstore.errors.NotEnoughBookiesError`, naming the constraint that could not
    be met and how many bookies were available.
    """

    name: str = ""

    # --- capabilities: read by the conformance suite.

    #: the option ``seed`` makes the choices reproducible: two policies built with the same
    #: options and seed choose the same ensembles from the same bookies
    supports_seed: ClassVar[bool] = False
    #: new ensembles spread each write quorum over racks (the ``rack`` of :class:`BookieInfo`)
    rack_aware: ClassVar[bool] = False
    #: new ensembles spread over regions (the ``region`` of :class:`BookieInfo`)
    region_aware: ClassVar[bool] = False

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        """``options``: the instance of the policy's ``Options`` dataclass the host parsed from its
        option table. A policy built in code may pass the table as keyword arguments instead; they
        are parsed by the same rules (:func:`~ledgerstore.api.options.parse_options`). A policy
        that declares no ``Options`` keeps its keyword arguments as a dict."""
        #: the policy's parsed options (its ``Options`` instance)
        self.options = options_for(type(self), options, values, f"placement plugin {self.name!r}")

    @abc.abstractmethod
    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Return ``ensemble_size`` distinct bookie ids chosen among writable ``bookies`` not in
        ``exclude``."""

    @abc.abstractmethod
    def replace_bookie(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        ack_quorum: int,
        index: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """Return a bookie to take the place of ``ensemble[index]``: not already in the ensemble,
        not excluded, writable."""

    def reorder_read_sequence(
        self, ensemble: Sequence[str], write_set: Sequence[int], bookies: Sequence[BookieInfo]
    ) -> list[int]:
        """Order the indexes of a write set for reading (default: writable bookies first, then
        read-only ones, then those not registered at all)."""
        state = {b.bookie_id: (1 if b.read_only else 0) for b in bookies}
        return sorted(write_set, key=lambda i: state.get(ensemble[i], 2))

    def is_ensemble_adhering(
        self, ensemble: Sequence[str], write_quorum: int, ack_quorum: int, bookies: Sequence[BookieInfo]
    ) -> bool:
        """Whether ``ensemble`` meets this policy's constraints (default: all distinct)."""
        return len(set(ensemble)) == len(ensemble)
