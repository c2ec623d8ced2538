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
from pathlib import Path
from typing import Any

from ledgerstore.bookie.journal import Journal
from ledgerstore.bookie.server import Bookie
from ledgerstore.client.client import Client
from ledgerstore.config import BookieConfig, ClientConfig
from ledgerstore.sim.disk import EngineDisk, SimStorageEngine
from ledgerstore.sim.files import SimFileSystem
from ledgerstore.sim.loop import VirtualTimeLoop
from ledgerstore.sim.metadata import SimMetadata, SimMetadataStore
from ledgerstore.sim.network import SimNetwork, SimTransport
from ledgerstore.sim.trace import Trace

log = logging.getLogger(__name__)


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
            ledger_dirs=[str(root / "ledgers")], storage="sim", auto_init_cluster=True,
            flush_interval_ms=world.rng_for(f"{self.name}.flush").randint(1000, 10_000),
            gc_wait_time_ms=0, metadata_start_retry_s=0.0)
        #: the machine's files (the journal's), which outlive its processes
        self.files = SimFileSystem(world.rng_for(f"{self.name}.files"))
        self.engine_disk = EngineDisk()
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
        bookie = Bookie(self.config, metadata_store=self.store, transport=SimTransport(w.net, self.name),
                        engine=SimStorageEngine([Path(d) for d in self.config.ledger_dirs], disk=self.engine_disk),
                        journal_factory=journal)
        await bookie.start()
        self.bookie = bookie
        w.trace("bookie.start", f"{self.name} #{self._incarnation}")

    def crash(self, *, tear: bool = False) -> None:
        """Kill the process (the bookie's :meth:`~Bookie.abort`): no clean stop, connections
        break, the metadata session ends; on the disks, journal bytes not synced are lost (with
        ``tear``, a random prefix of the last write stays: a torn write) and so is the engine's
        unflushed state."""
        b = self.bookie
        if b is None:
            return
        self.bookie = None
        b.abort()
        if self.store is not None:
            self.store.crash()
        lost = self.files.crash(tear=tear)
        self.world.trace("bookie.crash", f"{self.name} lost {lost} journal bytes" + (" (torn)" if tear else ""))

    def wipe_disks(self) -> None:
        """New, empty disks (the bookie is down): as after ``bookieformat``."""
        self.files = SimFileSystem(self.world.rng_for(f"{self.name}.files.{self._incarnation}"))
        self.engine_disk = EngineDisk()

    def engine(self) -> SimStorageEngine | None:
        """The running process's storage engine (what it serves reads from)."""
        if self.bookie is None or not isinstance(self.bookie.engine, SimStorageEngine):
            return None
        return self.bookie.engine


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
        # the cheapest password check: its cost is CPU time outside the simulation, and a seed
        # creates and opens hundreds of ledgers from fresh clients (at the default cost the
        # key derivation took more than half of a run's wall time)
        config = {"password_check_cost": 2**10, **config}
        cfg = ClientConfig(metadata=f"sim://{node}", placement="random",
                           placement_options={"seed": self.rng_for(f"{node}.placement").getrandbits(32)}, **config)
        c = Client(config=cfg, metadata_store=SimMetadataStore(self.meta, node),
                   transport=SimTransport(self.net, node))
        self.clients.append(c)
        return c

    def close(self) -> None:
        """Let go of every bookie's directory locks (their files stay open for as long as a bookie
        lives, and a run leaves its last bookies running) and remove the scratch directory."""
        for b in self.bookies:
            if b.bookie is not None:
                b.bookie.ownership.release()
        shutil.rmtree(self.tmp, ignore_errors=True)

