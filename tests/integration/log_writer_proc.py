"""A log writer process for takeover and crash tests.

Usage: ``log_writer_proc.py METADATA LOG ROLL_SIZE_BYTES TAG``. Opens the log as its leader, prints
``open <ledger id>``, then appends ``<TAG>-<seq>`` payloads forever in pipelined batches and prints,
in the order the futures resolve, ``ack <position> <seq>`` or ``fail <error class> <seq>`` (flushed
after every batch). After the first failure it tries one more append, prints ``next <error class>``
or ``next ok <position>``, and exits.
"""

from __future__ import annotations

import asyncio
import sys

from ledgerstore.aio import Client, Position


async def main(metadata: str, name: str, roll_size: int, tag: str) -> None:
    async with Client(metadata=metadata) as client:
        writer = await client.open_log(name, ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw",
                                       roll_size_bytes=roll_size)
        print(f"open {writer.ledger_id}", flush=True)
        seq = 0
        order: list[str] = []

        def record(s: int, f: asyncio.Future[Position]) -> None:
            exc = f.exception()
            order.append(f"ack {f.result()} {s}" if exc is None else f"fail {type(exc).__name__} {s}")

        while True:
            futs = []
            for _ in range(50):
                fut = writer.append_async(f"{tag}-{seq:08d}".encode())
                fut.add_done_callback(lambda f, s=seq: record(s, f))
                futs.append(fut)
                seq += 1
            await asyncio.gather(*futs, return_exceptions=True)
            await asyncio.sleep(0)  # let the done callbacks of the last futures run
            sys.stdout.write("".join(line + "\n" for line in order))
            sys.stdout.flush()
            failed = any(line.startswith("fail ") for line in order)
            order.clear()
            if failed:
                try:
                    pos = await writer.append(b"after the failure")
                    print(f"next ok {pos}", flush=True)
                except Exception as exc:  # the test reads the class name; any error class is reported
                    print(f"next {type(exc).__name__}", flush=True)
                return


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
