"""The bookie: wires its parts together and runs them.

The parts, each in its own module: the request processor (``processor.py``: decode, dispatch by
table, flow control, answer) and its read side (``reads.py``); the ledger rules and metadata
look-ups (``ledgers.py``: :class:`Ledgers`, :class:`LedgerLookup`); what it knows per ledger
(``ledger_state.py``); whether it takes writes (``state.py``, and the :class:`BookieStatus` it
reports); the journal (``journal.py``) and what it hands back (``completions.py``), built with
the look-ups and rules in one place (``parts.py``); the garbage collector (``gc.py``), disk usage
(``disks.py``), the cookie and data ownership (``cookie.py``, ``ownership.py``) and the admin
HTTP server (``http.py``). :class:`Bookie` owns them, starts them in order and stops them
(:meth:`Bookie.stop`), or drops them as a crash would (:meth:`Bookie.abort`).
``docs/architecture.md`` draws the layers and the write and read paths.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import (
    BookieInfo,
    MetadataStore,
    Server,
    ServerConnection,
    ServerLimits,
    SessionEvent,
    StorageEngine,
    Transport,
)
from ledgerstore.api.transport import split_address
from ledgerstore.bookie.compaction import CompactionControl
from ledgerstore.bookie.completions import Completion
from ledgerstore.bookie.cookie_validation import CookieOutcome, validate_cookie
from ledgerstore.bookie.counters import BookieCounters
from ledgerstore.bookie.disks import disk_usage
from ledgerstore.bookie.gc import GarbageCollector
from ledgerstore.bookie.http import AdminHttpServer, start_admin_http
from ledgerstore.bookie.journal import Journal, LogMark, read_mark
from ledgerstore.bookie.ledger_state import LedgerDescriptors
from ledgerstore.bookie.ledgers import RECOVERY_ADD_RESERVE_BYTES
from ledgerstore.bookie.limbo import Limbo, fence_in_limbo, ledgers_to_check, lost_data, write_ledger_marks
from ledgerstore.bookie.limbo_announce import LimboAnnouncer
from ledgerstore.bookie.ownership import Ownership
from ledgerstore.bookie.parts import JournalFactory, ServingParts
from ledgerstore.bookie.processor import RequestProcessor
from ledgerstore.bookie.repair import LimboRepair
from ledgerstore.bookie.state import BookieState, BookieStatus
from ledgerstore.bookie.timers import jittered
from ledgerstore.client.client import Client
from ledgerstore.config import BookieConfig, ClientConfig
from ledgerstore.errors import BookieDiskFullError, BookieUnavailableError, LedgerStoreError
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.plugins import build, create_transport, notify
from ledgerstore.proto import speedups
from ledgerstore.recovery.service import RecoveryService
from ledgerstore.stalls import peaks, probe_loop_lag, watch_gc
from ledgerstore.startup import (
    SUPERVISOR_PID_ENV,
    check_port_free,
    listen_error,
    prepare_dirs,
    set_parent_death_signal,
    start_metadata_store,
)

__all__ = ["RECOVERY_ADD_RESERVE_BYTES", "Bookie", "BookieCounters", "run_bookie", "watch_supervisor"]

log = logging.getLogger(__name__)


class Bookie:
    """One bookie. ``await start()`` then it serves until ``await stop()``."""

    def __init__(self, config: BookieConfig, *, metadata_store: MetadataStore | None = None,
                 transport: Transport | None = None, engine: StorageEngine | None = None,
                 journal_factory: JournalFactory = Journal,
                 repair_client: Callable[[], Awaitable[Client]] | None = None) -> None:
        """``config`` says what to build. The keyword arguments are seams for embedding and for
        the deterministic simulation (:mod:`ledgerstore.sim`): a given (unstarted) metadata store,
        transport or storage engine is used instead of the one the config names,
        ``journal_factory`` is called with :class:`Journal`'s arguments to build the journal, and
        ``repair_client`` starts the client that repairs limbo ledgers (by default one built
        from the config, as the auto-recovery's).

        The storage engine and the transport are built here, from their parsed options; what needs
        the running loop, a started metadata store or an open engine (the listening server, the
        journal, look-ups and ledger rules of :class:`ServingParts`, the admin HTTP server, the
        auto-recovery service) is made by :meth:`start` into the attributes declared here."""
        self.config = config
        self._journal_factory = journal_factory
        self.listen = config.listen
        self.advertised = config.advertised_address or config.listen
        _, host, port = split_address(self.advertised)
        self.bookie_id = f"{host}:{port}"
        self.journal_dir = Path(config.journal_dir)
        self.ledger_dirs = [Path(d) for d in config.ledger_dirs]
        #: the storage engine (opened by start(), closed by stop())
        self.engine: StorageEngine = engine if engine is not None else build(
            "storage", config.storage, self.ledger_dirs, options=config.storage_options)
        #: the server side of the transport ``listen`` names, its ``[transport]`` table parsed once
        self.transport: Transport = transport if transport is not None else create_transport(
            config.listen.partition("://")[0], max_frame_size=config.max_frame_size, options=config.transport)
        #: what the bookie allows its peers: its own settings, enforced by the transport's server
        self.limits = ServerLimits(
            max_unfinished_frame_bytes=config.max_unfinished_frame_bytes,
            unfinished_frame_timeout_s=config.unfinished_frame_timeout_s,
            max_connections=config.max_connections,
            idle_connection_timeout_s=config.idle_connection_timeout_s,
        )
        self._given_store = metadata_store
        #: what start() opened, so stop() closes exactly that: the metadata store, the engine
        self._store: MetadataStore | None = None
        self._engine_open = False
        self._server: Server | None = None
        self.state = BookieState(self.bookie_id, config.disk_usage_threshold, config.disk_usage_lwm)
        self.counters = BookieCounters()
        self.ledgers = LedgerDescriptors()
        #: the ledgers in limbo (this bookie lost data it may have held of them) and their record
        self.limbo = Limbo(self.ledgers.limbo)
        #: what the cookie check found (once started)
        self.cookie_outcome: CookieOutcome | None = None
        #: the journal position last left in the ledger directories (``limbo.write_ledger_marks``)
        self._ledger_mark: LogMark | None = None
        #: publishes the limbo count in the registration as the repair lowers it (the auditor
        #: leaves a repairing bookie's ledgers to it)
        self.limbo_announcer = LimboAnnouncer(lambda: len(self.limbo), self._register)
        #: repairs the limbo ledgers from their other replicas (runs while any is left)
        self.repair = LimboRepair(self.bookie_id, self.limbo, repair_client or self._repair_client, config.autorecovery,
                                  on_cleared=self.limbo_announcer.changed)
        self.processor = RequestProcessor(config, self.state, self.ledgers, self.counters)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._checkpoint_lock = threading.Lock()
        self._stopped = asyncio.Event()
        self._disk_check_now = asyncio.Event()
        #: one registration update at a time (the disk check, an admin's read-only switch and a
        #: restored session may each publish one; interleaved, the last delete could win)
        self._register_lock = asyncio.Lock()
        #: the read-only flag of the registration last published; None before the first and after
        #: a failed attempt, so the disk check publishes again until the store has the bookie's state
        self._published_read_only: bool | None = None
        self.instance_id: str | None = None
        self.started_at = 0.0
        #: compaction suspension switches and statistics (the admin API's gc endpoints)
        self.compaction = CompactionControl()
        self._collector: GarbageCollector | None = None
        #: the data directories' lock and cookie (held from start() until stop() or abort())
        self.ownership = Ownership(self.journal_dir, self.ledger_dirs)
        #: the journal, metadata look-ups and ledger rules the requests go through (once started)
        self.parts: ServingParts | None = None
        #: the admin HTTP server (with ``http_port``), once started
        self.http: AdminHttpServer | None = None
        #: the auto-recovery service (with ``[autorecovery] enabled``), once started
        self.recovery: RecoveryService | None = None

    # --- parts that exist once started ---------------------------------------------------------

    @property
    def store(self) -> MetadataStore:
        """The metadata store: the one given, or the config's once :meth:`start` started it."""
        store = self._store if self._store is not None else self._given_store
        if store is None:
            raise BookieUnavailableError(f"bookie {self.bookie_id} is not started: it has no metadata store yet")
        return store

    @property
    def registry(self) -> BookieRegistry:
        """Bookie registrations in :attr:`store`."""
        return BookieRegistry(self.store)

    @property
    def server(self) -> Server | None:
        """The listening server, once :meth:`start` bound it."""
        return self._server

    @property
    def journal(self) -> Journal[Completion] | None:
        """The journal, once :meth:`start` built it."""
        return self.parts.journal if self.parts is not None else None

    # --- views other parts read (admin API, metrics, hooks) ---------------------------------------

    @property
    def read_only(self) -> bool:
        """The bookie takes no adds (but recovery adds while its disks keep a reserve)."""
        return self.state.read_only

    @property
    def forced_read_only(self) -> bool:
        """Read-only was forced by an administrator."""
        return self.state.forced_read_only

    def status(self) -> BookieStatus:
        """What the bookie is doing now, for the admin API and metrics."""
        state = self.state
        stopping = self._stopped.is_set()
        journal_failed = self.journal is not None and self.journal.failed is not None
        return BookieStatus(
            serving=state.serving and not stopping,
            stopping=stopping,
            registered=state.registered.is_set(),
            read_only=state.read_only,
            forced_read_only=state.forced_read_only,
            journal_failed=journal_failed,
            # BookKeeper's high-priority writes are our recovery adds: a read-only bookie takes
            # them while its ledger disks keep the reserve
            takes_recovery_adds=not stopping and not journal_failed and (
                not state.read_only or self.disk_usage()[2] >= RECOVERY_ADD_RESERVE_BYTES),
            started_at=self.started_at,
            ledgers=len(self.ledgers.master_keys),
            lac_waiters=self.processor.waiters.count,
            requests_awaiting_metadata=self.parts.lookup.count if self.parts is not None else 0,
            ledgers_in_limbo=len(self.limbo),
        )

    @property
    def group_observer(self) -> Any:
        """Called on the event loop once per durable journal group with its record count (metrics)."""
        return self.processor.group_observer

    @group_observer.setter
    def group_observer(self, observer: Any) -> None:
        self.processor.group_observer = observer

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        # Everything that can fail for a reason the operator must fix (a directory, a plugin's
        # options, the metadata store, a port) is checked before the cookie is written: a failed
        # start leaves no cookie behind, in the directories or in the metadata store.
        prepare_dirs([("journal_dir", self.journal_dir), *(("ledger_dirs", d) for d in self.ledger_dirs)])
        if cfg.http_port:
            check_port_free("http_port", cfg.http_address, cfg.http_port)
        if self._given_store is not None:
            store = self._given_store
            await store.start()
        else:
            store = await start_metadata_store(cfg.metadata, bookie_metadata_options(cfg), cfg.metadata_start_retry_s)
        self._store = store
        # Bind first: with port 0 the bookie id (host:port) is only known once listening. Requests
        # that arrive before the journal runs are refused (see frames_received).
        try:
            self._server = server = await self.transport.serve(cfg.listen, self, self.limits)
        except OSError as exc:
            await store.close()
            raise listen_error("listen", cfg.listen, split_address(cfg.listen)[2], exc) from None
        if split_address(self.advertised)[2] == 0:  # port 0: advertise the real one
            self.advertised = server.address
            _, host, port = split_address(self.advertised)
            self.bookie_id = f"{host}:{port}"
            self.state.bookie_id = self.bookie_id
        try:
            # held until stop() (or the process's end): offline tools refuse these directories meanwhile
            self.ownership.acquire()
            await self._check_cookie()
        except BaseException:
            self.ownership.release()
            await server.close()
            await store.close()
            raise

        self.state.instance = secrets.randbits(63) + 1  # never 0, which means "not told"
        self._engine_open = True  # closed by stop() even if open() fails half-way, as before
        await asyncio.to_thread(self.engine.open)
        self.parts = parts = ServingParts.build(self.processor, self.engine, store, self.journal_dir, self._loop,
                                                disk_usage=self.disk_usage, on_disk_full=self.disk_full,
                                                journal_factory=self._journal_factory)
        # before the journal writes anything: the files it creates would hide the loss
        await asyncio.to_thread(self._check_data_integrity, parts)
        t0 = time.monotonic()
        replayed = await asyncio.to_thread(parts.journal.replay_into, parts.ledgers)
        if replayed:
            log.info("replayed %d journal records in %.2fs", replayed, time.monotonic() - t0)
        self.ledgers.load(self.engine)
        self.processor.attach(parts.ledgers, parts.journal, parts.lookup, self.ownership, self._loop)
        parts.journal.start(self._loop)
        if replayed:  # make the replayed state durable in the engine and move the mark past it
            await asyncio.to_thread(self.checkpoint)
        await self._enter_limbo(store)

        self.state.serving = True
        self._update_disk_state()
        if cfg.http_port:  # up before registration: "registered" implies the admin port answers
            self.http = await start_admin_http(self, cfg.http_address, cfg.http_port)
        await self._register()
        store.add_session_listener(self.on_session_event)
        self._tasks.append(asyncio.create_task(self._checkpoint_loop(), name="checkpoint"))
        self._tasks.append(asyncio.create_task(self._disk_check_loop(), name="disk-check"))
        if cfg.gc_wait_time_ms > 0:
            self._tasks.append(asyncio.create_task(self._gc().run(), name="gc"))
        self.started_at = time.time()
        if len(self.limbo):
            self.repair.bookie_id = self.bookie_id
            self._tasks.append(asyncio.create_task(self.limbo_announcer.run(), name="limbo-announcer"))
            self._tasks.append(asyncio.create_task(self.repair.run(), name="limbo-repair"))
        if cfg.autorecovery.enabled:
            self.recovery = RecoveryService.for_bookie(self)
            await self.recovery.start()
        log.info("bookie %s serving on %s (storage %s, journal %s, hot path: %s)", self.bookie_id, server.address,
                 cfg.storage, self.journal_dir, speedups.state)
        notify("ledgerstore_bookie_started", bookie=self)

    async def stop(self) -> None:
        """Stop serving, checkpoint, unregister. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        notify("ledgerstore_bookie_stopping", bookie=self)
        if self.recovery is not None:
            await self.recovery.stop()
        lookups = self.parts.lookup.tasks() if self.parts is not None else []
        for t in [*self._tasks, *lookups]:
            t.cancel()
        for t in [*self._tasks, *lookups]:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self._server is not None:
            await self._server.close()
        self.processor.reads.close()
        if self.http is not None:
            await self.http.close()
        journal = self.journal
        if journal is not None:
            await asyncio.to_thread(journal.close)
            if journal.failed is None:
                await asyncio.to_thread(self.checkpoint)
        if self._engine_open:
            await asyncio.to_thread(self.engine.close)
        if self._store is not None:
            try:
                await self.registry.unregister(self.bookie_id)
            except LedgerStoreError as exc:
                log.warning("could not unregister: %s", exc)
            await self._store.close()
        self.ownership.release()

    def abort(self) -> None:
        """Drop the bookie as a crash of its process would: it stops serving, its server drops
        every connection, its tasks and metadata look-ups are cancelled, its journal writes,
        syncs and answers nothing more, and its directory locks are let go; nothing is flushed,
        checkpointed or unregistered. What the process had written and not synced belongs to
        the file system, and the metadata session to the store: the caller gave them (the
        simulator's disks and store) and decides what a crash does to them."""
        self.state.serving = False
        lookups = self.parts.lookup.tasks() if self.parts is not None else []
        for t in [*self._tasks, *lookups]:
            t.cancel()
        self.processor.reads.close()
        if self.journal is not None:
            self.journal.abort()
        if self._server is not None:
            self._server.abort()
        self.ownership.release()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # --- cookie and registration ---------------------------------------------------------------

    async def _check_cookie(self) -> None:
        self.cookie_outcome = outcome = await validate_cookie(
            self.store, self.config, self.bookie_id, self.advertised, self.journal_dir, self.ledger_dirs)
        self.instance_id, self.ownership.cookie = outcome.instance_id, outcome.cookie

    # --- data integrity (limbo ledgers) ----------------------------------------------------------

    async def _repair_client(self) -> Client:
        """The client the limbo repair reads and writes through, configured as the auto-recovery's."""
        cfg = self.config
        return await Client(config=ClientConfig(
            metadata=cfg.metadata, metadata_options=dict(cfg.metadata_options),
            transport=dict(cfg.autorecovery.client_transport), max_frame_size=cfg.max_frame_size)).start()

    def _check_data_integrity(self, parts: ServingParts) -> None:
        """Read the limbo file and, with ``data_integrity_checking_enabled``, record durably
        when the directories lost what the cookie says they held (runs in a worker thread,
        before the journal is replayed or started)."""
        files = parts.journal.files
        self.limbo.open(self.journal_dir, files)
        outcome = self.cookie_outcome
        if not self.config.data_integrity_checking_enabled or outcome is None:
            return
        why = lost_data(self.journal_dir, files, fresh_cookie=outcome.fresh, restamped=outcome.restamped,
                        ledger_dirs=self.ledger_dirs)
        if why is not None:
            log.warning("bookie %s lost data: %s. Its ledgers go in limbo before it serves", self.bookie_id, why)
            self.limbo.begin()
            # the loss is recorded: the ledger directories' marks catch up, so that a start after
            # the repair does not find it again
            write_ledger_marks(self.journal_dir, self.ledger_dirs, read_mark(self.journal_dir, files), files)

    async def _enter_limbo(self, store: MetadataStore) -> None:
        """Finish what :meth:`_check_data_integrity` began: list the ledgers whose fragments
        name this bookie and put them in limbo, then fence (again, at each start) the ones
        among them, durably, before the bookie serves."""
        limbo = self.limbo
        if limbo.pending:
            mds, fence_only = await ledgers_to_check(store, self.bookie_id, self.ledgers.master_keys.keys())
            if set(fence_only) - self.ledgers.fenced:
                # durably, before the listing is recorded as complete (a crash in between lists again)
                self._fence_here(fence_only)
                await asyncio.to_thread(self.checkpoint)
            fenced = [md.ledger_id for md in mds if fence_in_limbo(md, self.bookie_id)]
            await asyncio.to_thread(limbo.mark, [md.ledger_id for md in mds], fenced)
            log.warning("bookie %s: %d ledgers in limbo (%d of them fenced here) until repaired from their "
                        "other replicas; %d closed ledgers that no longer name it fenced here again", self.bookie_id,
                        len(mds), len(fenced), len(fence_only))
        if not limbo.fenced - self.ledgers.fenced:
            return
        self._fence_here(limbo.fenced)
        await asyncio.to_thread(self.checkpoint)

    def _fence_here(self, ledger_ids: Iterable[int]) -> None:
        """Fence the ledgers in the engine and the bookie's rules (durable at the next checkpoint)."""
        for lid in sorted(ledger_ids):
            self.engine.set_fenced(lid)
            self.ledgers.fenced.add(lid)

    def info(self) -> BookieInfo:
        total, used, free = self.disk_usage()
        return BookieInfo(
            bookie_id=self.bookie_id,
            endpoint=self.advertised,
            rack=self.config.rack,
            region=self.config.region,
            free_bytes=free,
            total_bytes=total,
            ledger_count=len(self.ledgers.master_keys),
            read_only=self.read_only,
            ledgers_in_limbo=len(self.limbo),
        )

    async def _register(self) -> None:
        async with self._register_lock:
            info = self.info()
            t0 = time.perf_counter()
            self._published_read_only = None
            self.limbo_announcer.published(None)
            await self.registry.register(info)
            self._published_read_only = info.read_only
            self.limbo_announcer.published(info.ledgers_in_limbo)
            peaks.observe("metadata_register", time.perf_counter() - t0)
            self.state.registered.set()

    def on_session_event(self, event: SessionEvent) -> None:
        """The metadata store's session listener: a lost session stops adds until the bookie
        is registered again, which it does once the session is restored."""
        if event is SessionEvent.LOST:
            log.warning("metadata session lost: refusing adds until re-registered")
            self.state.registered.clear()
        elif event is SessionEvent.RESTORED:
            log.warning("metadata session restored: re-registering")
            assert self._loop is not None
            self._loop.create_task(self._register())

    # --- state ---------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Flush the engine and advance the journal mark (runs in a worker thread)."""
        journal = self.journal
        if journal is None:
            raise BookieUnavailableError(f"bookie {self.bookie_id} is not started: it has no journal to checkpoint")
        with self._checkpoint_lock:
            t0 = time.perf_counter()
            mark = journal.durable_mark()
            self.engine.flush()
            t1 = time.perf_counter()
            if mark != self._ledger_mark:
                write_ledger_marks(self.journal_dir, self.ledger_dirs, mark, journal.files)
                self._ledger_mark = mark
            journal.checkpoint_done(mark)
            took = time.perf_counter() - t0
            self.counters.flush_seconds.observe(t1 - t0)
            self.counters.checkpoint_seconds.observe(took)
            peaks.observe("engine_flush", t1 - t0, time.time() - took)
            peaks.observe("checkpoint", took)

    async def _checkpoint_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000.0
        failing = ""  # the failure of the checkpoints since the last one that succeeded
        last_said = 0.0
        for wait_s in jittered(interval, self.config.background_timer_jitter):
            await asyncio.sleep(wait_s)
            try:
                await asyncio.to_thread(self.checkpoint)
            except BookieDiskFullError as exc:
                self.disk_full()
                if str(exc) != failing or time.monotonic() - last_said >= 60:
                    log.warning("checkpoint waits for disk space (retried every %.1fs; the journal keeps "
                                "every acknowledged entry meanwhile): %s", interval, exc)
                    failing, last_said = str(exc), time.monotonic()
            except Exception as exc:
                # the whole story once, then one line a minute while the same failure goes on
                if str(exc) != failing:
                    log.exception("checkpoint failed; will retry")
                elif time.monotonic() - last_said >= 60:
                    log.error("checkpoint still failing; will retry: %s", exc)
                else:
                    continue
                failing, last_said = str(exc), time.monotonic()
            else:
                if failing:
                    log.info("checkpoint succeeded again")
                    failing = ""

    # --- garbage collection ----------------------------------------------------------------------

    def _gc(self) -> GarbageCollector:
        if self._collector is None:
            self._collector = GarbageCollector(self.config, self.engine, self.store, self.ledgers, self.compaction)
        return self._collector

    async def gc(self, *, minor: bool = False, major: bool = False) -> dict[str, Any]:
        """Forget ledgers whose metadata is gone, let the engine reclaim their space, and run
        minor/major compaction when asked (or when their interval has passed)."""
        return await self._gc().collect(minor=minor, major=major)

    # --- disks ---------------------------------------------------------------------------------

    def disk_usage(self) -> tuple[int, int, int]:
        """(total, used, free) bytes of the ledger directories' file systems."""
        return disk_usage(self.ledger_dirs)

    def _update_disk_state(self) -> bool:
        total, used, _ = self.disk_usage()
        return self.state.update(used / total if total else 0.0, self.ownership.lost)

    async def set_read_only(self, read_only: bool) -> None:
        """Force read-only (admin) or return to disk-driven state."""
        self.state.forced_read_only = read_only
        self._update_disk_state()
        if not read_only:
            self.state.read_only = False
            self._update_disk_state()
        await self._register()

    def disk_full(self) -> None:
        """A write found a disk full: check the disks now rather than at the next interval, so
        the bookie turns read-only (and writers move on) at once."""
        self._disk_check_now.set()

    async def _disk_check_loop(self) -> None:
        failing = ""  # the failure of the checks since the last one that succeeded
        last_said = 0.0
        while True:
            try:
                await asyncio.wait_for(self._disk_check_now.wait(), self.config.disk_check_interval_ms / 1000.0)
            except TimeoutError:
                pass
            self._disk_check_now.clear()
            try:
                await self._check_disks()
            except Exception as exc:
                # the loop outlives any one failure: if it ended, the bookie would stay read-only
                # (or writable) whatever its disks did next. The story once, then a line a minute.
                if str(exc) != failing or time.monotonic() - last_said >= 60:
                    log.warning("disk check failed (retried every %.1fs): %s", self.config.disk_check_interval_ms / 1000.0,
                                exc, exc_info=not isinstance(exc, LedgerStoreError))
                    failing, last_said = str(exc), time.monotonic()
            else:
                if failing:
                    log.info("disk check succeeded again")
                    failing = ""

    async def _check_disks(self) -> None:
        """One disk check: ownership, then read-only or writable by the disks' usage, published
        in the registration. A registration the store does not have yet (the last update failed,
        e.g. a metadata timeout) is published again here, so it never stays stale."""
        if self.ownership.lost is None and await self.ownership.check(self.store, self.bookie_id):
            log.error("bookie %s no longer owns its data: %s. It refuses every write from now on and answers "
                      "the replicas check with nothing, so its ledgers are re-replicated elsewhere. Stop it, then "
                      "restore its directories or format it (ledgerstore shell bookieformat --delete-cookie)",
                      self.bookie_id, self.ownership.lost)
            await self.ownership.ask_for_replicas_check(self.store)
        changed = self._update_disk_state()
        if changed or self._published_read_only != self.state.read_only:
            await self._register()


    # --- requests (served by the request processor) ----------------------------------------------

    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        self.processor.frames_received(conn, frames)

    def connection_lost(self, conn: ServerConnection) -> None:
        self.processor.connection_lost(conn)




async def run_bookie(config: BookieConfig, ready: Any = None) -> None:
    """Run a bookie until cancelled or SIGTERM/SIGINT (used by the CLI)."""
    bookie = Bookie(config)
    await bookie.start()
    if ready is not None:
        ready(bookie)
    loop = asyncio.get_running_loop()
    # per-second peaks of loop lag and GC pauses (GET /api/v1/bookie/stalls): this process is
    # one bookie, so the process-wide window is this bookie's
    unwatch_gc = watch_gc(peaks)
    lag_probe = loop.create_task(probe_loop_lag(peaks), name="loop-lag-peaks")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
    watch = loop.create_task(watch_supervisor(int(supervisor), stop)) if supervisor.isdigit() else None
    try:
        await stop.wait()
    finally:
        if watch is not None:
            watch.cancel()
        lag_probe.cancel()
        unwatch_gc()
        await bookie.stop()


async def watch_supervisor(pid: int, stop: asyncio.Event, interval: float = 0.5) -> None:
    """Set ``stop`` once the supervising process (``ledgerstore standalone``) is gone, so no bookie
    outlives it holding its port. The parent-death signal does this at once on Linux (SIGTERM
    here, for a clean stop); polling the parent id covers the platforms without it."""
    set_parent_death_signal(signal.SIGTERM)
    while os.getppid() == pid:
        await asyncio.sleep(interval)
    log.warning("supervisor (pid %d) is gone; stopping", pid)
    stop.set()


def bookie_metadata_options(cfg: BookieConfig) -> dict[str, Any]:
    """The metadata store options a bookie starts its store with: the configured ones, and for
    sqlite ``server = "require"`` unless the configuration says otherwise. A bookie shares the
    database with other processes, and a paused one holding the file's write lock would stall
    them all (bookie restarts included): it goes through the metadata server, and opens the file
    itself only when asked to (``server = "never"``, direct mode)."""
    if cfg.metadata.startswith("sqlite://") and "server" not in cfg.metadata_options:
        return {**cfg.metadata_options, "server": "require"}
    return dict(cfg.metadata_options)
