"""A bookie's registration follows its disks even when the metadata store or a check fails once.

The disk check turns a bookie read-only past ``disk_usage_threshold`` and writable again below
``disk_usage_lwm``, and publishes the new state in its registration (BookKeeper's
``StateManager``). A registration update that fails (a metadata timeout under load) must be
published again at the next check, not forgotten; and a check that raises must not end the loop,
or the bookie would keep the state it had whatever its disks did next."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TypeVar

from ledgerstore.bookie.server import Bookie
from ledgerstore.cluster import free_ports
from ledgerstore.config import BookieConfig
from ledgerstore.errors import MetadataError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.startup import start_metadata_store
from ledgerstore.testing.faults import FaultyMetadataStore

_S = TypeVar("_S", bound=FaultyMetadataStore)


class _FailingEphemerals(FaultyMetadataStore):
    """Fails the next ``fail`` ephemeral writes under ``prefix`` (a registration update)."""

    prefix = ""
    fail = 0

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        if self.fail and key.startswith(self.prefix):
            self.fail -= 1
            raise MetadataError("injected: the registration update timed out")
        return await self.inner.put_ephemeral(key, value)


def _config(tmp_path: Path) -> BookieConfig:
    (port,) = free_ports(1)
    return BookieConfig(metadata=f"sqlite://{tmp_path / 'meta.db'}", listen=f"tcp://127.0.0.1:{port}",
                        metadata_options={"server": "never"}, auto_init_cluster=True,
                        journal_dir=str(tmp_path / "journal"), ledger_dirs=[str(tmp_path / "ledgers")],
                        disk_usage_threshold=0.9, disk_usage_lwm=0.8, disk_check_interval_ms=50)


async def _wait_listed(registry: BookieRegistry, bookie_id: str, read_only: bool) -> None:
    deadline = time.monotonic() + 10
    while True:
        infos = await (registry.read_only() if read_only else registry.writable())
        if bookie_id in {i.bookie_id for i in infos}:
            return
        assert time.monotonic() < deadline, f"{bookie_id} never registered as {'read-only' if read_only else 'writable'}"
        await asyncio.sleep(0.05)


async def _start(tmp_path: Path, wrapper: type[_S], used: list[int]) -> tuple[_S, Bookie, BookieRegistry]:
    """A bookie on a sqlite store behind ``wrapper``, its disks' usage as the test says (total 100,
    ``used[0]`` used)."""
    cfg = _config(tmp_path)
    store = wrapper(await start_metadata_store(cfg.metadata, dict(cfg.metadata_options), 10))
    bookie = Bookie(cfg, metadata_store=store)
    bookie.disk_usage = lambda: (100, used[0], 100 - used[0])  # type: ignore[method-assign]
    await bookie.start()
    return store, bookie, BookieRegistry(store)


def test_a_failed_registration_update_is_published_again_at_the_next_check(tmp_path: Path) -> None:
    async def main() -> None:
        used = [10]
        store, bookie, registry = await _start(tmp_path, _FailingEphemerals, used)
        try:
            await _wait_listed(registry, bookie.bookie_id, read_only=False)
            used[0] = 95
            await _wait_listed(registry, bookie.bookie_id, read_only=True)
            # the update back to writable fails twice; the bookie is writable all the same
            store.prefix, store.fail = f"{layout.AVAILABLE}/", 2
            used[0] = 10
            await _wait_listed(registry, bookie.bookie_id, read_only=False)
            assert store.fail == 0 and not bookie.read_only
            assert bookie.bookie_id not in {i.bookie_id for i in await registry.read_only()}
        finally:
            await bookie.stop()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_disk_check_that_raises_does_not_end_the_checks(tmp_path: Path) -> None:
    async def main() -> None:
        used = [10]
        store, bookie, registry = await _start(tmp_path, FaultyMetadataStore, used)
        calls = [0]

        def broken_once() -> tuple[int, int, int]:
            calls[0] += 1
            if calls[0] == 1:
                raise OSError(5, "Input/output error", "statvfs of the ledger directory")
            return (100, used[0], 100 - used[0])

        try:
            await _wait_listed(registry, bookie.bookie_id, read_only=False)
            bookie.disk_usage = broken_once  # type: ignore[method-assign]
            used[0] = 95
            await _wait_listed(registry, bookie.bookie_id, read_only=True)
            assert calls[0] > 1 and bookie.read_only
        finally:
            await bookie.stop()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), 60))
