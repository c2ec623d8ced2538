"""A bookie stays whole against bad and hostile peers: a request out of range is answered alone,
no peer can make it buffer without bound, and no peer can claim a ledger that is not its own.
Each test talks raw frames to a real bookie process while a well-behaved client keeps working."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster, free_ports
from ledgerstore.config import load_bookie_config
from ledgerstore.errors import ConfigError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager, master_key
from tests.integration.test_bookie_fuzz import rss

_LEN = struct.Struct(">I")


async def exchange(port: int, frames: list[bytes]) -> list[codec.Response]:
    """Send ``frames`` on one connection and read one answer per frame, in order of arrival."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(_LEN.pack(len(f)) + f for f in frames))
        await writer.drain()
        out = []
        for _ in frames:
            (size,) = _LEN.unpack(await asyncio.wait_for(reader.readexactly(4), 20))
            out.append(codec.decode_response(await reader.readexactly(size)))
        return out
    finally:
        writer.close()


def metrics(http: int) -> dict[str, float]:
    """Every sample of the bookie's ``/metrics``, keyed by name (and ``name`` label if any)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name + (f"[{s.labels['name']}]" if "name" in s.labels else "")] = s.value
    return out


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


async def write_and_read_back(cluster: LocalCluster, n: int, tag: bytes) -> int:
    """A well-behaved writer: ``n`` pipelined adds, every one acknowledged, then read back."""
    async with Client(metadata=cluster.metadata) as client:
        lh = await client.create_ledger(1, 1, 1, password=b"good")
        ids = await asyncio.gather(*(lh.append_async(tag + b"%d" % i) for i in range(n)))
        assert ids == list(range(n))
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id, password=b"good")
        assert [e.payload for e in await rh.read(0, n - 1)] == [tag + b"%d" % i for i in range(n)]
        return lh.ledger_id


# --- 7. one peer's bad request never hurts anyone else ---------------------------------------------


@pytest.mark.parametrize("storage", ["entrylog", "rocksdb"])
def test_a_request_out_of_range_is_refused_alone_while_another_writer_is_served(cluster_factory, storage: str) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(1, storage=storage)
    cluster.start()
    port = cluster.ports[0]
    top = 2**63

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            other = await client.create_ledger(1, 1, 1, password=b"other")
            await other.append(b"stored")
            key = master_key(b"other")
            lid = other.ledger_id
            hostile = [
                codec.encode_read(1, lid, 0),  # a good request before the bad ones
                codec.encode_read(2, lid, -1, key, codec.FLAG_FENCE),  # fencing read of entry -1
                codec.encode_read(3, lid, -1),  # plain read of entry -1
                codec.encode_add(4, top, 0, key, DigestManager(0, "crc32c").sign(0, -1, b"x")),  # ledger id >= 2**63
                codec.encode_read_lac(5, top, key, codec.FLAG_FENCE),  # fencing read-LAC of ledger id >= 2**63
                codec.encode_read(6, 2**64 - 1, 0),
                codec.encode_bookie_info(7),  # and a good one after them
            ]

            async def attack() -> None:
                for _ in range(40):
                    answers = await exchange(port, hostile)
                    by_id = {r.request_id: r for r in answers}
                    assert sorted(by_id) == [1, 2, 3, 4, 5, 6, 7], "a request went unanswered"
                    assert by_id[1].status == Status.OK and by_id[1].entry
                    assert [by_id[i].status for i in (2, 3, 4, 5, 6)] == [Status.BAD_REQUEST] * 5
                    assert by_id[7].status == Status.OK

            good = asyncio.create_task(write_and_read_back(cluster, 3000, b"good"))
            await attack()
            await good
            # the ledger the bad requests named was neither fenced nor changed
            assert await other.append(b"still open") == 1

    asyncio.run(asyncio.wait_for(main(), 120))
    assert cluster.procs[0].poll() is None
    assert "Traceback" not in cluster.log_path(0).read_text()


def test_a_max_frame_size_out_of_range_is_refused_at_start() -> None:
    for bad in (-1, 0, 100, 2**31):
        with pytest.raises(ConfigError, match="max_frame_size"):
            load_bookie_config(metadata="sqlite:///x.db", max_frame_size=bad)
    with pytest.raises(ConfigError, match="max_unfinished_frame_bytes"):
        load_bookie_config(metadata="sqlite:///x.db", max_frame_size=2**20, max_unfinished_frame_bytes=2**19)
    assert load_bookie_config(metadata="sqlite:///x.db").max_frame_size == 5 * 1024 * 1024


# --- 8. no peer can exhaust a bookie ------------------------------------------------------------------


def test_half_frames_are_bounded_across_connections_and_time_out(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    (http,) = free_ports(1)
    frame = 1024 * 1024
    cluster: LocalCluster = cluster_factory(1, extra_bookie_config=(
        f"http_port = {http}\nmax_frame_size = {frame}\nmax_unfinished_frame_bytes = {8 * frame}\n"
        "unfinished_frame_timeout_s = 2.0\n"))
    cluster.start()
    port = cluster.ports[0]
    asyncio.run(write_and_read_back(cluster, 200, b"warm"))
    before = rss(cluster.procs[0].pid)
    socks = []
    half = _LEN.pack(frame) + b"h" * (frame - 1)  # announces a full frame, holds back its last byte
    try:
        for _ in range(200):  # 200 MiB of unfinished frames if nothing bounded them
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks.append(s)
            try:
                s.sendall(half)
            except OSError:  # shed already
                pass
        wait_until(lambda: metrics(http)["ledgerstore_transport_stat[unfinished_frame_bytes]"] <= 8 * frame,
                   "the bookie holds no more than the bound")
        grown = rss(cluster.procs[0].pid) - before
        assert grown < 64 * 1024 * 1024, f"bookie RSS grew by {grown / 2**20:.0f} MiB holding half frames"

        def closed() -> float:
            m = metrics(http)
            return (m["ledgerstore_transport_stat[shed_unfinished_frames]"]
                    + m["ledgerstore_transport_stat[unfinished_frame_timeouts]"])

        # Connections still in the listen backlog are read later, so count over time, not at one
        # instant; on a slow machine some half frames reach the timeout before the bound sheds them.
        # Either way the bookie closes them, and the bound did shed some.
        wait_until(lambda: closed() >= 150, "the bookie closed the connections holding half frames", timeout=30)
        assert metrics(http)["ledgerstore_transport_stat[shed_unfinished_frames]"] >= 1
        assert metrics(http)["ledgerstore_transport_stat[unfinished_frame_bytes]"] <= 8 * frame
        # a well-behaved writer is served meanwhile
        asyncio.run(write_and_read_back(cluster, 2000, b"during"))
        # the connections still holding half a frame are closed once it is older than the timeout
        wait_until(lambda: metrics(http)["ledgerstore_transport_stat[unfinished_frames]"] == 0,
                   "every half frame timed out", timeout=10)
        m = metrics(http)
        assert m["ledgerstore_transport_stat[unfinished_frame_timeouts]"] >= 1
        assert m["ledgerstore_transport_stat[unfinished_frame_bytes]"] == 0
    finally:
        for s in socks:
            s.close()
    text = cluster.log_path(0).read_text()
    assert "max_unfinished_frame_bytes" in text and "unfinished_frame_timeout_s" in text


def test_long_poll_waiters_are_capped_and_freed_with_their_connection(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    (http,) = free_ports(1)
    cluster: LocalCluster = cluster_factory(1, extra_bookie_config=(
        f"http_port = {http}\nmax_long_poll_waiters = 5000\nmax_long_poll_waiters_per_connection = 1000\n"))
    cluster.start()
    lid = asyncio.run(write_and_read_back(cluster, 10, b"tail"))
    before = rss(cluster.procs[0].pid)
    conns, per_conn = 20, 5000  # 100,000 waiters asked for
    socks = []
    try:
        for c in range(conns):
            s = socket.create_connection(("127.0.0.1", cluster.ports[0]), timeout=10)
            socks.append(s)
            polls = (codec.encode_long_poll_lac(c * per_conn + i, lid, 1000, 60_000) for i in range(per_conn))
            s.sendall(b"".join(_LEN.pack(len(f)) + f for f in polls))
        wait_until(lambda: (lambda m: m["ledgerstore_bookie_long_poll_waiters"]
                            + m["ledgerstore_bookie_refused_long_polls_total"] == conns * per_conn)(metrics(http)),
                   "every long poll was either held or refused")
        m = metrics(http)
        assert m["ledgerstore_bookie_long_poll_waiters"] == 5000
        grown = rss(cluster.procs[0].pid) - before
        assert grown < 32 * 1024 * 1024, f"bookie RSS grew by {grown / 2**20:.0f} MiB for long-poll waiters"
        asyncio.run(write_and_read_back(cluster, 2000, b"during"))
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: metrics(http)["ledgerstore_bookie_long_poll_waiters"] == 0,
               "closed connections freed their waiters")

    # long polls are served again: this one waits its 200 ms out and is answered OK
    (answer,) = asyncio.run(exchange(cluster.ports[0], [codec.encode_long_poll_lac(1, lid, 1000, 200)]))
    assert answer.status == Status.OK


# --- 8. no peer can claim a ledger that is not its own ------------------------------------------------


def test_an_add_for_a_ledger_not_in_metadata_claims_nothing(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    (http,) = free_ports(1)
    cluster: LocalCluster = cluster_factory(1, extra_bookie_config=f"http_port = {http}\n")
    cluster.start()
    port = cluster.ports[0]

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            first = await client.create_ledger(1, 1, 1, password=b"good")
            await first.append(b"x")
            # the ids the next ledgers will get: claim them with a key of the intruder's choosing
            claimed = list(range(first.ledger_id + 1, first.ledger_id + 6))
            evil = master_key(b"intruder")
            answers = await exchange(port, [
                *(codec.encode_add(i, lid, 0, evil, DigestManager(lid, "crc32c").sign(0, -1, b"mine"))
                  for i, lid in enumerate(claimed)),
                codec.encode_read_lac(99, claimed[0], evil, codec.FLAG_FENCE),
            ])
            assert [r.status for r in answers] == [Status.NO_SUCH_LEDGER] * 6
            lookups = metrics(http)["ledgerstore_bookie_ledger_lookups_total"]
            # the real ledger takes one of those ids, and its writer is not refused
            real = await client.create_ledger(1, 1, 1, password=b"good")
            assert real.ledger_id in claimed, "the id allocator skipped the claimed ids: the test proves nothing"
            ids = await asyncio.gather(*(real.append_async(b"e%d" % i) for i in range(2000)))
            assert ids == list(range(2000))
            # one metadata look-up for the new ledger, not one per entry
            assert metrics(http)["ledgerstore_bookie_ledger_lookups_total"] == lookups + 1
            # and now the bookie holds the real key: the intruder is refused
            again = await exchange(port, [codec.encode_add(1, real.ledger_id, 5000, evil,
                                                           DigestManager(real.ledger_id, "crc32c").sign(5000, -1, b"m"))])
            assert again[0].status == Status.UNAUTHORIZED
            await real.close()
            rh = await client.open_ledger(real.ledger_id, password=b"good")
            assert [e.payload for e in await rh.read(0, 1999)] == [b"e%d" % i for i in range(2000)]

    asyncio.run(asyncio.wait_for(main(), 60))
