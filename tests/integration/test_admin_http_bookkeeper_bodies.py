"""Every admin endpoint we share with BookKeeper answers the body BookKeeper documents, field for
field and of the same JSON types, against real bookie processes.

Each case is a fixture in ``tests/fixtures/bookkeeper_rest/``, transcribed from BookKeeper's
"Admin REST API" page (``site3/website/docs/admin/http.md``; the section is in the file) and,
where the page only sketches a body, from the handler that writes it (named in the file). Our
bodies may hold more fields than BookKeeper's, never fewer or differently typed ones; bodies keyed
by ids (bookies, ledgers, entries, journals) must have every key shaped as BookKeeper's are.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster

from .admin_http_cluster import start_http_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bookkeeper_rest"
TOKEN = "bookkeeper-bodies-token-2c81"
PASSWORD = "pw"
UNDER_REPLICATED = {990001: ["10.0.0.1:3181"], 990002: ["10.0.0.2:3181", "10.0.0.3:3181"]}


def json_type(value: Any) -> str:
    """JSON's name for a value's type (a bool is not a number)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def mismatches(ours: Any, theirs: Any, where: str = "$", keyed_by: str | None = None,
               fixed_keys: tuple[str, ...] = (), value_pattern: str | None = None) -> list[str]:
    """Where ``ours`` lacks or retypes what ``theirs`` (BookKeeper's body) has. With ``keyed_by``,
    ``theirs`` is a map from ids: every key of ours must match the pattern (but ``fixed_keys``, which
    are compared as fields) and every value must be shaped as BookKeeper's example value."""
    if json_type(ours) != json_type(theirs):
        return [f"{where}: BookKeeper has a {json_type(theirs)}, we answer a {json_type(ours)} ({ours!r:.80})"]
    if isinstance(theirs, str) and value_pattern and not re.match(value_pattern, ours):
        return [f"{where}: {ours!r} is not shaped as BookKeeper's values ({value_pattern})"]
    out: list[str] = []
    if isinstance(theirs, dict) and keyed_by is not None:
        for key in fixed_keys:
            out += [f"{where}: no field {key!r}"] if key not in ours else mismatches(ours[key], theirs[key], f"{where}.{key}")
        example = next(v for k, v in theirs.items() if k not in fixed_keys)
        for key, value in ours.items():
            if key in fixed_keys:
                continue
            if not re.match(keyed_by, key):
                out.append(f"{where}: key {key!r} is not shaped as BookKeeper's keys ({keyed_by})")
            out += mismatches(value, example, f"{where}[{key!r}]", value_pattern=value_pattern)
    elif isinstance(theirs, dict):
        for key, value in theirs.items():
            out += [f"{where}: no field {key!r}"] if key not in ours else mismatches(
                ours[key], value, f"{where}.{key}", value_pattern=value_pattern)
    elif isinstance(theirs, list) and theirs:
        for i, value in enumerate(ours):
            out += mismatches(value, theirs[0], f"{where}[{i}]", value_pattern=value_pattern)
    return out


def test_the_shape_check_catches_renames_retypes_and_foreign_keys() -> None:
    assert mismatches({"readOnly": False, "extra": 1}, {"readOnly": True}) == []
    assert mismatches({"read_only": False}, {"readOnly": True}) == ["$: no field 'readOnly'"]
    assert mismatches({"is_in_force_gc": False}, {"is_in_force_gc": "false"})[0].startswith("$.is_in_force_gc")
    assert mismatches({"bookies": []}, {"a": "h"}, keyed_by=r"^[^:]+:[0-9]+$")
    assert mismatches({"h:1": None}, {"a": None}, keyed_by=r"^[^:]+:[0-9]+$") == []
    assert mismatches({"k": "Pos - x"}, {"k": "Pos - 1"}, value_pattern=r"^Pos - [0-9]+$")


class Bookies:
    """Two bookie processes with admin HTTP (the first runs the auditor) and one written ledger."""

    def __init__(self, cluster: LocalCluster, ports: list[int], ledger_id: int) -> None:
        self.cluster = cluster
        self.ports = ports
        self.ledger_id = ledger_id

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[0], timeout=60)
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Ledger-Password": PASSWORD}
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bookies]:
    cluster, ports = start_http_cluster(tmp_path_factory.mktemp("bk-bodies"), 2, TOKEN,
                                        lambda i: "[bookie.autorecovery]\nenabled = true\n" if i == 0 else "")
    try:
        async def write() -> int:
            async with Client(metadata=cluster.metadata) as client:
                lh = await client.create_ledger(2, 2, 2, password=PASSWORD.encode())
                for payload in (b"hello 0", b"caf\xc3\xa9 1", b"\x00\xff 2"):
                    await lh.append(payload)
                await lh.close()
                return lh.ledger_id

        b = Bookies(cluster, ports, asyncio.run(asyncio.wait_for(write(), 120)))
        _wait("an elected auditor", lambda: b.request("GET", "/api/v1/autorecovery/who_is_auditor")[0] == 200)
        yield b
    finally:
        cluster.stop()


async def _under_replicated(metadata: str, mark: bool) -> None:
    from ledgerstore.plugins import create_metadata_store
    from ledgerstore.recovery.markers import UnderReplicationManager

    store = create_metadata_store(metadata)
    await store.start()
    try:
        urm = UnderReplicationManager(store)
        for lid, missing in UNDER_REPLICATED.items():
            await (urm.mark(lid, set(missing)) if mark else urm.remove(lid))
    finally:
        await store.close()


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_endpoint_answers_bookkeepers_documented_body(bookies: Bookies, name: str) -> None:
    fixture = json.loads((FIXTURES / f"{name}.json").read_text())
    assert fixture["source"].endswith("site3/website/docs/admin/http.md") and fixture["section"]
    path = fixture["path"].format(ledger_id=bookies.ledger_id)
    under_replication = path.startswith("/api/v1/autorecovery/list_under_replicated_ledger")
    if under_replication:  # replication paused, so that no worker takes the made-up markers away
        assert bookies.request("PUT", "/api/v1/autorecovery/status?enabled=false")[0] == 200
        asyncio.run(_under_replicated(bookies.cluster.metadata, mark=True))
    try:
        status, raw = bookies.request(fixture["method"], path, fixture.get("request_body"))
    finally:
        if under_replication:
            asyncio.run(_under_replicated(bookies.cluster.metadata, mark=False))
            bookies.request("PUT", "/api/v1/autorecovery/status?enabled=true")
    assert status == 200, (path, raw)
    ours = json.loads(raw)
    problems = mismatches(ours, fixture["body"], keyed_by=fixture.get("keyed_by"),
                          fixed_keys=tuple(fixture.get("fixed_keys", ())), value_pattern=fixture.get("value_pattern"))
    assert not problems, f"{path} differs from BookKeeper's body ({fixture['section']}): {problems}"
    if fixture.get("keyed_by"):
        assert set(ours) - set(fixture.get("fixed_keys", ())), f"{path}: an empty map proves nothing"


def test_bodies_keyed_by_ids_hold_what_bookkeeper_puts_there(bookies: Bookies) -> None:
    lid = bookies.ledger_id
    ids = sorted(bookies.cluster.bookie_id(i) for i in range(2))

    def get(path: str) -> Any:
        status, raw = bookies.request("GET", path)
        assert status == 200, (path, raw)
        return json.loads(raw)

    assert get("/api/v1/bookie/list_bookies") == dict.fromkeys(ids)  # type=rw is the default, as BookKeeper
    assert get("/api/v1/bookie/list_bookies?type=ro") == {}
    assert get("/api/v1/bookie/list_bookies?print_hostnames=true") == {i: i.rsplit(":", 1)[0] for i in ids}
    assert sorted(b["bookie_id"] for b in get("/api/v1/bookie/list_bookies?type=all&details=true")["bookies"]) == ids
    # BookKeeper decodes payloads as US-ASCII: other bytes become U+FFFD
    assert get(f"/api/v1/ledger/read?ledger_id={lid}") == {"0": "hello 0", "1": "caf\ufffd\ufffd 1", "2": "\x00\ufffd 2"}
    assert get(f"/api/v1/ledger/read?ledger_id={lid}&start_entry_id=1&end_entry_id=1") == {"1": "caf\ufffd\ufffd 1"}
    assert get(f"/api/v1/ledger/read?ledger_id={lid}&page=1") == {
        "Entries for page: ": "1", "0": "hello 0", "1": "caf\ufffd\ufffd 1", "2": "\x00\ufffd 2"}
    detailed = get(f"/api/v1/ledger/read?ledger_id={lid}&details=true")
    assert [e["data_base64"] for e in detailed["entries"]] == ["aGVsbG8gMA==", "Y2Fmw6kgMQ==", "AP8gMg=="]
    assert detailed["last_add_confirmed"] == 2
    assert get("/api/v1/ledger/list") == {str(lid): None}
    as_text = get("/api/v1/ledger/list?print_metadata=true")[str(lid)]
    assert json.loads(as_text)["state"] == "CLOSED"
    assert get("/api/v1/ledger/list?print_metadata=true&decode_meta=true")[str(lid)]["state"] == "CLOSED"
    assert get("/api/v1/ledger/list?print_metadata=true&page=2") == {}  # one ledger: page 2 is empty
    md = get(f"/api/v1/ledger/metadata?ledger_id={lid}")
    assert list(md) == [str(lid)] and md[str(lid)]["last_entry_id"] == 2
    (key, value), = get("/api/v1/bookie/last_log_mark").items()
    mark = get("/api/v1/bookie/last_log_mark?details=true")["last_log_mark"]
    assert (key, value) == (f"LastLogMark: Journal Id - {mark['file_id']}({mark['file_id']:x}.txn)",
                            f"Pos - {mark['offset']}")
    assert get("/api/v1/bookie/gc") == {"is_in_force_gc": "false"}
    assert get("/api/v1/bookie/state")["availableForHighPriorityWrites"] is True
    info = get("/api/v1/bookie/info")
    assert info["totalSpace"] == info["total_bytes"] > info["freeSpace"] > 0


def test_bookkeepers_gc_request_body_forces_the_compactions_it_names(bookies: Bookies) -> None:
    def gc(body: object) -> Any:
        status, raw = bookies.request("PUT", "/api/v1/bookie/gc", body)
        assert status == 200, raw
        return json.loads(raw)["compaction"]

    # BookKeeper's TriggerGCService: {"forceMajor", "forceMinor"}, a switch left out is on
    assert gc({"forceMajor": True, "forceMinor": False}) == "major"
    assert gc({"forceMajor": "false", "forceMinor": "true"}) == "minor"  # BookKeeper parses strings too
    assert gc({"forceMajor": False}) == "minor"
    assert gc({"forceMajor": False, "forceMinor": False}) is None
    status, _ = bookies.request("PUT", "/api/v1/bookie/gc", {"forceMajor": "perhaps"})
    assert status == 400


def test_server_config_takes_bookkeepers_names_for_the_settings_that_change_at_run_time(bookies: Bookies) -> None:
    def put(body: object) -> tuple[int, Any]:
        status, raw = bookies.request("PUT", "/api/v1/config/server_config", body)
        return status, json.loads(raw)

    assert put({"diskUsageThreshold": 0.97, "minorCompactionInterval": 7200}) == (
        200, {"updated": {"disk_usage_threshold": 0.97, "minor_compaction_interval_s": 7200.0}})
    try:
        status, raw = bookies.request("GET", "/api/v1/config/server_config")
        cfg = json.loads(raw)
        assert (cfg["disk_usage_threshold"], cfg["minor_compaction_interval_s"]) == (0.97, 7200.0)
        status, err = put({"journalDirectories": "/elsewhere"})  # not a run-time setting: named in the refusal
        assert status == 400 and "'journalDirectories' cannot be changed on a running bookie" in err["error"]
    finally:
        assert put({"diskUsageThreshold": 0.95, "minorCompactionInterval": 3600})[0] == 200
