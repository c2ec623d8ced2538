"""Python function calls per added entry, in the client and in the bookies: a deterministic
measure of the add path's work, unlike a throughput figure on a shared machine.

Three bookies (entrylog storage, a journal each, sqlite metadata opened directly) run in one
child process, one event loop; the client runs in this process. Both sides run
:mod:`cProfile` on their event-loop thread over the same ``--entries`` adds to one ledger
(E=3 Qw=3 Qa=2, ``--size`` bytes each), issued ``--turn`` at a time as
:func:`ledgerstore.bench.workload.run_writes` does, after ``--warmup`` adds that are not counted.
The figure is the profiler's call count (Python functions and the C functions they call)
divided by the entries: every entry reaches all three bookies, so the bookie figure is the work of
three stores; ``per bookie`` divides it by three. The bookies' other threads (the journal's
writer, the entry logs' write-back) are counted apart, over the same span; the compiled hot loops
(``ledgerstore.proto._speedups``) count as one call each: compare runs in the same mode
(``LEDGERSTORE_PURE_PYTHON`` set or not in both).

With ``--log``, the same adds go through a log writer instead of a bare ledger: ``plain``
(no sequence), ``sequenced`` (each with its producer's next sequence) or ``both`` (plain, then
sequenced, on the same bookies, each with its own warm-up), one ``append_async`` per entry or,
with ``--batch N``, one ``append_many`` of ``N`` entries per call. ``both`` also reports the
difference per entry: the work exactly-once appends add (``docs/logs.md``).

Usage::

    python benchmarks/callcount.py --entries 20000 --size 1024
    python benchmarks/callcount.py --top 25 --json            # the functions called most, per entry
    python benchmarks/callcount.py --log both --size 100      # a log writer, plain against sequenced
    python benchmarks/callcount.py --log both --size 100 --batch 100

To measure an older checkout, run this file with that checkout's interpreter (its editable
install puts its own ``ledgerstore`` on the path)::

    OLD/.venv/bin/python benchmarks/callcount.py --entries 20000 --size 1024
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import json
import os
import pstats
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

BOOKIES = 3
ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2


def _metadata(workdir: Path) -> tuple[str, dict[str, Any]]:
    """The sqlite store both processes open directly (no metadata server process to count)."""
    return f"sqlite:///{workdir / 'metadata.db'}", {"server": "never"}


def _summary(profile: cProfile.Profile, entries: int, top: int) -> dict[str, Any]:
    """Total calls per entry, and the ``top`` functions by calls per entry."""
    stats = pstats.Stats(profile)
    rows: list[tuple[float, str]] = []
    for (filename, line, name), (_cc, ncalls, _tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = name if filename == "~" else f"{_short(filename)}:{line}({name})"
        rows.append((ncalls / entries, where))
    rows.sort(reverse=True)
    return {
        "calls": stats.total_calls,  # type: ignore[attr-defined]
        "calls_per_entry": round(stats.total_calls / entries, 2),  # type: ignore[attr-defined]
        "top": [{"calls_per_entry": round(n, 3), "function": where} for n, where in rows[:top]],
    }


def _short(filename: str) -> str:
    """A source path from its package down (``ledgerstore/bookie/journal.py``)."""
    parts = Path(filename).parts
    for anchor in ("site-packages", "core", "plugins", "lib"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor):])
    return filename


# --- the bookies' process ---------------------------------------------------------------------------


class ThreadProfiles:
    """A profiler in every thread started after :meth:`install` (the journal's writer, the entry
    logs' write-back): each thread's first profiling event starts its own ``cProfile.Profile``,
    and :meth:`calls` reads their call counts without stopping them."""

    def __init__(self) -> None:
        self._profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def install(self) -> None:
        threading.setprofile(self._first_event)

    def _first_event(self, frame: Any, event: str, arg: Any) -> None:
        profile = cProfile.Profile()
        with self._lock:
            self._profiles.append(profile)
        sys.setprofile(None)
        profile.enable()

    def calls(self) -> int:
        """Calls counted so far, in every profiled thread."""
        with self._lock:
            profiles = list(self._profiles)
        return sum(entry.callcount for profile in profiles for entry in profile.getstats())  # type: ignore[attr-defined]


async def _serve_bookies(workdir: Path, entries: int, top: int) -> None:
    """Start the bookies, print their addresses, then profile between each ``start`` and
    ``stop`` line of the parent on stdin and print each span's summary as one JSON line, until
    stdin closes."""
    from ledgerstore.bookie.server import Bookie
    from ledgerstore.config import BookieConfig

    metadata, options = _metadata(workdir)
    threads = ThreadProfiles()
    threads.install()
    bookies = []
    for i in range(BOOKIES):
        cfg = BookieConfig(metadata=metadata, metadata_options=options, listen="tcp://127.0.0.1:0",
                           journal_dir=str(workdir / f"b{i}" / "journal"), ledger_dirs=[str(workdir / f"b{i}" / "ledgers")],
                           storage="entrylog", auto_init_cluster=True)
        bookie = Bookie(cfg)
        await bookie.start()
        bookies.append(bookie)
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": [b.bookie_id for b in bookies]}), flush=True)
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            if line.strip() != "start":
                raise SystemExit(f"callcount bookies: expected 'start' on stdin, got {line.strip()!r}")
            thread_calls = threads.calls()
            profile = cProfile.Profile()
            profile.enable()
            print(json.dumps({"started": True}), flush=True)
            line = await loop.run_in_executor(None, sys.stdin.readline)
            profile.disable()
            thread_calls = threads.calls() - thread_calls
            if line.strip() != "stop":
                raise SystemExit(f"callcount bookies: expected 'stop' on stdin, got {line.strip()!r}")
            summary = _summary(profile, entries, top)
            summary["other_threads_calls_per_entry"] = round(thread_calls / entries, 2)
            print(json.dumps(summary), flush=True)
    finally:
        for bookie in bookies:
            await bookie.stop()


# --- the client's process ------------------------------------------------------------------------


async def _adds(handle: Any, payload: bytes, count: int, turn: int) -> None:
    """``count`` pipelined adds, ``turn`` issued per event-loop turn; only each turn's last add is
    awaited (acknowledgements come in entry order), so the harness adds no call per entry."""
    done = 0
    while done < count:
        n = min(turn, count - done)
        append = handle.append_async
        for _ in range(n - 1):
            append(payload)
        await append(payload)
        done += n


class _LogAdds:
    """The adds of ``--log``: through a log writer, plain or sequenced, one per call or
    ``batch`` per ``append_many``; the sequence carries on from call to call."""

    def __init__(self, writer: Any, sequenced: bool, batch: int) -> None:
        self.writer = writer
        self.sequenced = sequenced
        self.batch = batch
        self.next_seq = 0

    async def __call__(self, payload: bytes, count: int, turn: int) -> None:
        """``count`` entries, as :func:`_adds` issues them (a batch counts as ``batch`` entries)."""
        w, seq, batch = self.writer, self.next_seq, self.batch
        done = 0
        while done < count:
            n = min(turn, count - done)
            last = None
            if batch == 1:
                append = w.append_async
                for i in range(seq, seq + n):
                    last = append(payload, seq=i) if self.sequenced else append(payload)
            else:
                many = w.append_many_async
                for first in range(seq, seq + n, batch):
                    payloads = [payload] * min(batch, seq + n - first)
                    last = many(payloads, first_seq=first) if self.sequenced else many(payloads)
            await last
            seq += n
            done += n
        self.next_seq = seq


async def _span(child: Any, run: Any) -> dict[str, Any]:
    """Profile ``await run()`` here and, over the same span, in the bookies' process; returns the
    bookies' summary and leaves this process's profile in ``run.profile``."""
    child.stdin.write(b"start\n")
    await child.stdin.drain()
    await asyncio.wait_for(child.stdout.readline(), 120)  # the bookies count from now on
    profile = cProfile.Profile()
    profile.enable()
    await run()
    profile.disable()
    run.profile = profile
    child.stdin.write(b"stop\n")
    await child.stdin.drain()
    return json.loads(await asyncio.wait_for(child.stdout.readline(), 120))  # type: ignore[no-any-return]


def _sides(client: cProfile.Profile, bookie: dict[str, Any], entries: int, top: int) -> dict[str, Any]:
    """The result's ``client`` and ``bookie`` parts."""
    return {
        "client": _summary(client, entries, top),
        "bookie": {**bookie, "calls_per_entry_per_bookie": round(bookie["calls_per_entry"] / BOOKIES, 2),
                   "other_threads_calls_per_entry_per_bookie": round(
                       bookie["other_threads_calls_per_entry"] / BOOKIES, 2)},
    }


async def _measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from ledgerstore.aio import Client
    from ledgerstore.config import ClientConfig
    from ledgerstore.proto import speedups

    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-bookies", str(workdir), "--entries", str(args.entries),
        "--top", str(args.top), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    result: dict[str, Any] = {"entries": args.entries, "size": args.size}
    try:
        ready = json.loads(await asyncio.wait_for(child.stdout.readline(), 120))
        result["bookies"] = ready["ready"]
        metadata, options = _metadata(workdir)
        client = Client(config=ClientConfig(metadata=metadata, metadata_options=options))
        await client.start()
        payload = os.urandom(args.size)
        try:
            if args.log is None:
                handle = await client.create_ledger(ENSEMBLE, WRITE_QUORUM, ACK_QUORUM, password=b"callcount")
                await _adds(handle, payload, args.warmup, args.turn)
                run: Any = functools.partial(_adds, handle, payload, args.entries, args.turn)
                bookie = await _span(child, run)
                await handle.close()
                result |= _sides(run.profile, bookie, args.entries, args.top)
            else:
                result |= {"log": args.log, "batch": args.batch}
                modes = ("plain", "sequenced") if args.log == "both" else (args.log,)
                for mode in modes:
                    writer = await client.open_log(f"callcount-{mode}", ensemble=ENSEMBLE, write_quorum=WRITE_QUORUM,
                                                   ack_quorum=ACK_QUORUM, password=b"callcount",
                                                   producer_id="callcount" if mode == "sequenced" else None)
                    adds = _LogAdds(writer, mode == "sequenced", args.batch)
                    await adds(payload, args.warmup, args.turn)
                    run = functools.partial(adds, payload, args.entries, args.turn)
                    bookie = await _span(child, run)
                    await writer.close()
                    result[mode] = _sides(run.profile, bookie, args.entries, args.top)
        finally:
            await client.close()
    finally:
        if child.returncode is None:
            child.stdin.close()
            await child.wait()
    # ``state`` names the mode and why; older checkouts only say whether the extension runs
    result["hot_path"] = str(getattr(speedups, "state", "compiled" if speedups.compiled is not None else "pure Python"))
    if args.log == "both":
        result["sequenced_minus_plain"] = {
            "client_calls_per_entry": round(result["sequenced"]["client"]["calls_per_entry"]
                                            - result["plain"]["client"]["calls_per_entry"], 2),
            "bookie_calls_per_entry_per_bookie": round(
                result["sequenced"]["bookie"]["calls_per_entry_per_bookie"]
                - result["plain"]["bookie"]["calls_per_entry_per_bookie"], 2)}
    return result


def _print(result: dict[str, Any]) -> None:
    how = ""
    if "log" in result:
        calls = "one append per call" if result["batch"] == 1 else f"append_many of {result['batch']}"
        how = f", through a log writer ({calls})"
    print(f"{result['entries']} entries of {result['size']} bytes, E={ENSEMBLE} Qw={WRITE_QUORUM} Qa={ACK_QUORUM}"
          f"{how}, hot path: {result['hot_path']}")
    modes = [m for m in ("plain", "sequenced") if m in result] or [None]
    for mode in modes:
        part = result if mode is None else result[mode]
        if mode is not None:
            print(f"\n{mode}:")
        c, b = part["client"], part["bookie"]
        print(f"client: {c['calls_per_entry']:.2f} calls/entry")
        print(f"bookie: {b['calls_per_entry_per_bookie']:.2f} calls/entry per bookie "
              f"({b['calls_per_entry']:.2f} for all {BOOKIES}) on the event loop, "
              f"{b['other_threads_calls_per_entry_per_bookie']:.2f} in its other threads (journal, write-back)")
        for side in ("client", "bookie"):
            if part[side]["top"]:
                print(f"\n{side}: functions called most (calls/entry)")
                for row in part[side]["top"]:
                    print(f"  {row['calls_per_entry']:9.3f}  {row['function']}")
    if "sequenced_minus_plain" in result:
        d = result["sequenced_minus_plain"]
        print(f"\nsequenced - plain: {d['client_calls_per_entry']:+.2f} calls/entry in the client, "
              f"{d['bookie_calls_per_entry_per_bookie']:+.2f} per bookie")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=20_000, help="adds counted (default 20000)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per entry (default 1024)")
    parser.add_argument("--warmup", type=int, default=2_000, help="adds before counting starts (default 2000)")
    parser.add_argument("--turn", type=int, default=1_000, help="adds issued per event-loop turn (default 1000)")
    parser.add_argument("--top", type=int, default=0, help="also list the N functions called most")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--log", choices=("plain", "sequenced", "both"),
                        help="add through a log writer: without sequences, with them, or both in turn")
    parser.add_argument("--batch", type=int, default=1,
                        help="with --log: entries per append_many call (default 1: one append_async per entry)")
    parser.add_argument("--serve-bookies", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("entries", "size", "turn", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0 or args.top < 0:
        parser.error("--warmup and --top must not be negative")
    if args.batch != 1 and args.log is None:
        parser.error("--batch needs --log")
    if args.serve_bookies is not None:
        asyncio.run(_serve_bookies(args.serve_bookies, args.entries, args.top))
        return 0
    with tempfile.TemporaryDirectory(prefix="callcount-") as tmp:
        result = asyncio.run(_measure(args, Path(tmp)))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
