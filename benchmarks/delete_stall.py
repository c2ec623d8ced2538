"""What deleting a large file does to a prompt fsync beside it, on the disk of ``--dir``.

GC deletes entry logs of up to 1 GiB. On a file system that discards the blocks a deletion
frees (ext4 mounted with ``discard``), an unlink frees them all in one commit, and every fsync on
the file system waits for it. This writes a file of ``--mb`` MiB, then, while a probe appends
4 KiB and fdatasyncs every 10 ms, deletes it either at once (``unlink``) or as the ``entrylog``
engine does (truncated from its end in steps of ``--step-mb``, each made durable, at most
``--rate-mb`` MiB/s, then unlinked), and reports the probe's p99 and max:

    python benchmarks/delete_stall.py --dir /var/lib/ledgerstore --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ledgerstore.api import OS_STORAGE_FILES

_MiB = 1024 * 1024


def _write(path: Path, size: int) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        chunk = b"\1" * (8 * _MiB)
        for _ in range(size // len(chunk)):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def _probe(path: Path, stop: threading.Event, took: list[float]) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fdatasync(fd)
            took.append(time.perf_counter() - t0)
            time.sleep(0.01)
    finally:
        os.close(fd)


def _delete_in_steps(path: Path, step: int, rate: float) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        size = os.fstat(fd).st_size
        t0 = time.perf_counter()
        freed = 0
        while size > 0:
            size = max(0, size - step)
            os.ftruncate(fd, size)
            os.fdatasync(fd)
            freed += step
            ahead = freed / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
    finally:
        os.close(fd)
    os.unlink(path)


def trial(directory: Path, size: int, how: str, step: int, rate: float) -> dict[str, Any]:
    big = directory / "big"
    _write(big, size)
    time.sleep(3)  # what the write left for the disk to do is done
    stop = threading.Event()
    took: list[float] = []
    probe = threading.Thread(target=_probe, args=(directory / "probe", stop, took))
    probe.start()
    time.sleep(1)
    first = len(took)
    t0 = time.perf_counter()
    if how == "unlink":
        os.unlink(big)
    else:
        _delete_in_steps(big, step, rate)
    OS_STORAGE_FILES.sync_dir(directory)
    seconds = time.perf_counter() - t0
    time.sleep(2)
    stop.set()
    probe.join()
    beside = sorted(took[first:])
    return {"how": how, "delete_s": round(seconds, 2), "probes": len(beside),
            "probe_p99_ms": round(beside[int(len(beside) * 0.99)] * 1000, 1),
            "probe_max_ms": round(beside[-1] * 1000, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="a directory on the disk to measure (default: a temporary one)")
    ap.add_argument("--mb", type=int, default=1024, help="size of the deleted file in MiB")
    ap.add_argument("--step-mb", type=int, default=16, help="truncation step in MiB")
    ap.add_argument("--rate-mb", type=float, default=256.0, help="MiB freed per second at most")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (unlink, steps)")
    args = ap.parse_args(argv)
    if args.mb < 1 or args.step_mb < 1 or args.rate_mb <= 0 or args.rounds < 1:
        ap.error("--mb, --step-mb and --rounds must be at least 1, --rate-mb positive")
    with tempfile.TemporaryDirectory(prefix="ledgerstore-delete-", dir=args.dir) as tmp:
        out = [trial(Path(tmp), args.mb * _MiB, how, args.step_mb * _MiB, args.rate_mb * _MiB)
               for _ in range(args.rounds) for how in ("unlink", "steps")]
    print(json.dumps({"mb": args.mb, "step_mb": args.step_mb, "rate_mb": args.rate_mb, "trials": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
