"""Throughput of a StorageEngine backend: add_entry with periodic flush(), and random or sequential get_entry.

Usage::

    python benchmarks/storage_engine.py --engine rocksdb
    python benchmarks/storage_engine.py --engine entrylog --add-entries 200000 --json
    python benchmarks/storage_engine.py --engine entrylog --add-entries 200000 --sizes 128 --batch 500
    python benchmarks/storage_engine.py --engine rocksdb -o wal=true -o compression='"none"'
    python benchmarks/storage_engine.py --engine entrylog --sizes --read-entries 200000 \
        --lookups 200000 --batch 2000 --sequential-reads --read-stride 3 --load-batch 2000

The engine is loaded by name through the ``ledgerstore.storage`` entry points, exactly as a bookie
does, and runs on real files in a fresh directory per phase (``--dir``, default a temp dir).
Adds are spread round-robin over ``--ledgers`` ledgers, as a bookie interleaves them; payloads are
random bytes, so compression gains nothing. Every phase is bounded by its entry count.
With ``--batch N`` the adds go through ``add_entries`` in batches of N consecutive entries of one
ledger (ledgers taking turns by batch) and the lookups through ``get_entries`` with N random
entries of one ledger per call, as a bookie hands over what it drained from its journal or
received in one read request.
With ``--sequential-reads`` the lookups walk each ledger from its first entry in steps of
``--read-stride`` (a reader of a ledger striped over an ensemble of that size asks one bookie for
every stride-th entry), ``--batch`` ids per get_entries call, ledgers taking turns by call.
``--load-batch N`` stores the read phase's entries through add_entries, N consecutive entries of
one ledger per call (a writer's batch lies contiguously in the entry log); the default 1 stores
them one add_entry at a time, ledgers interleaved entry by entry.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerstore.plugins import load_driver


def _payloads(size: int, count: int = 1024) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def bench_add(
    factory: Callable[[Path], Any],
    root: Path,
    size: int,
    entries: int,
    ledgers: int,
    flush_every: int,
    batch: int = 1,
) -> dict[str, Any]:
    """Add ``entries`` entries of ``size`` bytes with a flush() every ``flush_every`` adds; with
    ``batch`` > 1 through add_entries, ``batch`` entries of one ledger per call."""
    engine = factory(root)
    engine.open()
    try:
        for lid in range(ledgers):
            engine.set_master_key(lid, b"bench-master-key")
        pool = _payloads(size)
        npool = len(pool)
        add, flush = engine.add_entry, engine.flush
        flush_time = 0.0
        flushes = 0
        if batch > 1:
            batches = _add_batches(pool, entries, ledgers, batch)
            add_many = engine.add_entries
            done = 0
            start = time.perf_counter()
            for lid, items in batches:
                add_many(lid, items)
                before, done = done, done + len(items)
                if done // flush_every != before // flush_every:
                    f0 = time.perf_counter()
                    flush()
                    flush_time += time.perf_counter() - f0
                    flushes += 1
        else:
            start = time.perf_counter()
            for i in range(entries):
                add(i % ledgers, i // ledgers, pool[i % npool])
                if (i + 1) % flush_every == 0:
                    f0 = time.perf_counter()
                    flush()
                    flush_time += time.perf_counter() - f0
                    flushes += 1
        f0 = time.perf_counter()
        flush()
        flush_time += time.perf_counter() - f0
        flushes += 1
        elapsed = time.perf_counter() - start
        stats = engine.stats()
    finally:
        engine.close()
    return {
        "phase": f"add {size} B" + (f" in batches of {batch}" if batch > 1 else ""),
        "entries": entries,
        "seconds": round(elapsed, 3),
        "entries_per_s": round(entries / elapsed),
        "mb_per_s": round(entries * size / elapsed / 1e6, 1),
        # The engine's own add path, without the fsync-bound flushes (noisy on a shared disk).
        "entries_per_s_without_flush": round(entries / max(elapsed - flush_time, 1e-9)),
        "flushes": flushes,
        "mean_flush_ms": round(flush_time / flushes * 1000, 2),
        "flush_share": round(flush_time / elapsed, 3),
        "bytes_on_disk": stats.bytes_on_disk,
    }


def _add_batches(
    pool: list[bytes], entries: int, ledgers: int, batch: int
) -> list[tuple[int, list[tuple[int, bytes]]]]:
    """``(ledger, [(entry id, payload), ...])`` calls covering ``entries`` adds, built before the
    clock starts so the timing covers the engine only."""
    npool = len(pool)
    next_id = [0] * ledgers
    out: list[tuple[int, list[tuple[int, bytes]]]] = []
    i = 0
    while i < entries:
        lid = len(out) % ledgers
        n = min(batch, entries - i)
        first = next_id[lid]
        out.append((lid, [(first + k, pool[(i + k) % npool]) for k in range(n)]))
        next_id[lid] = first + n
        i += n
    return out


def bench_get(
    factory: Callable[[Path], Any],
    root: Path,
    size: int,
    entries: int,
    ledgers: int,
    lookups: int,
    flush_every: int,
    batch: int = 1,
    sequential: bool = False,
    stride: int = 1,
    load_batch: int = 1,
) -> dict[str, Any]:
    """Store ``entries`` entries, reopen the engine (cold engine caches, warm OS page cache) and
    time ``lookups`` get_entry calls on uniformly random stored entries; with ``batch`` > 1,
    get_entries calls of ``batch`` random entries of one random ledger each. With ``sequential``,
    the ids of each call continue where the ledger's previous call stopped, ``stride`` apart."""
    engine = factory(root)
    engine.open()
    pool = _payloads(size)
    try:
        for lid in range(ledgers):
            engine.set_master_key(lid, b"bench-master-key")
        t0 = time.perf_counter()
        if load_batch > 1:
            done = 0
            for lid, items in _add_batches(pool, entries, ledgers, load_batch):
                engine.add_entries(lid, items)
                before, done = done, done + len(items)
                if done // flush_every != before // flush_every:
                    engine.flush()
        else:
            for i in range(entries):
                engine.add_entry(i % ledgers, i // ledgers, pool[i % len(pool)])
                if (i + 1) % flush_every == 0:
                    engine.flush()
        engine.flush()
        load_seconds = time.perf_counter() - t0
    finally:
        engine.close()
    engine = factory(root)
    engine.open()
    try:
        rnd = random.Random(42)
        stored_ids = _stored_ids(entries, ledgers, load_batch)
        calls: list[tuple[int, list[int]]] = []
        if sequential:
            calls = _sequential_calls(entries, ledgers, lookups, batch, stride, load_batch)
        elif batch > 1:
            for start_at in range(0, lookups, batch):
                lid = rnd.randrange(min(ledgers, entries))
                stored = stored_ids[lid]
                calls.append((lid, [rnd.randrange(stored) for _ in range(min(batch, lookups - start_at))]))
        if sequential or batch > 1:
            get_many = engine.get_entries
            start = time.perf_counter()
            for lid, eids in calls:
                results = get_many(lid, eids)
            elapsed = time.perf_counter() - start
            lid, eids = calls[-1]
            for eid, got in zip(eids, results, strict=True):
                if got != pool[_pool_index(lid, eid, entries, ledgers, load_batch) % len(pool)]:
                    raise SystemExit(f"get_entries returned {got!r:.80} for ledger {lid} entry {eid}")
        else:
            if load_batch > 1:
                keys = []
                for _ in range(lookups):
                    lid = rnd.randrange(min(ledgers, entries))
                    keys.append((lid, rnd.randrange(stored_ids[lid])))
            else:
                keys = [divmod(rnd.randrange(entries), ledgers)[::-1] for _ in range(lookups)]
            get = engine.get_entry
            start = time.perf_counter()
            for lid, eid in keys:
                data = get(lid, eid)
            elapsed = time.perf_counter() - start
            i = _pool_index(keys[-1][0], keys[-1][1], entries, ledgers, load_batch)
            if data != pool[i % len(pool)]:
                raise SystemExit(
                    f"get_entry returned wrong bytes for ledger {keys[-1][0]} entry {keys[-1][1]}"
                )
        stats = engine.stats()
    finally:
        engine.close()
    return {
        "phase": (f"sequential (stride {stride}) " if sequential else "random ")
        + f"get {size} B"
        + (f" in batches of {batch}" if batch > 1 else "")
        + (f", stored in batches of {load_batch}" if load_batch > 1 else ""),
        "entries": entries,
        "lookups": lookups,
        "load_seconds": round(load_seconds, 1),
        "seconds": round(elapsed, 3),
        "entries_per_s": round(lookups / elapsed),
        "bytes_on_disk": stats.bytes_on_disk,
    }


def _stored_ids(entries: int, ledgers: int, load_batch: int) -> list[int]:
    """How many entries each ledger holds after the read phase's load."""
    if load_batch <= 1:
        return [(entries - 1 - lid) // ledgers + 1 if lid < entries else 0 for lid in range(ledgers)]
    counts = [0] * ledgers
    i = call = 0
    while i < entries:
        n = min(load_batch, entries - i)
        counts[call % ledgers] += n
        i += n
        call += 1
    return counts


def _pool_index(lid: int, eid: int, entries: int, ledgers: int, load_batch: int) -> int:
    """Which payload of the pool the load stored as entry ``eid`` of ledger ``lid``."""
    if load_batch <= 1:
        return eid * ledgers + lid
    # _add_batches: call c goes to ledger c % ledgers and starts at global position c * load_batch
    # (every call but the last is full).
    call = (eid // load_batch) * ledgers + lid
    return call * load_batch + eid % load_batch


def _sequential_calls(
    entries: int, ledgers: int, lookups: int, batch: int, stride: int, load_batch: int
) -> list[tuple[int, list[int]]]:
    """get_entries calls that read each ledger from entry 0 in steps of ``stride``, ``batch`` ids
    per call, ledgers taking turns; a ledger read to its end starts over."""
    stored = _stored_ids(entries, ledgers, load_batch)
    live = [lid for lid in range(ledgers) if stored[lid]]
    pos = dict.fromkeys(live, 0)
    calls: list[tuple[int, list[int]]] = []
    done = 0
    while done < lookups:
        lid = live[len(calls) % len(live)]
        want = min(batch, lookups - done)
        ids: list[int] = []
        p = pos[lid]
        while len(ids) < want:
            if p >= stored[lid]:
                p = 0
            ids.append(p)
            p += stride
        pos[lid] = p
        calls.append((lid, ids))
        done += want
    return calls


def _add_phase(
    factory: Callable[[Path], Any], args: argparse.Namespace, size: int, path: Path
) -> dict[str, Any]:
    return bench_add(factory, path, size, args.add_entries, args.ledgers, args.flush_every, args.batch)


def _get_phase(factory: Callable[[Path], Any], args: argparse.Namespace, path: Path) -> dict[str, Any]:
    return bench_get(
        factory,
        path,
        args.read_size,
        args.read_entries,
        args.ledgers,
        args.lookups,
        args.flush_every,
        args.batch,
        args.sequential_reads,
        args.read_stride,
        args.load_batch,
    )


def _option(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"engine option {text!r} must be NAME=VALUE (VALUE as JSON)")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="storage backend name, e.g. rocksdb or entrylog")
    parser.add_argument(
        "-o",
        "--option",
        type=_option,
        action="append",
        default=[],
        help="engine option NAME=VALUE (VALUE parsed as JSON when it can be)",
    )
    parser.add_argument("--dir", type=Path, help="where to put the data (default: a temp dir, removed)")
    parser.add_argument("--add-entries", type=int, default=500_000, help="adds per add phase")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="*",
        default=[100, 1024],
        help="entry sizes of add phases (none: no add phase)",
    )
    parser.add_argument("--flush-every", type=int, default=10_000)
    parser.add_argument("--ledgers", type=int, default=16)
    parser.add_argument(
        "--read-entries", type=int, default=1_000_000, help="entries stored for the read phase"
    )
    parser.add_argument("--read-size", type=int, default=100)
    parser.add_argument("--lookups", type=int, default=200_000, help="random get_entry calls timed")
    parser.add_argument("--skip-reads", action="store_true")
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="entries per add_entries / get_entries call (default 1: add_entry / get_entry)",
    )
    parser.add_argument(
        "--sequential-reads",
        action="store_true",
        help="read each ledger in order (--read-stride apart) instead of random entries",
    )
    parser.add_argument("--read-stride", type=int, default=1, help="id step of --sequential-reads")
    parser.add_argument(
        "--load-batch",
        type=int,
        default=1,
        help="store the read phase's entries with add_entries, this many per call (default 1: add_entry)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.read_stride < 1 or args.load_batch < 1:
        parser.error("--read-stride and --load-batch must be at least 1")

    cls = load_driver("storage", args.engine)
    options = dict(args.option)

    def factory(path: Path) -> Any:
        return cls([path], **options)

    base = args.dir or Path(tempfile.mkdtemp(prefix="ledgerstore-bench-"))
    results: list[dict[str, Any]] = []
    try:
        phases: list[tuple[str, Callable[[Path], dict[str, Any]]]] = []
        for size in args.sizes:
            phases.append((f"add-{size}", functools.partial(_add_phase, factory, args, size)))
        if not args.skip_reads:
            phases.append(("get", functools.partial(_get_phase, factory, args)))
        for name, run in phases:
            path = base / name
            shutil.rmtree(path, ignore_errors=True)
            if not args.json:
                print(f"{args.engine}: {name} ...", file=sys.stderr, flush=True)
            result = run(path)
            shutil.rmtree(path, ignore_errors=True)
            results.append(result)
            if not args.json:
                print("  " + ", ".join(f"{k}={v}" for k, v in result.items() if k != "phase"))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps({"engine": args.engine, "options": options, "results": results}))
    else:
        summary = "; ".join(f"{r['phase']}: {r['entries_per_s']:,}/s" for r in results)
        print(f"{args.engine}: {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
