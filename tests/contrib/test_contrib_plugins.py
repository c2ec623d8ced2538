"""The contrib distributions, installed into the environment as a user installs them
(``pip install -e contrib/ledgerstore-memory``, ``pip install -e contrib/plugin-template``), and
found only through their entry points: never imported by name here."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledgerstore.api import MetadataStore, PlacementPolicy
from ledgerstore.errors import PluginError
from ledgerstore.plugins import create_metadata_store, describe_plugins, hooks, load_driver
from ledgerstore.ports import free_ports
from ledgerstore.testing import MetadataStoreConformance, PlacementPolicyConformance

T = TypeVar("T")

MEMORY_DIST = "ledgerstore-memory"
TEMPLATE_DIST = "ledgerstore-example-plugin"
TEMPLATE_HOOKS = "example-plugin"


def _missing_distributions() -> list[str]:
    import importlib.metadata

    missing = []
    for name in (MEMORY_DIST, TEMPLATE_DIST):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


@pytest.fixture(autouse=True)
def _contrib_installed() -> None:
    """Fail (not skip) when the contrib distributions are absent: these tests exist to prove the
    installed plugins work, and scripts/setup.sh installs them."""
    missing = _missing_distributions()
    if missing:
        pytest.fail(
            f"contrib distributions not installed: {', '.join(missing)}; run "
            "pip install -e contrib/ledgerstore-memory -e contrib/plugin-template"
        )


def _fresh_memory_uri() -> str:
    return f"memory://contrib-{uuid.uuid4().hex}"


async def _wipe(uri: str) -> None:
    store = create_metadata_store(uri)
    await store.start()
    await store.delete_recursive("/")
    await store.close()


# --- (a) discovery ---------------------------------------------------------------------------------


def test_memory_store_is_found_through_its_entry_point() -> None:
    cls = load_driver("metadata", "memory")
    assert issubclass(cls, MetadataStore)
    assert cls.__module__.startswith("ledgerstore_memory")
    store = create_metadata_store("memory://discovery")
    assert isinstance(store, cls)


def test_plugins_command_lists_contrib_plugins_with_their_distributions() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ledgerstore", "plugins", "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rows = {(r["slot"], r["name"]): r for r in json.loads(done.stdout)}
    memory = rows[("metadata", "memory")]
    assert memory["distribution"] == MEMORY_DIST and memory["status"] == "ok"
    assert memory["target"] == "ledgerstore_memory:MemoryMetadataStore"
    placement = rows[("placement", "round-robin")]
    assert placement["distribution"] == TEMPLATE_DIST and placement["status"] == "ok"
    hook_row = rows[("hooks", TEMPLATE_HOOKS)]
    assert hook_row["distribution"] == TEMPLATE_DIST and hook_row["status"] == "ok"


def test_a_missing_plugin_names_the_slot_the_name_and_what_is_installed() -> None:
    with pytest.raises(PluginError) as info:
        create_metadata_store("memcached://127.0.0.1:11211")
    message = str(info.value)
    assert "no metadata backend named 'memcached'" in message
    assert "ledgerstore.metadata" in message
    assert "memory" in message.split("installed:")[1]
    assert "install the distribution that provides it" in message


def test_describe_plugins_reports_no_contrib_load_errors() -> None:
    contrib = [p for p in describe_plugins() if p.distribution in (MEMORY_DIST, TEMPLATE_DIST)]
    assert {(p.slot, p.name) for p in contrib} == {
        ("metadata", "memory"),
        ("placement", "round-robin"),
        ("hooks", TEMPLATE_HOOKS),
    }
    assert [p.error for p in contrib] == ["", "", ""]


# --- (b) the memory store passes the metadata conformance suite -----------------------------------


class TestMemoryStoreFromEntryPoint(MetadataStoreConformance):
    ephemeral_timeout = 2.0

    @pytest.fixture
    def store_factory(self) -> Iterator[Callable[[], MetadataStore]]:
        uri = _fresh_memory_uri()
        yield lambda: create_metadata_store(uri)
        asyncio.run(_wipe(uri))


# --- (c) the template: placement by entry point, hooks registered and called ----------------------


class TestTemplatePlacementFromEntryPoint(PlacementPolicyConformance):
    @pytest.fixture
    def policy(self) -> PlacementPolicy:
        return load_driver("placement", "round-robin")()


def test_template_hook_implementation_is_registered() -> None:
    pm = hooks()
    plugin = pm.get_plugin(TEMPLATE_HOOKS)
    assert plugin is not None, [pm.get_name(p) for p in pm.get_plugins()]
    implemented = {caller.name for caller in pm.get_hookcallers(plugin) or []}
    assert {"ledgerstore_ledger_created", "ledgerstore_ledger_closed", "ledgerstore_cli_commands"} <= implemented


class _LoopThread:
    """An event loop on a background thread: where a notebook would run in-process bookies."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bookies", daemon=True)
        self.thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def bookie_thread() -> Iterator[_LoopThread]:
    lt = _LoopThread()
    yield lt
    lt.close()


def test_client_and_in_process_bookies_share_a_memory_namespace_with_round_robin_placement(
    tmp_path: Path, bookie_thread: _LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Three bookies on a background loop and a client on the main loop, all on one
    ``memory://`` namespace: the bookies register there, the client finds them, places two
    ledgers with the template's round-robin policy, writes and reads back real entries over TCP,
    and the template's hooks log each ledger's creation and close."""
    from ledgerstore.aio import Client
    from ledgerstore.bookie.server import Bookie
    from ledgerstore.config import load_bookie_config

    uri = _fresh_memory_uri()
    bookies = [
        Bookie(
            load_bookie_config(
                None,
                metadata=uri,
                auto_init_cluster=True,  # a fresh memory:// namespace holds no cluster yet
                # A real port, not 0: the bookie id (and so its cookie) is fixed before it listens.
                listen=f"tcp://127.0.0.1:{port}",
                journal_dir=str(tmp_path / f"b{i}" / "journal"),
                ledger_dirs=[str(tmp_path / f"b{i}" / "ledgers")],
            )
        )
        for i, port in enumerate(sorted(free_ports(3)))
    ]

    async def main() -> None:
        for b in bookies:
            await bookie_thread.run(b.start())
        try:
            async with Client(metadata=uri, placement="round-robin", ensemble=3, write_quorum=2, ack_quorum=2) as client:
                registered = sorted(b.bookie_id for b in await client.list_bookies())
                assert registered == sorted(b.bookie_id for b in bookies)

                first = await client.create_ledger(password=b"pw")
                second = await client.create_ledger(password=b"pw")
                e1, e2 = first.metadata.current_ensemble, second.metadata.current_ensemble
                assert e1 == registered and e2 == registered[1:] + registered[:1]

                for i in range(20):
                    await first.append(b"entry-%d" % i)
                await first.close()
                await second.close()
                reader = await client.open_ledger(first.ledger_id, password=b"pw")
                entries = await reader.read(0, 19)
                assert [e.payload for e in entries] == [b"entry-%d" % i for i in range(20)]
                await reader.close()

                await bookie_thread.run(bookies[0].stop())
                # The stopped bookie's registration was ephemeral in the shared namespace.
                for _ in range(100):
                    if len(await client.list_bookies()) == 2:
                        break
                    await asyncio.sleep(0.05)
                assert sorted(b.bookie_id for b in await client.list_bookies()) == registered[1:]
        finally:
            for b in bookies:
                await bookie_thread.run(b.stop())

    with caplog.at_level(logging.INFO, logger="ledgerstore_example_plugin"):
        asyncio.run(asyncio.wait_for(main(), 120))
        asyncio.run(_wipe(uri))
    logged = [r.getMessage() for r in caplog.records if r.name == "ledgerstore_example_plugin"]
    assert any(m.startswith("ledger ") and " created on " in m and "(ensemble 3, write quorum 2, ack quorum 2)" in m
               for m in logged), logged
    assert sum(" created on " in m for m in logged) == 2, logged
    assert any(m.endswith("closed at entry 19") for m in logged), logged
