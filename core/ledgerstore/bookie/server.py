"""The bookie: serves add / read / fence / LAC requests over any transport, durably.

Write path: decode → check master key, fenced flag, read-only → add to the storage engine →
append to the journal → answer once the journal group holding it is fsync'd. Reads are served
from the engine (entries are readable as soon as they are added, like BookKeeper's).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import shutil
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import BookieInfo, MetadataStore, ServerConnection, SessionEvent, StorageEngine
from ledgerstore.api.transport import split_address
from ledgerstore.bookie import cookie as cookies
from ledgerstore.bookie.compaction import CompactionControl
from ledgerstore.bookie.dirlock import LOCK_FILE
from ledgerstore.bookie.journal import ADD, ADD_BATCH, FENCE, MASTER_KEY, Journal, Record, encode_record
from ledgerstore.bookie.ownership import Ownership
from ledgerstore.config import BookieConfig
from ledgerstore.errors import (
    InvalidArgumentError,
    LedgerStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
)
from ledgerstore.latency import LatencyHistogram
from ledgerstore.meta.bookies import BookieRegistry, ClusterManager, CookieManager, compare_cookies
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.plugins import create_transport, load_driver, notify
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Op, Status
from ledgerstore.proto.digest import ENTRY_HEADER, master_key, parse_entry_header
from ledgerstore.startup import (
    SUPERVISOR_PID_ENV,
    check_port_free,
    listen_error,
    prepare_dirs,
    set_parent_death_signal,
    start_metadata_store,
)

log = logging.getLogger(__name__)

#: what ``_check_key`` answers for a ledger new to this bookie whose metadata was not looked up
#: yet: the request waits for the look-up (not a wire status)
_AWAIT_METADATA = -1
#: a ledger the metadata store did not have is looked up once more after this long (a metadata
#: store read from another session may lag the writer's create by a moment)
_LOOKUP_RETRY_S = 0.1
#: a read-only bookie accepts recovery adds while its ledger disks have this much free space
RECOVERY_ADD_RESERVE_BYTES = 64 << 20


class BookieCounters:
    """Figures exported as metrics."""

    def __init__(self) -> None:
        self.add_requests = 0
        self.add_bytes = 0
        self.read_requests = 0
        self.bad_requests = 0
        #: requests whose handler failed unexpectedly (answered IO_ERROR; the connection carries on)
        self.failed_requests = 0
        self.rejected_adds: dict[str, int] = defaultdict(int)
        #: long-poll LAC requests refused because a waiter limit was reached
        self.refused_long_polls = 0
        #: metadata look-ups of ledgers new to this bookie (one per ledger, before its first key)
        self.ledger_lookups = 0
        #: requests naming a ledger new to this bookie that the metadata store does not hold
        self.unknown_ledger_claims = 0
        #: read requests (READ, READ_MULTI) from arrival to answer (BookKeeper's READ_ENTRY_REQUEST)
        self.read_request_seconds = LatencyHistogram()
        #: engine.flush() of each checkpoint (the ledger storage flush), and the whole checkpoint
        self.flush_seconds = LatencyHistogram()
        self.checkpoint_seconds = LatencyHistogram()


class Bookie:
    """One bookie. ``await start()`` then it serves until ``await stop()``."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.listen = config.listen
        self.advertised = config.advertised_address or config.listen
        _, host, port = split_address(self.advertised)
        self.bookie_id = f"{host}:{port}"
        self.journal_dir = Path(config.journal_dir)
        self.ledger_dirs = [Path(d) for d in config.ledger_dirs]
        self.store: MetadataStore | None = None
        self.engine: StorageEngine | None = None
        self.journal: Journal | None = None
        self.server: Any = None
        self.registry: BookieRegistry | None = None
        self.read_only = False
        self.forced_read_only = False
        self.counters = BookieCounters()
        self._master_keys: dict[int, bytes] = {}
        self._fenced: set[int] = set()
        self._lac: dict[int, int] = {}
        #: long-poll LAC waiters: ledger → (connection, request id) → (known LAC, expiry timer)
        self._lac_waiters: dict[int, dict[tuple[ServerConnection, int], tuple[int, asyncio.TimerHandle]]] = {}
        #: the same waiters by connection: connection → {(ledger, request id)}, so a connection's
        #: waiters are counted against its limit and freed with it without scanning the others
        self._conn_waiters: dict[ServerConnection, set[tuple[int, int]]] = {}
        self.lac_waiter_count = 0
        #: first master keys allowed by the metadata store, for ledgers new to this bookie:
        #: ledger → the key its stored password gives, or b"" when the metadata holds no password
        self._allowed_keys: dict[int, bytes] = {}
        #: requests waiting for the metadata look-up of a ledger new to this bookie
        self._awaiting_metadata: dict[int, list[tuple[ServerConnection, codec.Request]]] = {}
        self._awaiting_count = 0
        self._lookups: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._checkpoint_lock = threading.Lock()
        self._stopped = asyncio.Event()
        self.instance_id: str | None = None
        self.started_at = 0.0
        self._registered_event = asyncio.Event()
        self._last_minor = self._last_major = time.monotonic()
        #: compaction suspension switches and statistics (the admin API's gc endpoints)
        self.compaction = CompactionControl()
        self._serving = False
        self.http: Any = None
        #: adds waiting for the journal, per connection (the per-connection in-flight limit)
        self._inflight: dict[ServerConnection, int] = {}
        #: called on the event loop once per durable journal group with its record count (metrics);
        #: per group, never per entry, so the write path stays flat
        self.group_observer: Any = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        # Everything that can fail for a reason the operator must fix (a directory, a plugin's
        # options, the metadata store, a port) is checked before the cookie is written: a failed
        # start leaves no cookie behind, in the directories or in the metadata store.
        prepare_dirs([("journal_dir", self.journal_dir), *(("ledger_dirs", d) for d in self.ledger_dirs)])
        engine = load_driver("storage", cfg.storage)(self.ledger_dirs, **cfg.storage_options)
        if cfg.http_port:
            check_port_free("http_port", cfg.http_address, cfg.http_port)
        self.store = await start_metadata_store(cfg.metadata, cfg.metadata_options, cfg.metadata_start_retry_s)
        self.registry = BookieRegistry(self.store)
        # Bind first: with port 0 the bookie id (host:port) is only known once listening. Requests
        # that arrive before the journal runs are refused (see frames_received).
        scheme = cfg.listen.partition("://")[0]
        transport = create_transport(scheme, max_frame_size=cfg.max_frame_size, **{
            **cfg.transport,
            "max_unfinished_frame_bytes": cfg.max_unfinished_frame_bytes,
            "unfinished_frame_timeout_s": cfg.unfinished_frame_timeout_s,
        })
        try:
            self.server = await transport.serve(cfg.listen, self)
        except OSError as exc:
            await self.store.close()
            raise listen_error("listen", cfg.listen, split_address(cfg.listen)[2], exc) from None
        if split_address(self.advertised)[2] == 0:  # port 0: advertise the real one
            self.advertised = self.server.address
            _, host, port = split_address(self.advertised)
            self.bookie_id = f"{host}:{port}"
        self.ownership = Ownership(self.journal_dir, self.ledger_dirs)
        try:
            # held until stop() (or the process's end): offline tools refuse these directories meanwhile
            self.ownership.acquire()
            await self._check_cookie()
        except BaseException:
            self.ownership.release()
            await self.server.close()
            await self.store.close()
            raise

        self.engine = engine
        await asyncio.to_thread(self.engine.open)
        self.journal = Journal(
            self.journal_dir,
            self._on_durable,
            max_group_wait_ms=cfg.journal.max_group_wait_ms,
            max_group_bytes=cfg.journal.max_group_bytes,
            flush_when_queue_empty=cfg.journal.flush_when_queue_empty,
            max_file_size=cfg.journal.max_file_size_mb * 1024 * 1024,
            max_backups=cfg.journal.max_backups,
            sync=cfg.journal.sync,
        )
        t0 = time.monotonic()
        replayed = await asyncio.to_thread(self.journal.replay, self._apply_replayed)
        if replayed:
            log.info("replayed %d journal records in %.2fs", replayed, time.monotonic() - t0)
        self._load_ledger_state()
        self.journal.start(self._loop)
        if replayed:  # make the replayed state durable in the engine and move the mark past it
            await asyncio.to_thread(self.checkpoint)

        self._serving = True
        self._update_disk_state()
        self.http = None
        if cfg.http_port:  # up before registration: "registered" implies the admin port answers
            from ledgerstore.bookie.http import start_admin_http

            self.http = await start_admin_http(self, cfg.http_address, cfg.http_port)
        await self._register()
        self.store.add_session_listener(self._on_session_event)
        self._tasks.append(asyncio.create_task(self._checkpoint_loop(), name="checkpoint"))
        self._tasks.append(asyncio.create_task(self._disk_check_loop(), name="disk-check"))
        if cfg.gc_wait_time_ms > 0:
            self._tasks.append(asyncio.create_task(self._gc_loop(), name="gc"))
        self.started_at = time.time()
        self.recovery: Any = None
        if cfg.autorecovery.enabled:
            from ledgerstore.recovery.service import RecoveryService

            self.recovery = RecoveryService.for_bookie(self)
            await self.recovery.start()
        log.info("bookie %s serving on %s (storage %s, journal %s)", self.bookie_id, self.server.address, cfg.storage, self.journal_dir)
        notify("ledgerstore_bookie_started", bookie=self)

    async def stop(self) -> None:
        """Stop serving, checkpoint, unregister. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        notify("ledgerstore_bookie_stopping", bookie=self)
        if getattr(self, "recovery", None) is not None:
            await self.recovery.stop()
        for t in [*self._tasks, *self._lookups]:
            t.cancel()
        for t in [*self._tasks, *self._lookups]:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.server is not None:
            await self.server.close()
        if getattr(self, "http", None) is not None:
            await self.http.close()
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)
        if self.engine is not None and self.journal is not None and self.journal.failed is None:
            await asyncio.to_thread(self.checkpoint)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)
        if self.store is not None:
            try:
                if self.registry is not None:
                    await self.registry.unregister(self.bookie_id)
            except LedgerStoreError as exc:
                log.warning("could not unregister: %s", exc)
            await self.store.close()
        if getattr(self, "ownership", None) is not None:
            self.ownership.release()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # --- cookie and registration ---------------------------------------------------------------

    async def _check_cookie(self) -> None:
        assert self.store is not None
        cluster = ClusterManager(self.store)
        iid = await cluster.instance_id()
        if iid is None:
            if not self.config.auto_init_cluster:
                raise LedgerStoreError(
                    f"the metadata store {self.config.metadata} holds no cluster; run "
                    f"'ledgerstore shell --metadata {self.config.metadata} initnewcluster' first"
                )
            iid = await cluster.init()
        self.instance_id = iid
        dirs = cookies.cookie_dirs(self.journal_dir, self.ledger_dirs)
        expected = {
            "bookie_id": self.bookie_id,
            "instance_id": iid,
            "journal_dir": str(self.journal_dir.resolve()),
            "ledger_dirs": [str(d.resolve()) for d in self.ledger_dirs],
            "layout": 1,
        }
        local = cookies.read_local(dirs)
        mgr = CookieManager(self.store)
        remote = await mgr.get(self.bookie_id)
        where = f"bookie {self.bookie_id}"
        if local is None and remote is None:
            if any(self._has_data(d) for d in self.ledger_dirs):
                raise LedgerStoreError(
                    f"{where}: its directories hold data but no cookie; refusing to adopt them. "
                    "Format them (ledgerstore shell bookieformat) if the data is not needed."
                )
            fresh = {**expected, cookies.INCARNATION: cookies.new_incarnation()}
            cookies.write_local(dirs, fresh)
            await mgr.put(self.bookie_id, {**fresh, "endpoint": self.advertised})
            self.ownership.cookie = fresh
            return
        if local is None:
            raise LedgerStoreError(
                f"{where}: the cluster has a cookie for this bookie but its directories have none: its disks were "
                "wiped or replaced. Decommission/recover the old bookie (its data is gone) and delete its cookie, "
                "or restore the directories."
            )
        if remote is None:
            raise LedgerStoreError(
                f"{where}: its directories have a cookie but the cluster has none for it "
                f"(instance {local.get('instance_id')}); this metadata store may be another cluster's"
            )
        compare_cookies(local, {k: v for k, v in remote.items() if k != "endpoint"}, where)
        if cookies.INCARNATION in local:
            expected[cookies.INCARNATION] = local[cookies.INCARNATION]
        compare_cookies(local, expected, where + " (configuration)")
        if remote.get("endpoint") != self.advertised:
            await mgr.put(self.bookie_id, {**local, "endpoint": self.advertised})
        self.ownership.cookie = local

    @staticmethod
    def _has_data(d: Path) -> bool:
        return d.exists() and any(p.name not in (cookies.COOKIE_FILE, LOCK_FILE) for p in d.iterdir())

    def info(self) -> BookieInfo:
        total, used, free = self._disk_usage()
        return BookieInfo(
            bookie_id=self.bookie_id,
            endpoint=self.advertised,
            rack=self.config.rack,
            region=self.config.region,
            free_bytes=free,
            total_bytes=total,
            ledger_count=len(self._master_keys),
            read_only=self.read_only,
        )

    async def _register(self) -> None:
        assert self.registry is not None
        await self.registry.register(self.info())
        self._registered_event.set()

    def _on_session_event(self, event: SessionEvent) -> None:
        if event is SessionEvent.LOST:
            log.warning("metadata session lost: refusing adds until re-registered")
            self._registered_event.clear()
        elif event is SessionEvent.RESTORED:
            log.warning("metadata session restored: re-registering")
            assert self._loop is not None
            self._loop.create_task(self._register())

    # --- state ---------------------------------------------------------------------------------

    def _apply_replayed(self, rec: Record) -> None:
        engine = self.engine
        assert engine is not None
        if rec.type == ADD:
            engine.add_entry(rec.ledger_id, rec.entry_id, rec.data)
        elif rec.type == FENCE:
            engine.set_fenced(rec.ledger_id)
        elif rec.type == MASTER_KEY:
            engine.set_master_key(rec.ledger_id, rec.data)

    def _load_ledger_state(self) -> None:
        engine = self.engine
        assert engine is not None
        for lid in engine.list_ledgers():
            key = engine.get_master_key(lid)
            if key is not None:
                self._master_keys[lid] = key
            if engine.is_fenced(lid):
                self._fenced.add(lid)
            last = engine.last_entry_id(lid)
            if last >= 0:
                try:
                    _, _, lac = parse_entry_header(engine.get_entry(lid, last))
                    self._lac[lid] = lac
                except LedgerStoreError:
                    self._lac[lid] = -1

    def checkpoint(self) -> None:
        """Flush the engine and advance the journal mark (runs in a worker thread)."""
        assert self.engine is not None and self.journal is not None
        with self._checkpoint_lock:
            t0 = time.perf_counter()
            mark = self.journal.durable_mark()
            self.engine.flush()
            t1 = time.perf_counter()
            self.journal.checkpoint_done(mark)
            self.counters.flush_seconds.observe(t1 - t0)
            self.counters.checkpoint_seconds.observe(time.perf_counter() - t0)

    async def _checkpoint_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.checkpoint)
            except Exception:
                log.exception("checkpoint failed; will retry")

    # --- garbage collection ----------------------------------------------------------------------

    async def gc(self, *, minor: bool = False, major: bool = False) -> dict[str, Any]:
        """Forget ledgers whose metadata is gone, let the engine reclaim their space, and run
        minor/major compaction when asked (or when their interval has passed)."""
        assert self.engine is not None and self.store is not None
        from ledgerstore.meta.ledgers import LedgerManager

        mgr = LedgerManager(self.store)
        t0 = time.monotonic()
        before = await asyncio.to_thread(self.engine.stats)
        local = await asyncio.to_thread(lambda: list(self.engine.list_ledgers()))  # type: ignore[union-attr]
        deleted = []
        for lid in local:
            try:
                await mgr.read(lid)
            except NoSuchLedgerError:
                await asyncio.to_thread(self.engine.delete_ledger, lid)
                self._master_keys.pop(lid, None)
                self._fenced.discard(lid)
                self._lac.pop(lid, None)
                deleted.append(lid)
        after = await asyncio.to_thread(self.engine.gc)
        now = time.monotonic()
        compacted = None
        compact = self.engine.compact if self.engine.supports_compaction else None
        cfg = self.config
        if compact is not None:
            if self.compaction.allows("major") and (major or (
                    cfg.major_compaction_threshold > 0 and cfg.major_compaction_interval_s > 0
                    and now - self._last_major >= cfg.major_compaction_interval_s)):
                with self.compaction.compacting("major"):
                    compacted = ("major", await asyncio.to_thread(compact, cfg.major_compaction_threshold if cfg.major_compaction_threshold > 0 else 0.8))
                self._last_major = self._last_minor = now
            elif self.compaction.allows("minor") and (minor or (
                    cfg.minor_compaction_threshold > 0 and cfg.minor_compaction_interval_s > 0
                    and now - self._last_minor >= cfg.minor_compaction_interval_s)):
                with self.compaction.compacting("minor"):
                    compacted = ("minor", await asyncio.to_thread(compact, cfg.minor_compaction_threshold if cfg.minor_compaction_threshold > 0 else 0.2))
                self._last_minor = now
        if compacted is not None:
            after = compacted[1]
        return {
            "deleted_ledgers": deleted,
            "bytes_on_disk_before": before.bytes_on_disk,
            "bytes_on_disk_after": after.bytes_on_disk,
            "reclaimed_bytes": max(0, before.bytes_on_disk - after.bytes_on_disk),
            "compaction": compacted[0] if compacted else None,
            "seconds": round(time.monotonic() - t0, 3),
        }

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_wait_time_ms / 1000.0)
            try:
                result = await self.gc()
                if result["deleted_ledgers"] or result["compaction"]:
                    log.info("gc: %s", result)
            except Exception:
                log.exception("garbage collection failed; will retry")

    # --- disks ---------------------------------------------------------------------------------

    def _disk_usage(self) -> tuple[int, int, int]:
        total = used = free = 0
        seen = set()
        for d in self.ledger_dirs:
            try:
                st = os.statvfs(d)
            except OSError:
                continue
            if st.f_fsid in seen:
                continue
            seen.add(st.f_fsid)
            du = shutil.disk_usage(d)
            total += du.total
            used += du.used
            free += du.free
        return total, used, free

    def _update_disk_state(self) -> bool:
        total, used, _ = self._disk_usage()
        frac = used / total if total else 0.0
        was = self.read_only
        lost = self.ownership.lost
        if self.forced_read_only or lost is not None:
            self.read_only = True
        elif frac >= self.config.disk_usage_threshold:
            self.read_only = True
        elif frac < self.config.disk_usage_lwm:
            self.read_only = False
        if self.read_only != was:
            log.warning("bookie %s is now %s (%s)", self.bookie_id, "READ-ONLY" if self.read_only else "writable",
                        "it lost its data" if lost is not None else f"disk {frac * 100:.1f}% used")
        return self.read_only != was

    async def set_read_only(self, read_only: bool) -> None:
        """Force read-only (admin) or return to disk-driven state."""
        self.forced_read_only = read_only
        self._update_disk_state()
        if not read_only:
            self.read_only = False
            self._update_disk_state()
        await self._register()

    async def _disk_check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.disk_check_interval_ms / 1000.0)
            if self.ownership.lost is None and await self.ownership.check(self.store, self.bookie_id):
                log.error("bookie %s no longer owns its data: %s. It refuses every write from now on and answers "
                          "the replicas check with nothing, so its ledgers are re-replicated elsewhere. Stop it, then "
                          "restore its directories or format it (ledgerstore shell bookieformat --delete-cookie)",
                          self.bookie_id, self.ownership.lost)
                await self.ownership.ask_for_replicas_check(self.store)
            if self._update_disk_state():
                try:
                    await self._register()
                except LedgerStoreError as exc:
                    log.warning("could not update registration: %s", exc)

    def _handle_list_ledgers(self, conn: ServerConnection, req: codec.ListLedgersRequest) -> None:
        """The ledgers held from ``req.first_ledger_id`` on, with the last entry of each (the
        auditor's replicas check). A bookie that lost its data holds nothing it could vouch for."""
        assert self.engine is not None
        out: list[tuple[int, int]] = []
        if self.ownership.lost is None:
            for lid in sorted(lid for lid in self.engine.list_ledgers() if lid >= req.first_ledger_id):
                try:
                    out.append((lid, self.engine.last_entry_id(lid)))
                except NoSuchLedgerError:
                    continue
                if len(out) >= req.max_ledgers:
                    break
        conn.send(codec.encode_list_ledgers_response(req.request_id, Status.OK, out))

    # --- requests ------------------------------------------------------------------------------

    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        if not self._serving:  # still starting (replaying the journal): refuse, do not queue
            for frame in frames:
                if len(frame) >= codec.HEADER_SIZE:
                    _, op, _, rid = codec.HEADER.unpack_from(frame)
                    conn.send(codec.encode_error_response(op, rid, Status.READ_ONLY))
            return
        max_frame_size = self.config.max_frame_size
        for frame in frames:
            # One request's failure is answered for that request alone: the connection, the
            # requests after it and other peers carry on.
            try:
                req = codec.decode_request(frame, max_frame_size)
                self._dispatch(conn, req)
            except (ProtocolError, InvalidArgumentError) as exc:
                self._bad_request(conn, frame, exc)
            except Exception as exc:
                self._failed_request(conn, frame, exc)

    def _dispatch(self, conn: ServerConnection, req: codec.Request) -> None:
        if isinstance(req, codec.AddBatchRequest):
            self._handle_add_batch(conn, req)
        elif isinstance(req, codec.ReadMultiRequest):
            self._handle_read_multi(conn, req)
        elif isinstance(req, codec.AddRequest):
            self._handle_add(conn, req)
        elif isinstance(req, codec.ReadRequest):
            self._handle_read(conn, req)
        elif isinstance(req, codec.ReadLacRequest):
            self._handle_read_lac(conn, req)
        elif isinstance(req, codec.LongPollLacRequest):
            self._handle_long_poll(conn, req)
        elif isinstance(req, codec.BookieInfoRequest):
            total, _, free = self._disk_usage()
            conn.send(codec.encode_bookie_info_response(
                req.request_id, Status.OK, free, total, len(self._master_keys), self.read_only))
        elif isinstance(req, codec.ListLedgersRequest):
            self._handle_list_ledgers(conn, req)
        else:
            raise ProtocolError(f"this bookie does not serve {type(req).__name__}")

    def connection_lost(self, conn: ServerConnection) -> None:
        self._inflight.pop(conn, None)
        mine = self._conn_waiters.pop(conn, None)
        if mine:
            for lid, rid in mine:
                waiters = self._lac_waiters.get(lid)
                w = waiters.pop((conn, rid), None) if waiters is not None else None
                if w is not None:
                    w[1].cancel()
                    self.lac_waiter_count -= 1
                    if not waiters:
                        del self._lac_waiters[lid]

    def _bad_request(self, conn: ServerConnection, frame: bytes, exc: Exception) -> None:
        self.counters.bad_requests += 1
        if len(frame) >= codec.HEADER_SIZE:
            _, op, _, rid = codec.HEADER.unpack_from(frame)
            conn.send(codec.encode_error_response(op, rid, Status.BAD_REQUEST))
        else:
            conn.send(codec.encode_error_response(0, 0, Status.BAD_REQUEST))
        if self.counters.bad_requests % 1000 == 1:
            log.warning("bad request from %s: %s (%d so far)", conn.peer, exc, self.counters.bad_requests)

    def _failed_request(self, conn: ServerConnection, frame: bytes, exc: Exception) -> None:
        """A request whose handling failed unexpectedly: answered IO_ERROR, logged (with the
        traceback of the first of every thousand), the connection kept."""
        c = self.counters
        c.failed_requests += 1
        _, op, _, rid = codec.HEADER.unpack_from(frame)
        conn.send(codec.encode_error_response(op, rid, Status.IO_ERROR))
        if c.failed_requests % 1000 == 1:
            log.error("request from %s (opcode %d) failed: %r (%d so far)", conn.peer, op, exc, c.failed_requests,
                      exc_info=exc)

    def _check_key(self, ledger_id: int, key: bytes) -> int | None:
        """Status to refuse with, or None. Records the key of a ledger new to this bookie, once
        the metadata store has shown the ledger exists (and, when it stores the ledger's password,
        that the key is the one it gives); until then answers ``_AWAIT_METADATA``."""
        known = self._master_keys.get(ledger_id)
        if known is None:
            if not key:
                return Status.UNAUTHORIZED
            allowed = self._allowed_keys.get(ledger_id)
            if allowed is None:
                return _AWAIT_METADATA
            if allowed and allowed != key:
                return Status.UNAUTHORIZED
            assert self.engine is not None and self.journal is not None
            self.engine.set_master_key(ledger_id, key)
            del self._allowed_keys[ledger_id]
            self._master_keys[ledger_id] = key
            self.journal.append(encode_record(MASTER_KEY, ledger_id, 0, key), None)
            return None
        if known != key:
            return Status.UNAUTHORIZED
        return None

    def _handle_add(self, conn: ServerConnection, req: codec.AddRequest) -> None:
        started = time.perf_counter()
        c = self.counters
        status = self._add_refusal(req.ledger_id, req.master_key, req.flags)
        if status == _AWAIT_METADATA:
            self._await_metadata(conn, req)
            return
        c.add_requests += 1
        entry = req.entry
        if status is None:
            try:
                lid, eid, lac = parse_entry_header(entry)
            except LedgerStoreError:
                lid = eid = lac = -1
            if lid != req.ledger_id or eid != req.entry_id:
                status = Status.BAD_REQUEST
        if status is not None:
            c.rejected_adds[Status(status).name] += 1
            conn.send(codec.encode_add_response(req.request_id, status, req.ledger_id, req.entry_id))
            return
        assert self.engine is not None and self.journal is not None
        try:
            self.engine.add_entry(req.ledger_id, req.entry_id, entry)
        except (LedgerStoreError, OSError) as exc:
            log.error("storage failed to add ledger %d entry %d: %s", req.ledger_id, req.entry_id, exc)
            conn.send(codec.encode_add_response(req.request_id, Status.IO_ERROR, req.ledger_id, req.entry_id))
            return
        c.add_bytes += len(entry)
        if lac > self._lac.get(req.ledger_id, -1):
            self._lac[req.ledger_id] = lac
            if req.ledger_id in self._lac_waiters:
                self._wake_lac_waiters(req.ledger_id)
        self._inflight[conn] = self._inflight.get(conn, 0) + 1
        self.journal.append(
            encode_record(ADD, req.ledger_id, req.entry_id, entry),
            (conn, codec.encode_add_response(req.request_id, Status.OK, req.ledger_id, req.entry_id), 1),
            1, started,
        )

    def _add_refusal(self, ledger_id: int, key: bytes, flags: int) -> int | None:
        """The status refusing every add of a request, or None to go on."""
        if not self._registered_event.is_set():
            return Status.READ_ONLY
        if self.read_only and not (flags & FLAG_RECOVERY_ADD and self._disk_usage()[2] >= RECOVERY_ADD_RESERVE_BYTES):
            # like BookKeeper's high-priority writes: recovery adds still land on a read-only
            # bookie so that ledgers can be closed, as long as its disks keep a reserve
            return Status.READ_ONLY
        if self.journal is None or self.journal.failed is not None:
            return Status.IO_ERROR
        status = self._check_key(ledger_id, key)
        if status is None and ledger_id in self._fenced and not flags & FLAG_RECOVERY_ADD:
            return Status.FENCED
        return status

    def _handle_add_batch(self, conn: ServerConnection, req: codec.AddBatchRequest) -> None:
        """Many entries of one ledger: one key/fence check, one journal item, one answer once
        the whole batch is durable."""
        started = time.perf_counter()
        c = self.counters
        entries = req.entries
        lid = req.ledger_id
        status = self._add_refusal(lid, req.master_key, req.flags)
        if status == _AWAIT_METADATA:
            self._await_metadata(conn, req)
            return
        c.add_requests += len(entries)
        inflight = self._inflight.get(conn, 0)
        if status is None and inflight + len(entries) > self.config.max_adds_in_flight_per_connection and inflight:
            status = Status.TOO_MANY_REQUESTS
        if status is not None:
            c.rejected_adds[Status(status).name] += len(entries)
            conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, lid, [(e, status) for e, _ in entries]))
            return
        assert self.engine is not None and self.journal is not None
        # every signed entry must name this ledger and the id it is sent under
        unpack = ENTRY_HEADER.unpack_from
        hsize = ENTRY_HEADER.size
        max_lac = -1
        bad = False
        for eid, entry in entries:
            if len(entry) < hsize:
                bad = True
                break
            hl, he, lac = unpack(entry)
            if hl != lid or he != eid:
                bad = True
                break
            if lac > max_lac:
                max_lac = lac
        if bad or not req.raw_entries:
            self._add_batch_each(conn, req, inflight)
            return
        try:
            self.engine.add_entries(lid, entries)
        except (LedgerStoreError, OSError) as exc:
            log.error("storage failed to add a batch of %d entries of ledger %d: %s", len(entries), lid, exc)
            conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, lid,
                                                      [(e, Status.IO_ERROR) for e, _ in entries]))
            return
        n = len(entries)
        c.add_bytes += len(req.raw_entries) - 12 * n
        self._note_lac(lid, max_lac)
        self._inflight[conn] = inflight + n
        # the entry section as received is the journal record's data: nothing is encoded per entry
        self.journal.append(encode_record(ADD_BATCH, lid, n, req.raw_entries),
                            (conn, codec.encode_add_batch_all_ok(req.request_id, lid, n), n), n, started)

    def _note_lac(self, lid: int, lac: int) -> None:
        if lac > self._lac.get(lid, -1):
            self._lac[lid] = lac
            if lid in self._lac_waiters:
                self._wake_lac_waiters(lid)

    def _add_batch_each(self, conn: ServerConnection, req: codec.AddBatchRequest, inflight: int) -> None:
        """A batch with malformed entries: store and answer entry by entry."""
        assert self.engine is not None and self.journal is not None
        lid = req.ledger_id
        add = self.engine.add_entry
        items: list[tuple[int, int]] = []
        records: list[bytes] = []
        max_lac = -1
        nbytes = 0
        for eid, entry in req.entries:
            try:
                hl, he, lac = parse_entry_header(entry)
            except LedgerStoreError:
                hl = he = lac = -1
            if hl != lid or he != eid:
                items.append((eid, Status.BAD_REQUEST))
                continue
            try:
                add(lid, eid, entry)
            except (LedgerStoreError, OSError) as exc:
                log.error("storage failed to add ledger %d entry %d: %s", lid, eid, exc)
                items.append((eid, Status.IO_ERROR))
                continue
            records.append(encode_record(ADD, lid, eid, entry))
            items.append((eid, Status.OK))
            nbytes += len(entry)
            if lac > max_lac:
                max_lac = lac
        self.counters.add_bytes += nbytes
        self._note_lac(lid, max_lac)
        frame = codec.encode_add_batch_response(req.request_id, Status.OK, lid, items)
        if records:
            self._inflight[conn] = inflight + len(records)
            self.journal.append(b"".join(records), (conn, frame, len(records)), len(records))
        else:
            conn.send(frame)

    def _handle_read_multi(self, conn: ServerConnection, req: codec.ReadMultiRequest) -> None:
        """Many entries in one answer, up to the frame limit; the rest are answered
        TOO_MANY_REQUESTS for the client to ask again."""
        started = time.perf_counter()
        assert self.engine is not None
        self.counters.read_requests += len(req.entry_ids)
        budget = self.config.max_frame_size - 64 - 14 * len(req.entry_ids)
        items: list[tuple[int, int, bytes]] = []
        append = items.append
        for eid, got in zip(req.entry_ids, self.engine.get_entries(req.ledger_id, req.entry_ids), strict=True):
            if isinstance(got, bytes):
                if budget <= 0 or len(got) > budget:
                    # past the frame limit: the client asks again for the rest
                    append((eid, Status.TOO_MANY_REQUESTS, b""))
                    budget = 0
                    continue
                budget -= len(got)
                append((eid, Status.OK, got))
            elif isinstance(got, NoSuchLedgerError):
                append((eid, Status.NO_SUCH_LEDGER, b""))
            elif isinstance(got, NoSuchEntryError):
                append((eid, Status.NO_SUCH_ENTRY, b""))
            else:
                log.error("read of ledger %d entry %d failed: %s", req.ledger_id, eid, got)
                append((eid, Status.IO_ERROR, b""))
        conn.send(codec.encode_read_multi_response(req.request_id, Status.OK, req.ledger_id, items))
        self.counters.read_request_seconds.observe(time.perf_counter() - started)

    def _on_durable(self, tokens: list[Any]) -> None:
        """A journal group is on disk: answer every request waiting for it (on the loop)."""
        if self.group_observer is not None:  # records in the group: a batch token carries its count
            self.group_observer(sum(t[2] if isinstance(t, tuple) and len(t) == 3 and isinstance(t[2], int) else 1
                                    for t in tokens))
        for token in tokens:
            if token is None:
                continue
            if token[0] == "journal-error":  # the writer failed: answer everyone with an IO error
                for t in token[2]:
                    if t is not None and len(t) >= 2 and isinstance(t[1], bytes):
                        conn, ok_frame = t[0], t[1]
                        _, op, _, rid = codec.HEADER.unpack_from(ok_frame)
                        conn.send(codec.encode_error_response(op, rid, Status.IO_ERROR))
                    # a pending fence (callable) gets no answer: the client times out and retries elsewhere
                continue
            if len(token) == 3:  # adds: answer and release their in-flight count
                conn, frame, n = token
                left = self._inflight.get(conn, 0) - n
                if left > 0:
                    self._inflight[conn] = left
                else:
                    self._inflight.pop(conn, None)
                conn.send(frame)
                continue
            conn, frame = token
            if callable(frame):
                try:  # a fence's answer: its failure must not cost the rest of the group theirs
                    frame()
                except Exception as exc:
                    self.counters.failed_requests += 1
                    log.error("answering a fence of %s failed: %r", conn.peer, exc, exc_info=exc)
            else:
                conn.send(frame)

    def _fence(self, conn: ServerConnection, ledger_id: int, key: bytes, then: Any) -> int | None:
        """Fence durably, then run ``then()``. Returns None when under way, else the status the
        caller refuses with (or ``_AWAIT_METADATA`` for it to wait for the ledger's look-up)."""
        assert self.engine is not None and self.journal is not None
        status = self._check_key(ledger_id, key)
        if status is not None:
            return status
        if ledger_id not in self._fenced:
            self.engine.set_fenced(ledger_id)
            self._fenced.add(ledger_id)
        # Answer only once the fence record (and everything queued before it) is durable.
        self.journal.append(encode_record(FENCE, ledger_id, 0), (conn, then))
        return None

    def _handle_read(self, conn: ServerConnection, req: codec.ReadRequest) -> None:
        if req.flags & FLAG_FENCE:
            status = self._fence(conn, req.ledger_id, req.master_key, lambda: conn.send(self._read_response(req)))
            if status == _AWAIT_METADATA:
                self._await_metadata(conn, req)
                return
            self.counters.read_requests += 1
            if status is not None:
                conn.send(codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id))
            return
        self.counters.read_requests += 1
        started = time.perf_counter()
        conn.send(self._read_response(req))
        self.counters.read_request_seconds.observe(time.perf_counter() - started)

    def _read_response(self, req: codec.ReadRequest) -> bytes:
        assert self.engine is not None
        try:
            data = self.engine.get_entry(req.ledger_id, req.entry_id)
        except NoSuchLedgerError:
            return codec.encode_read_response(req.request_id, Status.NO_SUCH_LEDGER, req.ledger_id, req.entry_id)
        except NoSuchEntryError:
            return codec.encode_read_response(req.request_id, Status.NO_SUCH_ENTRY, req.ledger_id, req.entry_id)
        except InvalidArgumentError:  # an id the engine cannot hold: no such entry can exist
            return codec.encode_read_response(req.request_id, Status.BAD_REQUEST, req.ledger_id, req.entry_id)
        except (LedgerStoreError, OSError) as exc:
            log.error("read of ledger %d entry %d failed: %s", req.ledger_id, req.entry_id, exc)
            return codec.encode_read_response(req.request_id, Status.IO_ERROR, req.ledger_id, req.entry_id)
        return codec.encode_read_response(req.request_id, Status.OK, req.ledger_id, req.entry_id, data)

    def _lac_response(self, op: Op, rid: int, ledger_id: int) -> bytes:
        assert self.engine is not None
        if ledger_id not in self._master_keys:
            return codec.encode_lac_response(op, rid, Status.NO_SUCH_LEDGER, ledger_id, -1, -1)
        try:
            last = self.engine.last_entry_id(ledger_id)
        except NoSuchLedgerError:
            last = -1
        return codec.encode_lac_response(op, rid, Status.OK, ledger_id, self._lac.get(ledger_id, -1), last)

    def _handle_read_lac(self, conn: ServerConnection, req: codec.ReadLacRequest) -> None:
        if req.flags & FLAG_FENCE:
            then = lambda: conn.send(self._lac_response(Op.READ_LAC, req.request_id, req.ledger_id))  # noqa: E731
            status = self._fence(conn, req.ledger_id, req.master_key, then)
            if status == _AWAIT_METADATA:
                self._await_metadata(conn, req)
                return
            self.counters.read_requests += 1
            if status is not None:
                conn.send(codec.encode_lac_response(Op.READ_LAC, req.request_id, status, req.ledger_id, -1, -1))
            return
        self.counters.read_requests += 1
        conn.send(self._lac_response(Op.READ_LAC, req.request_id, req.ledger_id))

    def _handle_long_poll(self, conn: ServerConnection, req: codec.LongPollLacRequest) -> None:
        lid = req.ledger_id
        lac = self._lac.get(lid, -1)
        if lac > req.known_lac or req.timeout_ms == 0 or lid in self._fenced:
            conn.send(self._lac_response(Op.LONG_POLL_LAC, req.request_id, lid))
            return
        assert self._loop is not None
        cfg = self.config
        mine = self._conn_waiters.get(conn)
        key = (conn, req.request_id)
        waiters = self._lac_waiters.get(lid)
        if (self.lac_waiter_count >= cfg.max_long_poll_waiters
                or (mine is not None and len(mine) >= cfg.max_long_poll_waiters_per_connection)
                or (waiters is not None and key in waiters)):
            # past a limit (or a request id already waiting): refused, the client polls again later
            c = self.counters
            c.refused_long_polls += 1
            if c.refused_long_polls % 1000 == 1:
                log.warning("refusing long-poll LAC waiters from %s: %d waiting here, %d from it (limits %d and %d "
                            "per connection; %d refused so far)", conn.peer, self.lac_waiter_count,
                            len(mine or ()), cfg.max_long_poll_waiters, cfg.max_long_poll_waiters_per_connection,
                            c.refused_long_polls)
            conn.send(codec.encode_lac_response(Op.LONG_POLL_LAC, req.request_id, Status.TOO_MANY_REQUESTS, lid, -1, -1))
            return
        timeout = min(req.timeout_ms, 600_000) / 1000.0
        handle = self._loop.call_later(timeout, self._expire_waiter, lid, req.request_id, conn)
        if waiters is None:
            waiters = self._lac_waiters[lid] = {}
        waiters[key] = (req.known_lac, handle)
        if mine is None:
            mine = self._conn_waiters[conn] = set()
        mine.add((lid, req.request_id))
        self.lac_waiter_count += 1

    def _forget_waiter(self, ledger_id: int, rid: int, conn: ServerConnection) -> None:
        """Drop a waiter from the per-connection index and the count (it left its ledger's dict)."""
        self.lac_waiter_count -= 1
        mine = self._conn_waiters.get(conn)
        if mine is not None:
            mine.discard((ledger_id, rid))
            if not mine:
                del self._conn_waiters[conn]

    def _expire_waiter(self, ledger_id: int, rid: int, conn: ServerConnection) -> None:
        waiters = self._lac_waiters.get(ledger_id)
        if waiters is None or waiters.pop((conn, rid), None) is None:
            return
        if not waiters:
            del self._lac_waiters[ledger_id]
        self._forget_waiter(ledger_id, rid, conn)
        conn.send(self._lac_response(Op.LONG_POLL_LAC, rid, ledger_id))

    def _wake_lac_waiters(self, ledger_id: int) -> None:
        lac = self._lac.get(ledger_id, -1)
        waiters = self._lac_waiters.get(ledger_id)
        if waiters is None:
            return
        woken = [(key, w) for key, w in waiters.items() if lac > w[0]]
        for key, w in woken:
            del waiters[key]
            w[1].cancel()
            conn, rid = key
            self._forget_waiter(ledger_id, rid, conn)
            conn.send(self._lac_response(Op.LONG_POLL_LAC, rid, ledger_id))
        if not waiters:
            del self._lac_waiters[ledger_id]

    # --- first master key of a ledger new to this bookie ------------------------------------------

    def _await_metadata(self, conn: ServerConnection, req: codec.Request) -> None:
        """Hold ``req`` (an add or fence of a ledger new to this bookie) until the metadata store
        says whether the ledger exists: one look-up per ledger, however many requests wait for it.
        Later requests of the ledger find its key recorded and are not delayed."""
        lid = req.ledger_id  # type: ignore[union-attr]
        if self._awaiting_count >= self.config.max_requests_awaiting_metadata:
            self._refuse_waiting(conn, req, Status.TOO_MANY_REQUESTS)
            return
        waiting = self._awaiting_metadata.get(lid)
        self._awaiting_count += 1
        if waiting is not None:
            waiting.append((conn, req))
            return
        self._awaiting_metadata[lid] = [(conn, req)]
        assert self._loop is not None
        task = self._loop.create_task(self._look_up_ledger(lid), name=f"ledger-lookup-{lid}")
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _look_up_ledger(self, ledger_id: int) -> None:
        assert self.store is not None
        mgr = LedgerManager(self.store)
        self.counters.ledger_lookups += 1
        status: int | None = None
        try:
            try:
                md = await mgr.read(ledger_id)
            except NoSuchLedgerError:
                await asyncio.sleep(_LOOKUP_RETRY_S)
                md = await mgr.read(ledger_id)
        except NoSuchLedgerError:
            status = Status.NO_SUCH_LEDGER
        except Exception as exc:  # the store is unreachable: the writer retries, nothing is claimed
            log.warning("could not look up ledger %d in the metadata store: %s", ledger_id, exc)
            status = Status.IO_ERROR
        else:
            allowed = b""
            if md.password is not None:
                try:
                    allowed = master_key(base64.b64decode(md.password, validate=True))
                except binascii.Error:
                    log.warning("ledger %d's metadata holds a password that is not base64; its first key is not "
                                "checked against it", ledger_id)
            if ledger_id not in self._master_keys:
                self._allowed_keys[ledger_id] = allowed
        waiting = self._awaiting_metadata.pop(ledger_id, [])
        self._awaiting_count -= len(waiting)
        if status is not None:
            c = self.counters
            if status == Status.NO_SUCH_LEDGER:
                c.unknown_ledger_claims += 1
                if c.unknown_ledger_claims % 1000 == 1:
                    log.warning("refused %d request(s) from %s naming ledger %d, which the metadata store does not "
                                "hold (%d such ledgers so far)", len(waiting), waiting[0][0].peer if waiting else "?",
                                ledger_id, c.unknown_ledger_claims)
            for conn, req in waiting:
                self._refuse_waiting(conn, req, status)
            return
        for conn, req in waiting:
            try:
                self._dispatch(conn, req)
            except Exception as exc:
                self._failed_request(conn, codec.encode_request(req)[: codec.HEADER_SIZE], exc)

    def _refuse_waiting(self, conn: ServerConnection, req: codec.Request, status: int) -> None:
        if isinstance(req, codec.AddBatchRequest):
            self.counters.rejected_adds[Status(status).name] += len(req.entries)
            conn.send(codec.encode_add_batch_response(req.request_id, Status.OK, req.ledger_id,
                                                      [(e, status) for e, _ in req.entries]))
        elif isinstance(req, codec.AddRequest):
            self.counters.rejected_adds[Status(status).name] += 1
            conn.send(codec.encode_add_response(req.request_id, status, req.ledger_id, req.entry_id))
        elif isinstance(req, codec.ReadRequest):
            conn.send(codec.encode_read_response(req.request_id, status, req.ledger_id, req.entry_id))
        elif isinstance(req, codec.ReadLacRequest):
            conn.send(codec.encode_lac_response(Op.READ_LAC, req.request_id, status, req.ledger_id, -1, -1))


async def run_bookie(config: BookieConfig, ready: Any = None) -> None:
    """Run a bookie until cancelled or SIGTERM/SIGINT (used by the CLI)."""
    bookie = Bookie(config)
    await bookie.start()
    if ready is not None:
        ready(bookie)
    loop = asyncio.get_running_loop()
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
