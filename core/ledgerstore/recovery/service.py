"""The auto-recovery service of one process: an auditor candidate (which runs the auditor while
elected) and a replication worker, beside a bookie or on its own (``ledgerstore autorecovery``).

Inside a bookie it also watches ``/underreplication/decommission/<its id>`` and turns the
bookie read-only when it is being decommissioned, so that no new ledger is placed on it and
writers move their open ledgers off it by ensemble changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ledgerstore.aio import Client
from ledgerstore.api import Notification, Subscription
from ledgerstore.config import AutoRecoveryConfig, ClientConfig
from ledgerstore.errors import LedgerStoreError
from ledgerstore.recovery.auditor import Auditor
from ledgerstore.recovery.election import AuditorElection
from ledgerstore.recovery.markers import DECOMMISSION
from ledgerstore.recovery.worker import ReplicationWorker

log = logging.getLogger(__name__)


class RecoveryService:
    """Start with ``await start()``, stop with ``await stop()``.

    ``process_id`` names this process as auditor candidate and worker (a bookie uses its bookie
    id). ``on_decommission`` is awaited once when ``/underreplication/decommission/<process_id>``
    appears (a bookie passes a callback that makes it read-only).
    """

    def __init__(self, client_config: ClientConfig, settings: AutoRecoveryConfig, process_id: str | None = None,
                 on_decommission: Callable[[], Awaitable[None]] | None = None, *, client: Client | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.process_id = process_id or f"autorecovery-{socket.gethostname()}-{os.getpid()}"
        #: ``client`` and the clocks are seams (the simulation passes its own)
        self.client = client or Client(config=client_config)
        self.clock = clock
        self.wall_clock = wall_clock
        self.on_decommission = on_decommission
        self.election: AuditorElection | None = None
        self.worker: ReplicationWorker | None = None
        self.auditor: Auditor | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._auditor_task: asyncio.Task[None] | None = None
        self._decom_sub: Subscription | None = None
        self._decommissioned = False

    @classmethod
    def for_bookie(cls, bookie: Any) -> RecoveryService:
        """The service a bookie runs when ``[bookie.autorecovery] enabled = true``."""
        cfg = bookie.config
        client_config = ClientConfig(metadata=cfg.metadata, metadata_options=dict(cfg.metadata_options),
                                     transport=dict(cfg.autorecovery.client_transport),
                                     placement=cfg.autorecovery.placement,
                                     placement_options=dict(cfg.autorecovery.placement_options),
                                     max_frame_size=cfg.max_frame_size)
        return cls(client_config, cfg.autorecovery, bookie.bookie_id,
                   on_decommission=lambda: bookie.set_read_only(True))

    async def start(self) -> None:
        await self.client.start()
        store = self.client.store
        assert store is not None
        self.election = AuditorElection(store, self.process_id)
        await self.election.start()
        self.worker = ReplicationWorker(self.client, self.settings, self.process_id, clock=self.wall_clock)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.worker.run(), name="replication-worker"))
        self._tasks.append(loop.create_task(self._follow_election(), name="auditor-supervisor"))
        if self.on_decommission is not None:
            self._decom_sub = await store.watch(f"{DECOMMISSION}/{self.process_id}", self._on_decommission_event)
            await self._check_decommission()
        log.info("auto-recovery started as %s", self.process_id)

    async def stop(self) -> None:
        """Stop the auditor, worker and candidacy, then the client. Each step is bounded, so a
        stuck peer connection cannot hold up the shutdown of the bookie around this service."""
        if self._decom_sub is not None:
            self._decom_sub.cancel()
        tasks = [*self._tasks, *([self._auditor_task] if self._auditor_task else [])]
        self._tasks.clear()
        self._auditor_task = None
        for t in tasks:
            t.cancel()

        async def drain() -> None:
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

        await self._bounded("stopping the auditor and worker", drain())
        if self.election is not None:
            await self._bounded("leaving the auditor election", self.election.stop())
        await self._bounded("closing the auto-recovery client", self.client.close())

    @staticmethod
    async def _bounded(what: str, coro: Awaitable[None], timeout: float = 5.0) -> None:
        try:
            await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            log.warning("auto-recovery shutdown: %s took over %.0fs; going on without it", what, timeout)
        except LedgerStoreError as exc:
            log.warning("auto-recovery shutdown: %s failed: %s", what, exc)

    @property
    def is_auditor(self) -> bool:
        return self.election is not None and self.election.is_auditor

    async def _follow_election(self) -> None:
        assert self.election is not None and self.client.store is not None
        while True:
            await self.election.changed.wait()
            self.election.changed.clear()
            running = self._auditor_task is not None and not self._auditor_task.done()
            if self.election.is_auditor and not running:
                log.info("%s is the auditor", self.process_id)
                self.auditor = Auditor(self.client.store, self.settings, self.clock, self.wall_clock)
                self._auditor_task = asyncio.get_running_loop().create_task(self.auditor.run(), name="auditor")
            elif not self.election.is_auditor and running:
                assert self._auditor_task is not None
                log.info("%s is no longer the auditor (%s is)", self.process_id, self.election.auditor)
                self._auditor_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._auditor_task
                self._auditor_task = None

    def _on_decommission_event(self, _n: Notification) -> None:
        asyncio.get_running_loop().create_task(self._check_decommission())

    async def _check_decommission(self) -> None:
        assert self.client.store is not None and self.on_decommission is not None
        if self._decommissioned:
            return
        if await self.client.store.get(f"{DECOMMISSION}/{self.process_id}") is not None:
            self._decommissioned = True
            log.warning("%s is being decommissioned: turning read-only", self.process_id)
            try:
                await self.on_decommission()
            except LedgerStoreError as exc:
                self._decommissioned = False
                log.warning("could not turn read-only for decommissioning: %s", exc)


async def run_standalone(client_config: ClientConfig, settings: AutoRecoveryConfig, process_id: str | None = None,
                         ready: Callable[[RecoveryService], None] | None = None) -> None:
    """Run an auditor candidate and a worker until SIGTERM/SIGINT (``ledgerstore autorecovery``)."""
    import signal

    service = RecoveryService(client_config, settings, process_id)
    await service.start()
    if ready is not None:
        ready(service)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await service.stop()
