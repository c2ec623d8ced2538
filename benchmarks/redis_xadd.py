"""Baseline for the write benchmark: Redis ``XADD`` with every write fsync'd before its reply.

Usage::

    python benchmarks/redis_xadd.py --entry-size 100 --duration 10
    python benchmarks/redis_xadd.py --entry-size 1024 --count 100000 --pipeline 1000 --json

Starts its own ``redis-server`` (Debian package ``redis-server``) on a free 127.0.0.1 port with a
temporary directory, ``appendonly yes``, ``appendfsync always`` and no RDB snapshots, so that an
``XADD`` is answered only after it is in the fsync'd append-only file, as a bookie answers an add
only after its journal is fsync'd. One Python client (``redis`` package) appends one random payload
of ``--entry-size`` bytes to one stream, ``--pipeline`` commands per round trip; Redis writes and
fsyncs the AOF once per event-loop iteration, so a pipeline is group-committed like a journal batch.
The server is stopped by its PID and the directory removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_STREAM = "ledgerstore-bench"


class RedisBenchError(RuntimeError):
    """The Redis baseline could not run (server or client missing, server did not start)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A ``redis-server`` process with an fsync-always AOF in a temporary directory."""

    def __init__(self, executable: str | None = None) -> None:
        exe = executable or shutil.which("redis-server")
        if exe is None:
            raise RedisBenchError("redis-server is not installed: `apt-get install -y redis-server` "
                                  "(scripts/setup.sh installs it)")
        self.executable = exe
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ledgerstore-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        import redis

        log = self.dir / "redis.log"
        self.proc = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
             "--logfile", str(log), "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RedisBenchError(f"redis-server exited with code {self.proc.returncode}:\n{tail}")
            try:
                if redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1).ping():
                    return self
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RedisBenchError(f"redis-server on port {self.port} did not answer PING within {timeout}s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server by its PID and remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_xadd(entry_size: int = 100, duration: float | None = 10.0, count: int | None = None,
             pipeline: int = 1000, warmup: float = 0.0) -> dict[str, Any]:
    """Start a server, append with pipelined ``XADD`` for ``duration`` seconds or ``count``
    entries (whichever ends first), stop it; return entries/s and the server's settings."""
    if duration is None and count is None:
        raise ValueError("give a duration (seconds) or a count (entries)")
    if entry_size < 1 or pipeline < 1:
        raise ValueError("entry_size and pipeline must be at least 1")
    try:
        import redis
    except ImportError as e:
        raise RedisBenchError("the redis client is missing: pip install redis") from e
    payload = os.urandom(entry_size)
    with RedisServer() as server:
        r = redis.Redis(host="127.0.0.1", port=server.port)
        settings = {k: v for k, v in (r.config_get("appendonly") | r.config_get("appendfsync")
                                      | r.config_get("save")).items()}
        version = r.info("server")["redis_version"]

        def batch(n: int) -> None:
            pipe = r.pipeline(transaction=False)
            for _ in range(n):
                pipe.xadd(_STREAM, {"d": payload})
            pipe.execute()

        warm_end = time.perf_counter() + warmup
        while time.perf_counter() < warm_end:
            batch(pipeline)
        base = r.xlen(_STREAM)
        entries = 0
        start = time.perf_counter()
        while True:
            n = pipeline if count is None else min(pipeline, count - entries)
            if n <= 0 or (duration is not None and time.perf_counter() - start >= duration):
                break
            batch(n)
            entries += n
        seconds = time.perf_counter() - start
        stored = r.xlen(_STREAM) - base
        r.close()
    if stored != entries:
        raise RedisBenchError(f"wrote {entries} entries but the stream grew by {stored}")
    return {
        "system": "redis", "redis_version": version, "settings": settings,
        "entry_size": entry_size, "pipeline": pipeline, "entries": entries, "bytes": entries * entry_size,
        "seconds": round(seconds, 3), "entries_per_s": round(entries / seconds, 1) if seconds else 0.0,
        "mb_per_s": round(entries * entry_size / 1e6 / seconds, 3) if seconds else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a summary line or, with ``--json``, the result."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entry-size", type=int, default=100, help="bytes per entry (default 100)")
    ap.add_argument("--duration", type=float, default=None, help="measured seconds (default 10 without --count)")
    ap.add_argument("--count", type=int, default=None, help="measured entries")
    ap.add_argument("--pipeline", type=int, default=1000, help="XADDs per round trip (default 1000)")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds of unmeasured XADDs first")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    duration = args.duration if args.duration is not None or args.count is not None else 10.0
    try:
        res = run_xadd(args.entry_size, duration, args.count, args.pipeline, args.warmup)
    except (RedisBenchError, ValueError) as e:
        print(f"redis_xadd: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"redis {res['redis_version']} XADD (appendfsync always, pipeline {res['pipeline']}): "
              f"{res['entries']:,} entries of {res['entry_size']} B in {res['seconds']:.2f} s: "
              f"{res['entries_per_s']:,.0f} entries/s, {res['mb_per_s']:.2f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
