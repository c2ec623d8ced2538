"""Bytes the bookies write per log entry: the ``wchar`` of the 3 bookie processes of a fresh
``LocalCluster`` (journal, entry logs and index) over ``--entries`` 100 B entries of
``append_many`` (100 per call), divided by entries and bookies. Modes: ``plain`` (no sequence),
``varint`` (sequenced: the current entry format) and ``fixed`` (sequenced with the 8-byte sequence
of releases before the varint, written by a stand-in encoder of those bytes).

Usage::

    python benchmarks/log_bytes.py                       # plain, varint, fixed
    python benchmarks/log_bytes.py --entries 500000 varint
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

import ledgerstore.client.log.writer as writer_mod
from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster

MODES = ("plain", "varint", "fixed")


def wchar(pid: int) -> int:
    """Bytes process ``pid`` has passed to write calls (``/proc/PID/io``)."""
    with open(f"/proc/{pid}/io") as fh:
        for line in fh:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError(f"no wchar for process {pid}")


def fixed_many(header: bytes, first: int, payloads: list[bytes]) -> list[bytes]:
    """Sequenced entries as releases before the varint wrote them: flags 0x01, 8 sequence bytes."""
    return [b"\x01" + header[1:] + s.to_bytes(8, "big") + p for s, p in enumerate(payloads, first)]


async def bytes_per_entry(cluster: LocalCluster, mode: str, entries: int) -> float:
    pids = [p.pid for p in cluster.procs.values()]
    seq = mode != "plain"
    async with Client(metadata=cluster.metadata) as client:
        w = await client.open_log(f"bytes-{mode}", ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw",
                                  producer_id="bench" if seq else None)
        payloads = [b"x" * 100] * 100
        await w.append_many(payloads, **({"first_seq": 0} if seq else {}))  # the ledger's first add: not counted
        await asyncio.sleep(1)
        before = sum(wchar(p) for p in pids)
        futs = []
        for first in range(100, entries + 100, 100):
            futs.append(w.append_many_async(payloads, **({"first_seq": first} if seq else {})))
            if len(futs) >= 50:
                await asyncio.gather(*futs)
                futs.clear()
        await asyncio.gather(*futs)
        await w.close()
        await asyncio.sleep(3)  # the entry logs' buffers written out
        return (sum(wchar(p) for p in pids) - before) / entries / len(pids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modes", nargs="*", choices=MODES, default=list(MODES))
    ap.add_argument("--entries", type=int, default=200_000)
    args = ap.parse_args()
    encode_many = writer_mod.encode_many
    for mode in args.modes:
        writer_mod.encode_many = fixed_many if mode == "fixed" else encode_many  # type: ignore[assignment]
        tmp = Path(tempfile.mkdtemp(prefix="log-bytes-"))
        cluster = LocalCluster(tmp / "c", bookies=3, port_base=None, storage="entrylog")
        try:
            cluster.start()
            print(f"{mode}: {asyncio.run(bytes_per_entry(cluster, mode, args.entries)):.1f} bytes written per "
                  "entry per bookie", flush=True)
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    writer_mod.encode_many = encode_many


if __name__ == "__main__":
    main()
