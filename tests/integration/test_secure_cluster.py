"""Bookies behind TLS (client certificates required) and behind CURVE: a client with the right
credentials works; one without them can neither add nor read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq.auth

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerStoreError
from ledgerstore.testing.servers import make_pki


async def roundtrip(client: Client) -> int:
    lh = await client.create_ledger(3, 2, 2, password=b"pw")
    await asyncio.gather(*(lh.append_async(b"secret %d" % i) for i in range(50)))
    await lh.close()
    rh = await client.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
    assert [e.payload for e in await rh.read(0, 49)] == [b"secret %d" % i for i in range(50)]
    return lh.ledger_id


async def refused(metadata: str, transport: dict[str, object], ledger_id: int) -> None:
    async with Client(metadata=metadata, add_timeout_s=3, read_timeout_s=3, transport=transport) as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")  # metadata is not the bookies' to guard
        with pytest.raises(LedgerStoreError):
            await asyncio.wait_for(lh.append(b"intruder"), 60)
        rh = await client.open_ledger(ledger_id, password=b"pw", recovery=False)
        with pytest.raises(LedgerStoreError):
            await asyncio.wait_for(rh.read(0, 0, allow_beyond_lac=True), 60)


def test_tls_bookies_refuse_clients_without_a_certificate(cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    extra = (
        "[bookie.transport]\n"
        f'cert_file = "{pki["server.pem"]}"\nkey_file = "{pki["server.key"]}"\n'
        f'ca_file = "{pki["ca.pem"]}"\nrequire_client_cert = true\n'
    )
    cluster: LocalCluster = cluster_factory(3, transport="tcp+tls", extra_bookie_config=extra)
    cluster.start()
    good = {"tcp+tls": {"ca_file": pki["ca.pem"], "client_cert_file": pki["client.pem"],
                        "client_key_file": pki["client.key"]}}

    async def main() -> None:
        async with Client(metadata=cluster.metadata, transport=good) as client:
            lid = await roundtrip(client)
        await refused(cluster.metadata, {"tcp+tls": {"ca_file": pki["ca.pem"]}}, lid)  # no client certificate
        await refused(cluster.metadata, {}, lid)  # does not trust the bookies' CA either

    asyncio.run(asyncio.wait_for(main(), 300))


def test_curve_bookies_refuse_unknown_keys(cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = tmp_path / "keys"
    allowed = tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(str(keys), "server")
    client_public, client_secret = zmq.auth.create_certificates(str(keys), "client")
    _, stranger_secret = zmq.auth.create_certificates(str(keys), "stranger")
    zmq.auth.create_certificates(str(allowed), "unused")  # the allow-list holds only public keys
    Path(client_public).rename(allowed / "client.key")
    extra = (
        "[bookie.transport]\n"
        f'curve_server_secret_key = "{server_secret}"\ncurve_allowed_clients = "{allowed}"\n'
    )
    for p in allowed.glob("*.key_secret"):
        p.unlink()
    cluster: LocalCluster = cluster_factory(3, transport="zmq", extra_bookie_config=extra)
    cluster.start()

    async def main() -> None:
        good = {"zmq": {"curve_server_public_key": server_public, "curve_secret_key": client_secret}}
        async with Client(metadata=cluster.metadata, transport=good) as client:
            lid = await roundtrip(client)
        stranger = {"zmq": {"curve_server_public_key": server_public, "curve_secret_key": stranger_secret}}
        await refused(cluster.metadata, stranger, lid)
        await refused(cluster.metadata, {}, lid)  # plain zmq against CURVE bookies

    asyncio.run(asyncio.wait_for(main(), 300))
