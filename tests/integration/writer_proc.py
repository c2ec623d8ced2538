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
