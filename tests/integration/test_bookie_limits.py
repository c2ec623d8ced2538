"""Per-connection limits: a writer pipelining far more adds than a bookie lets one connection have
in flight is throttled (TOO_MANY_REQUESTS, back-off, resend), never failed, and loses nothing."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster, free_ports


def test_in_flight_limit_throttles_without_failing(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    (http,) = free_ports(1)
    cluster: LocalCluster = cluster_factory(
        1, extra_bookie_config=f"http_port = {http}\nmax_adds_in_flight_per_connection = 100\n")
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            ids = await asyncio.gather(*(lh.append_async(b"e%d" % i) for i in range(20_000)))
            assert ids == list(range(20_000))
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 19_999)] == [b"e%d" % i for i in range(20_000)]

    asyncio.run(asyncio.wait_for(main(), 300))
    text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read().decode()
    throttled = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                 if s.name.startswith("ledgerstore_bookie_rejected_adds") and "TOO_MANY_REQUESTS" in s.labels.values()]
    assert throttled and throttled[0] > 0, "the limit never applied: the test proves nothing"
