"""The bookie's domain layer: the rules an add or a fence must pass, storing entries (BookKeeper's
``Bookie.addEntry``: ``handle.addEntry(entry)``; the request processor then logs them with
``Journal.log_add`` and the completion that answers them), fencing durably, and the metadata
look-up of a ledger new to this bookie.

:class:`Ledgers` holds the rules (master key, fenced flag, read-only and the recovery-add
reserve, a failed journal) and raises a typed error from :mod:`ledgerstore.errors` for each
refusal; the request processor (``processor.py``) answers them with the status their class
declares. :class:`LedgerLookup` owns the look-ups of ledgers new to this bookie, the requests
waiting for them and what they found (the first key each ledger may take). What is known per
ledger lives in ``ledger_state.py``; the journal in ``journal.py``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Callable, Sequence

from ledgerstore.api import MetadataStore, ServerConnection, StorageEngine
from ledgerstore.bookie.completions import Completion, FenceCompletion
from ledgerstore.bookie.counters import BookieCounters
from ledgerstore.bookie.journal import Journal
from ledgerstore.bookie.ledger_state import LedgerDescriptors
from ledgerstore.bookie.state import BookieState
from ledgerstore.errors import (
    BookieDiskFullError,
    BookieIOError,
    BookieReadOnlyError,
    LedgerFencedError,
    LedgerStoreError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_RECOVERY_ADD, Status
from ledgerstore.proto.digest import master_key, parse_entry_header
from ledgerstore.stalls import peaks

log = logging.getLogger(__name__)

#: a read-only bookie accepts recovery adds while its ledger disks have this much free space
RECOVERY_ADD_RESERVE_BYTES = 64 << 20
#: a ledger the metadata store did not have is looked up once more after this long (a metadata
#: store read from another session may lag the writer's create by a moment)
LOOKUP_RETRY_S = 0.1


class LedgerNotLookedUpError(LedgerStoreError):
    """A request names a ledger new to this bookie whose metadata was not looked up yet: it waits
    for :class:`LedgerLookup` (never answered on the wire)."""


class JournalFailedError(BookieIOError):
    """The journal failed: the bookie takes no more adds (answered IO_ERROR)."""


#: the errors the ledger rules refuse a request with; each declares the status it is answered with
REFUSALS = (BookieReadOnlyError, JournalFailedError, UnauthorizedAccessError, LedgerFencedError)


#: a request that may wait for its ledger's look-up: an add, or a fence (a read or LAC read with
#: the fence flag)
KeyedRequest = codec.AddRequest | codec.AddBatchRequest | codec.ReadRequest | codec.ReadLacRequest
Waiting = tuple[ServerConnection, KeyedRequest]


class LedgerLookup:
    """Looks up ledgers new to this bookie in the metadata store, once per ledger however many
    requests wait for it, and remembers what each look-up allowed until the ledger's first key is
    recorded. Requests wait on :meth:`wait`; once the look-up ends each is handed to ``resume``
    (the ledger exists) or ``refuse`` with the status to answer."""

    def __init__(self, store: MetadataStore, counters: BookieCounters, limit: int, loop: asyncio.AbstractEventLoop,
                 resume: Callable[[ServerConnection, KeyedRequest], None],
                 refuse: Callable[[ServerConnection, KeyedRequest, int], None]) -> None:
        self._store = store
        self._counters = counters
        self._limit = limit
        self._loop = loop
        self._resume = resume
        self._refuse = refuse
        #: ledger → requests waiting for its look-up
        self._waiting: dict[int, list[Waiting]] = {}
        #: first master keys allowed by the metadata store, for ledgers new to this bookie:
        #: ledger → the key its stored password gives, or b"" when the metadata holds no password
        self._allowed: dict[int, bytes] = {}
        #: those of them the metadata store showed closed: fenced here with their first key
        self._closed: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: requests waiting for a look-up (the ``requests_awaiting_metadata`` gauge)
        self.count = 0

    def allowed_key(self, ledger_id: int) -> bytes | None:
        """The first key the ledger may take (b"": any), or None when it was not looked up."""
        return self._allowed.get(ledger_id)

    def was_closed(self, ledger_id: int) -> bool:
        """Whether the look-up of a ledger new to this bookie found it closed."""
        return ledger_id in self._closed

    def key_recorded(self, ledger_id: int) -> None:
        """The ledger's first key is recorded: its look-up's finding is no longer needed."""
        self._allowed.pop(ledger_id, None)
        self._closed.discard(ledger_id)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The look-ups under way (the bookie cancels them when it stops)."""
        return list(self._tasks)

    def wait(self, conn: ServerConnection, req: KeyedRequest) -> None:
        """Hold ``req`` until the metadata store says whether its ledger exists. Later requests of
        the ledger find its key recorded and are not delayed."""
        lid = req.ledger_id
        if self.count >= self._limit:
            self._refuse(conn, req, Status.TOO_MANY_REQUESTS)
            return
        waiting = self._waiting.get(lid)
        self.count += 1
        if waiting is not None:
            waiting.append((conn, req))
            return
        self._waiting[lid] = [(conn, req)]
        task = self._loop.create_task(self._look_up(lid), name=f"ledger-lookup-{lid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _look_up(self, ledger_id: int) -> None:
        mgr = LedgerManager(self._store)
        self._counters.ledger_lookups += 1
        status: int | None = None
        t0 = time.perf_counter()
        try:
            try:
                md = await mgr.read(ledger_id)
            except NoSuchLedgerError:
                await asyncio.sleep(LOOKUP_RETRY_S)
                md = await mgr.read(ledger_id)
            finally:  # the first adds of the ledger wait for it
                peaks.observe("metadata_lookup", time.perf_counter() - t0)
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
            self._allowed[ledger_id] = allowed
            if md.is_closed:
                self._closed.add(ledger_id)
        waiting = self._waiting.pop(ledger_id, [])
        self.count -= len(waiting)
        if status is not None:
            c = self._counters
            if status == Status.NO_SUCH_LEDGER:
                c.unknown_ledger_claims += 1
                if c.unknown_ledger_claims % 1000 == 1:
                    log.warning("refused %d request(s) from %s naming ledger %d, which the metadata store does not "
                                "hold (%d such ledgers so far)", len(waiting), waiting[0][0].peer if waiting else "?",
                                ledger_id, c.unknown_ledger_claims)
            for conn, req in waiting:
                self._refuse(conn, req, status)
            return
        for conn, req in waiting:
            self._resume(conn, req)


class Ledgers:
    """The ledger rules of one bookie over its engine and journal: what an add or a fence must
    pass, storing entries and logging them, fencing durably, and replaying the journal (it is the
    journal's :class:`~ledgerstore.bookie.journal.ReplayTarget`)."""

    def __init__(self, state: BookieState, descriptors: LedgerDescriptors, engine: StorageEngine,
                 journal: Journal[Completion], lookup: LedgerLookup,
                 disk_usage: Callable[[], tuple[int, int, int]], on_disk_full: Callable[[], None]) -> None:
        """``disk_usage`` gives (total, used, free) bytes of the ledger disks; ``on_disk_full`` is
        called when storage found a disk full."""
        self.state = state
        self.descriptors = descriptors
        self.engine = engine
        self.journal = journal
        self.lookup = lookup
        self.disk_usage = disk_usage
        self.on_disk_full = on_disk_full

    # --- rules ---------------------------------------------------------------------------------

    def check_key(self, ledger_id: int, key: bytes) -> None:
        """Pass when ``key`` is the ledger's master key. The key of a ledger new to this bookie is
        recorded (durably, before anything acknowledged depends on it) once the metadata store has
        shown the ledger exists and, when it stores the ledger's password, that the key is the one
        it gives; a ledger the store showed closed is fenced here with it. Raises :class:`UnauthorizedAccessError`, or :class:`LedgerNotLookedUpError`
        until the look-up is done."""
        known = self.descriptors.master_keys.get(ledger_id)
        if known is None:
            if not key:
                raise UnauthorizedAccessError(f"ledger {ledger_id} is new to this bookie and the request has no key")
            allowed = self.lookup.allowed_key(ledger_id)
            if allowed is None:
                raise LedgerNotLookedUpError(f"ledger {ledger_id} is not looked up yet")
            if allowed and allowed != key:
                raise UnauthorizedAccessError(f"the key is not ledger {ledger_id}'s")
            self.engine.set_master_key(ledger_id, key)
            self.journal.log_master_key(ledger_id, key, None)
            if self.lookup.was_closed(ledger_id) and ledger_id not in self.descriptors.fenced:
                # a closed ledger takes no new entries: a stale writer's add (to a bookie that
                # lost the fence it recorded, or that a re-replication swapped in) is refused
                self.engine.set_fenced(ledger_id)
                self.descriptors.fenced.add(ledger_id)
                self.journal.log_fence(ledger_id, None)
            self.lookup.key_recorded(ledger_id)
            self.descriptors.master_keys[ledger_id] = key
        elif known != key:
            raise UnauthorizedAccessError(f"the key is not ledger {ledger_id}'s")

    def check_add(self, ledger_id: int, key: bytes, flags: int) -> None:
        """Pass when adds of the ledger with this key and flags may be stored. Raises
        :class:`BookieReadOnlyError` (not registered, or read-only and not a recovery add that
        fits the disks' reserve), :class:`JournalFailedError` (the journal failed), what
        :meth:`check_key` raises, or :class:`LedgerFencedError` (fenced or in limbo, and not a
        recovery add)."""
        state = self.state
        if not state.registered.is_set():
            raise BookieReadOnlyError("the bookie is not registered")
        if state.read_only and not (flags & FLAG_RECOVERY_ADD and self.disk_usage()[2] >= RECOVERY_ADD_RESERVE_BYTES):
            # like BookKeeper's high-priority writes: recovery adds still land on a read-only
            # bookie so that ledgers can be closed, as long as its disks keep a reserve
            raise BookieReadOnlyError("the bookie is read-only")
        if self.journal.failed is not None:
            raise JournalFailedError(f"the journal failed: {self.journal.failed}")
        self.check_key(ledger_id, key)
        if not flags & FLAG_RECOVERY_ADD:
            if ledger_id in self.descriptors.fenced:
                raise LedgerFencedError(f"ledger {ledger_id} is fenced")
            if ledger_id in self.descriptors.limbo:
                # a ledger in limbo takes recovery adds only (BookKeeper fences the open ones
                # when it puts them in limbo; a closed one takes no new entries)
                raise LedgerFencedError(f"ledger {ledger_id} is in limbo on this bookie")

    # --- changes -------------------------------------------------------------------------------

    def fence(self, conn: ServerConnection, ledger_id: int, key: bytes, then: Callable[[], None]) -> None:
        """Fence the ledger, then run ``then()`` once the fence record (and everything logged
        before it) is durable. Raises what :meth:`check_key` raises."""
        self.check_key(ledger_id, key)
        if ledger_id not in self.descriptors.fenced:
            self.engine.set_fenced(ledger_id)
            self.descriptors.fenced.add(ledger_id)
        self.journal.log_fence(ledger_id, FenceCompletion(conn, then))

    def add_entry(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """Store one entry (readable at once; durable once logged). Raises :class:`BookieIOError`."""
        try:
            self.engine.add_entry(ledger_id, entry_id, entry)
        except (LedgerStoreError, OSError) as exc:
            raise self._storage_failed(exc, f"ledger {ledger_id} entry {entry_id}") from exc

    def add_entries(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Store a batch of one ledger's entries. Raises :class:`BookieIOError`."""
        try:
            self.engine.add_entries(ledger_id, entries)
        except (LedgerStoreError, OSError) as exc:
            raise self._storage_failed(exc, f"a batch of {len(entries)} entries of ledger {ledger_id}") from exc

    def add_each(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]
                 ) -> tuple[list[tuple[int, int]], list[tuple[int, bytes]], int, int]:
        """Store a batch entry by entry (a batch with malformed entries): each must be signed for
        this ledger and the id it is sent under. Returns the status of each entry, the entries
        stored, their bytes and the highest LAC they carry (-1: none)."""
        items: list[tuple[int, int]] = []
        stored: list[tuple[int, bytes]] = []
        max_lac = -1
        nbytes = 0
        for eid, entry in entries:
            try:
                hl, he, lac = parse_entry_header(entry)
            except LedgerStoreError:
                hl = he = lac = -1
            if hl != ledger_id or he != eid:
                items.append((eid, Status.BAD_REQUEST))
                continue
            try:
                self.add_entry(ledger_id, eid, entry)
            except BookieIOError:
                items.append((eid, Status.IO_ERROR))
                continue
            stored.append((eid, entry))
            items.append((eid, Status.OK))
            nbytes += len(entry)
            if lac > max_lac:
                max_lac = lac
        return items, stored, nbytes, max_lac

    def _storage_failed(self, exc: BaseException, what: str) -> BookieIOError:
        """The one answer to a failed store: logged, a full disk reported, an IO error raised."""
        log.error("storage failed to add %s: %s", what, exc)
        if isinstance(exc, BookieDiskFullError):
            self.on_disk_full()
        return BookieIOError(f"storage failed to add {what}: {exc}")

    # --- journal replay (a ReplayTarget) -----------------------------------------------------------

    def replay_add(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """Store a replayed entry."""
        self.engine.add_entry(ledger_id, entry_id, entry)

    def replay_fence(self, ledger_id: int) -> None:
        """Fence a ledger again in the engine."""
        self.engine.set_fenced(ledger_id)

    def replay_master_key(self, ledger_id: int, key: bytes) -> None:
        """Record a ledger's first key again in the engine."""
        self.engine.set_master_key(ledger_id, key)
