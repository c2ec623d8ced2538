"""Write-quorum windows of a striped ensemble, and orders of fault domains that cover them.

Entries are striped round-robin: entry ``e`` of an ensemble of ``E`` bookies is written to the
``Qw`` positions ``e mod E, e+1 mod E, ..., e+Qw-1 mod E``. So the write quorums of a ledger are
exactly the ``E`` cyclic windows of ``Qw`` consecutive positions, and a placement constraint on
write quorums is a constraint on the ORDER of the ensemble, not only on its members.

A fault domain is a rack or a region. The *shortfall* of an order is, summed over every window,
how many domains the window lacks to reach the required number. :func:`arrange` searches for an
order of domains (one label per position, at most as many positions per domain as it has
bookies) with the smallest shortfall.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping, Sequence

__all__ = [
    "SEARCH_BUDGET",
    "Arrangement",
    "arrange",
    "min_shortfall",
    "shortfall",
    "window_shortfall",
    "windows_containing",
    "write_windows",
]

#: Window evaluations :func:`arrange` may spend (a few microseconds each) before settling for the
#: best order found so far: at most about a second. Orders that meet the constraint are found on the
#: first descent; the budget only bounds the proof that none exists, which it covers for ensembles
#: up to about 20 bookies and most larger ones.
SEARCH_BUDGET = 200_000


def write_windows(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The write set of every entry, as ensemble positions: window ``s`` serves entries ``e``
    with ``e mod ensemble_size == s``."""
    if not ensemble_size >= write_quorum >= 1:
        raise ValueError(f"need ensemble_size >= write_quorum >= 1, got {ensemble_size}/{write_quorum}")
    return [tuple((s + j) % ensemble_size for j in range(write_quorum)) for s in range(ensemble_size)]


def windows_containing(index: int, ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The write windows that include position ``index``."""
    return [w for w in write_windows(ensemble_size, write_quorum) if index in w]


def window_shortfall(labels: Sequence[str], window: Sequence[int], required: int) -> int:
    """How many domains ``window`` lacks to span ``required`` of them."""
    return max(0, required - len({labels[i] for i in window}))


def shortfall(labels: Sequence[str], write_quorum: int, required: int) -> int:
    """Total shortfall of the order ``labels`` over all its write windows (0: every window
    spans at least ``required`` domains)."""
    return sum(window_shortfall(labels, w, required) for w in write_windows(len(labels), write_quorum))


@dataclasses.dataclass(frozen=True, slots=True)
class Arrangement:
    """An order of domain labels found by :func:`arrange`."""

    labels: list[str]
    #: total shortfall of ``labels``; 0 when every window meets the requirement
    shortfall: int
    #: True when the search finished, so no order has a smaller shortfall
    proven: bool


class _BudgetSpent(Exception):
    pass


def arrange(
    capacity: Mapping[str, int],
    ensemble_size: int,
    write_quorum: int,
    required: int,
    rnd: random.Random,
    budget: int = SEARCH_BUDGET,
) -> Arrangement:
    """Find an order of ``ensemble_size`` domain labels, label ``d`` used at most ``capacity[d]``
    times, that minimises the shortfall against ``required`` domains per write window.

    Depth-first branch and bound: positions are filled in order, a partial order is abandoned as
    soon as a lower bound of its shortfall (windows already complete, plus windows that cannot
    gain enough domains from their unfilled positions) reaches the best complete order. Domains
    not used yet with the same remaining capacity are interchangeable, so only one of them is
    tried. Ties are broken with ``rnd`` and the result is rotated by a random offset (rotation
    maps windows onto windows) so placements spread over the cluster.

    Raises :class:`ValueError` if the capacities cannot fill the ensemble at all.
    """
    windows = write_windows(ensemble_size, write_quorum)
    remaining = {d: min(c, ensemble_size) for d, c in capacity.items() if c > 0}
    if sum(remaining.values()) < ensemble_size:
        raise ValueError(f"capacities {dict(capacity)} cannot fill {ensemble_size} positions")
    domains = list(remaining)
    rnd.shuffle(domains)
    seq: list[str] = []
    best: list[str] | None = None
    best_short = float("inf")
    work = 0

    def lower_bound() -> int:
        # Two bounds on the shortfall of every completion of ``seq``; capacities only shrink deeper
        # in the search, so both hold for the whole subtree. Per window: it gains at most one domain
        # per unfilled position, and only domains with bookies left. Per domain: ``k`` more bookies
        # of it sit in at most ``k * write_quorum`` windows, so it adds itself to at most that many.
        nonlocal work
        work += len(windows)
        filled = len(seq)
        spare = {d: left for d, left in remaining.items() if left > 0}
        per_window = 0
        need_total = 0
        cap_total = 0
        lacking = dict.fromkeys(spare, 0)
        for w in windows:
            present = {seq[i] for i in w if i < filled}
            unfilled = sum(1 for i in w if i >= filled)
            need = max(0, required - len(present))
            if need == 0:
                continue
            newcomers = [d for d in spare if d not in present]
            gain = min(unfilled, len(newcomers))
            per_window += need - min(need, gain)
            need_total += need
            cap_total += min(need, gain)
            if gain:
                for d in newcomers:
                    lacking[d] += 1
        supply = sum(min(n, spare[d] * write_quorum) for d, n in lacking.items())
        return max(per_window, need_total - min(cap_total, supply))

    def descend(pos: int) -> None:
        nonlocal best, best_short
        if pos == ensemble_size:
            best, best_short = list(seq), lower_bound()
            return
        if work > budget and best is not None:
            raise _BudgetSpent
        used = set(seq)
        fresh_keys: set[int] = set()
        options: list[tuple[int, int, float, str]] = []
        for d in domains:
            left = remaining[d]
            if left == 0:
                continue
            key = min(left, ensemble_size - pos)
            if d not in used:
                if key in fresh_keys:
                    continue
                fresh_keys.add(key)
            seq.append(d)
            remaining[d] -= 1
            options.append((lower_bound(), -left, rnd.random(), d))
            remaining[d] += 1
            seq.pop()
        options.sort()
        for bound, _, _, d in options:
            if bound >= best_short:
                break
            seq.append(d)
            remaining[d] -= 1
            descend(pos + 1)
            remaining[d] += 1
            seq.pop()
            if best_short == 0:
                return

    proven = True
    try:
        descend(0)
    except _BudgetSpent:
        proven = False
    assert best is not None  # the first descent always completes: capacities fill the ensemble
    offset = rnd.randrange(ensemble_size)
    labels = best[offset:] + best[:offset]
    return Arrangement(labels=labels, shortfall=int(best_short), proven=proven or best_short == 0)


@functools.lru_cache(maxsize=256)
def _min_shortfall_cached(
    capacities: tuple[int, ...], ensemble_size: int, write_quorum: int, required: int
) -> int:
    labels = {f"d{i}": c for i, c in enumerate(capacities)}
    return arrange(labels, ensemble_size, write_quorum, required, random.Random(0)).shortfall


def min_shortfall(capacity: Mapping[str, int], ensemble_size: int, write_quorum: int, required: int) -> int:
    """The smallest shortfall any order can reach with these capacities (the best found, if the
    search budget runs out first). Only the multiset of capacities matters, so results are cached
    on it."""
    caps = tuple(sorted((min(c, ensemble_size) for c in capacity.values() if c > 0), reverse=True))
    return _min_shortfall_cached(caps, ensemble_size, write_quorum, required)
