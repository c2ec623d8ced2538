"""A client given plugin instances (as tests and embedding applications give them) sends its
real traffic through them, against real bookie processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from ledgerstore.aio import Client
from ledgerstore.api import BookieInfo, Connection
from ledgerstore.cluster import LocalCluster
from ledgerstore.config import ClientConfig
from ledgerstore_placement import RandomPlacement
from ledgerstore_tcp import TcpTransport


class CountingTransport(TcpTransport):
    """The tcp transport, counting the connections it opens."""

    def __init__(self) -> None:
        super().__init__()
        self.connected: list[str] = []

    async def connect(self, address: str, on_frames: Callable[[Sequence[bytes]], None],
                      on_close: Callable[[BaseException | None], None]) -> Connection:
        self.connected.append(address)
        return await super().connect(address, on_frames, on_close)


class ChoosingPlacement(RandomPlacement):
    """Random placement that records every ensemble it chose."""

    def __init__(self) -> None:
        super().__init__(seed=7)
        self.chosen: list[list[str]] = []

    def new_ensemble(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                     bookies: Sequence[BookieInfo], exclude: frozenset[str] = frozenset()) -> list[str]:
        ens = super().new_ensemble(ensemble_size, write_quorum, ack_quorum, bookies, exclude)
        self.chosen.append(ens)
        return ens


def test_a_client_sends_its_traffic_through_the_transport_and_placement_it_is_given(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()
    transport, placement = CountingTransport(), ChoosingPlacement()

    async def main() -> None:
        config = ClientConfig(metadata=cluster.metadata)
        async with Client(config, transport=transport, placement=placement) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            assert placement.chosen == [lh.md.ensembles[0][1]]
            for i in range(10):
                await lh.append(b"e%d" % i)
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 9)] == [b"e%d" % i for i in range(10)]
        assert len(transport.connected) >= 3  # one connection per bookie of the ensemble, at least

    asyncio.run(asyncio.wait_for(main(), 120))
