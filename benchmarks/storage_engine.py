"""Throughput of a StorageEngine backend: add_entry with periodic flush(), and random get_entry.

Usage::

    python benchmarks/storage_engine.py --engine rocksdb
    python benchmarks/storage_engine.py --engine entrylog --add-entries 200000 --json
    python benchmarks/storage_engine.py --engine rocksdb -o wal=true -o compression='"none"'

The engine is loaded by name through the ``ledgerstore.storage`` entry points, exactly as a bookie
does, and runs on real files in a fresh directory per phase (``--dir``, default a temp dir).
Adds are spread round-robin over ``--ledgers`` ledgers, as a bookie interleaves them; payloads are
random bytes, so compression gains nothing. Every phase is bounded by its entry count.
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
    factory: Callable[[Path], Any], root: Path, size: int, entries: int, ledgers: int, flush_every: int
) -> dict[str, Any]:
    """Add ``entries`` entries of ``size`` bytes with a flush() every ``flush_every`` adds."""
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
        "phase": f"add {size} B",
        "entries": entries,
        "seconds": round(elapsed, 3),
        "entries_per_s": round(entries / elapsed),
        "mb_per_s": round(entries * size / elapsed / 1e6, 1),
        "flushes": flushes,
        "mean_flush_ms": round(flush_time / flushes * 1000, 2),
        "flush_share": round(flush_time / elapsed, 3),
        "bytes_on_disk": stats.bytes_on_disk,
    }


def bench_get(
    factory: Callable[[Path], Any],
    root: Path,
    size: int,
    entries: int,
    ledgers: int,
    lookups: int,
    flush_every: int,
) -> dict[str, Any]:
    """Store ``entries`` entries, reopen the engine (cold engine caches, warm OS page cache) and
    time ``lookups`` get_entry calls on uniformly random stored entries."""
    engine = factory(root)
    engine.open()
    pool = _payloads(size)
    try:
        for lid in range(ledgers):
            engine.set_master_key(lid, b"bench-master-key")
        t0 = time.perf_counter()
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
        keys = [divmod(rnd.randrange(entries), ledgers)[::-1] for _ in range(lookups)]
        get = engine.get_entry
        start = time.perf_counter()
        for lid, eid in keys:
            data = get(lid, eid)
        elapsed = time.perf_counter() - start
        i = keys[-1][1] * ledgers + keys[-1][0]
        if data != pool[i % len(pool)]:
            raise SystemExit(f"get_entry returned wrong bytes for ledger {keys[-1][0]} entry {keys[-1][1]}")
        stats = engine.stats()
    finally:
        engine.close()
    return {
        "phase": f"random get {size} B",
        "entries": entries,
        "lookups": lookups,
        "load_seconds": round(load_seconds, 1),
        "seconds": round(elapsed, 3),
        "entries_per_s": round(lookups / elapsed),
        "bytes_on_disk": stats.bytes_on_disk,
    }


def _add_phase(
    factory: Callable[[Path], Any], args: argparse.Namespace, size: int, path: Path
) -> dict[str, Any]:
    return bench_add(factory, path, size, args.add_entries, args.ledgers, args.flush_every)


def _get_phase(factory: Callable[[Path], Any], args: argparse.Namespace, path: Path) -> dict[str, Any]:
    return bench_get(
        factory, path, args.read_size, args.read_entries, args.ledgers, args.lookups, args.flush_every
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
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1024], help="entry sizes of add phases")
    parser.add_argument("--flush-every", type=int, default=10_000)
    parser.add_argument("--ledgers", type=int, default=16)
    parser.add_argument(
        "--read-entries", type=int, default=1_000_000, help="entries stored for the read phase"
    )
    parser.add_argument("--read-size", type=int, default=100)
    parser.add_argument("--lookups", type=int, default=200_000, help="random get_entry calls timed")
    parser.add_argument("--skip-reads", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)

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
