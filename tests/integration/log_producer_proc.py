"""A producer process for the exactly-once crash test.

Usage: ``log_producer_proc.py METADATA LOG COUNT``. Opens the log as its leader with producer id
``producer-1``, prints ``open <ledger id> <last seq or -1>``, then appends ``entry-<seq>`` for
every sequence from 0 to COUNT-1 (so a restarted producer resends everything from 0), pipelined
in windows of 20, printing ``ack <seq>`` as each resolves, and ``done`` after closing the log.
"""

from __future__ import annotations

import asyncio
import sys

from ledgerstore.aio import Client


async def main(metadata: str, name: str, count: int) -> None:
    async with Client(metadata=metadata) as client:
        writer = await client.open_log(name, ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw",
                                       roll_size_bytes=2000, producer_id="producer-1")
        last = writer.last_seq
        print(f"open {writer.ledger_id} {-1 if last is None else last}", flush=True)
        for start in range(0, count, 20):
            seqs = range(start, min(start + 20, count))
            futs = [writer.append_async(b"entry-%d" % s, seq=s) for s in seqs]
            await asyncio.gather(*futs)
            print("".join(f"ack {s}\n" for s in seqs), end="", flush=True)
            await asyncio.sleep(0.002)  # a producer paced by its input, so a kill lands mid-stream
        await writer.close()
        print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
