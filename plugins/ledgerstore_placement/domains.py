"""Shared machinery of the fault-domain policies (``rack-aware``, ``region-aware``).

A fault domain is what can fail as a unit: a rack, a region. These policies choose the members AND
the order of an ensemble so that every write quorum (every cyclic window of ``write_quorum``
positions, see :mod:`ledgerstore_placement.striping`) spans several domains.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ledgerstore.api import BookieInfo, PlacementPolicy, option
from ledgerstore.errors import NotEnoughBookiesError
from ledgerstore_placement.striping import (
    arrange,
    min_shortfall,
    shortfall,
    windows_containing,
    write_windows,
)
from ledgerstore_placement.topology import NetworkTopology

__all__ = ["FaultDomainPlacement", "writable_candidates"]

_UNKNOWN = BookieInfo(bookie_id="")  # facts assumed for a bookie missing from the registrations


def writable_candidates(bookies: Sequence[BookieInfo], exclude: frozenset[str]) -> list[BookieInfo]:
    """Bookies that may receive new entries: writable and not excluded."""
    return [b for b in bookies if not b.read_only and b.bookie_id not in exclude]


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class FaultDomainPlacement(PlacementPolicy):
    """Base of the policies that spread every write quorum over ``min_<domain>s_per_write_quorum``
    fault domains.

    Subclasses set :attr:`domain` (the noun used in messages and option names) and implement
    :meth:`domain_of`. Options common to all: ``enforce`` (default true: fail rather than place a
    write quorum in too few domains) and ``seed`` (reproducible choices).
    """

    #: "rack" or "region": names the options and appears in error messages
    domain: ClassVar[str] = ""
    supports_seed = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """Options every fault-domain policy takes; subclasses add ``min_<domain>s_per_write_quorum``."""

        enforce: bool = option(True, "fail rather than place a write quorum in too few fault domains")
        seed: int | str | None = option(None, "seed of the random choices, for reproducible placement")
        topology_file: str | None = option(None, "file mapping hosts or addresses to /region/rack locations; "
                                                 "when set, racks come from it, not from the registrations")
        default_rack: str = option("/default-rack", "location of a bookie the topology file does not name")

        def __post_init__(self) -> None:
            if not self.default_rack.startswith("/"):
                raise ValueError(f"default_rack must start with '/', got {self.default_rack!r}")
            if self.topology_file == "":
                raise ValueError("topology_file must be a file path, got ''")
            for name in ("local_rack", "local_region"):
                if getattr(self, name, None) == "":
                    raise ValueError(f"{name} must be a non-empty string, got ''")

    def __init__(self, options: Any = None, /, **values: Any) -> None:
        super().__init__(options, **values)
        opts = self.options
        self.min_option = f"min_{self.domain}s_per_write_quorum"
        #: how many domains every write quorum must span (capped at the write quorum size)
        self.min_domains: int = getattr(opts, self.min_option)
        #: fail instead of placing best effort when the constraint cannot be met
        self.enforce: bool = opts.enforce
        self._rnd = random.Random(opts.seed)
        #: racks and regions from the ``topology_file`` mapping; ``None``: from the registrations
        self.topology: NetworkTopology | None = (
            None if opts.topology_file is None else NetworkTopology(opts.topology_file, opts.default_rack))

    # --- what subclasses provide -------------------------------------------------------------

    @abc.abstractmethod
    def domain_of(self, bookie: BookieInfo) -> str:
        """The fault domain of ``bookie``."""

    @abc.abstractmethod
    def locality(self, bookie: BookieInfo) -> int:
        """Read preference of a writable ``bookie``: 0 for the closest, larger for farther."""

    def assign_bookies(self, labels: Sequence[str], pools: Mapping[str, list[BookieInfo]]) -> list[str]:
        """Pick a distinct bookie of domain ``labels[p]`` for every position ``p``."""
        shuffled = {d: self._rnd.sample(pool, len(pool)) for d, pool in pools.items()}
        return [shuffled[d].pop().bookie_id for d in labels]

    def tie_break(self, candidate: BookieInfo, neighbours: Sequence[Sequence[BookieInfo]]) -> int:
        """Among replacements equally good for the domain constraint, lower is preferred;
        ``neighbours`` holds the other members of each write window the replacement joins."""
        return 0

    # --- constraint arithmetic ---------------------------------------------------------------

    def located(self, bookies: Sequence[BookieInfo]) -> Sequence[BookieInfo]:
        """``bookies`` with the racks and regions the topology file gives them (unchanged without one)."""
        return bookies if self.topology is None else self.topology.locate(bookies)

    def _info(self, bookies: Sequence[BookieInfo]) -> dict[str, BookieInfo]:
        return {b.bookie_id: b for b in bookies}

    def _domain_of_id(self, bookie_id: str, info: Mapping[str, BookieInfo]) -> str:
        return self.domain_of(info.get(bookie_id, _UNKNOWN))

    def _required(self, write_quorum: int, domains_available: int, detail: str) -> int:
        """Domains each write window must span; raises when ``enforce`` and too few domains exist
        (``detail`` says which bookies were counted)."""
        wanted = min(self.min_domains, write_quorum)
        if domains_available >= wanted:
            return wanted
        if self.enforce:
            verb = "has" if domains_available == 1 else "have"
            raise NotEnoughBookiesError(
                f"write quorum must span {_plural(wanted, self.domain)}; only "
                f"{_plural(domains_available, self.domain)} {verb} writable bookies ({detail}); add bookies "
                f"in other {self.domain}s, lower {self.min_option}, or set enforce = false"
            )
        return max(1, domains_available)

    @staticmethod
    def _counts(pools: Mapping[str, Sequence[Any]]) -> str:
        return ", ".join(f"{d}: {len(p)}" for d, p in sorted(pools.items())) or "none"

    # --- PlacementPolicy ---------------------------------------------------------------------

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Choose and order ``ensemble_size`` distinct writable bookies so that every write quorum
        spans ``min(min_<domain>s_per_write_quorum, write_quorum)`` domains.

        Raises :class:`NotEnoughBookiesError` when there are fewer than ``ensemble_size`` writable
        bookies, or (with ``enforce``) when the domains available cannot satisfy every window; with
        ``enforce = false`` the order with the smallest shortfall is returned instead.
        """
        bookies = self.located(bookies)
        cands = writable_candidates(bookies, exclude)
        if len(cands) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies for the ensemble, found {len(cands)} "
                f"({len(bookies)} registered, {len(exclude)} excluded, "
                f"{sum(b.read_only for b in bookies)} read-only)"
            )
        pools: dict[str, list[BookieInfo]] = collections.defaultdict(list)
        for b in cands:
            pools[self.domain_of(b)].append(b)
        counts = self._counts(pools)
        required = self._required(write_quorum, len(pools), f"writable bookies per {self.domain}: {counts}")
        capacity = {d: len(p) for d, p in pools.items()}
        found = arrange(capacity, ensemble_size, write_quorum, required, self._rnd)
        if found.shortfall and self.enforce:
            short = sum(
                1 for w in write_windows(ensemble_size, write_quorum)
                if len({found.labels[i] for i in w}) < required
            )
            how = "no order" if found.proven else "no order found within the search budget"
            raise NotEnoughBookiesError(
                f"write quorum must span {_plural(required, self.domain)}, but {how} of {ensemble_size} "
                f"bookies from the writable {self.domain}s ({counts}) makes every write quorum of "
                f"{write_quorum} span {_plural(required, self.domain)} (the best order leaves {short} of its "
                f"{ensemble_size} write quorums short); add bookies in other {self.domain}s, change the "
                f"ensemble size, or set enforce = false"
            )
        return self.assign_bookies(found.labels, pools)

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        ack_quorum: int,
        index: int,
        bookies: Sequence[BookieInfo],
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """A writable bookie outside the ensemble for position ``index`` that keeps every write
        window through ``index`` spanning the required domains, as far as the other members of
        those windows allow.

        Raises :class:`NotEnoughBookiesError` when no bookie is eligible, or (with ``enforce``)
        when every eligible bookie leaves one of those windows short.
        """
        bookies = self.located(bookies)
        cands = writable_candidates(bookies, exclude | frozenset(ensemble))
        if not cands:
            raise NotEnoughBookiesError(
                f"no writable bookie outside the ensemble to replace {ensemble[index]} "
                f"({len(bookies)} registered, ensemble of {len(ensemble)}, {len(exclude)} excluded)"
            )
        info = self._info(bookies)
        labels = [self._domain_of_id(b, info) for b in ensemble]
        pools: dict[str, list[BookieInfo]] = collections.defaultdict(list)
        for b in cands:
            pools[self.domain_of(b)].append(b)
        kept = {labels[i] for i in range(len(ensemble)) if i != index}
        required = self._required(
            write_quorum,
            len(kept | set(pools)),
            f"the rest of the ensemble is on {', '.join(sorted(kept)) or 'no ' + self.domain}; writable bookies "
            f"outside it per {self.domain}: {self._counts(pools)}",
        )
        windows = windows_containing(index, len(ensemble), write_quorum)
        others = [[i for i in w if i != index] for w in windows]
        present = [{labels[i] for i in o} for o in others]
        # what even a bookie from a domain new to every window could not fix
        unavoidable = sum(max(0, required - len(p) - 1) for p in present)

        def short(b: BookieInfo) -> int:
            d = self.domain_of(b)
            return sum(max(0, required - len(p | {d})) for p in present)

        scored = [(short(b), b) for b in cands]
        best = min(s for s, _ in scored)
        if best > unavoidable and self.enforce:
            raise NotEnoughBookiesError(
                f"replacing {ensemble[index]}: every write quorum must span {_plural(required, self.domain)}, "
                f"but each of the {len(cands)} writable bookies outside the ensemble ({self._counts(pools)}) "
                f"would leave a write quorum through position {index} short; add bookies in other "
                f"{self.domain}s or set enforce = false"
            )
        good = [b for s, b in scored if s == best]
        neighbours = [[info.get(ensemble[i], _UNKNOWN) for i in o] for o in others]
        ranked = [(self.tie_break(b, neighbours), b) for b in good]
        top = min(r for r, _ in ranked)
        return self._rnd.choice([b for r, b in ranked if r == top]).bookie_id

    def reorder_read_sequence(
        self, ensemble: Sequence[str], write_set: Sequence[int], bookies: Sequence[BookieInfo]
    ) -> list[int]:
        """Writable bookies nearest first (see :meth:`locality`), then read-only ones, then those
        not registered; the write-set order is kept among equals."""
        bookies = self.located(bookies)
        info = self._info(bookies)
        far = 1 << 16

        def key(i: int) -> int:
            b = info.get(ensemble[i])
            if b is None:
                return far + 1
            return far if b.read_only else self.locality(b)

        return sorted(write_set, key=key)

    def is_ensemble_adhering(
        self, ensemble: Sequence[str], write_quorum: int, ack_quorum: int, bookies: Sequence[BookieInfo]
    ) -> bool:
        """Whether the members are distinct and every write window spans the required domains.

        With ``enforce`` the requirement is ``min(min_<domain>s_per_write_quorum, write_quorum)``.
        Without it, the requirement is also capped at the number of domains with writable bookies,
        and an ensemble falling short still adheres when no ensemble drawn from the same bookies
        could fall short by less: there is nothing better to move it to.
        """
        bookies = self.located(bookies)
        if len(set(ensemble)) != len(ensemble) or not ensemble:
            return False
        info = self._info(bookies)
        labels = [self._domain_of_id(b, info) for b in ensemble]
        members = set(ensemble)
        usable = [b for b in bookies if not b.read_only and b.bookie_id not in members]
        capacity = collections.Counter(self.domain_of(b) for b in usable)
        capacity.update(labels)
        required = min(self.min_domains, write_quorum)
        if not self.enforce:
            required = min(required, len(capacity))
        missing = shortfall(labels, write_quorum, required)
        if missing == 0:
            return True
        if self.enforce:
            return False
        return missing <= min_shortfall(capacity, len(ensemble), write_quorum, required)

