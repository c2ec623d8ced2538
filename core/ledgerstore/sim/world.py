"""The simulated world: one seed, one loop, the network, the metadata server and the bookies.

Every random choice of a run comes from one :class:`random.Random` seeded with the run's seed;
each component gets its own generator derived from it (:meth:`World.rng_for`), so adding a draw
in one component does not shift the choices of another.
"""

from __future__ import annotations

import functools
import logging
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ledgerstore import plugins
from ledgerstore.api import StorageEngine
from ledgerstore.bookie.journal import Journal
from ledgerstore.bookie.server import Bookie
from ledgerstore.client.client import Client
from ledgerstore.config import BookieConfig, ClientConfig
from ledgerstore.sim.disk import DiskFaults
from ledgerstore.sim.files import SimFileSystem, SimProcessFiles
from ledgerstore.sim.loop import VirtualTimeLoop
from ledgerstore.sim.metadata import SimMetadata, SimMetadataStore
from ledgerstore.sim.network import SimNetwork, SimTransport
from ledgerstore.sim.trace import Trace

log = logging.getLogger(__name__)

#: the storage engine the simulated bookies run, over their simulated files
STORAGE = "entrylog"
#: its options: small buffers, pages, cache and logs, so that a run of a few hundred small
#: entries meets what a production bookie meets over hours: buffers written out, background
#: syncs, dirty pages evicted, logs rolled, and logs sparse enough to compact
STORAGE_OPTIONS = {"write_buffer_size": 2048, "flush_entrylog_bytes": 8192, "page_size": 128,
                   "page_limit_bytes": 2048, "entry_log_size_limit": 16384}
#: scrypt's cost N for the simulated clients' password checks: 2, the smallest scrypt takes,
#: below the 1024 a deployment may configure (``password_check_cost``). The checks are still
#: made, stored, verified and refused as in production; only their price goes, which is CPU time
#: outside the simulation: a seed creates and opens dozens of ledgers from fresh clients, and
#: at N=1024 their key derivation was the largest single cost of a seed (cProfile over seeds
#: 0..3: 327 derivations, 1.8 s; docs/simulation.md)
PASSWORD_CHECK_COST = 2


@functools.cache
def driver(slot: str, name: str) -> type:
    """The backend class registered as ``name`` in ``slot``, looked up once per process: each
    lookup reads every installed distribution's entry points (milliseconds), and a seed starts
    dozens of bookies and clients."""
    return plugins.load_driver(slot, name)


class SimBookie:
    """One bookie of the world: its disks outlive its process, which can crash and restart."""

    def __init__(self, world: World, index: int) -> None:
        self.world = world
        self.name = f"bookie-{index}"
        self.address = f"sim://{self.name}:3181"
        self.bookie_id = f"{self.name}:3181"
        root = world.tmp / self.name
        self.config = BookieConfig(
            metadata=f"sim://{self.name}", listen=self.address, journal_dir=str(root / "journal"),
            ledger_dirs=[str(root / "ledgers")], storage=STORAGE, storage_options=STORAGE_OPTIONS,
            auto_init_cluster=True, flush_interval_ms=world.rng_for(f"{self.name}.flush").randint(1000, 10_000),
            metadata_start_retry_s=0.0,
            # garbage collection every few seconds, compactions soon after (virtual time); the
            # timers without their jitter, which would draw from the run's global random and so
            # move every later draw of a seed's schedule (the checkpoint intervals differ, above)
            background_timer_jitter=0.0, gc_wait_time_ms=3000, minor_compaction_threshold=0.5, minor_compaction_interval_s=4,
            major_compaction_threshold=0.9, major_compaction_interval_s=15)
        #: the machine's files (the journal's and the storage engine's), which outlive its processes
        self.files = self._new_disks(world.rng_for(f"{self.name}.files"))
        self.bookie: Bookie | None = None
        self.store: SimMetadataStore | None = None
        self._incarnation = 0
        self.starting = False

    @property
    def running(self) -> bool:
        return self.bookie is not None

    async def start(self) -> None:
        """Start the real :class:`Bookie` on the simulated disks, network and metadata store
        (nothing if it runs or is starting)."""
        if self.bookie is not None or self.starting:
            return
        self.starting = True
        try:
            await self._start()
        finally:
            self.starting = False

    async def _start(self) -> None:
        self._incarnation += 1
        w = self.world
        self.store = SimMetadataStore(w.meta, self.name)
        # the production journal on the simulated files, its group commit on the loop, each fsync
        # taking a random virtual time (answers go out only after it, as on a real bookie)
        fsync = w.rng_for(f"{self.name}.journal.{self._incarnation}")
        journal = functools.partial(Journal, files=self.files,
                                    commit_on_loop=functools.partial(fsync.uniform, 0.0005, 0.004))
        # the production entry-log engine on the same simulated files, its write-back run as
        # callbacks of the loop instead of on its thread
        engine = plugins.construct("storage", STORAGE, driver("storage", STORAGE),
                                   [Path(d) for d in self.config.ledger_dirs], options=STORAGE_OPTIONS,
                                   files=SimProcessFiles(self.files), schedule=w.loop.call_soon)
        bookie = Bookie(self.config, metadata_store=self.store, transport=SimTransport(w.net, self.name),
                        engine=engine, journal_factory=journal, repair_client=self._repair_client)
        await bookie.start()
        self.bookie = bookie
        w.trace("bookie.start", f"{self.name} #{self._incarnation}")

    async def _repair_client(self) -> Client:
        """The client the bookie repairs its limbo ledgers through: a process of this machine."""
        return await self.world.client(self.name).start()

    @property
    def journal_dir(self) -> Path:
        """The journal's directory on this machine's disks."""
        return Path(self.config.journal_dir)

    def crash(self, *, tear: bool = False) -> None:
        """Kill the process (the bookie's :meth:`~Bookie.abort`): no clean stop, connections
        break, the metadata session ends; on the disks, every byte not synced is lost, the
        journal's and the storage engine's (with ``tear``, a random prefix of the last write
        stays: a torn write)."""
        b = self.bookie
        if b is None:
            return
        self.bookie = None
        b.abort()
        if self.store is not None:
            self.store.crash()
        lost = self.files.crash(tear=tear)
        self.world.trace("bookie.crash", f"{self.name} lost {lost} unsynced bytes" + (" (torn)" if tear else ""))

    def _new_disks(self, rng: random.Random) -> SimFileSystem:
        return SimFileSystem(rng, engine_roots=tuple(Path(d) for d in self.config.ledger_dirs))

    def wipe_disks(self) -> None:
        """New, empty disks (the bookie is down): as after ``bookieformat``."""
        self.files = self._new_disks(self.world.rng_for(f"{self.name}.files.{self._incarnation}"))

    @property
    def disk_faults(self) -> DiskFaults:
        """How the ledger disk misbehaves now (:class:`~ledgerstore.sim.disk.DiskFaults`)."""
        return self.files.disk

    @disk_faults.setter
    def disk_faults(self, faults: DiskFaults) -> None:
        self.files.disk = faults

    def engine(self) -> StorageEngine | None:
        """The running process's storage engine (what it serves reads from)."""
        return None if self.bookie is None else self.bookie.engine

    def stored(self, ledger_ids: Iterable[int] | None = None) -> dict[int, set[int]]:
        """The entries the running process's engine holds, by ledger (of ``ledger_ids``, or
        every ledger it stores), read through the engine's own API with the disk's faults held
        off (nothing if the bookie is down): what the final checks count as stored."""
        engine = self.engine()
        if engine is None:
            return {}
        faults, self.files.disk = self.files.disk, DiskFaults()
        try:
            held: dict[int, set[int]] = {}
            for lid in engine.list_ledgers() if ledger_ids is None else ledger_ids:
                if not engine.has_ledger(lid):
                    continue
                got = engine.get_entries(lid, range(engine.last_entry_id(lid) + 1))
                held[lid] = {eid for eid, r in enumerate(got) if isinstance(r, bytes)}
            return held
        finally:
            self.files.disk = faults


class World:
    """Everything one simulated run needs; ``close()`` removes its scratch directory."""

    def __init__(self, seed: int, loop: VirtualTimeLoop, bookies: int = 5) -> None:
        self.seed = seed
        self.loop = loop
        self.rng = random.Random(seed)
        self.trace = Trace(loop.clock)
        self.net = SimNetwork(loop, self.rng_for("net"), self.trace)
        self.meta = SimMetadata(loop, self.rng_for("meta"), self.trace)
        self.meta.paused = self.net.held  # a paused process is paused towards the store too
        self.tmp = Path(tempfile.mkdtemp(prefix=f"ledgerstore-sim-{seed}-"))
        self.bookies = [SimBookie(self, i + 1) for i in range(bookies)]
        self.clients: list[Client] = []

    def rng_for(self, component: str) -> random.Random:
        """A generator of its own for ``component``, derived from the seed and the name only."""
        return random.Random(f"{self.seed}/{component}")

    def bookie(self, name: str) -> SimBookie:
        """The bookie called ``name``."""
        return next(b for b in self.bookies if b.name == name)

    async def start_bookies(self) -> None:
        for b in self.bookies:
            await b.start()

    def client(self, node: str, **config: Any) -> Client:
        """A real :class:`ledgerstore.aio.Client` for the process ``node`` (not yet started)."""
        config = {"password_check_cost": PASSWORD_CHECK_COST, **config}
        cfg = ClientConfig(metadata=f"sim://{node}", placement="random",
                           placement_options={"seed": self.rng_for(f"{node}.placement").getrandbits(32)}, **config)
        # the placement policy built as the client builds it from its config, from the class found once
        placement = plugins.construct("placement", cfg.placement, driver("placement", cfg.placement),
                                      options=cfg.placement_options)
        c = Client(config=cfg, metadata_store=SimMetadataStore(self.meta, node),
                   transport=SimTransport(self.net, node), placement=placement)
        self.clients.append(c)
        return c

    def close(self) -> None:
        """Let go of every bookie's directory locks (their files stay open for as long as a bookie
        lives, and a run leaves its last bookies running) and remove the scratch directory."""
        for b in self.bookies:
            if b.bookie is not None:
                b.bookie.ownership.release()
        shutil.rmtree(self.tmp, ignore_errors=True)

