"""``ledgerstore sim``: run deterministic simulations of a whole cluster, one schedule per seed."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import multiprocessing
import sys
import time
from collections.abc import Iterator

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ledgerstore.cli.common import EXIT_FAILED, err_console, handle_errors
from ledgerstore.sim import FAULT_KINDS, PARTS, SCENARIOS, Outcome, Shape, run_seed, shrink


@click.command("sim")
@click.option("--seeds", default=100, show_default=True, help="how many schedules to run")
@click.option("--seed", "first", default=0, show_default=True, help="the first seed (replay one: --seeds 1 --seed S)")
@click.option("--bookies", default=5, show_default=True, help="bookies in the simulated cluster")
@click.option("--duration", default=60.0, show_default=True, help="simulated seconds of faults per schedule")
@click.option("--faults", default=",".join(FAULT_KINDS), show_default=True,
              help="comma-separated fault kinds to draw from (empty: none)")
@click.option("--trace", "show_trace", is_flag=True, help="print the whole event trace of every seed, not only failing ones")
@click.option("--jobs", default=1, show_default=True, help="processes running seeds side by side (results in seed order)")
@click.option("--shrink", "do_shrink", is_flag=True,
              help="shrink each failing seed (its faults, then its workload) while the same invariant breaks, and "
                   "print the command that replays what is left")
@click.option("--scenario", type=click.Choice(SCENARIOS), default=None,
              help="a directed scenario: no random faults, that fault at every recovery")
@click.option("--skip", default="", help="comma-separated indexes of drawn faults to leave out (from --shrink)")
@click.option("--ledgers", type=click.IntRange(min=1), default=None, help="at most this many ledgers (from --shrink)")
@click.option("--entries", type=click.IntRange(min=1), default=None,
              help="at most this many adds per ledger (from --shrink)")
@click.option("--without", default="", help=f"comma-separated parts of the workload left out: {', '.join(PARTS)}")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per seed, then a summary")
@handle_errors
def sim(seeds: int, first: int, bookies: int, duration: float, faults: str, show_trace: bool, jobs: int,
        do_shrink: bool, scenario: str | None, skip: str, ledgers: int | None, entries: int | None, without: str,
        as_json: bool) -> None:
    """Run the real client and bookies under a simulated network, disks and metadata store.

    Each seed decides every fault and every timing, so a failing seed replays exactly
    (``--seeds 1 --seed S``); its trace hash proves it. Exits non-zero on any violation."""
    kinds = tuple(k for k in faults.split(",") if k)
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise click.BadParameter(f"unknown fault kinds {unknown}; choose from {', '.join(FAULT_KINDS)}",
                                 param_hint="--faults")
    parts = frozenset(p for p in without.split(",") if p)
    if parts - set(PARTS):
        raise click.BadParameter(f"unknown parts {sorted(parts - set(PARTS))}; choose from {', '.join(PARTS)}",
                                 param_hint="--without")
    try:
        left_out = frozenset(int(i) for i in skip.split(",") if i)
    except ValueError:
        raise click.BadParameter(f"{skip!r} is not a comma-separated list of fault indexes", param_hint="--skip") from None
    shape = Shape(ledgers, entries, parts)
    # the code under test logs what it survives (sessions lost, bookies gone): expected here
    logging.disable(logging.CRITICAL)
    failing: list[int] = []
    started = time.perf_counter()
    progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[failing]} failing"), console=err_console, disable=as_json)
    run = functools.partial(_run_quietly, bookies=bookies, duration=duration, faults=kinds, skip=left_out,
                            shape=shape, scenario=scenario)
    with contextlib.ExitStack() as stack:
        stack.enter_context(progress)
        if jobs > 1:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(jobs))
            outcomes: Iterator[Outcome] = pool.imap(run, range(first, first + seeds))
        else:
            outcomes = map(run, range(first, first + seeds))
        task = progress.add_task("sim", total=seeds, failing=0)
        for out in outcomes:
            seed = out.seed
            if as_json:
                click.echo(json.dumps({"seed": seed, "ok": out.ok, "trace_hash": out.trace_hash,
                                       "violations": out.violations, "stats": out.stats}))
            if not out.ok:
                failing.append(seed)
                if do_shrink:
                    shrunk = shrink(seed, bookies=bookies, duration=duration, faults=kinds, scenario=scenario)
                    out = shrunk.outcome
                    kept, drawn = shrunk.faults()
                    progress.console.print(
                        f"seed {seed}: {shrunk.invariant} still breaks with {kept} of {drawn} faults and "
                        f"{len(out.trace)} trace lines; replay it with:\n  "
                        f"{shrunk.command(bookies=bookies, faults=kinds, scenario=scenario)}",
                        highlight=False, markup=False)
            if (not out.ok or show_trace) and not as_json:
                progress.console.print(f"seed {seed}: {'FAILED' if not out.ok else 'ok'} trace {out.trace_hash}",
                                       highlight=False)
                for line in out.trace:
                    progress.console.print(f"  {line}", highlight=False, markup=False)
                for v in out.violations:
                    progress.console.print(f"  violation: {v}", highlight=False, markup=False)
            progress.update(task, advance=1, failing=len(failing))
    wall = time.perf_counter() - started
    rate = seeds / wall * 60 if wall else 0.0
    summary = (f"{seeds} seeds ({first}..{first + seeds - 1}), {bookies} bookies, {duration:g} simulated s each: "
               f"{len(failing)} failing{' ' + str(failing[:20]) if failing else ''}; {wall:.1f}s wall, {rate:.0f} seeds/min")
    if as_json:
        click.echo(json.dumps({"seeds": seeds, "failing": failing, "wall_s": round(wall, 2), "seeds_per_min": round(rate)}))
    else:
        click.echo(summary)
    if failing:
        sys.exit(EXIT_FAILED)


def _run_quietly(seed: int, *, bookies: int, duration: float, faults: tuple[str, ...], skip: frozenset[int],
                 shape: Shape, scenario: str | None) -> Outcome:
    """One seed (in this process or a worker's), with the logging of the code under test off."""
    logging.disable(logging.CRITICAL)
    return run_seed(seed, bookies=bookies, duration=duration, faults=faults, skip=skip, shape=shape,
                    scenario=scenario)
