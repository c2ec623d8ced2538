"""Sessions of the ZooKeeper and etcd metadata stores against real servers and real processes.

- an ephemeral key of a SIGKILLed process vanishes within the session timeout / lease TTL, and a
  watcher in another process sees it deleted;
- a session lost under a live store (ZooKeeper session closed by another client, etcd lease revoked
  by another client) fires "lost" then "restored", and the store can hold ephemeral keys again;
- ZooKeeper digest auth and etcd user/password keep out clients without the credentials.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import aetcd
import pytest
from kazoo.client import KazooClient

from ledgerstore.api import NOT_EXISTS, EventType, MetadataStore, Notification
from ledgerstore.errors import MetadataError
from ledgerstore.testing.metadata import run, wait_until
from ledgerstore_etcd import EtcdMetadataStore
from ledgerstore_zookeeper import ZooKeeperMetadataStore

if TYPE_CHECKING:
    from ledgerstore.testing.servers import EtcdServer, ZooKeeperServer

pytest_plugins = ["ledgerstore.testing.servers"]

#: ZooKeeper session timeout and etcd lease TTL used here (seconds)
SESSION = 2
#: how late past SESSION the server may notice: ZooKeeper expires sessions on tick boundaries,
#: etcd checks leases every 500 ms; the rest is slack for a loaded machine
SLACK = 4.0

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from ledgerstore_zookeeper import ZooKeeperMetadataStore
    from ledgerstore_etcd import EtcdMetadataStore

    async def main(kind, uri, key, ttl):
        if kind == "zk":
            store = ZooKeeperMetadataStore(uri, session_timeout=ttl)
        else:
            store = EtcdMetadataStore(uri, lease_ttl=int(ttl))
        await store.start()
        version = await store.put_ephemeral(key, b"held by a child process")
        print("READY", version, flush=True)
        await asyncio.Event().wait()  # hold the session until killed

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
    """
)

StoreMaker = Callable[[], MetadataStore]


@pytest.fixture(params=["zk", "etcd"])
def backend(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[str, str, StoreMaker]]:
    """(kind, uri, factory) for a fresh namespace on a real server of each backend."""
    kind = request.param
    root = f"/sessions-{uuid.uuid4().hex[:12]}"
    if kind == "zk":
        zk: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        uri = zk.uri(root)
        yield kind, uri, lambda: ZooKeeperMetadataStore(uri, session_timeout=float(SESSION))
    else:
        etcd: EtcdServer = request.getfixturevalue("etcd_server")
        uri = etcd.uri(root)
        yield kind, uri, lambda: EtcdMetadataStore(uri, lease_ttl=SESSION)


def test_ephemeral_key_of_a_killed_process_vanishes_and_watchers_see_it(
    backend: tuple[str, str, StoreMaker],
) -> None:
    kind, uri, make = backend
    key = "/bookies/available/127.0.0.1:3181"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, uri, key, str(SESSION)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("READY"), f"child failed: {line!r} {child.stderr.read() if child.stderr else ''}"
        child_version = int(line.split()[1])

        async def main() -> float:
            observer = make()
            await observer.start()
            try:
                seen: list[Notification] = []
                sub = await observer.watch("/bookies", seen.append)
                got = await observer.get(key)
                assert got is not None and got.version == child_version
                assert got.value == b"held by a child process"

                os.kill(child.pid, signal.SIGKILL)
                child.wait(10)
                killed_at = time.monotonic()
                await wait_until(
                    lambda: any(n.type is EventType.DELETED and n.key == key for n in seen),
                    timeout=SESSION + SLACK,
                )
                elapsed = time.monotonic() - killed_at
                assert await observer.get(key) is None
                assert await observer.children("/bookies/available") == []
                sub.cancel()
                return elapsed
            finally:
                await observer.close()

        elapsed = run(main())
        assert elapsed <= SESSION + SLACK
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)


def _session_events(store: MetadataStore) -> list[str]:
    events: list[str] = []
    store.add_session_listener(events.append)
    return events


def test_zookeeper_session_expiry_fires_lost_then_restored(zookeeper_server: ZooKeeperServer) -> None:
    uri = zookeeper_server.uri(f"/sessions-{uuid.uuid4().hex[:12]}")

    async def main() -> None:
        store = ZooKeeperMetadataStore(uri, session_timeout=float(SESSION))
        observer = ZooKeeperMetadataStore(uri, session_timeout=float(SESSION))
        await store.start()
        await observer.start()
        try:
            events = _session_events(store)
            await store.put_ephemeral("/reg/me", b"1")
            old_session = store.session_id
            session_id, password = store.client.client_id

            # The classic expiry: a second client attaches to the same session and closes it.
            def close_session_from_elsewhere() -> None:
                intruder = KazooClient(hosts=zookeeper_server.address, client_id=(session_id, password))
                intruder.start(10)
                intruder.stop()
                intruder.close()

            await asyncio.to_thread(close_session_from_elsewhere)
            await wait_until(lambda: events == ["lost", "restored"], timeout=SESSION + SLACK + 5)
            assert await observer.get("/reg/me") is None, "the closed session's ephemeral key survived"
            assert store.session_id not in (None, old_session)

            await store.put_ephemeral("/reg/me", b"2")
            got = await observer.get("/reg/me")
            assert got is not None and got.value == b"2"
            stat = await asyncio.to_thread(store.client.exists, store.root + "/reg/me")
            assert stat is not None and stat.ephemeralOwner == store.session_id
        finally:
            await store.close()
            await observer.close()

    run(main())


def test_etcd_revoked_lease_fires_lost_then_restored(etcd_server: EtcdServer) -> None:
    uri = etcd_server.uri(f"/sessions-{uuid.uuid4().hex[:12]}")

    async def main() -> None:
        store = EtcdMetadataStore(uri, lease_ttl=SESSION)
        observer = EtcdMetadataStore(uri, lease_ttl=SESSION)
        await store.start()
        await observer.start()
        try:
            events = _session_events(store)
            await store.put_ephemeral("/reg/me", b"1")
            old_lease = store.lease_id
            assert old_lease is not None

            host, port = etcd_server.address.split(":")
            async with aetcd.Client(host=host, port=int(port)) as other:
                await other.revoke_lease(old_lease)

            await wait_until(lambda: events == ["lost", "restored"], timeout=SESSION + SLACK)
            assert await observer.get("/reg/me") is None, "the revoked lease's ephemeral key survived"
            assert store.lease_id not in (None, old_lease)

            await store.put_ephemeral("/reg/me", b"2")
            got = await observer.get("/reg/me")
            assert got is not None and got.value == b"2"
            # ...and it is bound to the new lease: revoking that one removes it.
            async with aetcd.Client(host=host, port=int(port)) as other:
                keys = await other.get_lease_info(store.lease_id)
            assert [k.decode() for k in keys.keys] == [store.prefix + "/reg/me"]
        finally:
            await store.close()
            await observer.close()

    run(main())


def test_zookeeper_auth_keeps_out_clients_without_credentials(zookeeper_server: ZooKeeperServer) -> None:
    uri = zookeeper_server.uri(f"/auth-{uuid.uuid4().hex[:12]}")

    async def main() -> None:
        alice = ZooKeeperMetadataStore(uri, auth="alice:secret", session_timeout=float(SESSION))
        anonymous = ZooKeeperMetadataStore(uri, session_timeout=float(SESSION))
        mallory = ZooKeeperMetadataStore(uri, auth="mallory:guess", session_timeout=float(SESSION))
        for s in (alice, anonymous, mallory):
            await s.start()
        try:
            await alice.put("/ledgers/L1", b"metadata", NOT_EXISTS)
            got = await alice.get("/ledgers/L1")
            assert got is not None and got.value == b"metadata"
            for outsider in (anonymous, mallory):
                with pytest.raises(MetadataError, match="not authorized"):
                    await outsider.get("/ledgers/L1")
                with pytest.raises(MetadataError, match="not authorized"):
                    await outsider.put("/ledgers/L1", b"overwritten")
                with pytest.raises(MetadataError, match="not authorized"):
                    await outsider.put("/ledgers/L2", b"new", NOT_EXISTS)
            got = await alice.get("/ledgers/L1")
            assert got is not None and got.value == b"metadata"
            assert await alice.children("/ledgers") == ["L1"]
        finally:
            for s in (alice, anonymous, mallory):
                await s.close()

    run(main())


def test_etcd_user_and_password_keep_out_clients_without_them() -> None:
    """A dedicated server (auth changes server-wide state) with authentication switched on."""
    from ledgerstore.testing.servers import EtcdServer

    async def enable_auth(address: str) -> None:
        from aetcd import rpc

        host, port = address.split(":")
        async with aetcd.Client(host=host, port=int(port)) as c:
            auth = rpc.AuthStub(c.channel)
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="rootpw"))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.AuthEnable(rpc.AuthEnableRequest())

    with EtcdServer() as server:
        run(enable_auth(server.address))
        uri = server.uri("/auth")

        async def main() -> None:
            store = EtcdMetadataStore(uri, user="root", password="rootpw", lease_ttl=SESSION)
            await store.start()
            try:
                v = await store.put("/k", b"v", NOT_EXISTS)
                got = await store.get("/k")
                assert got is not None and got.version == v
            finally:
                await store.close()
            anonymous = EtcdMetadataStore(uri, lease_ttl=SESSION)
            await anonymous.start()
            try:
                with pytest.raises(MetadataError, match="not authorized"):
                    await anonymous.get("/k")
                with pytest.raises(MetadataError, match="not authorized"):
                    await anonymous.put("/k", b"overwritten")
            finally:
                await anonymous.close()
            wrong = EtcdMetadataStore(uri, user="root", password="wrong", lease_ttl=SESSION)
            with pytest.raises(MetadataError, match="not authorized"):
                await wrong.start()

        run(main())


def test_etcd_over_mutual_tls(tmp_path: Path) -> None:
    """A dedicated TLS-only server that also demands a client certificate."""
    from ledgerstore.testing.servers import EtcdServer, make_pki

    pki = make_pki(tmp_path)
    with EtcdServer(cert_file=pki["server.pem"], key_file=pki["server.key"], client_ca_file=pki["ca.pem"]) as server:
        uri = server.uri("/tls")

        async def main() -> None:
            store = EtcdMetadataStore(
                uri, ca_file=pki["ca.pem"], cert_file=pki["client.pem"], key_file=pki["client.key"], lease_ttl=SESSION
            )
            await store.start()
            try:
                v = await store.put("/k", b"over tls", NOT_EXISTS)
                got = await store.get("/k")
                assert got is not None and (got.value, got.version) == (b"over tls", v)
                await store.put_ephemeral("/e", b"x")
                assert await store.children("/") == ["e", "k"]
            finally:
                await store.close()
            # Trusting the CA but presenting no certificate: the server refuses the handshake.
            no_cert = EtcdMetadataStore(uri, ca_file=pki["ca.pem"], lease_ttl=SESSION, operation_timeout=5)
            with pytest.raises(MetadataError, match="etcd unreachable"):
                await no_cert.start()

        run(main())
