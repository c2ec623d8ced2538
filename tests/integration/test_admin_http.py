"""The bookie's admin HTTP server against real bookie processes: health, Prometheus metrics, the
BookKeeper-style admin API, read-only toggling, forced GC, and robustness to malformed requests.
The bookies here have an admin token; every state change presents it (authentication itself is
tested in test_admin_http_auth.py)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster, free_ports
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager, master_key

from .admin_http_cluster import start_http_cluster


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 120))


TOKEN = "admin-token-for-tests-5f1c"


class HttpCluster:
    """Three bookie processes, each with its admin HTTP server on its own free port."""

    def __init__(self, cluster: LocalCluster, http_ports: list[int]) -> None:
        self.cluster = cluster
        self.http_ports = http_ports
        #: sent as the bearer token by request(); None sends no Authorization header
        self.token: str | None = TOKEN

    @property
    def metadata(self) -> str:
        return self.cluster.metadata

    def request(self, i: int, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_ports[i], timeout=60)
        sent = {"Content-Type": "application/json"} if body else {}
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request(method, path, body=body, headers={**sent, **(headers or {})})
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()

    def get_json(self, i: int, path: str, expect: int = 200, headers: dict[str, str] | None = None) -> Any:
        status, ctype, body = self.request(i, "GET", path, headers=headers)
        assert status == expect, (path, status, body)
        assert ctype.startswith("application/json"), ctype
        return json.loads(body)

    def put_json(self, i: int, path: str, data: object | None = None, expect: int = 200, method: str = "PUT") -> Any:
        status, _, body = self.request(i, method, path, json.dumps(data).encode() if data is not None else None)
        assert status == expect, (path, status, body)
        return json.loads(body)

    def metrics(self, i: int) -> dict[str, float]:
        """Every sample of ``/metrics`` keyed by name plus sorted labels."""
        status, ctype, body = self.request(i, "GET", "/metrics")
        assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
                out[key] = s.value
        return out


@pytest.fixture(scope="module")
def hc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpCluster]:
    cluster, ports = start_http_cluster(tmp_path_factory.mktemp("http-cluster"), 3, TOKEN)
    try:
        yield HttpCluster(cluster, ports)
    finally:
        cluster.stop()


def test_heartbeat_answers_ok(hc: HttpCluster) -> None:
    for i in range(3):
        status, ctype, body = hc.request(i, "GET", "/heartbeat")
        assert (status, body) == (200, b"OK\n") and ctype.startswith("text/plain")


def test_metrics_parse_and_move_when_entries_are_written(hc: HttpCluster) -> None:
    before = hc.metrics(0)
    for name in ("ledgerstore_bookie_disk_free_bytes", "ledgerstore_bookie_disk_total_bytes",
                 "ledgerstore_bookie_read_only", "ledgerstore_bookie_ledgers", "ledgerstore_storage_disk_bytes",
                 "ledgerstore_journal_fsync_seconds_count", "process_resident_memory_bytes"):
        assert name in before, name
    assert before["ledgerstore_bookie_read_only"] == 0
    assert before["ledgerstore_bookie_disk_total_bytes"] > before["ledgerstore_bookie_disk_free_bytes"] > 0

    async def write() -> int:
        async with Client(metadata=hc.metadata) as client:
            # E = Qw = 3: every bookie, bookie 0 included, stores every entry
            lh = await client.create_ledger(3, 3, 2, password=b"m")
            await asyncio.gather(*(lh.append_async(b"x" * 100) for _ in range(300)))
            await lh.close()
            return lh.ledger_id

    run(write())
    after = hc.metrics(0)

    def moved(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    # With Qa = 2 the writer may be done before bookie 0 answered: its journal counts a group's
    # records on the writer thread, the group histogram once the loop answers the group.
    deadline = time.monotonic() + 30
    while (moved("ledgerstore_journal_records_total") < 300 or moved("ledgerstore_journal_group_records_sum") < 300) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
        after = hc.metrics(0)

    assert moved("ledgerstore_bookie_add_requests_total") >= 300
    assert moved("ledgerstore_bookie_add_bytes_total") >= 300 * 100
    assert moved("ledgerstore_journal_records_total") >= 300
    assert moved("ledgerstore_journal_written_bytes_total") >= 300 * 100
    assert moved("ledgerstore_journal_groups_total") >= 1
    assert moved("ledgerstore_journal_fsync_seconds_count") >= 1
    assert moved("ledgerstore_journal_fsync_seconds_sum") > 0
    assert moved("ledgerstore_journal_group_records_count") >= 1
    assert after["ledgerstore_journal_group_records_bucket|le=+Inf"] == after["ledgerstore_journal_group_records_count"]
    assert after["ledgerstore_journal_group_records_sum"] >= 300
    assert after["ledgerstore_bookie_ledgers"] >= 1
    assert moved("ledgerstore_storage_entries_written_total") >= 300
    assert after["ledgerstore_bookie_info|bookie_id=" + hc.cluster.bookie_id(0) + "|listen=" + hc.cluster.address(0)
                 + "|storage=entrylog|version=" + __import__("ledgerstore").__version__] == 1


def test_json_endpoints_answer_sensibly(hc: HttpCluster) -> None:
    async def write() -> tuple[int, list[str]]:
        async with Client(metadata=hc.metadata) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"secret")
            for i in range(5):
                await lh.append(b"hello %d" % i)
            await lh.close()
            return lh.ledger_id, (await client.ledger_metadata(lh.ledger_id)).ensembles[0][1]

    lid, ensemble = run(write())
    info = hc.get_json(0, "/api/v1/bookie/info")
    assert info["bookie_id"] == hc.cluster.bookie_id(0)
    assert info["total_bytes"] > info["free_bytes"] > 0 and info["ledger_count"] >= 1
    assert info["storage"] == "entrylog" and info["instance_id"] and info["uptime_seconds"] >= 0
    assert hc.get_json(0, "/api/v1/bookie/state") == {
        "running": True, "readOnly": False, "shuttingDown": False, "availableForHighPriorityWrites": True,
        "forcedReadOnly": False, "registered": True, "journalFailed": False, "ledgersInLimbo": 0}

    assert sorted(hc.get_json(1, "/api/v1/bookie/list_bookies")) == sorted(hc.cluster.bookie_id(i) for i in range(3))
    bookies = hc.get_json(1, "/api/v1/bookie/list_bookies?details=true")["bookies"]
    assert sorted(b["bookie_id"] for b in bookies) == sorted(hc.cluster.bookie_id(i) for i in range(3))
    assert hc.get_json(1, "/api/v1/bookie/list_bookies?type=ro") == {}
    hc.get_json(1, "/api/v1/bookie/list_bookies?type=bogus", expect=400)

    mark = hc.get_json(0, "/api/v1/bookie/last_log_mark?details=true")
    assert mark["durable"]["file_id"] >= 1 and mark["durable"]["offset"] > 16
    assert (mark["last_log_mark"]["file_id"], mark["last_log_mark"]["offset"]) <= (
        mark["durable"]["file_id"], mark["durable"]["offset"])

    listed = hc.get_json(2, "/api/v1/ledger/list")
    assert str(lid) in listed and listed[str(lid)] is None
    with_md = hc.get_json(2, "/api/v1/ledger/list?print_metadata=true&decode_meta=true")
    assert with_md[str(lid)]["state"] == "CLOSED"

    md = hc.get_json(2, f"/api/v1/ledger/metadata?ledger_id={lid}")[str(lid)]
    assert md["ledger_id"] == lid and md["state"] == "CLOSED" and md["last_entry_id"] == 4
    assert md["ensembles"][0][1] == ensemble
    hc.get_json(2, "/api/v1/ledger/metadata?ledger_id=987654321", expect=404)
    hc.get_json(2, "/api/v1/ledger/metadata", expect=400)
    hc.get_json(2, "/api/v1/ledger/metadata?ledger_id=abc", expect=400)

    secret = {"X-Ledger-Password": "secret"}
    assert hc.get_json(0, f"/api/v1/ledger/read?ledger_id={lid}", headers=secret) == {
        str(i): f"hello {i}" for i in range(5)}
    got = hc.get_json(0, f"/api/v1/ledger/read?ledger_id={lid}&details=true", headers=secret)
    assert [e["text"] for e in got["entries"]] == [f"hello {i}" for i in range(5)]
    assert base64.b64decode(got["entries"][2]["data_base64"]) == b"hello 2"
    part = hc.get_json(0, f"/api/v1/ledger/read?ledger_id={lid}&first=1&last=2&details=true", headers=secret)
    assert [e["entry_id"] for e in part["entries"]] == [1, 2]
    hc.get_json(0, f"/api/v1/ledger/read?ledger_id={lid}", headers={"X-Ledger-Password": "wrong"}, expect=403)
    hc.get_json(0, f"/api/v1/ledger/read?ledger_id={lid}&last=9", headers=secret, expect=404)

    assert hc.get_json(0, "/api/v1/bookie/gc") == {"is_in_force_gc": "false"}  # a string, as BookKeeper
    hc.get_json(0, "/api/v1/no/such/endpoint", expect=404)
    status, _, body = hc.request(0, "DELETE", "/api/v1/bookie/state")
    assert status == 405 and "GET" in json.loads(body)["error"]


def test_put_state_read_only_makes_the_bookie_refuse_adds_and_back(hc: HttpCluster) -> None:
    target = hc.cluster.bookie_id(0)

    def listbookies(*flags: str) -> list[dict[str, object]]:
        out = subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "--metadata", hc.metadata, "listbookies",
                              *flags, "--json"], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)

    async def probe_add(client: Client, ledger_id: int) -> int:
        """Send one add straight to the target bookie and return its status."""
        await client.bookie_infos(max_age=0)
        entry = DigestManager(ledger_id, "crc32c").sign(0, -1, b"direct")
        resp = await client.pool.get(target).request(
            lambda rid: codec.encode_add(rid, ledger_id, 0, master_key(b"ro"), entry), 10)
        return resp.status

    state = hc.put_json(0, "/api/v1/bookie/state", {"readOnly": True})
    try:
        assert state["readOnly"] is True and state["forcedReadOnly"] is True
        assert [r["bookie_id"] for r in listbookies("-ro")] == [target]
        assert target not in [r["bookie_id"] for r in listbookies("-rw")]
        assert list(hc.get_json(1, "/api/v1/bookie/list_bookies?type=ro")) == [target]
        rejected_before = hc.metrics(0).get("ledgerstore_bookie_rejected_adds_total|reason=READ_ONLY", 0.0)

        async def while_read_only() -> None:
            async with Client(metadata=hc.metadata) as client:
                for _ in range(5):  # placement must avoid the read-only bookie every time
                    lh = await client.create_ledger(2, 2, 2, password=b"ro")
                    md = await client.ledger_metadata(lh.ledger_id)
                    assert target not in md.ensembles[0][1]
                    await lh.append(b"fine")
                    await lh.close()
                assert await probe_add(client, lh.ledger_id + 1_000_000) == Status.READ_ONLY

        run(while_read_only())
        assert hc.metrics(0)["ledgerstore_bookie_rejected_adds_total|reason=READ_ONLY"] == rejected_before + 1
        assert hc.metrics(0)["ledgerstore_bookie_read_only"] == 1
    finally:
        state = hc.put_json(0, "/api/v1/bookie/state", {"readOnly": False})
    assert state["readOnly"] is False and state["forcedReadOnly"] is False
    assert listbookies("-ro") == []
    assert hc.metrics(0)["ledgerstore_bookie_read_only"] == 0

    async def writable_again() -> None:
        async with Client(metadata=hc.metadata) as client:
            lh = await client.create_ledger(3, 3, 3, password=b"ro")
            assert target in (await client.ledger_metadata(lh.ledger_id)).ensembles[0][1]
            assert await lh.append(b"back") == 0
            await lh.close()
            # a ledger the metadata knows (bookies may refuse adds to ledgers it does not)
            fresh = await client.create_ledger(3, 3, 3, password=b"ro")
            assert await probe_add(client, fresh.ledger_id) == Status.OK

    run(writable_again())


def test_put_state_validates_its_body(hc: HttpCluster) -> None:
    for body in (b"not json", b"[1, 2]", b'{"readOnly": "maybe"}', b"{}"):
        status, _, data = hc.request(1, "PUT", "/api/v1/bookie/state", body)
        assert status == 400 and json.loads(data)["error"], body
    status, _, _ = hc.request(1, "PUT", "/api/v1/bookie/state")
    assert status == 400
    assert hc.get_json(1, "/api/v1/bookie/state")["readOnly"] is False


def test_put_gc_after_deleting_a_ledger_reports_it_deleted(hc: HttpCluster) -> None:
    async def make_and_delete() -> int:
        async with Client(metadata=hc.metadata) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"gc")
            await asyncio.gather(*(lh.append_async(b"g" * 1000) for _ in range(200)))
            await lh.close()
            await client.delete_ledger(lh.ledger_id)
            return lh.ledger_id

    lid = run(make_and_delete())
    result = hc.put_json(2, "/api/v1/bookie/gc?major=true")
    assert lid in result["deleted_ledgers"]
    assert result["compaction"] == "major" and result["seconds"] >= 0
    again = hc.put_json(2, "/api/v1/bookie/gc", {"minor": True})
    assert lid not in again["deleted_ledgers"]
    hc.put_json(2, "/api/v1/bookie/gc?major=perhaps", expect=400)


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("junk, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /heartbeat\r\n\r\n", 400),
    (b"get /heartbeat HTTP/1.1\r\n\r\n", 400),
    (b"GET /heartbeat HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"GET /heartbeat HTTP/9.9\r\n\r\n", 505),
    (b"PUT /api/v1/bookie/state HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400),
    (b"PUT /api/v1/bookie/state HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
    (b"PUT /api/v1/bookie/state HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    (b"GET /" + b"a" * 40_000 + b" HTTP/1.1\r\n\r\n", 431),
])
def test_malformed_request_gets_an_error_and_the_server_keeps_serving(hc: HttpCluster, junk: bytes, status: int) -> None:
    reply = raw_exchange(hc.http_ports[1], junk)
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["status"] == status
    assert hc.request(1, "GET", "/heartbeat")[:3:2] == (200, b"OK\n")


def test_keep_alive_serves_several_requests_on_one_connection(hc: HttpCluster) -> None:
    reply = raw_exchange(hc.http_ports[2], b"GET /heartbeat HTTP/1.1\r\n\r\n"
                                          b"HEAD /api/v1/bookie/state HTTP/1.1\r\n\r\n"
                                          b"GET /heartbeat HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert reply.count(b"HTTP/1.1 200 OK") == 3
    assert reply.endswith(b"OK\n") and b"readOnly" not in reply  # HEAD: headers only


def test_plugin_routes_are_served(tmp_path: Path) -> None:
    """A plugin's ``ledgerstore_http_routes`` contribution, on an in-process bookie."""
    import ledgerstore
    from ledgerstore.bookie.server import Bookie
    from ledgerstore.config import BookieConfig
    from ledgerstore.plugins import hooks

    class EchoRoutes:
        @ledgerstore.hookimpl
        def ledgerstore_http_routes(self, bookie: object) -> list[tuple[str, str, object]]:
            async def echo(request: object) -> tuple[int, str, bytes]:
                return 200, "text/plain", f"{request.bookie.bookie_id} {request.query['say']}".encode()  # type: ignore[attr-defined]

            def boom(request: object) -> tuple[int, str, bytes]:
                raise RuntimeError("plugin bug")

            return [("GET", "/plugin/echo", echo), ("GET", "/plugin/boom", boom)]

    plugin = EchoRoutes()
    hooks().register(plugin)
    bport, hport = free_ports(2)
    cfg = BookieConfig(metadata=f"sqlite://{tmp_path / 'meta.db'}", listen=f"tcp://127.0.0.1:{bport}",
                       metadata_options={"server": "never"},  # one process: direct mode, asked for
                       auto_init_cluster=True,  # a fresh store holds no cluster yet
                       journal_dir=str(tmp_path / "journal"), ledger_dirs=[str(tmp_path / "ledgers")], http_port=hport)

    def get(path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", hport, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    async def main() -> None:
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            assert bookie.http.port == hport
            assert await asyncio.to_thread(get, "/plugin/echo?say=hi") == (200, f"127.0.0.1:{bport} hi".encode())
            status, body = await asyncio.to_thread(get, "/plugin/boom")
            assert status == 500 and "plugin bug" in json.loads(body)["error"]
            assert await asyncio.to_thread(get, "/heartbeat") == (200, b"OK\n")
        finally:
            await bookie.stop()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", hport), timeout=2).close()

    try:
        run(main())
    finally:
        hooks().unregister(plugin)


# --- BookKeeper's endpoints that were missing -------------------------------------------------------


def test_bookie_endpoints_answer_in_bookkeepers_shapes(hc: HttpCluster) -> None:
    status, _, body = hc.request(0, "GET", "/api/v1/bookie/is_ready")
    assert (status, body) == (200, b"")
    assert hc.get_json(0, "/api/v1/bookie/state/readonly") == {"readOnly": False}
    assert hc.put_json(0, "/api/v1/bookie/state/readonly", {"readOnly": True}) == {"readOnly": True}
    try:
        assert hc.get_json(0, "/api/v1/bookie/state")["forcedReadOnly"] is True
    finally:
        assert hc.put_json(0, "/api/v1/bookie/state/readonly", {"readOnly": False}) == {"readOnly": False}
    hc.put_json(0, "/api/v1/bookie/state/readonly", {"readOnly": "perhaps"}, expect=400)

    files = hc.get_json(0, "/api/v1/bookie/list_disk_file")
    assert set(files) == {"journal files", "entrylog files", "index files"}
    assert files["journal files"].split()[0].endswith(".txn") or files["journal files"]
    assert set(hc.get_json(0, "/api/v1/bookie/list_disk_file?file_type=journal")) == {"journal files"}
    hc.get_json(0, "/api/v1/bookie/list_disk_file?file_type=bogus", expect=400)

    info = hc.get_json(1, "/api/v1/bookie/list_bookie_info")
    ids = [hc.cluster.bookie_id(i) for i in range(3)]
    assert set(info) == {*ids, "clusterInfo"}
    assert all(info[b]["total"] >= info[b]["free"] > 0 for b in ids)
    assert info["clusterInfo"]["total"] == sum(info[b]["total"] for b in ids)

    assert hc.get_json(2, "/api/v1/bookie/cluster_info") == {
        "auditorElected": False, "auditorId": "", "clusterUnderReplicated": False, "ledgerReplicationEnabled": True,
        "totalBookiesCount": 3, "writableBookiesCount": 3, "readonlyBookiesCount": 0, "unavailableBookiesCount": 0}

    sanity = hc.get_json(1, "/api/v1/bookie/sanity")
    assert sanity == {"passed": True, "readOnly": False}


def test_ledger_delete_removes_the_ledger_and_takes_no_password_in_the_url(hc: HttpCluster) -> None:
    async def make() -> int:
        async with Client(metadata=hc.metadata) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"del")
            await lh.append(b"x")
            await lh.close()
            return lh.ledger_id

    lid = run(make())
    hc.put_json(0, f"/api/v1/ledger/delete?ledger_id={lid}&password=del", method="DELETE", expect=400)
    hc.get_json(0, f"/api/v1/ledger/metadata?ledger_id={lid}")  # still there
    assert hc.put_json(0, f"/api/v1/ledger/delete?ledger_id={lid}", method="DELETE") == {"ledger_id": lid, "deleted": True}
    hc.get_json(0, f"/api/v1/ledger/metadata?ledger_id={lid}", expect=404)
    hc.put_json(0, f"/api/v1/ledger/delete?ledger_id={lid}", method="DELETE", expect=404)
    hc.put_json(0, "/api/v1/ledger/delete", method="DELETE", expect=400)


def test_a_suspended_major_compaction_does_not_run_even_when_forced(hc: HttpCluster) -> None:
    assert hc.get_json(2, "/api/v1/bookie/gc/suspend_compaction") == {"isMajorGcSuspended": "false",
                                                                      "isMinorGcSuspended": "false"}
    before = hc.get_json(2, "/api/v1/bookie/gc_details")[0]
    assert set(before) == {"forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
                           "lastMinorCompactionTime", "majorCompactionCounter", "minorCompactionCounter"}
    assert hc.put_json(2, "/api/v1/bookie/gc/suspend_compaction", {"suspendMajor": True, "suspendMinor": True}) == {
        "isMajorGcSuspended": "true", "isMinorGcSuspended": "true"}
    try:
        assert hc.put_json(2, "/api/v1/bookie/gc?major=true")["compaction"] is None
        assert hc.get_json(2, "/api/v1/bookie/gc_details")[0]["majorCompactionCounter"] == before["majorCompactionCounter"]
        # major suspended, minor allowed: a forced major falls through to a minor, as in BookKeeper
        assert hc.put_json(2, "/api/v1/bookie/gc/resume_compaction", {"resumeMinor": True}) == {
            "isMajorGcSuspended": "true", "isMinorGcSuspended": "false"}
        assert hc.put_json(2, "/api/v1/bookie/gc", {"minor": True, "major": True})["compaction"] == "minor"
    finally:
        hc.put_json(2, "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True, "resumeMinor": True})
    assert hc.put_json(2, "/api/v1/bookie/gc?major=true")["compaction"] == "major"
    after = hc.get_json(2, "/api/v1/bookie/gc_details")[0]
    assert after["majorCompactionCounter"] == before["majorCompactionCounter"] + 1
    assert after["minorCompactionCounter"] == before["minorCompactionCounter"] + 1
    assert after["lastMajorCompactionTime"] >= time.time() * 1000 - 60_000
    hc.put_json(2, "/api/v1/bookie/gc/suspend_compaction", {}, expect=400)


def test_server_config_is_redacted_and_only_live_settings_change(hc: HttpCluster) -> None:
    cfg = hc.get_json(0, "/api/v1/config/server_config")
    assert cfg["listen"] == hc.cluster.address(0) and cfg["http"]["token_file"].endswith("admin-token")
    assert TOKEN not in json.dumps(cfg)
    assert hc.put_json(0, "/api/v1/config/server_config", {"disk_usage_threshold": 0.97}) == {
        "updated": {"disk_usage_threshold": 0.97}}
    try:
        assert hc.get_json(0, "/api/v1/config/server_config")["disk_usage_threshold"] == 0.97
        err = hc.put_json(0, "/api/v1/config/server_config", {"listen": "tcp://0.0.0.0:1"}, expect=400)["error"]
        assert "cannot be changed on a running bookie" in err
        hc.put_json(0, "/api/v1/config/server_config", {"disk_usage_lwm": 0.99}, expect=400)  # above the threshold
        hc.put_json(0, "/api/v1/config/server_config", {"disk_usage_threshold": True}, expect=400)
    finally:
        hc.put_json(0, "/api/v1/config/server_config", {"disk_usage_threshold": 0.95})


def test_autorecovery_endpoints_read_and_set_the_cluster_switches(hc: HttpCluster) -> None:
    from ledgerstore.plugins import create_metadata_store
    from ledgerstore.recovery.markers import UnderReplicationManager

    hc.get_json(0, "/api/v1/autorecovery/who_is_auditor", expect=404)  # no auto-recovery process runs here
    hc.get_json(0, "/api/v1/autorecovery/list_under_replicated_ledger", expect=404)
    assert hc.get_json(0, "/api/v1/autorecovery/status") == {"enabled": True}
    assert hc.put_json(0, "/api/v1/autorecovery/status?enabled=false") == {"enabled": False}
    assert hc.get_json(1, "/api/v1/bookie/cluster_info")["ledgerReplicationEnabled"] is False
    assert hc.put_json(1, "/api/v1/autorecovery/status", {"enabled": True}) == {"enabled": True}

    assert hc.get_json(0, "/api/v1/autorecovery/lost_bookie_recovery_delay") == {"delay_seconds": 0.0, "cluster_wide": False}
    assert hc.put_json(0, "/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": 45}) == {
        "delay_seconds": 45.0, "cluster_wide": True}
    assert hc.get_json(2, "/api/v1/autorecovery/lost_bookie_recovery_delay")["delay_seconds"] == 45.0
    hc.put_json(0, "/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": -1}, expect=400)
    assert hc.put_json(0, "/api/v1/autorecovery/trigger_audit") == {"triggered": True, "auditor": None}

    async def mark() -> None:
        store = create_metadata_store(hc.metadata)
        await store.start()
        try:
            urm = UnderReplicationManager(store)
            await urm.mark(990001, {"10.0.0.1:3181"})
            await urm.mark(990002, {"10.0.0.2:3181"})
        finally:
            await store.close()

    async def unmark() -> None:
        store = create_metadata_store(hc.metadata)
        await store.start()
        try:
            for lid in (990001, 990002):
                await UnderReplicationManager(store).remove(lid)
        finally:
            await store.close()

    run(mark())
    try:
        assert hc.get_json(1, "/api/v1/autorecovery/list_under_replicated_ledger") == [990001, 990002]
        assert hc.get_json(1, "/api/v1/autorecovery/list_under_replicated_ledger?missingreplica=10.0.0.2:3181") == [990002]
        assert hc.get_json(1, "/api/v1/autorecovery/list_under_replicated_ledger"
                              "?excludingmissingreplica=10.0.0.2:3181") == [990001]
        assert hc.get_json(1, "/api/v1/bookie/cluster_info")["clusterUnderReplicated"] is True
    finally:
        run(unmark())
    hc.put_json(0, "/api/v1/autorecovery/decommission", {"bookie": "x"}, expect=400)
    hc.put_json(0, "/api/v1/autorecovery/bookie", {"bookie_src": ["a:1", "b:2"]}, expect=400)


def test_expand_storage_adds_an_empty_directory_the_bookie_starts_with_after_a_restart(
        cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import signal

    (http_port,) = free_ports(1)
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN)
    # disk checks (which also check the cookie files are still the bookie's own) every 50 ms
    cluster: LocalCluster = cluster_factory(1, extra_bookie_config=(
        f'http_port = {http_port}\ndisk_check_interval_ms = 50\n[bookie.http]\ntoken_file = "{token_file}"\n'))
    cluster.start()
    one = HttpCluster(cluster, [http_port])
    home = cluster.config_path(0).parent
    current, new = (home / "ledgers").resolve(), (home / "ledgers2").resolve()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "data").write_text("x")
    one.put_json(0, "/api/v1/bookie/expand_storage", {"ledger_dirs": [str(current), str(busy)]}, expect=409)
    one.put_json(0, "/api/v1/bookie/expand_storage", {"ledger_dirs": [str(new)]}, expect=400)  # drops a current one
    one.put_json(0, "/api/v1/bookie/expand_storage", {}, expect=400)
    assert one.put_json(0, "/api/v1/bookie/expand_storage", {"ledger_dirs": [str(current)]})["added"] == []

    async def write(payload: bytes) -> int:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"x")
            await lh.append(payload)
            await lh.close()
            return lh.ledger_id

    async def read(lid: int) -> bytes:
        async with Client(metadata=cluster.metadata) as client:
            rh = await client.open_ledger(lid, password=b"x")
            return (await rh.read(0, 0))[0].payload

    before = run(write(b"before"))
    r = one.put_json(0, "/api/v1/bookie/expand_storage", {"ledger_dirs": [str(current), str(new)]})
    assert r == {"added": [str(new)], "ledger_dirs": [str(current), str(new)], "restart_needed": True}
    for d in (current, new):  # every directory's cookie names both
        assert json.loads((d / "COOKIE").read_text())["ledger_dirs"] == [str(current), str(new)]
    # the running bookie still owns its data through 20 disk checks, and serves
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert one.get_json(0, "/api/v1/bookie/state")["readOnly"] is False
    after = run(write(b"after"))
    cluster.kill(0, signal.SIGTERM)
    cfg = cluster.config_path(0)
    cfg.write_text(cfg.read_text().replace('ledger_dirs = ["ledgers"]', 'ledger_dirs = ["ledgers", "ledgers2"]'))
    cluster.restart(0)
    assert run(read(before)) == b"before" and run(read(after)) == b"after"
