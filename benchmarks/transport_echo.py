"""Echo throughput of a transport: pipelined 100-byte frames, client and bookie-side server in
separate processes on 127.0.0.1.

    .venv/bin/python benchmarks/transport_echo.py                 # tcp and zmq, 200,000 frames each
    .venv/bin/python benchmarks/transport_echo.py --schemes zmq --frames 500000 --window 20000

The server is a child process running an echo handler; the client keeps up to ``--window`` frames
in flight and reports echoed frames per second (best of ``--runs``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from ledgerstore.api import Transport
from ledgerstore.testing.transport import EchoHandler
from ledgerstore_tcp import TcpTransport
from ledgerstore_zmq import ZmqTransport

TRANSPORTS: dict[str, type[Transport]] = {"tcp": TcpTransport, "zmq": ZmqTransport}


async def serve(scheme: str) -> None:
    """Child process: serve echo until stdin closes."""
    server = await TRANSPORTS[scheme]().serve(f"{scheme}://127.0.0.1:0", EchoHandler())
    print(server.address, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.close()


async def measure(scheme: str, address: str, frames: int, size: int, window: int) -> float:
    """Frames echoed per second over one connection."""
    received = 0
    room = asyncio.Event()
    done = asyncio.Event()

    def on_frames(batch: Sequence[bytes]) -> None:
        nonlocal received
        received += len(batch)
        room.set()
        if received >= frames:
            done.set()

    conn = await TRANSPORTS[scheme]().connect(address, on_frames, lambda exc: done.set())
    payload = os.urandom(size)
    start = time.perf_counter()
    sent = 0
    while sent < frames:
        while sent - received >= window:
            room.clear()
            await room.wait()
        burst = min(frames - sent, window - (sent - received), 1000)
        for _ in range(burst):
            conn.send(payload)
        sent += burst
        await conn.drain()
    await done.wait()
    elapsed = time.perf_counter() - start
    await conn.close()
    if received < frames:
        raise RuntimeError(f"{scheme}: connection closed after {received} of {frames} echoes")
    return frames / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", default=["tcp", "zmq"], choices=sorted(TRANSPORTS))
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=10_000, help="frames in flight at most")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serve", choices=sorted(TRANSPORTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    for scheme in args.schemes:
        child = subprocess.Popen([sys.executable, __file__, "--serve", scheme],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            address = child.stdout.readline().strip()
            rates = [asyncio.run(measure(scheme, address, args.frames, args.size, args.window))
                     for _ in range(args.runs)]
        finally:
            assert child.stdin is not None
            child.stdin.close()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        print(f"{scheme:4} {args.size}-byte frames, window {args.window}: "
              f"best {max(rates):,.0f} echoes/s (runs: {', '.join(f'{r:,.0f}' for r in rates)})")


if __name__ == "__main__":
    main()
