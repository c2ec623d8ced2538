"""Bad input cannot hurt a bookie: 100,000 random and mutated frames at a live bookie process,
then a well-behaved client is still served and the bookie's memory stayed bounded."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.proto import codec
from ledgerstore.proto.digest import DigestManager, master_key

FRAMES = 100_000
#: growth of the bookie's resident memory allowed across the fuzz run
RSS_BOUND = 64 * 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def valid_frames(rnd: random.Random) -> list[bytes]:
    dm = DigestManager(999_999, "crc32c")
    key = master_key(b"fuzz")
    return [
        codec.encode_add(1, 999_999, 0, key, dm.sign(0, -1, b"x")),
        codec.encode_read(2, 999_999, 0),
        codec.encode_read_lac(3, 999_999),
        codec.encode_long_poll_lac(4, 999_999, 10, 0),
        codec.encode_bookie_info(5),
        codec.encode_read(6, 123, 5, b"k" * 32, codec.FLAG_FENCE),
    ]


def mutate(frame: bytes, rnd: random.Random) -> bytes:
    b = bytearray(frame)
    kind = rnd.randrange(6)
    if kind == 0 and b:  # flip bytes
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(len(b))] ^= rnd.randint(1, 255)
    elif kind == 1:  # truncate
        b = b[: rnd.randrange(len(b) + 1)]
    elif kind == 2:  # garbage tail
        b += os.urandom(rnd.randint(1, 64))
    elif kind == 3:  # random opcode / version
        if len(b) >= 2:
            b[rnd.randrange(2)] = rnd.randrange(256)
    elif kind == 4:  # lie about the key length
        if len(b) >= codec.HEADER_SIZE + 18:
            struct.pack_into(">H", b, codec.HEADER_SIZE + 16, rnd.randrange(65536))
    else:  # pure noise
        b = bytearray(os.urandom(rnd.randint(0, 200)))
    return bytes(b)


def fuzz_frames(n: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    base = valid_frames(rnd)
    return [mutate(rnd.choice(base), rnd) for _ in range(n)]


def send_tcp(port: int, frames: list[bytes]) -> int:
    """Send length-prefixed frames in batches over fresh connections (the bookie may close a
    connection whose stream it cannot trust); drain answers. Returns connections used."""
    conns = 0
    i = 0
    while i < len(frames):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        conns += 1
        try:
            batch = frames[i : i + 2000]
            s.sendall(b"".join(struct.pack(">I", len(f)) + f for f in batch))
            s.settimeout(0.2)
            try:
                while s.recv(1 << 20):
                    pass
            except (TimeoutError, OSError):
                pass
        except OSError:
            pass
        finally:
            s.close()
        i += 2000
    # and the abusive cases: an oversized length prefix, a connection cut mid-frame
    for raw in (struct.pack(">I", 2**31) + b"x" * 100, struct.pack(">I", 1000) + b"half"):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(raw)
        finally:
            s.close()
    return conns


def send_zmq(port: int, frames: list[bytes]) -> None:
    import zmq

    ctx = zmq.Context()
    try:
        for i in range(0, len(frames), 5000):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            for f in frames[i : i + 5000]:
                sock.send(f, copy=False)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            while poller.poll(300):
                sock.recv()
            sock.close()
    finally:
        ctx.term()


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_fuzzed_frames_do_not_hurt_the_bookie(cluster_factory, transport: str) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3, transport=transport)
    cluster.start()
    victim = cluster.procs[0].pid
    port = cluster.ports[0]

    async def healthy_round(tag: bytes) -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"pw")
            await asyncio.gather(*(lh.append_async(tag + b"%d" % i) for i in range(500)))
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 499)] == [tag + b"%d" % i for i in range(500)]

    asyncio.run(healthy_round(b"before"))
    before = rss(victim)
    frames = fuzz_frames(FRAMES, seed=int(os.environ.get("LEDGERSTORE_FUZZ_SEED", "1234")))
    if transport == "tcp":
        send_tcp(port, frames)
    else:
        send_zmq(port, frames)
    assert cluster.procs[0].poll() is None, "the bookie died under fuzzing"
    asyncio.run(healthy_round(b"after"))
    grown = rss(victim) - before
    assert grown < RSS_BOUND, f"bookie RSS grew by {grown / 2**20:.1f} MiB during the fuzz run"
