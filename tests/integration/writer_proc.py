"""A writer process for crash tests: creates (or is given) a ledger, writes forever, and prints
``ack <entry id>`` for every acknowledged entry (flushed at once) until it is killed."""

from __future__ import annotations

import asyncio
import sys

from ledgerstore.aio import Client


async def main(metadata: str, ensemble: int, wq: int, aq: int, password: bytes) -> None:
    async with Client(metadata=metadata) as client:
        lh = await client.create_ledger(ensemble, wq, aq, password=password)
        print(f"ledger {lh.ledger_id}", flush=True)
        i = 0
        while True:
            futs = [lh.append_async(b"entry-%08d" % (i + k)) for k in range(50)]
            i += 50
            for f in futs:
                eid = await f
                sys.stdout.write(f"ack {eid}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].encode()))


def run_and_kill(metadata: str, until_ack: int, quorum: tuple[int, int, int] = (3, 2, 2), password: str = "pw") -> tuple[int, int]:
    """Start this script as a writer process, SIGKILL it once it has seen ``until_ack``
    acknowledged; returns (ledger id, last entry id it saw acknowledged)."""
    import os
    import signal
    import subprocess

    e, wq, aq = quorum
    proc = subprocess.Popen([sys.executable, __file__, metadata, str(e), str(wq), str(aq), password],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    last_ack = -1
    try:
        first = proc.stdout.readline()
        assert first.startswith("ledger "), first
        ledger_id = int(first.split()[1])
        while last_ack < until_ack:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"the writer process exited early with code {proc.poll()}")
            if line.startswith("ack "):
                last_ack = int(line.split()[1])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    for line in proc.stdout:  # acks printed before the kill landed
        if line.startswith("ack "):
            last_ack = max(last_ack, int(line.split()[1]))
    return ledger_id, last_ack
